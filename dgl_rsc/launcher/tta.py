"""Time to accuracy: the training time a run needs until its validation metric reaches a target.

Definition (one function for the launcher and the tools): a run's *training time* after epoch
``e`` is the sum of ``epoch_s`` over epochs ``1..e`` (forward, backward and optimizer step;
evaluation excluded, as for epoch times). Its *time to target* is the training time after the
first evaluated epoch whose validation metric is at or above the target; a run that never gets
there has none and is reported as not reached (``reached: False``, ``time_s: None``). Every
epoch counts, the first included: what a run pays once (building cached structures; a Numba
compile that the on-disk cache has not seen yet, which lands in the first run of a process)
is part of the time a user waits.

The target of a seed is, by default, the best validation metric of the reference run (the
launcher's ``exact`` method) of the same seed minus ``tolerance``; with ``target`` given it is
that absolute value for every seed. Metrics are stored as fractions in ``[0, 1]`` (accuracy,
ROC-AUC, micro-F1), so ``tolerance=0.003`` is 0.3 points. Without a reference run and without
an absolute target, time to accuracy is unavailable (``status: "unavailable"``, with the
reason), never a made-up number.

>>> hist = [{"epoch": 1, "epoch_s": 1.0, "val": 0.5}, {"epoch": 2, "epoch_s": 2.0, "val": None},
...         {"epoch": 3, "epoch_s": 1.5, "val": 0.8}]
>>> first_crossing(hist, 0.7)
{'epoch': 3, 'time_s': 4.5, 'val': 0.8}
>>> first_crossing(hist, 0.9) is None
True
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from .intervals import ratio_interval

__all__ = [
    "DEFAULT_TOLERANCE",
    "cumulative_times",
    "first_crossing",
    "time_to_accuracy",
    "train_time",
]

#: the default tolerance below the reference's best validation metric (metric units: 0.3 points)
DEFAULT_TOLERANCE = 0.003


def cumulative_times(history: Sequence[dict]) -> list:
    """Training seconds after each epoch of ``history`` (running sum of ``epoch_s``)."""
    out, total = [], 0.0
    for h in history:
        total += h["epoch_s"]
        out.append(total)
    return out


def train_time(history: Sequence[dict]) -> float:
    """Training seconds after the last epoch of ``history`` (its ``train_time_s``; summed
    from ``epoch_s`` for a history restored from an older checkpoint without it)."""
    if not history:
        return 0.0
    if "train_time_s" in history[-1]:
        return history[-1]["train_time_s"]
    return cumulative_times(history)[-1]


def _finite(v) -> bool:
    return v is not None and math.isfinite(v)


def first_crossing(history: Sequence[dict], target: float) -> Optional[dict]:
    """``{"epoch", "time_s", "val"}`` of the first evaluated epoch with ``val >= target``
    (``time_s`` the training time after it), or ``None`` when no evaluation gets there."""
    for h, t in zip(history, cumulative_times(history)):
        if _finite(h.get("val")) and h["val"] >= target:
            return {"epoch": h["epoch"], "time_s": t, "val": h["val"]}
    return None


def _mean(values) -> Optional[float]:
    return sum(values) / len(values) if values else None


def _targets(records, tolerance, target, reference) -> tuple:
    """``({seed: target}, description, reason)``; the dict is empty when unavailable."""
    seeds = list(dict.fromkeys(r["seed"] for r in records))
    if target is not None:
        return {s: float(target) for s in seeds}, f"absolute target {target}", None
    best = {r["seed"]: r["best"]["val"] for r in records if r["method"] == reference}
    if not best:
        why = f"no '{reference}' run to take the target from and no absolute target"
        return {}, None, why
    out = {s: best[s] - tolerance for s in seeds if _finite(best.get(s))}
    what = f"best validation of '{reference}' of the same seed minus {tolerance}"
    missing = [s for s in seeds if s not in out]
    return out, what, (f"no finite '{reference}' validation for seeds {missing}" if missing
                       else None)  # fmt: skip


def _paired_interval(base: dict, method: dict) -> Optional[list]:
    """95% bootstrap interval (seeds resampled) of ``base``'s time to target over
    ``method``'s, paired by seed (:func:`~.intervals.ratio_interval`)."""
    times = {x["seed"]: x["time_s"] for x in base["runs"]}
    pairs = [(times[x["seed"]], x["time_s"]) for x in method["runs"] if x["seed"] in times]
    if any(b is None or m is None or b <= 0 or m <= 0 for b, m in pairs):
        return None
    return ratio_interval(pairs)


