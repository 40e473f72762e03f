"""An unbiased estimate of the rows a sample drops: random groups, one per step, in turn.

A cached sample keeps the rows ``S`` with the largest scores and drops the rest ``R``; the
sampled product ``Â[S]^T dY[S]`` leaves out ``Â[R]^T dY[R]`` at every step that reuses it,
the same rows each time. With ``remainder_groups = K`` the refresh also splits the dropped
rows that can contribute (non-zero score) uniformly at random into ``K`` groups ``R_1..R_K``;
step ``u`` of the sample's life adds

    K * Â[R_g]^T dY[R_g],        g = u mod K,

whose expectation over the random split is ``Â[R]^T dY[R]``: the step's product is then an
unbiased estimate of the exact one (top rows exactly, the rest by a uniform group), and over
``K`` consecutive steps every dropped row enters once. Each step visits about ``nnz(R) / K``
more non-zeros than the sample alone.

A refresh draws the groups as row ids (one sort of the row labels). The groups' slices
``A[R_g, :]^T`` are cut when the first is needed on the CPU (all in one pass), elsewhere each
on its first use; a step's group product accumulates into the sample's
(:func:`step_product`).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..base import _deps
from ..sparse.csr import CSR
from ..sparse.products import Scales, csr_mm, csr_mm_sum, pooled_output
from .draw import Sample, cut_rows, sample_product, scaled_transpose

__all__ = ["Groups", "cut_groups", "step_product"]


class Groups:
    """The dropped rows' groups of one sample: ``rows[g]`` (sorted int64 row ids of ``A``)
    and ``nnz[g]`` (0-dim, their non-zeros), the slices ``A[R_g, :]^T`` once cut."""

    __slots__ = ("rows", "nnz", "_slices", "_grouped")

    def __init__(self, rows: list, nnz: list):
        self.rows, self.nnz = rows, nnz
        self._slices = [None] * len(rows)
        self._grouped = None

    def __len__(self) -> int:
        return len(self.rows)

    def slice(self, g: int, A: CSR, backend) -> CSR:
        """``A[R_g, :]^T`` as an ``(N, M)`` CSR, kept once cut: on the CPU every group's at
        the first use (:func:`~dgl_rsc.sparse.cpu_grouped.group_slices`, one pass over
        ``A^T``), elsewhere each on its own first use (``backend``)."""
        if self._slices[g] is None:
            if A.device.type == "cpu" and _deps.numba_available():
                from ..sparse.cpu_grouped import group_slices

                self._slices = group_slices(A, self.rows)
            else:
                mask = torch.zeros(A.shape[0], dtype=torch.bool, device=A.device)
                mask[self.rows[g].to(A.device)] = True
                self._slices[g] = cut_rows(A, mask, backend)
        return self._slices[g]

    def grouped(self, A: CSR, sample: Sample):
        """The sample's and the groups' entries of ``A^T`` grouped per row
        (:class:`~dgl_rsc.sparse.cpu_grouped.GroupedSlices`, CPU), built on first use."""
        if self._grouped is None:
            from ..sparse.cpu_grouped import GroupedSlices

            kept = sample.mask
            if kept is None:  # restored from a checkpoint: the slice's columns are its rows
                kept = torch.zeros(A.shape[0], dtype=torch.bool)
                kept[sample.t_slice.indices.long()] = True
            self._grouped = GroupedSlices(A, kept, self.rows)
        return self._grouped

    def nbytes(self) -> int:
        cut = sum(s.nbytes() for s in self._slices if s is not None)
        cut += 0 if self._grouped is None else self._grouped.nbytes()
        return cut + sum(r.numel() * r.element_size() for r in self.rows)

    def export(self) -> list:
        """The groups as dicts of tensors (their rows; slices are cut again on use)."""
        return [{"rows": r, "nnz": n} for r, n in zip(self.rows, self.nnz)]

    @classmethod
    def restore(cls, saved: list) -> Groups:
        """Inverse of :meth:`export`; also reads the slices an earlier version saved (their
        column ids are the group's rows)."""
        rows, nnz = [], []
        for g in saved:
            if "rows" in g:
                rows.append(g["rows"].long())
                nnz.append(torch.as_tensor(g["nnz"]).long())
            else:
                rows.append(torch.unique(g["indices"].long()))
                nnz.append(torch.tensor(int(g["indptr"][-1])))
        return cls(rows, nnz)


def cut_groups(
    A: CSR,
    sample: Sample,
    groups: int,
    generator: Optional[torch.Generator] = None,
    uses: Optional[int] = None,
) -> Groups:
    """Split the rows of ``A (M, N)`` that ``sample`` drops and that can contribute (score not
    zero, at least one non-zero) into ``groups`` uniform random groups; keep the first
    ``min(groups, uses)`` of them: a sample used ``uses`` times never reaches the others, and
    each group alone is a uniform draw of the dropped rows.

    ``sample.mask`` and ``sample.scores`` must be set (a fresh sample)."""
    if groups < 1:
        raise ValueError(f"groups must be >= 1, got {groups}.")
    count = groups if uses is None else max(1, min(groups, int(uses)))
    row_nnz = A.row_nnz()
    dropped = ~sample.mask & (sample.scores != 0) & (row_nnz > 0)
    dev = A.device if generator is None else generator.device
    label = torch.randint(0, groups, (A.shape[0],), generator=generator, device=dev).to(A.device)
    label = torch.where(dropped, label, torch.full_like(label, groups))
    order = torch.argsort(label, stable=True)  # rows by group, ascending ids within each
    sizes = torch.bincount(label, minlength=groups + 1)[:count].tolist()
    rows = list(torch.split(order[: sum(sizes)], sizes))
    return Groups(rows, [row_nnz[r].sum().long() for r in rows])


def step_product(
    A: CSR,
    sample: Sample,
    dY: torch.Tensor,
    scales: Scales,
    use: int,
    groups: int,
    backend,
    nonfinite: Optional[torch.Tensor] = None,
) -> tuple:
    """``(N, D)`` ``factor * diag(c) A[S]^T diag(r) dY + K * diag(c) A[R_g]^T diag(r) dY``
    (plus ``nonfinite (N, 1)``, :func:`~dgl_rsc.sampling.draw.nonfinite_rows`, when given):
    the sample's product plus group ``g = use mod len(sample.rest)``'s (``K = groups``), and
    the 0-dim number of non-zeros the group visited.

    ``K`` and the sample's factor go into ``dY``'s row scale (the rows are disjoint), and the
    two products accumulate into one output (:func:`~dgl_rsc.sparse.products.csr_mm_sum`:
    ``dY`` scaled once, the output scaled once; DGL's kernel on the CPU where DGL imports,
    cuSPARSE on CUDA), the group's slice from :meth:`Groups.slice`. The CPU engine without
    DGL reads ``A[S ∪ R_g]^T`` from the entries grouped at the first step in one Numba
    product (:class:`~dgl_rsc.sparse.cpu_grouped.GroupedSlices`). INT8 runs the two apart
    and adds them."""
    rest = sample.rest
    g = use % len(rest)
    if scales.quant is not None:  # INT8: the two products apart, added
        k = torch.tensor(float(groups), device=dY.device)
        out = csr_mm(rest.slice(g, A, backend), dY,
                     scaled_transpose(scales, k, A.shape[1], dY),
                     pool=A.transpose_pool())  # fmt: skip
        out.add_(sample_product(A, sample, dY, scales))
    elif not _numba_step(A, sample, dY):  # the non-finite term goes in with the row scale
        w = _row_weights(A, sample, rest.rows[g], groups, dY)
        out = csr_mm_sum([sample.t_slice, rest.slice(g, A, backend)], dY, scales.transposed(),
                         col_weight=w, row_add=nonfinite, pool=A.transpose_pool())  # fmt: skip
        return out, rest.nnz[g]
    else:
        w = _row_weights(A, sample, rest.rows[g], groups, dY)
        ts = scales.transposed()
        col = w if ts.col is None else ts.col.to(dY.dtype) * w
        out = pooled_output(A.transpose_pool(), (A.shape[1], dY.shape[1]), dY)[0]
        rest.grouped(A, sample).product(g, dY, ts.row, col, out)
    if nonfinite is not None:
        out.add_(nonfinite.to(out.dtype))
    return out, rest.nnz[g]


def _numba_step(A: CSR, sample: Sample, dY: torch.Tensor) -> bool:
    """Whether the step runs as one Numba product over the grouped entries: the CPU engine
    without DGL's kernel (which :func:`csr_mm_sum` uses where DGL imports), fp32/fp64, no
    factor on the sample."""
    from ..dgl import kernels as dgl_kernels

    return (dY.device.type == "cpu" and A.device.type == "cpu" and not dgl_kernels.usable(dY)
            and dY.dtype in (torch.float32, torch.float64) and sample.factor is None
            and _deps.numba_available())  # fmt: skip


def _row_weights(A: CSR, sample: Sample, rows: torch.Tensor, groups: int,
                 dY: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """``(M,)`` weights of ``dY``'s rows in a step: the sample's factor (1 without one), and
    ``K = groups`` on the group's ``rows`` (disjoint from the sample's)."""
    w = torch.ones(A.shape[0], dtype=dY.dtype, device=dY.device)
    if sample.factor is not None:
        w.mul_(sample.factor.to(dY.dtype))
    w[rows.to(dY.device)] = float(groups)
    return w
