"""An unbiased estimate of the rows a sample drops: a fixed random partition, one group a step.

A cached sample keeps the rows ``S`` with the largest scores and drops the rest; the sampled
product ``Â[S]^T dY[S]`` leaves out the dropped rows' product at every step that reuses it,
the same rows each time. With ``remainder_groups = K`` the rows of ``Â`` are split once per
matrix, uniformly at random, into ``K`` groups ``P_1..P_K`` of equal size (a
:class:`Partition`), and step ``u`` of a sample's life adds group ``g = (o + u) mod K`` (``o``
drawn at the sample's refresh) without the sample's rows, times ``K``:

    Â[S]^T dY[S] + K * Â[P_g \\ S]^T dY[P_g \\ S].

Every row outside ``S`` is in exactly one group and ``g`` is uniform at every step, so the
step's product is an unbiased estimate of the exact one; over ``K`` consecutive steps every
dropped row enters once. The step multiplies two slices into one output: the sample's
``Â[S]^T`` with ``dY`` and the group's ``Â[P_g]^T`` (cut once per matrix) with ``dY``
weighted by ``K`` off ``S`` and 0 on ``S``, so nothing is cut at a refresh beyond the sample.
The price: the group's product also reads its rows in ``S`` (as zeros) and its rows whose
score is zero (their ``dY`` row is zero at the refresh), about ``nnz(S) / K`` more non-zeros
a step.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..base import _deps
from ..sparse.csr import CSR
from ..sparse.products import Scales, csr_mm, csr_mm_sum
from .draw import Sample, cut_rows, sample_product
from .order import stable_order

__all__ = ["Groups", "Partition", "drops_any", "step_product"]


class Partition:
    """A fixed random split of the ``M`` rows of one matrix ``A (M, N)`` into ``K`` groups.

    Attributes:
        labels: ``(M,)`` int64 group of each row (group sizes differ by at most one).
        token: the structure token of the matrix it was drawn for (``None`` until a restored
            partition is bound).
    """

    __slots__ = ("labels", "groups", "token", "_slices")

    def __init__(self, labels: torch.Tensor, groups: int, token=None):
        self.labels, self.groups, self.token = labels, int(groups), token
        self._slices: list = [None] * self.groups

    @classmethod
    def draw(cls, A: CSR, groups: int, generator: Optional[torch.Generator] = None) -> Partition:
        """A uniform random partition of ``A``'s rows into ``groups`` groups of equal size."""
        if groups < 1:
            raise ValueError(f"groups must be >= 1, got {groups}.")
        m = A.shape[0]
        dev = A.device if generator is None else generator.device
        # a random order from uniform keys (torch.rand draws the same numbers in every
        # torch version, randperm's algorithm has changed), dealt out to the groups in turn
        order = stable_order(torch.rand(m, generator=generator, device=dev)).to(A.device)
        labels = torch.empty(m, dtype=torch.int64, device=A.device)
        labels[order] = torch.arange(m, device=A.device) % groups
        return cls(labels, groups, A.token)

    def fits(self, A: CSR, groups: int) -> bool:
        """Whether this partition is ``A``'s with ``groups`` groups."""
        return self.groups == groups and self.token == A.token and self.labels.numel() == A.shape[0]

    def slice(self, g: int, A: CSR, backend) -> CSR:
        """``A[P_g, :]^T`` as an ``(N, M)`` CSR, kept once cut: on the CPU every group's at the
        first use (:func:`~dgl_rsc.sparse.cpu_grouped.group_slices`, one pass over ``A^T``),
        elsewhere each on its own first use (``backend``)."""
        if self._slices[g] is None:
            if A.device.type == "cpu" and _deps.numba_available():
                from ..sparse.cpu_grouped import group_slices

                self._slices = group_slices(A, self.labels, self.groups)
            else:
                self._slices[g] = cut_rows(A, self.labels == g, backend)
        return self._slices[g]

    def nbytes(self) -> int:
        cut = sum(s.nbytes() for s in self._slices if s is not None)
        return cut + self.labels.numel() * self.labels.element_size()

    def export(self) -> dict:
        labels = self.labels.to(torch.int16 if self.groups <= 32767 else torch.int32)
        return {"labels": labels.cpu(), "groups": self.groups}

    @classmethod
    def restore(cls, saved: dict) -> Partition:
        return cls(saved["labels"].long(), int(saved["groups"]))


