"""``StepInfo``: what one approximated product needs to know of its training step.

The controller makes one per product (immutable); :class:`~dgl_rsc.core.layer_state.LayerState`
and :class:`~dgl_rsc.core.slot.LayerSlot` read it. It sits below both, so neither imports the
other for it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from .config import RSCConfig

__all__ = ["StepInfo", "PHASES"]

PHASES = ("warmup", "approx", "exact")


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """What a product needs to know of its step.

    Attributes:
        phase: ``"warmup"`` (exact, recording scores), ``"approx"`` or ``"exact"``.
        alloc_version: bumps when the budget is re-allocated (cached samples are redrawn).
        allocation: ``(non-zeros, generation)`` the solver gave this product, solved from the
            scores of the state's ``generation``; ``None`` before the first solve.
        config: the run's :class:`~dgl_rsc.RSCConfig`.
        probe: estimate the product's error curve this step (a tune follows it).
    """

    phase: str
    alloc_version: int
    allocation: Optional[tuple]
    config: RSCConfig
    probe: bool = False
