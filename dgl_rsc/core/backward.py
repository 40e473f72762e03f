"""The one seam between the sparse-dense operator and RSC: what computes ``dX = A^T dY``.

The operator (:class:`~dgl_rsc.core.spmm.RSCSpMM`, the distributed ``HaloSpMM``) knows only
:class:`BackwardSampler`: an object whose ``backward_product(A, dY, scales)`` returns the
approximated ``A^T dY``; without one the product is exact (:func:`feature_grad`). The
controller is a :class:`SamplerSource`, which hands out one sampler per product of a step
(``next_layer()``) and keeps the sparse structures seen (``structures``). Neither protocol
names the controller, its schedule or its budget.
"""

from __future__ import annotations

from typing import Optional, Protocol, runtime_checkable

import torch

from ..sparse.csr import CSR
from ..sparse.products import NO_SCALES, Scales, csr_t_mm
from ..sparse.structure_cache import StructureCache

__all__ = ["BackwardSampler", "SamplerSource", "feature_grad"]


@runtime_checkable
class BackwardSampler(Protocol):
    """Approximates ``A^T @ dY`` for ``A (M, N)`` (with its scales), ``dY (M, D)``; returns
    ``(N, D)``."""

    def backward_product(
        self, A: CSR, dY: torch.Tensor, scales: Scales = NO_SCALES
    ) -> torch.Tensor: ...  # fmt: skip


@runtime_checkable
class SamplerSource(Protocol):
    """Hands out the sampler of each product of a training step, in call order."""

    structures: StructureCache

    def next_layer(self) -> BackwardSampler: ...


def feature_grad(sampler: Optional[BackwardSampler], A: CSR, dY: torch.Tensor,
                 scales: Scales = NO_SCALES) -> torch.Tensor:  # fmt: skip
    """``(N, D)`` gradient of the dense operand: ``A^T dY`` exactly when ``sampler`` is
    ``None``, else the sampler's approximation."""
    if sampler is None:
        return csr_t_mm(A, dY, scales)
    return sampler.backward_product(A, dY, scales)
