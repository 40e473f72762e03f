"""``Sampler``: the backward of ``rsc=<float>``: top rows at a fixed budget fraction, drawn
afresh at every backward (no cache, no schedule, no controller)."""

from __future__ import annotations

import torch

from ..sampling import apply_scale, draw_sample, propagate_nonfinite, sample_product
from ..sparse.csr import CSR
from ..sparse.products import NO_SCALES, Scales

__all__ = ["Sampler"]


class Sampler:
    """Stateless top rows at a fixed budget fraction (no cache, no schedule).

    Used when ``rsc`` is a float: each backward scores, selects and slices afresh, with the
    default scale of :class:`~dgl_rsc.RSCConfig` (``rescale="ls"``, probe rows drawn from a
    generator seeded with ``seed``).
    """

    def __init__(self, budget: float, **options):
        """``options``: the :class:`~dgl_rsc.RSCConfig` fields ``rule``, ``min_k``,
        ``backend``, ``rescale``, ``diagonal``, ``probe_rows`` and ``seed``."""
        from .config import RSCConfig

        options.setdefault("min_k", 0)
        options.setdefault("remainder_groups", 0)  # no cached sample: nothing to take turns
        self.config = RSCConfig(budget=budget, **options)
        self._gen = None

    def backward_product(self, A: CSR, dY: torch.Tensor, scales: Scales = NO_SCALES):
        """``(N, D)`` sampled ``A^T @ dY`` (with ``A``'s scales), drawn afresh."""
        from ..backends import resolve

        cfg = self.config
        backend = resolve(cfg.backend, dY.device)
        sample = draw_sample(A, dY, int(cfg.fraction * A.nnz), cfg.rule, cfg.min_k, backend,
                             cfg.rescale, scales, cfg.diagonal)  # fmt: skip
        out = sample_product(A, sample, dY, scales)
        if self._gen is None or self._gen.device != dY.device:
            self._gen = torch.Generator(device=dY.device).manual_seed(cfg.seed)
        out = apply_scale(A, sample, dY, scales, out, cfg.rescale, cfg.probe_rows, self._gen,
                          cfg.diagonal)  # fmt: skip
        return propagate_nonfinite(A, dY, scales, out) if cfg.check_finite else out
