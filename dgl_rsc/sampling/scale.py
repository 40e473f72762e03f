"""The scale of the sampled product: a least-squares factor estimated from a few dropped rows.

The exact gradient is ``G = G_S + G_D``: the kept rows' product plus the dropped rows'. Among
the estimates ``c * G_S``, the one closest to ``G`` has

    c* = <G_S, G> / ||G_S||^2 = 1 + <G_S, G_D> / ||G_S||^2.

When the dropped rows' contributions point in independent directions, ``<G_S, G_D> ~ 0`` and
the best factor is 1 (scaling up only adds error); when the gradient's rows are coherent, as
in training, ``G_D`` points along ``G_S`` and the factor restores the lost part. The cross term
is a sum over dropped rows ``i`` of ``<G_S, g_i>`` with ``g_i = Â[i]^T dY[i]``; drawing a few
dropped rows with probability proportional to their score ``s_i = ||Â[i]|| ||dY[i]||`` (which
bounds ``|<G_S, g_i>| <= ||G_S|| s_i``) gives an unbiased, low-variance estimate at the cost of
gathering ``G_S`` on those rows' columns. The factor uses a lower confidence bound of the
cross term (its estimate minus two standard errors) and is clipped to ``[1, mass]`` with ``mass``
the total over kept score mass. The error of ``c * G_S`` falls from ``c = 1`` to ``c = c*``, so a
factor between 1 and ``c*`` is never worse than the unscaled estimator: where the cross term is
not clearly positive (independent rows) the factor is exactly 1.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ..sparse.csr import CSR
from ..sparse.products import Scales

__all__ = ["estimate_ls_scale", "cross_terms", "sampled_cross_terms", "CONFIDENCE"]

#: standard errors subtracted from the estimated cross term (a one-sided ~98% lower bound)
CONFIDENCE = 2.0


def _entry_weights(A: CSR, scales: Scales, w, ent, rows, cols, skip_diagonal: bool):
    """``w * Â[rows, cols]`` in float64 for entries ``ent`` of ``A`` (0 on the diagonal when
    ``skip_diagonal``)."""
    if A.values is not None:
        w = w * A.values.detach().double()[ent]
    if scales.score_col() is not None:
        w = w * scales.score_col().double()[cols]
    r = scales.row_factor()
    if r is not None:
        w = w * r.double()[rows]
    if skip_diagonal:
        w = torch.where(cols == rows, torch.zeros_like(w), w)
    return w


def cross_terms(
    A: CSR, dY: torch.Tensor, scales: Scales, G: torch.Tensor, rows: torch.Tensor,
    skip_diagonal: bool = False,
) -> torch.Tensor:  # fmt: skip
    """``(R,)`` float64 ``<G, Â[i]^T dY[i]>`` for each ``i`` in ``rows``, with
    ``Â = diag(r) A diag(c)`` (the diagonal entry left out when ``skip_diagonal``).

    Args:
        A: ``(M, N)``; ``dY (M, D)``; ``G (N, D)``; ``rows (R,)`` int64 row ids of ``A``.
    """
    rows = rows.long()
    starts = A.indptr.long()[rows]
    lens = A.indptr.long()[rows + 1] - starts
    seg = torch.repeat_interleave(torch.arange(rows.numel(), device=rows.device), lens)
    offs = torch.arange(int(lens.sum()), device=rows.device)
    offs = offs - torch.repeat_interleave(torch.cumsum(lens, 0) - lens, lens)
    ent = starts[seg] + offs
    cols = A.indices.long()[ent]
    i = rows[seg]
    w = torch.ones(ent.numel(), dtype=torch.float64, device=G.device)
    w = _entry_weights(A, scales, w, ent, i, cols, skip_diagonal)
    dots = (G[cols].double() * dY[i].double()).sum(1) * w
    out = torch.zeros(rows.numel(), dtype=torch.float64, device=G.device)
    return out.index_add_(0, seg, dots)


def sampled_cross_terms(
    A: CSR, dY: torch.Tensor, scales: Scales, G: torch.Tensor, rows: torch.Tensor,
    generator: Optional[torch.Generator] = None, skip_diagonal: bool = False,
    g_scale: Optional[torch.Tensor] = None,
) -> torch.Tensor:  # fmt: skip
    """``(R,)`` float64 unbiased estimates of :func:`cross_terms`: for each ``i`` in ``rows``
    one entry ``j`` of row ``i`` drawn uniformly, ``nnz_i * Â[i, j] * <G[j], dY[i]>`` (0 for
    an empty row, and for the diagonal entry when ``skip_diagonal``).

    Args:
        A: ``(M, N)``; ``dY (M, D)``; ``G (N, D)``; ``rows (R,)`` int64 row ids of ``A``.
        g_scale: ``(N,)`` row scale of ``G`` (the terms of ``diag(g_scale) G``), or ``None``.
    """
    rows = rows.long()
    indptr = A.indptr.long()
    starts = indptr[rows]
    lens = indptr[rows + 1] - starts
    u = torch.rand(rows.numel(), generator=generator, dtype=torch.float64, device=rows.device)
    pick = torch.minimum((u * lens.double()).long(), (lens - 1).clamp(min=0))
    ent = starts + pick
    ent = torch.where(lens > 0, ent, torch.zeros_like(ent))  # empty rows: weight 0 below
    if A.nnz == 0:
        return torch.zeros(rows.numel(), dtype=torch.float64, device=G.device)
    cols = A.indices.long()[ent]
    w = _entry_weights(A, scales, lens.double(), ent, rows, cols, skip_diagonal)
    if g_scale is not None:
        w = w * g_scale.double()[cols]
    return (G[cols].double() * dY[rows].double()).sum(1) * w


def _squared_norm(G: torch.Tensor, h: Optional[torch.Tensor]) -> float:
    """``||diag(h) G||_F^2`` of ``G (N, D)`` (``h (N,)`` or ``None``: 1), from the fp32 row
    norms: one pass over ``G``, no scaled copy."""
    rows = torch.linalg.vector_norm(G.float(), dim=1)
    if h is not None:
        rows = rows * h.to(rows.dtype).abs()
    return float(torch.linalg.vector_norm(rows)) ** 2


def estimate_ls_scale(
    A: CSR,
    dY: torch.Tensor,
    scales: Scales,
    G_kept: torch.Tensor,
    scores: torch.Tensor,
    kept: torch.Tensor,
    probe_rows: int,
    generator: Optional[torch.Generator] = None,
    skip_diagonal: bool = False,
) -> torch.Tensor:
    """0-dim float32 estimate of ``c*`` (see the module docstring), clipped to ``[1, mass]``;
    always finite: non-finite entries of ``G_kept`` and non-finite probes are left out (the
    NaN/Inf themselves reach the gradient through the kept rows and
    :func:`~dgl_rsc.sampling.propagate_nonfinite`, never through the factor).

    Args:
        G_kept: ``(N, D)`` the sampled product of the kept rows (without an exactly applied
            diagonal: the factor scales the sampled part only).
        scores: ``(M,)`` the rows' scores ``s_i``; ``kept``: ``(M,)`` bool, the kept rows.
        probe_rows: how many dropped rows to draw (with replacement, ``p_i ~ s_i``), each
            through one uniformly drawn entry (:func:`sampled_cross_terms`).
    """
    s = torch.nan_to_num(scores.float(), nan=0.0, posinf=0.0, neginf=0.0).clamp(min=0)
    total = s.sum()
    dropped_s = torch.where(kept, torch.zeros_like(s), s)
    one = torch.ones((), dtype=torch.float32, device=s.device)
    kept_mass = total - dropped_s.sum()
    if float(kept_mass) <= 0:
        return one
    mass = total / kept_mass
    # the caller may apply the column scale to X itself (hint_col): G is measured in the space
    # of the normalized matrix, as if the scale had been applied here (the same factor whether
    # a layer fuses the scale into the product or scales X first, as stock DGL does); the
    # scale enters through G's row norms and the probed rows, never as a scaled copy of G
    h = scales.hint_col if scales.col is None else None
    g2 = _squared_norm(G_kept, h)
    if not math.isfinite(g2):  # a NaN/Inf in dY: estimate from the finite entries only, so
        G_kept = torch.nan_to_num(G_kept.float(), nan=0.0, posinf=0.0, neginf=0.0)  # the
        g2 = _squared_norm(G_kept, h)  # factor stays finite
    dropped = torch.nonzero(dropped_s).squeeze(1)
    if dropped.numel() == 0 or probe_rows <= 0 or not 0 < g2 < math.inf:
        return one
    p = dropped_s[dropped].double()
    p = p / p.sum()
    pick = torch.multinomial(p, probe_rows, replacement=True, generator=generator)
    cross = sampled_cross_terms(A, dY, scales, G_kept, dropped[pick], generator,
                                skip_diagonal, h) / p[pick]  # fmt: skip
    se = float(cross.std()) / probe_rows**0.5 if probe_rows > 1 else float("inf")
    lower = float(cross.mean()) - CONFIDENCE * se
    if not math.isfinite(lower):  # NaN/Inf in a probed row: no evidence for a factor
        return one
    c = 1.0 + max(lower, 0.0) / g2
    return torch.clamp(torch.tensor(c, dtype=torch.float32, device=s.device), 1.0, float(mass))
