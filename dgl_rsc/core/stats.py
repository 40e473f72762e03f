"""``LayerStats``: what one layer's approximated products did, kept without host syncs.

Counters that live on the device (non-zeros kept by each sampled product) and CUDA timing
events are folded into plain numbers every :data:`FOLD_EVERY` products or when asked for,
so that memory stays bounded and training never waits for the device to report.
"""

from __future__ import annotations

import time
from typing import Optional

import torch

__all__ = ["LayerStats", "Timer", "FOLD_EVERY", "run_stats"]

#: device-side counters are folded into numbers this often (and on :meth:`LayerStats.as_dict`)
FOLD_EVERY = 256


class Timer:
    """Wall time of a region; on CUDA through events, read only when stats are asked for."""

    def __init__(self, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.end = torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self) -> Timer:
        if self.cuda:
            self.end.record()
        else:
            self.elapsed = time.perf_counter() - self.t0
        return self

    def seconds(self) -> float:
        if self.cuda:
            self.end.synchronize()
            return self.start.elapsed_time(self.end) / 1000.0
        return self.elapsed


class LayerStats:
    """Counters of one layer: products by phase, cache use, non-zeros, selection time."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.hits = self.misses = 0
        self.approx_calls = self.exact_calls = 0
        self.nnz_visited = self.nnz_exact = 0
        self.select_seconds = 0.0
        self.last_k: Optional[torch.Tensor] = None
        self.last_rows = 0
        self.width = 0
        self.grad_rows = self.grad_rows_total = 0  # rows of dY computed (restricted backward)
        self._pending: list[torch.Tensor] = []
        self._timers: list[Timer] = []

    def product(self, rows: int, width: int, nnz: int) -> None:
        """One backward product of a matrix with ``rows`` rows and ``nnz`` non-zeros."""
        self.last_rows, self.width = rows, width
        self.nnz_exact += nnz

    def exact(self, nnz: int) -> None:
        self.exact_calls += 1
        self.nnz_visited += nnz

    def sampled(self, nnz_kept: torch.Tensor, hit: bool) -> None:
        """A sampled product that visited ``nnz_kept`` (0-dim, on the device) non-zeros."""
        self.approx_calls += 1
        self.hits += int(hit)
        self.misses += int(not hit)
        self._pending.append(nnz_kept)
        if len(self._pending) >= FOLD_EVERY:
            self.fold()

    def gradient_rows(self, computed: int, total: int) -> None:
        """The backward before this product computed ``computed`` of the ``total`` rows of
        its incoming gradient (:mod:`dgl_rsc.core.restrict`)."""
        self.grad_rows += int(computed)
        self.grad_rows_total += int(total)

    def refreshed(self, timer: Timer, k: torch.Tensor) -> None:
        self._timers.append(timer)
        self.last_k = k

    def timed(self, timer: Timer) -> None:
        """Count a stopped ``timer`` as selection work (an error probe, say)."""
        self._timers.append(timer)

    def fold(self) -> None:
        """Add the device-side counters and timers into plain numbers."""
        if self._pending:
            self.nnz_visited += int(torch.stack(self._pending).sum())
            self._pending = []
        if self._timers:
            self.select_seconds += sum(t.seconds() for t in self._timers)
            self._timers = []

    def as_dict(self) -> dict:
        """Plain numbers (synchronizes with the device once)."""
        self.fold()
        return {
            "rows": self.last_rows,
            "k": None if self.last_k is None else int(self.last_k),
            "width": self.width,
            "nnz_visited": self.nnz_visited,
            "nnz_exact": self.nnz_exact,
            "visited_fraction": self.nnz_visited / self.nnz_exact if self.nnz_exact else 1.0,
            "approx_calls": self.approx_calls,
            "exact_calls": self.exact_calls,
            "cache_hits": self.hits,
            "cache_misses": self.misses,
            "select_seconds": self.select_seconds,
            "backward_rows_fraction": (
                self.grad_rows / self.grad_rows_total if self.grad_rows_total else 1.0
            ),
        }


def run_stats(ctl) -> dict:
    """What a controller's run did (``RSCController.stats()``): per-product rows kept,
    non-zeros visited vs exact, cache use, timing.

    ``not_approximated`` counts training products left exact because RSC could not take
    them (``not_approximated_reasons``: by reason); ``visited_fraction`` covers the products
    RSC took and is ``None`` when it took none while some were left exact.
    ``implicit_steps``: steps the controller counted for a missing ``rsc.step()``;
    ``cached_input_aggregation``: input aggregations reused (``hits``) or built (``builds``);
    ``switch``: the switch to the exact backward (``{"step", "signal", "detail"}``, signal
    ``"steps"``, ``"plateau"`` or ``"guard"``), ``None`` while it has not happened."""
    layers = []
    for s in ctl.layers:
        d = s.stats.as_dict()
        alloc = ctl.allocation.get(s.index)
        d.update(layer=s.index, cache_bytes=s.cache_bytes(), narrow=ctl.narrow(s),
                 nnz_budget=None if alloc is None else alloc[0])  # fmt: skip
        layers.append(d)
    visited = sum(x["nnz_visited"] for x in layers)
    exact = sum(x["nnz_exact"] for x in layers)
    skipped = sum(ctl.not_approximated.values())
    phase = ctl.phase()
    return {
        "step": ctl.step_count,
        "phase": phase,
        "layers": layers,
        "nnz_visited": visited,
        "nnz_exact": exact,
        "visited_fraction": visited / exact if exact else None if skipped else 1.0,
        "select_seconds": sum(x["select_seconds"] for x in layers),
        "cache_bytes": sum(x["cache_bytes"] for x in layers),
        "cache_hits": sum(x["cache_hits"] for x in layers),
        "cache_misses": sum(x["cache_misses"] for x in layers),
        "subgraph_hits": sum(s.subgraph_hits for s in ctl.layers),
        "budgets": list(ctl.budget_log),
        "guard": [] if ctl.guard is None else list(ctl.guard.actions),
        "switch": None if phase != "exact" else ctl.schedule.switched,
        "switch_returns": list(ctl.schedule.returns),
        "not_approximated": skipped,
        "not_approximated_reasons": dict(ctl.not_approximated),
        "implicit_steps": ctl.implicit_steps,
        "cached_input_aggregation": dict(ctl.cached_inputs),
    }
