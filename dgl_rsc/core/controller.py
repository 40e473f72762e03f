"""``RSCController``: the step counter, the layers' states, the budget solver and switching.

One controller drives one model's training run. Products are identified by call order within
a step (the DGL patch: the i-th approximated product of a step is product i) or by attachment
(:func:`dgl_rsc.nn.attach` gives each drop-in conv its own slots). Call ``step()`` once per
optimizer step, like an LR scheduler.

State flows one way: the controller reads the layers' scores, solves and keeps the allocation;
each product gets an immutable :class:`~.step_info.StepInfo` (phase, cache period, allocation)
through a :class:`~.slot.LayerSlot`.
"""

from __future__ import annotations

import logging
from typing import Optional

from ..base.user_warnings import warn_user
from ..sampling import get_rule, selection_key
from ..sampling.error import fraction_for_error
from ..sparse.structure_cache import StructureCache
from .config import RSCConfig
from .guard import Guard
from .layer_state import LayerState
from .schedule import Schedule
from .slot import LayerSlot
from .solver import LayerProblem, allocate, full_cost
from .stats import run_stats
from .step_info import StepInfo

__all__ = ["RSCController", "MAX_PRODUCTS_PER_STEP", "MISSING_STEP_MESSAGE"]

log = logging.getLogger(__name__)

#: More approximated products in one step (no backward among them) almost surely means no
#: ``step()`` calls: the controller warns once and maps the next onto the first states again.
MAX_PRODUCTS_PER_STEP = 1024
#: tune records kept for ``stats()["budgets"]`` (the most recent)
MAX_LOG = 1000

MISSING_STEP_MESSAGE = (
    "rsc.step() was not called between two training passes (a forward pass started after the "
    "backward of the previous one): call rsc.step() once per optimizer step, after "
    "optimizer.step(). Until it is called, dgl_rsc counts a step at each forward pass that "
    "follows a backward, so warm-up, budget re-allocation and the switch to the exact "
    "backward still happen."
)


