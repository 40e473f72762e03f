"""``Plateau``: a monitored value that stopped improving, as early stopping knows it.

The rule of Keras' ``EarlyStopping`` and of PyG's examples: a value improves when it beats the
best so far by more than ``min_delta`` (above it for ``mode="max"``, below for ``"min"``); the
rule fires once ``patience`` updates in a row brought no improvement. A non-finite value
never improves. The launcher stops a run with it (``train.stop: plateau``, one update per
evaluation of the validation metric) and :class:`~dgl_rsc.RSCController` switches to the exact
backward with it (``rsc.switch_patience``); tools that step runs themselves use it the same
way::

    stop = Plateau(patience=30)
    for epoch in range(1, cap + 1):
        train_one_epoch()
        if stop.update(validate()):
            break  # converged: no better validation for 30 evaluations

>>> p = Plateau(patience=2)
>>> [p.update(v) for v in (0.50, 0.60, 0.60, 0.59)]
[False, False, False, True]
>>> p.best, p.best_step, p.steps, p.wait
(0.6, 2, 4, 2)
"""

from __future__ import annotations

import math
from typing import Optional

__all__ = ["Plateau", "MODES"]

MODES = ("max", "min")


class Plateau:
    """Counts updates since the monitored value last improved.

    Args:
        patience: updates without improvement after which :meth:`update` returns ``True``
            (an integer >= 1).
        min_delta: the margin an update must beat the best by to count as an improvement
            (>= 0, in the value's units: 0.001 is 0.1 points of a metric kept as a fraction).
        mode: ``"max"`` (higher is better: accuracy, ROC-AUC) or ``"min"`` (a loss).

    Attributes:
        best: the best value so far (``None`` before the first finite one).
        best_step: the update (1-based) that gave ``best``; 0 before.
        steps: updates so far.
        wait: updates since the last improvement.
        fired_step: the first update at which the rule fired, or ``None``.
    """

    def __init__(self, patience: int, min_delta: float = 0.0, mode: str = "max"):
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"Plateau patience must be an integer >= 1, got {patience!r}.")
        if (
            isinstance(min_delta, bool)
            or not isinstance(min_delta, (int, float))
            or not (0.0 <= min_delta < math.inf)
        ):
            raise ValueError(f"Plateau min_delta must be a finite number >= 0, got {min_delta!r}.")
        if mode not in MODES:
            raise ValueError(f"Plateau mode must be 'max' or 'min', got {mode!r}.")
        self.patience, self.min_delta, self.mode = patience, float(min_delta), mode
        self.best: Optional[float] = None
        self.best_step = self.steps = self.wait = 0
        self.fired_step: Optional[int] = None

    def improves(self, value) -> bool:
        """Whether ``value`` would count as an improvement on :attr:`best`."""
        if value is None or not math.isfinite(value):
            return False
        if self.best is None:
            return True
        gain = value - self.best if self.mode == "max" else self.best - value
        return gain > self.min_delta

    def update(self, value) -> bool:
        """Record one value (``None`` or non-finite: no improvement); ``True`` when
        ``patience`` updates in a row have not improved on the best."""
        self.steps += 1
        if self.improves(value):
            self.best, self.best_step, self.wait = float(value), self.steps, 0
        else:
            self.wait += 1
        if self.plateaued and self.fired_step is None:
            self.fired_step = self.steps
        return self.plateaued

    @property
    def plateaued(self) -> bool:
        """``patience`` updates or more since the last improvement."""
        return self.wait >= self.patience

    def state_dict(self) -> dict:
        """Numbers only (fits a ``weights_only`` checkpoint)."""
        return {"patience": self.patience, "min_delta": self.min_delta, "mode": self.mode,
                "best": self.best, "best_step": self.best_step, "steps": self.steps,
                "wait": self.wait, "fired_step": self.fired_step}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict` (the configured patience, margin and mode stay)."""
        best = state.get("best")
        self.best = None if best is None else float(best)
        self.best_step = int(state.get("best_step", 0))
        self.steps = int(state.get("steps", 0))
        self.wait = int(state.get("wait", 0))
        fired = state.get("fired_step")
        self.fired_step = None if fired is None else int(fired)

    def __repr__(self) -> str:
        return (f"Plateau(patience={self.patience}, min_delta={self.min_delta}, "
                f"mode={self.mode!r}, best={self.best}, wait={self.wait})")  # fmt: skip
