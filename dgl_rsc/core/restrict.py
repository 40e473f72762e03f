"""The row-restricted backward: the rows a sampled product reads decide what the backward
before it computes.

The sampled backward of ``Z = Â X`` reads only rows ``R = T ∪ P_g`` of its incoming gradient
``dZ``: ``T`` the rows of the cached sample's slice, ``P_g`` the remainder group of this use
(:mod:`dgl_rsc.sampling.remainder`). On a step that reuses a cached sample, ``R`` is known
before ``dZ`` is computed, so the backward that produces ``dZ`` -- the dense
input-gradient GEMM of the next layer, the dropout, ReLU and bias backwards, and an
aggregate-first layer's own weight -- needs only the rows ``R`` (rows outside it are left
zero: the product never reads them). On a refresh step the selection scores need
``||dZ_i||`` for every row, and on a probe step the error curve reads every row: all rows
are computed there.

A parameter gradient summed over the rows of a restricted tensor (a bias, an aggregate-first
weight ``Z^T dU``) is, under ``restrict="weights"``, estimated from ``R`` with the sample's
weights: ``1`` on ``T`` (kept at every step), ``K`` (the number of remainder groups) on
``P_g \\ T`` (each row outside ``T`` is in exactly one group, and the group is uniform):

    sum_i g_i  ~  sum_{i in T} g_i + K sum_{i in P_g \\ T} g_i,

unbiased given the sample (without groups the rows outside ``T`` are left out, as by the
sparse product itself), and exact when ``T`` holds every row (budget 1). Under
``restrict="rows"`` those gradients stay exact, so the rows they sum over are computed.

:class:`RowPlan` resolves ``R`` for one product at backward time; :class:`RestrictedSegment`
is the backward of what lies between two products of the native GCN.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from ..sparse.csr import CSR
from .config import RESTRICTS
from .layer_state import LayerState
from .step_info import StepInfo

__all__ = ["RowSet", "RowPlan", "RestrictedSegment", "SegmentSpec", "RESTRICTS", "segment_row_work"]

#: The solver's work unit is one non-zero times one column of a sparse product (a gather and a
#: multiply-add, bound by memory). Against it, measured on the 200k preset (2-core AMD EPYC
#: VM, AVX2, fp32, 2026-11-28): a 200000-row product of width 256 took 1558 ms for 5.1e9
#: units (0.30 ns each); a 200000 x 256 x 256 GEMM 142 ms for 1.3e10 multiply-adds (0.011 ns:
#: 0.04 units); ``relu(c * s + b)`` on 200000 x 256 52 ms for three passes (0.34 ns per
#: element and pass: 1 unit).
DENSE_FMA_WORK = 0.04
ELEMENTWISE_WORK = 1.0
#: elementwise passes over a restricted row of the hidden width: the gather of ``dX``'s row,
#: the column and dropout scale, ReLU's mask, the row scale and the scatter into ``dZ``
ELEMENTWISE_PASSES = 5


class RowSet(NamedTuple):
    """Rows of a product's incoming gradient that its backward reads.

    Attributes:
        index: ``(r,)`` int64 row ids, ascending.
        weight: ``(r,)`` weight of each row in an estimate of a sum over all rows (``1`` on
            the sample's rows, ``K`` on the remainder group's others).
        total: ``M``, the gradient's rows.
    """

    index: torch.Tensor
    weight: torch.Tensor
    total: int


class RowPlan:
    """The rows product ``state`` will read in this step's backward (``step``: its step record,
    ``A (M, N)``: its matrix), resolved when asked (the backward before the product runs
    first), under ``mode`` (``"rows"`` or ``"weights"``, :data:`RESTRICTS`)."""

    __slots__ = ("state", "step", "A", "mode")

    def __init__(self, state: LayerState, step: StepInfo, A: CSR, mode: str):
        if mode not in RESTRICTS[1:]:
            raise ValueError(f"mode must be one of {RESTRICTS[1:]}, got {mode!r}.")
        self.state, self.step, self.A, self.mode = state, step, A, mode

    def resolve(self, dtype: torch.dtype) -> Optional[RowSet]:
        """The :class:`RowSet` of this step (weights in ``dtype``), or ``None`` when the
        product reads every row (exact or warm-up phase, a probe step, a refresh)."""
        step, state, A = self.step, self.state, self.A
        if step.phase != "approx" or step.probe:
            return None
        if state.ema_token is not None and state.ema_token != A.token:
            return None  # another matrix's state is current: the product rebinds first
        sample = state.cached(A, step)
        if sample is None:
            return None  # a refresh: the scores need every row's norm
        m = A.shape[0]
        kept = sample.mask if step.config.diagonal == "sample" else None
        if kept is None:  # restored, or an exact diagonal: the slice's columns are its rows
            kept = torch.zeros(m, dtype=torch.bool, device=A.device)
            kept[sample.t_slice.indices.long()] = True
        weight = kept.to(dtype)
        if sample.rest:
            part = sample.rest.partition
            group = (part.labels == sample.rest.group(sample.uses)) & ~kept
            weight = torch.where(group, torch.full_like(weight, float(len(sample.rest))), weight)
        index = torch.nonzero(weight).squeeze(1)
        return RowSet(index, weight.index_select(0, index), m)


class SegmentSpec(NamedTuple):
    """What lies between product ``l`` (output ``Z (N, D)``) and product ``l + 1`` (input
    ``X``), besides the parameters: ``X = dropout(relu(Z W * row + b)) * col' W'``.

    Attributes:
        row: ``(N,)`` scale after an aggregate-first weight ``W``, or ``None``.
        col_next: ``(N,)`` scale before a transform-first ``W'``, or ``None``.
        p: dropout probability in ``[0, 1)`` (training mode).
    """

    row: Optional[torch.Tensor]
    col_next: Optional[torch.Tensor]
    p: float


def _dropout(a: torch.Tensor, p: float):
    """``(dropout(a), scale)``: the output of ``torch.nn.functional.dropout(a, p, True)`` bit
    for bit, from the same random numbers, and the 0-dim ``1 / (1 - p)`` its kept entries
    were multiplied by (``None`` for ``p == 0``)."""
    if p == 0:
        return a, None
    if a.device.type == "cpu":  # ATen's composite dropout on the CPU: the same three steps
        noise = torch.empty_like(a).bernoulli_(1 - p).div_(1 - p)
        out = a * noise
    else:  # the fused kernel elsewhere: a * mask * scale with a 0/1 mask
        out = F.dropout(a, p, True)
    return out, torch.ones((), dtype=a.dtype, device=a.device).div_(1 - p)


#: per product state: ``(dZ buffer, rows written last)``, reused so that a restricted step
#: zeroes only the rows the previous one wrote instead of a fresh ``(N, D)`` tensor
_BUFFERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _scatter_rows(owner, rows: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor:
    """``(n, D)`` zeros but ``rows (r, D)`` at ``index (r,)``: in ``owner``'s kept buffer when
    it fits (the previous rows zeroed again), else in a new one."""
    shape = (n, rows.shape[1])
    kept = None if owner is None or torch.is_grad_enabled() else _BUFFERS.get(owner)
    if kept is not None and kept[0].shape == shape and kept[0].dtype == rows.dtype and (
            kept[0].device == rows.device):  # fmt: skip
        buf = kept[0].index_fill_(0, kept[1], 0)
    else:
        buf = rows.new_zeros(shape)
    buf.index_copy_(0, index, rows)
    if owner is not None and not torch.is_grad_enabled():
        _BUFFERS[owner] = (buf, index)
    return buf


def _rows(t: Optional[torch.Tensor], index: Optional[torch.Tensor]):
    if t is None or index is None:
        return t
    return t.index_select(0, index)


def _col(t: Optional[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return x if t is None else x * t.reshape(-1, 1)


def segment_row_work(
    width: int, hidden: int, weight_fmas: int, next_fmas: int, mode: str, sums: bool
) -> float:
    """The solver's cost (units of :mod:`~dgl_rsc.core.solver`) of one row of ``dZ (N,
    width)`` that a :class:`RestrictedSegment`'s backward computes, besides the product's own
    non-zeros: the GEMMs on that row (``next_fmas``: the next layer's input gradient,
    ``hidden x D'``; ``weight_fmas``: an aggregate-first weight's, ``width x hidden``, once
    for ``dZ`` and once more for its weight's estimate under ``"weights"``) and
    :data:`ELEMENTWISE_PASSES` passes over the ``hidden`` columns between them. Under
    ``"rows"`` with exact parameter sums (``sums``) only the aggregate-first GEMM and the
    gather and scatter of ``dZ``'s rows are restricted."""
    if mode == "rows" and sums:
        return DENSE_FMA_WORK * weight_fmas + ELEMENTWISE_WORK * 2 * width
    gemms = next_fmas + weight_fmas * (2 if mode == "weights" else 1)
    return DENSE_FMA_WORK * gemms + ELEMENTWISE_WORK * ELEMENTWISE_PASSES * hidden


class RestrictedSegment(torch.autograd.Function):
    """``X = dropout(relu(Z W * row + b)) * col' W'`` (each factor optional) with a backward
    that computes ``dZ`` on the rows ``plan`` resolves (see the module).

    Forward: the same operations in the same order as the plain layers (bit for bit, and the
    same random numbers for the dropout). Saves ``Z`` (for ``dW``) and ``X``'s operand
    before ``W'`` (for ``dW'``), from whose sign the backward reads ReLU's and dropout's mask:
    one ``(N, D)`` tensor where autograd keeps three (the ReLU output, the dropout noise and
    that operand)."""

    @staticmethod
    def forward(ctx, z, weight, bias, weight_next, spec: SegmentSpec, plan: Optional[RowPlan]):
        u = z if weight is None else torch.matmul(z, weight)
        if spec.row is not None:
            u = u * spec.row.reshape(-1, 1)
        if bias is not None:
            u = u + bias
        h, scale = _dropout(F.relu(u), spec.p)
        h = _col(spec.col_next, h)  # positive scales: h > 0 exactly where relu' * mask is 1
        x = h if weight_next is None else torch.matmul(h, weight_next)
        ctx.spec, ctx.plan, ctx.scale = spec, plan, scale
        ctx.save_for_backward(z if weight is not None else None, weight, h, weight_next)
        if plan is not None:  # what a kept row of dZ costs the backward: for the solver
            sums = bias is not None or weight is not None
            plan.state.row_work = segment_row_work(
                z.shape[1],
                h.shape[1],
                0 if weight is None else weight.numel(),
                0 if weight_next is None else weight_next.numel(),
                plan.mode,
                sums,
            )
        return x

    @staticmethod
    def backward(ctx, dx):
        z, weight, h, weight_next = ctx.saved_tensors
        spec, plan = ctx.spec, ctx.plan
        need_w, need_b, need_wn = ctx.needs_input_grad[1:4]
        sums = need_b or (weight is not None and need_w)
        # under "rows", with every row feeding an exact sum and no GEMM of this layer's own
        # to restrict, there is nothing to skip
        skip = plan is None or (plan.mode == "rows" and sums and weight is None)
        rows = None if skip else plan.resolve(dx.dtype)
        estimate = rows is not None and (plan.mode == "weights" or not sums)
        idx = rows.index if estimate else None  # the rows every step below computes
        dwn = None
        if weight_next is not None and need_wn:
            dwn = torch.matmul(h.t(), dx)
        d = dx if idx is None else dx.index_select(0, idx)
        if weight_next is not None:
            d = torch.matmul(d, weight_next.t())
        # the column scale and dropout's backward (their factors multiplied first: equal to
        # autograd's to rounding), then ReLU's
        col = _rows(spec.col_next, idx)
        if ctx.scale is not None:
            col = ctx.scale if col is None else col.reshape(-1, 1) * ctx.scale
        d = d if col is None else d * (col if col.dim() != 1 else col.reshape(-1, 1))
        d = torch.ops.aten.threshold_backward(d, _rows(h, idx), 0)
        db = None
        if need_b:
            db = d.sum(0) if not estimate else torch.matmul(rows.weight, d)
        d = _col(_rows(spec.row, idx), d)
        dw = None
        if weight is not None and need_w:
            dw = torch.matmul(_rows(z, idx).t(), d if not estimate else d * rows.weight[:, None])
        dz = None
        if ctx.needs_input_grad[0]:  # else Z is a constant (the first layer's aggregation)
            if rows is not None and idx is None:  # "rows" with exact sums: the GEMM alone
                idx = rows.index
                d = d.index_select(0, idx)
            if weight is not None:
                d = torch.matmul(d, weight.t())
            dz = d if idx is None else _scatter_rows(plan.state, d, idx, dx.shape[0])
        if plan is not None:
            plan.state.stats.gradient_rows(d.shape[0], dx.shape[0])
        return dz, dw, db, dwn, None, None
