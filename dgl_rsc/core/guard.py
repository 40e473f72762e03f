"""The guard of the approximate phase: measurable signals that RSC falls behind, and actions.

Two signals, checked when the controller re-tunes its budget:

- **error**: a layer's estimated relative error at its allocation
  (:mod:`dgl_rsc.sampling.error`) of at least :data:`USELESS_ERROR`: its sample carries almost
  none of the gradient, whatever the budget says;
- **loss**: the mean training loss of the last ``window`` steps (passed to
  ``RSCController.step(loss)``) exceeds the mean of the ``window`` steps before it by more
  than :data:`LOSS_RISE`, and exceeds the lowest window mean seen in the approximate phase by
  as much: the loss goes up against its own recent past, as it does not in a healthy run.

The first time a signal fires the guard raises the budget (a fixed budget is doubled, capped
at 1; ``budget: auto`` halves its error target); the second time, or when the budget cannot
rise further, it switches the backward to exact for the rest of the run. Each action is a
record in :attr:`Guard.actions` (``step``, ``action``, ``signal``, ``detail``).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

__all__ = ["Guard", "LOSS_RISE", "MIN_WINDOW", "USELESS_ERROR"]

#: an estimated layer error at least this large means the sample captures almost nothing
USELESS_ERROR = 0.95
#: the fewest steps in a loss window (shorter windows mistake dropout noise for a trend)
MIN_WINDOW = 10
#: relative rise of the windowed mean training loss that counts as falling behind
LOSS_RISE = 0.05


class Guard:
    """The guard's state for one run.

    Args:
        window: steps per loss window (the controller passes its tune interval; at least
            :data:`MIN_WINDOW`).
    """

    def __init__(self, window: int):
        self.window = max(int(window), MIN_WINDOW)
        self.losses: list[float] = []
        self.best_mean: Optional[float] = None
        self.raised = 0
        self.exact_from: Optional[int] = None  # step from which the guard forces exact
        self.actions: list[dict] = []

    def observe(self, loss: float) -> None:
        """Record the training loss of an approximate step (non-finite losses are ignored:
        the training loop handles divergence)."""
        if math.isfinite(loss):
            self.losses.append(float(loss))
            del self.losses[: -2 * self.window]

    def restart(self) -> None:
        """Forget the loss history (after an action: the new budget gets fresh windows)."""
        self.losses.clear()
        self.best_mean = None

    def loss_signal(self) -> Optional[str]:
        """A description of a rising loss, or ``None``."""
        w = self.window
        if len(self.losses) < 2 * w:
            return None
        before = sum(self.losses[:w]) / w
        recent = sum(self.losses[w:]) / w
        self.best_mean = before if self.best_mean is None else min(self.best_mean, before)
        rise = 1.0 + LOSS_RISE
        if recent > before * rise and recent > self.best_mean * rise:
            return f"mean loss of the last {w} steps {recent:.4g} > {before:.4g} before"
        return None

    @staticmethod
    def error_signal(errors: Sequence[Optional[float]]) -> Optional[str]:
        """A description of a layer whose sample is useless, or ``None``."""
        for i, e in enumerate(errors):
            if e is not None and e >= USELESS_ERROR:
                return f"layer {i} estimated error {e:.3f} >= {USELESS_ERROR}"
        return None

    def decide(self, step: int, errors: Sequence[Optional[float]], can_raise: bool) -> str:
        """``"none"``, ``"raise"`` or ``"exact"`` for this tune, recorded when not none."""
        signal, detail = "error", self.error_signal(errors)
        if detail is None:
            signal, detail = "loss", self.loss_signal()
        if detail is None:
            return "none"
        action = "raise" if can_raise and self.raised == 0 else "exact"
        if action == "raise":
            self.raised += 1
        else:
            self.exact_from = step
        self.actions.append({"step": step, "action": action, "signal": signal,
                             "detail": detail})  # fmt: skip
        self.restart()
        return action

    def state_dict(self) -> dict:
        return {"losses": list(self.losses), "best_mean": self.best_mean, "raised": self.raised,
                "exact_from": self.exact_from, "actions": list(self.actions)}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        self.losses = [float(x) for x in state.get("losses", [])]
        self.best_mean = state.get("best_mean")
        self.raised = int(state.get("raised", 0))
        self.exact_from = state.get("exact_from")
        self.actions = list(state.get("actions", []))
