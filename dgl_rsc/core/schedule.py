"""``Schedule``: when a run's backward is exact, approximated, or exact again.

Three phases, by optimizer step: ``"warmup"`` (the first ``warmup_steps``: exact, recording
scores), ``"approx"`` (the sampled backward) and ``"exact"`` (switched back for good). The
switch to exact comes at the first of:

- **steps**: step ``switch_at * total_steps`` (:attr:`~dgl_rsc.RSCConfig.switch_step`), when
  the run's length is known;
- **plateau**: ``switch_patience`` evaluations in a row without a new best validation metric
  (:class:`~dgl_rsc.core.plateau.Plateau`, fed by :meth:`Schedule.observe`, i.e.
  ``RSCController.observe_validation``): the approximate phase has stopped making progress,
  and the exact phase recovers what sampling costs, however long the run turns out to be.
  With ``switch_returns`` a plateau switch is provisional: a new best validation metric in
  the exact phase it started approximates again until the next plateau (off by default: on
  the validation family it lost 0.28-0.56 points on 3 of 15 graphs that the switch for good
  kept within 0.2, ``docs/benchmarks.md``). The steps and the guard switch for good;
- **guard**: the guard's decision (:mod:`dgl_rsc.core.guard`).

:attr:`Schedule.switched` records the first of them that fired.
"""

from __future__ import annotations

from typing import Optional

from .config import RSCConfig
from .plateau import Plateau

__all__ = ["Schedule"]


class Schedule:
    """The phase of each step of one run under ``config`` (see the module docstring)."""

    def __init__(self, config: RSCConfig):
        self.config = config
        patience = config.switch_patience
        self.plateau: Optional[Plateau] = Plateau(patience) if patience else None
        self.exact_from: Optional[int] = None  # the step the plateau switched at
        self.switched: Optional[dict] = None  # {"step", "signal", "detail"} of the switch
        self.returns: list = []  # steps at which a new best ended a plateau's exact phase

    def phase(self, step: int, guard=None) -> str:
        """``"warmup"``, ``"approx"`` or ``"exact"`` at optimizer step ``step`` (0-based),
        given the run's :class:`~dgl_rsc.core.guard.Guard` (or ``None``)."""
        switch = self.config.switch_step
        if switch is not None and step >= switch:
            self._note(switch, "steps", f"step {switch} = switch_at x total_steps")
            return "exact"
        if self.exact_from is not None and step >= self.exact_from:
            return "exact"
        if guard is not None and guard.exact_from is not None:
            self._note(guard.exact_from, "guard", guard.actions[-1]["detail"])
            return "exact"
        return "warmup" if step < self.config.warmup_steps else "approx"

    def observe(self, step: int, value, phase: str, guard=None) -> bool:
        """One evaluation's validation metric (higher is better) after ``step`` steps, in
        ``phase``; ``True`` when it switches the backward to exact now. A new best in the
        exact phase of a plateau switch (and of nothing else) approximates again under
        ``switch_returns``."""
        if self.plateau is None:
            return False
        plateaued = self.plateau.update(value)
        if phase == "exact":
            improved = self.plateau.wait == 0
            if self.config.switch_returns and self.exact_from is not None and improved:
                self.exact_from = None
                if self.phase(step, guard) == "exact":  # the steps or the guard: for good
                    self.exact_from = step
                else:
                    self.returns.append(int(step))
            return False
        if plateaued and phase == "approx":
            self.exact_from = step
            best = self.plateau.best
            self._note(step, "plateau", f"no better validation than {best} for "
                       f"{self.plateau.wait} evaluations")  # fmt: skip
            return True
        return False

    def _note(self, step: int, signal: str, detail: str) -> None:
        if self.switched is None:
            self.switched = {"step": int(step), "signal": signal, "detail": detail}

    def state_dict(self) -> dict:
        return {"plateau": None if self.plateau is None else self.plateau.state_dict(),
                "exact_from": self.exact_from, "switched": self.switched,
                "returns": list(self.returns)}  # fmt: skip

    def load_state_dict(self, state: Optional[dict]) -> None:
        """Continue from :meth:`state_dict` (``None``: a checkpoint from before the
        schedule was saved; nothing to restore)."""
        if not state:
            return
        if self.plateau is not None and state.get("plateau") is not None:
            self.plateau.load_state_dict(state["plateau"])
        self.exact_from = state.get("exact_from")
        self.switched = state.get("switched")
        self.returns = list(state.get("returns", []))