def time_to_accuracy(
    records: Sequence[dict],
    tolerance: float = DEFAULT_TOLERANCE,
    target: Optional[float] = None,
    reference: str = "exact",
    baselines: Sequence[str] = ("exact", "stock"),
) -> dict:
    """Time to target of every run in ``records`` and, per method, its mean and speedups.

    Args:
        records: run records, each with ``method``, ``seed``, ``history`` (per epoch
            ``epoch``, ``epoch_s`` and ``val``, ``None`` where not evaluated) and
            ``best["val"]`` (needed for the reference's runs).
        tolerance: metric units below the reference's best validation (default target).
        target: an absolute validation target instead (same for every seed).
        reference: the method whose best validation sets the default target.
        baselines: methods the speedups are taken against (``vs_<name>``, where they ran).

    Returns:
        ``{"status", "target", "reason", "methods"}``: ``status`` is ``"ok"`` or
        ``"unavailable"``; ``target`` describes it and lists it per seed; ``methods[m]`` holds
        ``runs`` (per seed: ``seed``, ``target``, ``reached``, ``epoch``, ``time_s``, ``val``),
        ``reached`` (runs that got there), ``status`` (``"reached"`` when every run did, else
        ``"not reached"``), ``time_s`` and ``epoch`` (means over seeds, ``None`` unless every
        run reached the target) and ``vs_<baseline>`` (the baseline's mean time over the
        method's, ``None`` unless both reached it on every seed) with ``vs_<baseline>_ci``,
        its 95% bootstrap interval over the seeds (``[low, high]``; ``None`` for one seed).
    """
    targets, what, why = _targets(records, tolerance, target, reference)
    if not targets:
        return {"status": "unavailable", "target": None, "reason": why, "methods": {}}
    methods = {}
    for method in dict.fromkeys(r["method"] for r in records):
        runs = []
        for r in (r for r in records if r["method"] == method and r["seed"] in targets):
            hit = first_crossing(r["history"], targets[r["seed"]])
            runs.append({"seed": r["seed"], "target": targets[r["seed"]], "reached": bool(hit),
                         "epoch": hit and hit["epoch"], "time_s": hit and hit["time_s"],
                         "val": hit and hit["val"]})  # fmt: skip
        done = all(x["reached"] for x in runs) and bool(runs)
        methods[method] = {
            "runs": runs,
            "reached": sum(x["reached"] for x in runs),
            "status": "reached" if done else "not reached",
            "time_s": _mean([x["time_s"] for x in runs]) if done else None,
            "epoch": _mean([x["epoch"] for x in runs]) if done else None,
        }
    for s in methods.values():
        for b in baselines:
            if b in methods:
                base = methods[b]["time_s"]
                ok = base is not None and s["time_s"] is not None and s["time_s"] > 0
                s[f"vs_{b}"] = base / s["time_s"] if ok else None
                s[f"vs_{b}_ci"] = _paired_interval(methods[b], s) if ok else None
    desc = {"rule": what, "tolerance": None if target is not None else tolerance,
            "absolute": target, "per_seed": {str(k): v for k, v in targets.items()}}  # fmt: skip
    return {"status": "ok", "target": desc, "reason": why, "methods": methods}
