"""``RSCController``: the step counter, the layers' states, the budget solver and switching.

One controller drives one model's training run. Layers are identified either by call order
within a step (the DGL patch: the i-th approximated product of a step is layer i) or by
attachment (:func:`dgl_rsc.nn.attach` gives each drop-in conv its own index). Call
:meth:`RSCController.step` once per optimizer step, like an LR scheduler.
"""

from __future__ import annotations

import logging
from typing import Optional

from .config import RSCConfig
from .layer_state import LayerState
from .solver import LayerProblem, allocate
from .structure_cache import StructureCache

__all__ = ["RSCController", "MAX_PRODUCTS_PER_STEP"]

log = logging.getLogger(__name__)

#: More approximated products than this in one step almost surely means that
#: ``step()`` is never called; the controller then raises instead of growing forever.
MAX_PRODUCTS_PER_STEP = 1024


class RSCController:
    """Owns the per-layer state of one training run.

    Args:
        config: an :class:`~dgl_rsc.RSCConfig`; keyword arguments override its fields.

    Example:
        >>> rsc = RSCController(budget=0.2, total_steps=100)
        >>> rsc.phase(), rsc.config.switch_step
        ('warmup', 80)
    """

    def __init__(self, config: Optional[RSCConfig] = None, **overrides):
        if config is None:
            config = RSCConfig(**overrides)
        elif overrides:
            config = config.replace(**overrides)
        if not isinstance(config, RSCConfig):
            raise TypeError(f"config must be an RSCConfig, got {type(config).__name__}.")
        self.config = config
        self.step_count = 0
        self.alloc_version = 0
        self.layers: list[LayerState] = []
        self._calls = 0
        self.last_allocation = None
        self.structures = StructureCache()

    # -- layer identity ----------------------------------------------------------------
    def layer(self, index: int) -> LayerState:
        """The state of layer ``index``, created on first use."""
        while len(self.layers) <= index:
            self.layers.append(LayerState(self, len(self.layers)))
        return self.layers[index]

    def next_layer(self) -> LayerState:
        """The state for the next approximated product of this step (call order)."""
        if self._calls >= MAX_PRODUCTS_PER_STEP:
            raise RuntimeError(
                f"{self._calls} approximated sparse products since the last rsc.step(): call "
                "rsc.step() once per optimizer step (after optimizer.step())."
            )
        state = self.layer(self._calls)
        self._calls += 1
        return state

    # -- schedule ----------------------------------------------------------------------
    def phase(self) -> str:
        """``"warmup"`` (exact, recording scores), ``"approx"``, or ``"exact"`` (switched)."""
        switch = self.config.switch_step
        if switch is not None and self.step_count >= switch:
            return "exact"
        if self.step_count < self.config.warmup_steps:
            return "warmup"
        return "approx"

    def cache_epoch(self) -> int:
        """Index of the current cache period; samples are reused within one period."""
        return (self.step_count - self.config.warmup_steps) // self.config.cache_interval

    def step(self) -> None:
        """Advance one optimizer step; re-solve the budget allocation when it is due."""
        self.step_count += 1
        self._calls = 0
        since = self.step_count - self.config.warmup_steps
        if self.phase() == "approx" and since % self.config.tune_interval == 0:
            self.solve()

    def solve(self) -> None:
        """Re-allocate the budget across layers from their running-average scores."""
        ready = [s for s in self.layers if s.ema is not None and s.width > 0]
        if len(ready) < 1:
            return
        cfg = self.config
        problems = []
        from .backends.torch_ref import selection_key

        for s in ready:
            key = selection_key(s.ema, s.row_nnz, cfg.rule)
            mass = s.ema.square() if cfg.rule == "cost" else s.ema
            problems.append(LayerProblem(key, mass, s.row_nnz, s.width, cfg.min_k))
        exact_work = sum((float(s.row_nnz.sum()) + s.fixed_nnz) * s.width for s in ready)
        fixed_work = sum(s.fixed_nnz * s.width for s in ready)
        alloc = allocate(problems, max(cfg.budget * exact_work - fixed_work, 0.0))
        for s, nnz in zip(ready, alloc.nnz):
            s.nnz_budget = nnz
        self.alloc_version += 1
        self.last_allocation = alloc
        log.debug("step %d: allocation k=%s nnz=%s", self.step_count, alloc.k, alloc.nnz)

    # -- housekeeping ------------------------------------------------------------------
    def clear_cache(self) -> None:
        """Drop every layer's cached sample."""
        for s in self.layers:
            s.clear_cache()
        self.structures.clear()

    def stats(self) -> dict:
        """What RSC did: per-layer rows kept, non-zeros visited vs exact, cache use, timing."""
        layers = [s.stats() for s in self.layers]
        visited = sum(x["nnz_visited"] for x in layers)
        exact = sum(x["nnz_exact"] for x in layers)
        return {
            "step": self.step_count,
            "phase": self.phase(),
            "layers": layers,
            "nnz_visited": visited,
            "nnz_exact": exact,
            "visited_fraction": visited / exact if exact else 1.0,
            "select_seconds": sum(x["select_seconds"] for x in layers),
            "cache_bytes": sum(x["cache_bytes"] for x in layers),
            "cache_hits": sum(x["cache_hits"] for x in layers),
            "cache_misses": sum(x["cache_misses"] for x in layers),
        }

    def state_dict(self) -> dict:
        """Tensors and numbers only (loads with ``torch.load(weights_only=True)``)."""
        return {
            "step_count": self.step_count,
            "alloc_version": self.alloc_version,
            "layers": [s.export() for s in self.layers],
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore from :meth:`state_dict`. Samples are re-drawn on the next backward."""
        self.step_count = int(state["step_count"])
        self.alloc_version = int(state["alloc_version"])
        self.layers = []
        for i, d in enumerate(state["layers"]):
            self.layer(i).restore(d)
        self._calls = 0

    def __repr__(self) -> str:
        return f"RSCController(step={self.step_count}, layers={len(self.layers)}, {self.config})"