class RSCController:
    """Owns the per-product state of one training run.

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
        self.allocation: dict[int, tuple] = {}  # product index -> (non-zeros, generation)
        self.last_allocation = None
        self.structures = StructureCache()
        self._calls = self._bound = 0  # products bound since the last step() (_bound)
        self._seen_products, self._empty_steps = False, 0
        self.guard = Guard(config.tune_interval) if config.guard else None
        self.schedule = Schedule(config)  # the phase of each step; the switch to exact
        self.boost = 1.0  # the guard's multiplier of a fixed budget
        self.target_error = config.target_error  # budget: auto's target (the guard lowers it)
        self.budget_log: list[dict] = []  # one entry per tune: budgets and estimated errors
        self._step_backwards = 0  # backward products of the layers when this step began
        self._warned_missing = self._warned_cap = self._warned_steps = False
        self.implicit_steps = 0  # steps counted for a missing rsc.step() (see slot())
        self.not_approximated: dict[str, int] = {}  # reason -> training products left to DGL
        self.cached_inputs = {"hits": 0, "builds": 0}  # layers' input aggregations reused
        self._solved_backwards: dict[int, int] = {}  # product -> its backward_calls at a solve

    @classmethod
    def coerce(cls, config=None, **overrides) -> RSCController:
        """``config`` itself when it is a controller (then no ``overrides``), else a new
        controller from an :class:`~dgl_rsc.RSCConfig` (or ``None``) and ``overrides``."""
        if isinstance(config, RSCController):
            if overrides:
                raise TypeError("pass either an RSCController or RSCConfig fields, not both.")
            return config
        return cls(config, **overrides)

    # -- product identity ---------------------------------------------------------------------
    def layer(self, index: int) -> LayerState:
        """The state of product ``index``, created on first use."""
        while len(self.layers) <= index:
            self.layers.append(LayerState(len(self.layers), self.config.seed,
                                          self.config.subgraph_cache))  # fmt: skip
        return self.layers[index]

    def step_info(self, index: int) -> StepInfo:
        """Product ``index``'s immutable record of this step (exact if under ``min_width``)."""
        phase = "exact" if self.narrow(self.layer(index)) else self.phase()
        return StepInfo(phase, self.alloc_version, self.allocation.get(index), self.config,
                        self._probe_due())  # fmt: skip

    def narrow(self, state: LayerState) -> bool:
        """Product ``state``'s gradient is narrower than ``min_width`` (it stays exact)."""
        return 0 < state.stats.width < self.config.min_width

    def ready(self) -> list:
        """The products the budget is shared by: scored, of known width, not narrow, and run
        backward since the last solve (a product that stopped running, e.g. a first layer
        whose input aggregation is now reused, takes no share)."""
        since = self._solved_backwards
        return [s for s in self.layers
                if s.ema is not None and s.stats.width > 0 and not self.narrow(s)
                and s.backward_calls > since.get(s.index, -1)]  # fmt: skip

    def _probe_due(self) -> bool:
        """This step's products estimate error curves: a tune follows; budget auto/guarded."""
        cfg = self.config
        if not (cfg.auto or cfg.guard) or self.phase() == "exact":
            return False
        since = self.step_count + 1 - cfg.warmup_steps
        return since >= 0 and since % cfg.tune_interval == 0

    def slot(self, index: int) -> LayerSlot:
        """Product ``index`` bound to the current step (what ``spmm(..., rsc=...)`` takes).

        A product bound after a backward of this step's products has run starts a new
        training pass: without ``step()`` in between, the controller warns once (naming
        ``rsc.step()``) and counts the step itself."""
        self._check_new_pass()
        self._bound += 1
        self._seen_products = True
        return LayerSlot(self.layer(index), self.step_info(index))

    def next_layer(self) -> LayerSlot:
        """The slot of the next approximated product of this step (call order)."""
        self._check_new_pass()
        if self._calls >= MAX_PRODUCTS_PER_STEP:  # no backward at all: never grow forever
            if not self._warned_cap:
                self._warned_cap = True
                warn_user(
                    f"{self._calls} approximated sparse products without a backward or an "
                    "rsc.step(): call rsc.step() once per optimizer step, and evaluate under "
                    "torch.no_grad(). Further products reuse the first products' states."
                )
            self._calls = 0
        slot = self.slot(self._calls)
        self._calls += 1
        return slot

    def _backward_total(self) -> int:
        return sum(s.backward_calls for s in self.layers)

    def _check_new_pass(self) -> None:
        """A product after this step's backward, without ``step()``: count the step."""
        if self._bound == 0 or self._backward_total() == self._step_backwards:
            return
        if not self._warned_missing:
            self._warned_missing = True
            warn_user(MISSING_STEP_MESSAGE)
        self.implicit_steps += 1
        self._advance()

    # -- schedule -------------------------------------------------------------------------------
    def phase(self) -> str:
        """``"warmup"`` (exact, recording scores), ``"approx"``, or ``"exact"`` (switched:
        at ``switch_at`` of the steps, on a validation plateau or by the guard)."""
        return self.schedule.phase(self.step_count, self.guard)

    def observe_validation(self, value: float) -> bool:
        """Report one evaluation's validation metric (higher is better, e.g. accuracy);
        with ``switch_patience`` set, ``switch_patience`` evaluations in a row without a
        new best switch the backward to exact, until a new best says training still
        improves (:mod:`dgl_rsc.core.schedule`). Call it after the step of the epoch
        evaluated. Returns ``True`` when this call switched to exact."""
        phase = self.phase()
        if not self.schedule.observe(self.step_count, value, phase, self.guard):
            return False
        log.info("step %d: validation plateau, switched to the exact backward (no better "
                 "validation for %d evaluations)", self.step_count,
                 self.config.switch_patience)  # fmt: skip
        self.clear_cache(structures=False)  # no backward reads the samples again
        return True

    def step(self, loss: Optional[float] = None) -> None:
        """Advance one optimizer step; re-solve the budget allocation when it is due.

        Args:
            loss: this step's training loss (a float or a 0-dim tensor), for the guard's
                loss signal; optional.

        Warns (once) when steps outnumber the training products, e.g. ``step()`` called
        several times per optimizer step, which would bring the switch to exact early."""
        if loss is not None and self.guard is not None and self.phase() == "approx":
            self.guard.observe(float(loss.detach() if hasattr(loss, "detach") else loss))
        if self._seen_products and self._bound == 0:
            self._empty_steps += 1
            if self._empty_steps >= 2 and not self._warned_steps:
                self._warned_steps = True
                warn_user(
                    f"rsc.step() was called {self._empty_steps} times without a training "
                    "forward in between: call it once per optimizer step, or the switch to "
                    f"the exact backward (step {self.config.switch_step}) comes early."
                )
        self._advance()

    def _advance(self) -> None:
        was = self.phase()
        self.step_count += 1
        self._calls = self._bound = 0
        self._step_backwards = self._backward_total()
        since = self.step_count - self.config.warmup_steps
        if self.phase() == "approx" and since % self.config.tune_interval == 0:
            self.solve()
        if self.phase() == "exact" and was != "exact":  # switched: no backward reads them again
            self.clear_cache(structures=False)

    def solve(self) -> None:
        """Re-allocate the budget across products: from their error curves under
        ``budget: auto``, else from their running-average scores under the fixed budget; then
        let the guard look at the result (it may raise the budget and solve again, or switch
        to exact)."""
        ready = self.ready()
        if not ready:
            return
        self._solved_backwards = {s.index: s.backward_calls for s in self.layers}
        self._solve_with(ready)
        self._log_and_guard(ready)

    def _solve_auto(self, ready: list) -> None:
        """Each layer: the smallest fraction whose estimated error is under the target (the
        configured start fraction while a layer has no curve); ranks agree on the largest."""
        fr = [self.config.fraction if s.curve is None else
              fraction_for_error(s.curve, self.target_error) for s in ready]  # fmt: skip
        fr = self._agree_max(fr)
        self.allocation = {s.index: (int(round(f * float(s.row_nnz.sum()))), s.generation)
                           for s, f in zip(ready, fr)}  # fmt: skip
        self.alloc_version += 1
        self.last_allocation = None

    def _agree_max(self, values: list) -> list:
        return values  # the element-wise maximum over the processes of the run: one here

    def _log_and_guard(self, ready: list) -> None:
        """Record the tune's budgets and estimated errors; apply the guard's decision."""
        fracs, errors = [], []
        for s in ready:
            total = float(s.row_nnz.sum())
            alloc = self.allocation.get(s.index)
            f = 1.0 if alloc is None or total <= 0 else min(alloc[0] / total, 1.0)
            fracs.append(round(f, 4))
            errors.append(None if s.curve is None else round(s.curve.at(f), 4))
        errors = self._agree_max([-1.0 if e is None else e for e in errors])
        errors = [None if e < 0 else e for e in errors]
        entry = {"step": self.step_count, "fractions": fracs, "errors": errors}
        entry["target_error" if self.config.auto else "budget"] = (self.target_error
            if self.config.auto else min(self.config.fraction * self.boost, 1))  # fmt: skip
        self.budget_log.append(entry)
        del self.budget_log[:-MAX_LOG]
        if self.guard is None:
            return
        if self.config.auto:
            can_raise = self.target_error > 0.02
        else:
            can_raise = self.config.fraction * self.boost < 1.0
        action = self.guard.decide(self.step_count, errors, can_raise)
        if action == "raise":
            if self.config.auto:
                self.target_error /= 2
            else:
                self.boost *= 2
            log.info("step %d: the guard raised the budget (%s)", self.step_count,
                     self.guard.actions[-1]["detail"])  # fmt: skip
            self._solve_with(ready)  # once more, without a second guard check
        elif action == "exact":
            log.info("step %d: the guard switched to the exact backward (%s)", self.step_count,
                     self.guard.actions[-1]["detail"])  # fmt: skip

    def _solve_with(self, ready: list) -> None:
        """The allocation over ``ready`` under ``budget: auto`` or the fixed budget."""
        (self._solve_auto if self.config.auto else self._solve_fixed)(ready)

    def _solve_fixed(self, ready: list) -> None:
        """The greedy allocation of the fixed budget (times the guard's boost) in work units
        (``nnz * width`` plus ``row_cost`` per row) over :meth:`_problems`; kept: :meth:`_share`."""
        problems, fixed_nnz, owners = self._problems(ready)
        exact_work = sum(full_cost(p) + f * p.width for p, f in zip(problems, fixed_nnz))
        fixed_work = sum(f * p.width for p, f in zip(problems, fixed_nnz))
        budget = min(self.config.fraction * self.boost, 1.0)
        alloc = allocate(problems, max(budget * exact_work - fixed_work, 0.0))
        self.allocation = self._share(ready, problems, owners, alloc)
        self.alloc_version += 1
        self.last_allocation = alloc
        log.debug("step %d: allocation k=%s nnz=%s", self.step_count, alloc.k, alloc.nnz)

    def _problems(self, ready: list) -> tuple:
        """``(problems, fixed_nnz, owners)``: each layer's solver input over this process's
        rows, the non-zeros visited anyway (an exact diagonal), row owners (``None``)."""
        cfg = self.config
        rule = get_rule(cfg.rule)
        problems = [
            LayerProblem(selection_key(s.ema, s.row_nnz, cfg.rule), rule.mass(s.ema),
                         s.row_nnz, s.stats.width, cfg.min_k, s.row_work * (cfg.restrict != "off"))
            for s in ready
        ]  # fmt: skip
        return problems, [float(s.fixed_nnz) for s in ready], None

    def _share(self, ready: list, problems: list, owners, alloc) -> dict:
        """``{layer index: (non-zeros, score generation)}`` kept here: all of ``alloc``."""
        return {s.index: (nnz, s.generation) for s, nnz in zip(ready, alloc.nnz)}

    def note_not_approximated(self, reason: str) -> bool:
        """Count a training product that a caller (the DGL patch) left exact because RSC
        cannot take it (``reason``, e.g. ``"bfloat16 features on cpu"``); ``True`` the first
        time ``reason`` is seen (the caller then warns). Shown by :meth:`stats`."""
        first = reason not in self.not_approximated
        self.not_approximated[reason] = self.not_approximated.get(reason, 0) + 1
        return first

    def note_cached_input(self, built: bool) -> None:
        """Count a layer's input aggregation reused (``built``: computed first), for stats."""
        self.cached_inputs["builds" if built else "hits"] += 1

    # -- housekeeping ---------------------------------------------------------------------------
    def clear_cache(self, structures: bool = True) -> None:
        """Drop the products' cached samples, and the structures unless ``structures=False``."""
        for s in self.layers:
            s.clear_cache()
        if structures:
            self.structures.clear()

    def stats(self) -> dict:
        """What RSC did: per-product rows kept, non-zeros visited vs exact, cache use, timing,
        the budget log, the guard's actions and the switch to exact
        (:func:`~dgl_rsc.core.stats.run_stats`)."""
        return run_stats(self)

    def state_dict(self) -> dict:
        """Tensors and numbers only (loads with ``torch.load(weights_only=True)``)."""
        return {
            "step_count": self.step_count,
            "alloc_version": self.alloc_version,
            "layers": [s.export() for s in self.layers],
            "allocation": [[i, int(n), int(g)] for i, (n, g) in self.allocation.items()],
            "boost": self.boost,
            "target_error": self.target_error,
            "budget_log": list(self.budget_log),
            "guard": None if self.guard is None else self.guard.state_dict(),
            "schedule": self.schedule.state_dict(),
            "cached_inputs": dict(self.cached_inputs),
            "backward_calls": [s.backward_calls for s in self.layers],
            "solved_backwards": [[i, n] for i, n in self._solved_backwards.items()],
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore from :meth:`state_dict`. Samples are re-drawn on the next backward."""
        self.step_count = int(state["step_count"])
        self.alloc_version = int(state["alloc_version"])
        self.layers = []
        for i, d in enumerate(state["layers"]):
            self.layer(i).restore(d)
        self.allocation = {int(i): (int(n), int(g)) for i, n, g in state.get("allocation", [])}
        self.boost = float(state.get("boost", 1.0))
        self.target_error = float(state.get("target_error", self.config.target_error))
        self.budget_log = list(state.get("budget_log", []))
        if self.guard is not None and state.get("guard") is not None:
            self.guard.load_state_dict(state["guard"])
        self.schedule.load_state_dict(state.get("schedule"))
        self.cached_inputs.update(state.get("cached_inputs", {}))
        for s, n in zip(self.layers, state.get("backward_calls", [])):
            s.backward_calls = int(n)
        # which products ran backward since the last solve: they share the next budget
        self._solved_backwards = {int(i): int(n) for i, n in state.get("solved_backwards", [])}
        self._calls = self._bound = 0
        self._step_backwards = self._backward_total()

    def __repr__(self) -> str:
        return f"RSCController(step={self.step_count}, layers={len(self.layers)}, {self.config})"