class Groups:
    """One sample's remainder estimate: the matrix's :class:`Partition` and the group of the
    sample's first use (``offset``). Without a partition (``None``: the sample drops no row
    that can contribute) it has no groups and is false."""

    __slots__ = ("partition", "offset")

    def __init__(self, partition: Optional[Partition], offset: int = 0):
        self.partition = partition
        self.offset = 0 if partition is None else int(offset) % partition.groups

    def __len__(self) -> int:
        return 0 if self.partition is None else self.partition.groups

    def group(self, use: int) -> int:
        """The group of the sample's ``use``-th step (0-based)."""
        return (self.offset + use) % len(self)

    def slice(self, g: int, A: CSR, backend) -> CSR:
        """Group ``g``'s slice ``A[P_g, :]^T`` (:meth:`Partition.slice`)."""
        return self.partition.slice(g, A, backend)

    def nbytes(self) -> int:
        return 0  # the slices are the partition's, counted once with it

    def export(self) -> dict:
        """What a checkpoint keeps (the partition is saved with the layer's state)."""
        return {"offset": self.offset, "groups": len(self)}

    @classmethod
    def restore(cls, saved, partition: Optional[Partition], num_rows: int) -> Groups:
        """Inverse of :meth:`export`, given the layer's restored ``partition``. A checkpoint of
        an earlier version holds each group's dropped rows (or their slices) and no partition:
        those groups become one (each row in its old group, the others spread by row id)."""
        if isinstance(saved, dict):
            ok = int(saved["groups"]) and partition is not None
            return cls(partition if ok else None, int(saved["offset"]))
        if not any(_count(d) for d in saved):
            return cls(None)
        labels = torch.arange(num_rows, dtype=torch.int64) % len(saved)
        for g, d in enumerate(saved):
            rows = d["rows"] if "rows" in d else torch.unique(d["indices"].long())
            labels[rows.long()] = g
        return cls(Partition(labels, len(saved)), 0)


def _count(saved: dict) -> int:
    """Non-zeros of one group of an earlier version's checkpoint."""
    return int(saved["nnz"]) if "nnz" in saved else int(saved["indptr"][-1])


def drops_any(A: CSR, sample: Sample) -> bool:
    """Whether ``sample`` (fresh: ``mask`` and ``scores`` set) leaves out a row of ``A`` that
    can contribute (a non-zero score and at least one non-zero)."""
    return bool((~sample.mask & (sample.scores != 0) & (A.row_nnz() > 0)).any())


def step_product(
    A: CSR,
    sample: Sample,
    dY: torch.Tensor,
    scales: Scales,
    use: int,
    backend,
    nonfinite: Optional[torch.Tensor] = None,
) -> tuple:
    """``(N, D)`` ``factor * diag(c) A[S]^T diag(r) dY + K * diag(c) A[P_g \\ S]^T diag(r) dY``
    (plus ``nonfinite (N, 1)``, :func:`~dgl_rsc.sampling.draw.nonfinite_rows`, when given):
    the sample's product plus group ``g = sample.rest.group(use)``'s (``K``: the partition's
    group count), and
    the 0-dim number of non-zeros the group's slice visited.

    Both products accumulate into one output (:func:`~dgl_rsc.sparse.products.csr_mm_sum`:
    the group's ``dY`` weighted by ``K`` off ``S`` and 0 on ``S``, the output scaled once;
    DGL's kernel on the CPU where DGL imports, ``torch.sparse`` elsewhere). INT8 runs the
    two products apart and adds them."""
    rest = sample.rest
    part = rest.slice(rest.group(use), A, backend)
    nnz = torch.tensor(part.nnz, dtype=torch.int64)
    rest_w = _rest_weights(A, sample, len(rest), dY)
    if scales.quant is not None:  # INT8: the group's product, then the sample's added
        ts = scales.transposed()
        col = rest_w if ts.col is None else ts.col.to(rest_w.dtype) * rest_w
        out = csr_mm(part, dY, Scales(ts.row, col, quant=ts.quant), pool=A.transpose_pool())
        out.add_(sample_product(A, sample, dY, scales))
        if nonfinite is not None:
            out.add_(nonfinite.to(out.dtype))
        return out, nnz
    f = sample.factor
    kept_w = None if f is None else f.to(rest_w.dtype).expand(A.shape[0])
    out = csr_mm_sum([sample.t_slice, part], dY, scales.transposed(),
                     col_weight=[kept_w, rest_w], row_add=nonfinite,
                     pool=A.transpose_pool())  # fmt: skip
    return out, nnz


def _rest_weights(A: CSR, sample: Sample, groups: int, dY: torch.Tensor) -> torch.Tensor:
    """``(M,)`` weights of ``dY``'s rows in a step's group product: 0 on the sample's rows,
    ``K = groups`` on every other row."""
    kept = sample.mask
    if kept is None:  # restored from a checkpoint: the slice's columns are its rows
        kept = torch.zeros(A.shape[0], dtype=torch.bool, device=dY.device)
        kept[sample.t_slice.indices.long()] = True
        sample.mask = kept
    wdt = torch.float32 if dY.dtype in (torch.float16, torch.bfloat16) else dY.dtype
    zero = torch.zeros((), dtype=wdt, device=dY.device)
    return torch.where(kept.to(dY.device), zero, torch.full_like(zero, float(groups)))
