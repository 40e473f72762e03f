"""The relative error of the sampled product as a function of the budget, from a few columns.

For ``G = Â^T dY`` (``Â = diag(r) A diag(c)``, ``A (M, N)``, ``dY (M, D)``) and a kept row set
``S``, the sampled product is ``c_S * Â[S]^T dY[S]``. Output row ``j`` of ``G`` only involves
column ``j`` of ``Â``, so drawing ``P`` output rows (columns of ``A``) uniformly and computing
their exact and kept parts from the transposed structure costs ``P * nnz(col) * D``, a small
fraction of one product, and gives for every prefix of the selection order at once

    err(S)^2 = sum_j ||G[j] - c_S G_S[j]||^2 / sum_j ||G[j]||^2     (j over the probes),

a ratio estimator of the relative Frobenius error. ``c_S`` is the least-squares factor on the
probes clipped to ``[1, mass]`` like the ``"ls"`` scale (1 for ``rescale: none``). The curve is
evaluated on a grid of non-zero fractions (:data:`GRID`); :func:`fraction_for_error` reads the
smallest fraction whose error is under a target from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..sparse.csr import CSR
from ..sparse.products import Scales, coo_mm
from .order import stable_order

__all__ = ["GRID", "ErrorCurve", "error_curve", "fraction_for_error"]

#: non-zero fractions at which the error curve is evaluated (1.0: every useful row)
GRID = (0.0, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0)


@dataclass(frozen=True)
class ErrorCurve:
    """Estimated relative error of the sampled product at each non-zero fraction.

    Attributes:
        fractions: ``(G,)`` float64 non-zero fractions (of the layer's non-zeros).
        errors: ``(G,)`` float64 estimated relative errors ``||G - c G_S|| / ||G||``.
        probes: output rows the estimate used.
    """

    fractions: torch.Tensor
    errors: torch.Tensor
    probes: int

    def at(self, fraction: float) -> float:
        """The error at ``fraction``, linearly interpolated between grid points."""
        f, e = self.fractions, self.errors
        i = int(torch.searchsorted(f, torch.tensor([float(fraction)], dtype=f.dtype)))
        if i <= 0:
            return float(e[0])
        if i >= f.numel():
            return float(e[-1])
        w = (fraction - float(f[i - 1])) / max(float(f[i] - f[i - 1]), 1e-12)
        return float(e[i - 1] + w * (e[i] - e[i - 1]))


def fraction_for_error(curve: ErrorCurve, target: float) -> float:
    """The smallest non-zero fraction whose estimated error is at most ``target``, linearly
    interpolated on the grid (1.0 when none is)."""
    f, e = curve.fractions.tolist(), curve.errors.tolist()
    if e[0] <= target:
        return f[0]
    for i in range(1, len(f)):
        if e[i] <= target:
            w = (e[i - 1] - target) / max(e[i - 1] - e[i], 1e-12)
            return f[i - 1] + w * (f[i] - f[i - 1])
    return 1.0


def _probe_entries(A: CSR, cols: torch.Tensor):
    """Entries of ``A`` in columns ``cols``: ``(seg, rows, ent)``, ``seg`` the probe each
    belongs to, ``rows`` their row ids, ``ent`` their positions in ``A``."""
    t_indptr, t_rows, perm = A.transposed()
    t_indptr = t_indptr.long()
    starts, ends = t_indptr[cols], t_indptr[cols + 1]
    lens = ends - starts
    seg = torch.repeat_interleave(torch.arange(cols.numel(), device=cols.device), lens)
    offs = torch.arange(int(lens.sum()), device=cols.device)
    offs = offs - torch.repeat_interleave(torch.cumsum(lens, 0) - lens, lens)
    pos = starts[seg] + offs
    return seg, t_rows.long()[pos], perm[pos]


def error_curve(
    A: CSR,
    dY: torch.Tensor,
    scales: Scales,
    key: torch.Tensor,
    row_nnz: torch.Tensor,
    probes: int,
    generator: Optional[torch.Generator] = None,
    rescale: str = "ls",
    grid=GRID,
) -> Optional[ErrorCurve]:
    """Estimate the sampled product's relative error at each fraction of ``grid``.

    Args:
        A: ``(M, N)``; ``dY``: ``(M, D)``; ``scales``: ``A``'s row/column scales.
        key: ``(M,)`` the selection key (rows are kept in descending order; 0: never kept).
        row_nnz: ``(M,)`` non-zeros of each row (the cost of keeping it).
        probes: output rows (columns of ``A``) to draw, uniformly without replacement.
        rescale: ``"ls"`` or ``"mass"`` scale the kept part by the probes' least-squares
            factor clipped to ``[1, total/kept score mass]``; ``"none"``: no scale.
    Returns:
        The :class:`ErrorCurve`, or ``None`` when ``A`` has no entries or ``G`` is zero on the
        probes.
    """
    n = A.shape[1]
    if A.nnz == 0 or n == 0 or probes <= 0:
        return None
    dev = dY.device
    cols = torch.randperm(n, generator=generator, device=dev)[: min(probes, n)]
    seg, rows, ent = _probe_entries(A, cols)
    w = torch.ones(ent.numel(), dtype=torch.float32, device=dev)
    if A.values is not None:
        w = w * A.values.detach().float()[ent]
    r = scales.row_factor()
    if r is not None:
        w = w * r.detach().float()[rows]
    # the column scale multiplies all of G[j] and G_S[j] alike: it cancels in the ratio only
    # per probe, so keep it
    c = scales.col if scales.col is not None else scales.hint_col
    if c is not None:
        w = w * c.detach().float()[cols[seg]]
    # the rank of each row in the selection order, and the non-zeros of each prefix
    k = key.float()
    order = stable_order(k, descending=True)
    useful = int((k > 0).sum())
    rank = torch.full((k.numel(),), k.numel(), dtype=torch.long, device=k.device)
    rank[order[:useful]] = torch.arange(useful, device=k.device)
    csum = torch.cumsum(row_nnz.double()[order[:useful]], 0)
    total = float(row_nnz.double().sum())
    # the first grid point that keeps each entry's row: one scatter into (grid + 1) buckets,
    # then a cumulative sum over buckets gives the kept part of G at every grid point
    fr = torch.tensor(grid, dtype=csum.dtype, device=csum.device)
    cuts = torch.searchsorted(csum, fr * total, right=True).clamp(max=useful)
    cuts[fr >= 1.0] = useful
    bucket = torch.searchsorted(cuts, rank[rows], right=True)  # == len(grid): never kept
    p, g = cols.numel(), len(grid)
    # the probes' parts by bucket: one sparse product ((G + 1) P, M) @ dY
    parts = coo_mm(bucket * p + seg, rows, w, (g + 1) * p, dY.detach().float())
    parts = parts.view(g + 1, p, -1).double()
    cum = torch.cumsum(parts, 0)
    Gd, GS = cum[g], cum[:g]  # (P, D) exact, (G, P, D) kept parts
    g2 = float(Gd.square().sum())
    if not g2 > 0 or not torch.isfinite(torch.tensor(g2)):
        return None
    s2 = GS.square().sum((1, 2))
    scale = torch.ones(g, dtype=torch.float64, device=s2.device)
    if rescale != "none":
        ls = (GS * Gd).sum((1, 2)) / s2.clamp(min=1e-300)
        scale = torch.where(s2 > 0, ls.clamp(min=1.0), scale)
    errs = (Gd - scale[:, None, None] * GS).square().sum((1, 2)) / g2
    errors = errs.clamp(min=0).sqrt()
    # a larger kept set never does worse in expectation: keep the curve non-increasing
    errors = torch.cummin(errors, 0).values.cpu()  # G numbers, read on the host by the solver
    return ErrorCurve(torch.tensor(grid, dtype=torch.float64), errors, int(cols.numel()))
