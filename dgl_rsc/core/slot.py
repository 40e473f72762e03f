"""One approximated product of one training step: the step record and the phase dispatch.

The controller makes a :class:`StepInfo` per product (immutable: phase, allocation version
and this product's allocation, the config) and hands it, with the
product's :class:`~dgl_rsc.core.layer_state.LayerState`, to :class:`RSCSpMM
<dgl_rsc.core.spmm.RSCSpMM>` as a :class:`LayerSlot`. Its ``backward_product`` dispatches on the
phase: exact (after the switch), warm-up (exact, recording scores) or approximate (the cached
sample, reused for ``cache_interval`` uses of its matrix, or a fresh one, then its scale), and
records the statistics.
"""

from __future__ import annotations

import torch

from ..backends import resolve
from ..sampling import apply_scale, nonfinite_rows, sample_product
from ..sampling.remainder import step_product
from ..sparse.csr import CSR
from ..sparse.products import NO_SCALES, Scales, csr_t_mm
from .layer_state import LayerState
from .step_info import PHASES, StepInfo

__all__ = ["StepInfo", "LayerSlot", "PHASES"]


class LayerSlot:
    """A layer's state bound to one step: what the autograd function's backward calls."""

    __slots__ = ("state", "step")

    def __init__(self, state: LayerState, step: StepInfo):
        self.state, self.step = state, step

    def backward_product(self, A: CSR, dY: torch.Tensor, scales: Scales = NO_SCALES):
        """``(N, D)`` approximation of ``A^T @ dY`` for ``A (M, N)``, ``dY (M, D)`` (with
        ``A``'s row and column scales), by the step's phase."""
        state, step, cfg = self.state, self.step, self.step.config
        state.backward_calls += 1  # the controller sees a training pass end (rsc.step checks)
        state.bind(A)
        state.stats.product(A.shape[0], dY.shape[1], A.nnz)
        if step.phase == "exact":
            state.stats.exact(A.nnz)
            return csr_t_mm(A, dY, scales)
        backend = resolve(cfg.backend, dY.device)
        if step.probe:
            state.probe_error(A, dY, scales, backend, cfg)
        if step.phase == "warmup":
            state.stats.exact(A.nnz)
            skip = cfg.diagonal == "exact" and A.diagonal() is not None
            state.record(A, backend.row_scores(state.norms(A, scales, skip), dY), cfg)
            return csr_t_mm(A, dY, scales)
        sample = state.cached(A, step)
        fresh = sample is None
        if fresh:
            sample = state.refresh(A, dY, scales, step, backend)
        sample.uses += 1
        # NaN where the exact product would be non-finite (None: nothing to add)
        nonfinite = nonfinite_rows(A, dY, scales) if cfg.check_finite else None
        if not sample.rest:  # no groups, or none needed
            out, nnz = sample_product(A, sample, dY, scales), sample.nnz
        else:  # plus one group of the dropped rows, unbiased; the step adds ``nonfinite``
            out, extra = step_product(A, sample, dY, scales, sample.uses - 1, backend,
                                      nonfinite)  # fmt: skip
            nnz, nonfinite = sample.nnz + extra, None
        state.stats.sampled(nnz, hit=not fresh)
        if fresh:
            gen = state.generator(dY.device)
            out = apply_scale(A, sample, dY, scales, out, cfg.scale_mode, cfg.probe_rows, gen,
                              cfg.diagonal)  # fmt: skip
            sample.scores = None  # only the refresh needs them
        if nonfinite is not None:
            out = out.add_(nonfinite.to(out.dtype))
        return out

    def __repr__(self) -> str:
        return f"LayerSlot({self.state!r}, phase={self.step.phase})"
