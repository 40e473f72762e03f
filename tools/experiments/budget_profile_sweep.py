"""Time to accuracy under a budget that changes over the run: issue 22's "time profile" candidate.

The fixed budget is one number for the whole approximate phase, then a step to the exact
backward at ``switch_at``. This experiment lets a variant of ``tta_sweep.py`` (beside it) give the
budget a profile instead, with the pseudo-key ``profile`` (the other keys are the sweep's):

    early-B0-U  budget B0 at the start, falling linearly to ``rsc.budget`` at fraction U of
                the run (more of the gradient while the model moves fastest)
    late-S      ``rsc.budget`` until fraction S of the run, then rising linearly to 1.0 at
                ``switch_at`` (a ramp into the exact phase instead of a step)

The profile scales the controller's fixed budget at each tune (``tune_interval`` steps apart;
the guard's raises still multiply it), so the work each tune allocates follows it; each tune's
budget is in the run's ``rsc_stats["budgets"]``. It is an experiment, not a setting of the
package: it measured no gain (``docs/benchmarks.md``, *A budget that changes over the run*).

    python tools/experiments/budget_profile_sweep.py yaml_configs/quickstart.yaml \
        --seeds 0 1 2 3 4 --eval-every 2 --variant default: --variant early:profile=early-0.5-0.4 \
        --variant late:profile=late-0.5 --out results/tta_profile_qs.json
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tta_sweep
from bench_common import parse_variant

from dgl_rsc.core.controller import RSCController


def budget_at(spec: str, budget: float, t: float, switch_at: float) -> float:
    """The profile's budget at fraction ``t`` of the run (``budget``: the configured one)."""
    kind, _, rest = spec.partition("-")
    try:
        args = [float(x) for x in rest.split("-")] if rest else []
    except ValueError:
        args = None
    if kind == "early" and args and len(args) == 2 and args[1] > 0:
        start, until = args
        return start + (budget - start) * min(t / until, 1.0)
    if kind == "late" and args and len(args) == 1:
        (begin,) = args
        if t <= begin:
            return budget
        return budget + (1.0 - budget) * min((t - begin) / max(switch_at - begin, 1e-9), 1.0)
    raise ValueError(f"profile {spec!r}: expected early-B0-U (e.g. early-0.5-0.4) or late-S "
                     "(e.g. late-0.5)")  # fmt: skip


def install(active: dict) -> None:
    """Make every controller's fixed-budget solve follow ``active["profile"]`` (``None``: the
    configured budget). The factor is applied around the solve and divided out after it, so
    a guard's raise inside the solve (a doubling) is kept."""
    solve = RSCController.solve

    def profiled_solve(self: RSCController) -> None:
        spec, cfg = active.get("profile"), self.config
        if spec is None or cfg.auto or not cfg.total_steps:
            return solve(self)
        t = self.step_count / float(cfg.total_steps)
        factor = budget_at(spec, cfg.fraction, t, cfg.switch_at) / cfg.fraction
        self.boost *= factor
        try:
            solve(self)
        finally:
            self.boost /= factor

    RSCController.solve = profiled_solve
    config = tta_sweep._config

    def profiled_config(path: str, sets: dict, base_sets: list):
        sets = dict(sets)
        spec = sets.pop("rsc.profile", None)
        active["profile"] = None if spec is None else str(spec)
        return config(path, sets, base_sets)

    tta_sweep._config = profiled_config


def check_variants(argv: list) -> None:
    """Exit with a clear message when a ``--variant``'s profile is malformed, before any
    training."""
    for i, arg in enumerate(argv[:-1]):
        if arg == "--variant":
            spec = parse_variant(argv[i + 1])[1].get("rsc.profile")
            if spec is None:
                continue
            try:
                budget_at(str(spec), 0.1, 0.0, 0.8)
            except ValueError as e:
                sys.exit(f"--variant {argv[i + 1]!r}: {e}")


if __name__ == "__main__":
    check_variants(sys.argv[1:])
    install({})
    sys.exit(tta_sweep.main())
