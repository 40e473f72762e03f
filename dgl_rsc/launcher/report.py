"""What a launcher run leaves behind: results.json, metrics.csv, summary.png and the table.

Every file is written atomically (temporary file + ``os.replace``). Epoch times are means
over the epochs after the first (the first builds cached structures; ``epoch_s_median`` is
robust to one-off costs such as a kernel compile). ``speedup`` is the mean epoch time of the
faster exact baseline (``exact``: dgl_rsc's engine with the exact backward, or ``stock``: the
stock DGL model when DGL is installed, or the stock PyG model for the PyG engines) over
this method's; ``speedup_approx`` the same over
the method's approximate phase only; ``vs_exact`` and ``vs_stock`` against each baseline.
``nnz_fraction`` is the backward sparse non-zeros visited over the exact count, for the whole
run.

Time to accuracy (:mod:`.tta`, the ``report`` config section) comes first: ``time_to_target_s``
is the training time (evaluation excluded) until validation first reaches the target (by
default exact's best validation of the same seed minus ``report.tta_tolerance``), with
``time_to_target_epoch`` that epoch; ``tta_speedup`` is exact's time over the method's and
``tta_vs_stock`` stock's over the method's, ``tta_speedup_ci`` and ``tta_vs_stock_ci`` their
95% bootstrap intervals over the seeds (``[low, high]``), ``test_delta_ci`` the half-width of
the 95% t-interval of ``test_delta`` (the test gap to exact, else to the baseline), paired by
seed. ``tta_status`` is ``"reached"``,
``"not reached"`` (some seed never got there: times and speedups are ``null``) or
``"unavailable"`` (no exact run and no absolute target; ``tta_reason`` says why).
metrics.csv has ``train_time_s``, the training seconds after each epoch (``wall_s`` is the
older name of the same column).

JSON files are strict JSON (:func:`strict_json`): a NaN or infinite number, which would
otherwise be written as a bare ``NaN`` token that JSON parsers reject, becomes ``null``.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os

import numpy as np

from ..base import _deps
from .checkpoint import atomic_write_text, claim
from .environment import cpu_caches, cpu_name, environment
from .intervals import t_interval
from .tta import DEFAULT_TOLERANCE, cumulative_times, time_to_accuracy

__all__ = [
    "environment", "summarize", "format_table", "format_setup", "format_partition",
    "write_report", "strict_json",
    "CSV_FIELDS", "cpu_name", "cpu_caches",
]  # fmt: skip

log = logging.getLogger(__name__)

CSV_FIELDS = (
    "method", "seed", "epoch", "phase", "loss", "train", "val", "test", "epoch_s",
    "forward_s", "backward_s", "step_s", "select_s", "nnz_fraction", "train_time_s", "wall_s",
)  # fmt: skip
TIMES = ("epoch_s", "forward_s", "backward_s", "select_s", "step_s")


def strict_json(obj, **kwargs) -> str:
    """``json.dumps`` that writes NaN and infinities as ``null`` (never a bare ``NaN``).

    >>> strict_json({"a": float("nan"), "b": [1.5, float("-inf")]})
    '{"a": null, "b": [1.5, null]}'
    """
    return json.dumps(_finite(obj), allow_nan=False, **kwargs)


def _finite(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _mean(values) -> float:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def _std(values) -> float:
    values = [v for v in values if v is not None]
    return float(np.std(values)) if values else None


def _timed(rec: dict) -> list:
    """The epochs whose times are averaged: all but the first (which builds structures)."""
    return rec["history"][1:] or rec["history"]


def _converged(rec: dict):
    """Whether a run converged by the stop rule (``None``: a record from before it)."""
    return (rec.get("stop") or {}).get("converged")


def _run_times(rec: dict) -> dict:
    hist = _timed(rec)
    out = {k: _mean(h[k] for h in hist) for k in TIMES}
    approx = [h["epoch_s"] for h in hist if h["phase"] == "approx"]
    out["approx_epoch_s"] = _mean(approx) if approx else None
    out["train_s"] = sum(h["epoch_s"] for h in rec["history"])
    return out


def summarize(records: list, tolerance: float = DEFAULT_TOLERANCE, target=None) -> dict:
    """Per method: time to target (``tolerance`` below exact's best validation, or the
    absolute ``target``), test/val mean and std over seeds, mean times, speedup, nnz fraction."""
    summary = {}
    for method in dict.fromkeys(r["method"] for r in records):
        recs = [r for r in records if r["method"] == method]
        tests = [r["best"]["test"] for r in recs]
        times = [_run_times(r) for r in recs]
        visited = sum(h.get("nnz_visited", 0) for r in recs for h in r["history"])
        exact = sum(h.get("nnz_exact", 0) for r in recs for h in r["history"])
        summary[method] = {
            "runs": len(recs),
            "seeds": [r["seed"] for r in recs],
            "converged": sum(_converged(r) is True for r in recs),
            "hit_cap": [r["seed"] for r in recs if _converged(r) is False],
            "test_mean": _mean(tests),
            "test_std": _std(tests),
            "val_mean": _mean(r["best"]["val"] for r in recs),
            **{f"{k}_mean": _mean(t[k] for t in times) for k in (*TIMES, "train_s")},
            "approx_epoch_s_mean": _mean(t["approx_epoch_s"] for t in times),
            "epoch_s_median": float(np.median([h["epoch_s"] for r in recs for h in _timed(r)])),
            "nnz_fraction": visited / exact if exact else 1.0,
            # pages faulted in per timed epoch (0 once freed blocks are reused), the process's
            # peak resident memory at the run's end (a process-wide high-water mark: the
            # first run of a process gives its method's own peak), the allocator setting
            "minor_faults_mean": _mean(h.get("minor_faults", 0) for r in recs for h in _timed(r)),
            "peak_rss_mb": max(r.get("peak_rss_mb") or 0.0 for r in recs),
            "allocator": recs[0].get("allocator", "default"),
        }
    baselines = [m for m in ("exact", "stock") if m in summary]
    if baselines:
        fastest = min(baselines, key=lambda m: summary[m]["epoch_s_mean"])
        base = summary[fastest]
        ref_name = "exact" if "exact" in summary else fastest
        ref = summary[ref_name]
        for method, s in summary.items():
            s["baseline"] = fastest
            s["speedup"] = base["epoch_s_mean"] / s["epoch_s_mean"]
            approx = s["approx_epoch_s_mean"] or s["epoch_s_mean"]
            s["speedup_approx"] = base["epoch_s_mean"] / approx
            for m in baselines:
                s[f"vs_{m}"] = summary[m]["epoch_s_mean"] / s["epoch_s_mean"]
            s["backward_speedup"] = base["backward_s_mean"] / s["backward_s_mean"]
            known = s["test_mean"] is not None and ref["test_mean"] is not None
            s["test_delta"] = s["test_mean"] - ref["test_mean"] if known else None
            s["test_delta_ci"] = _gap_half_width(records, method, ref_name) if known else None
    _add_tta(summary, time_to_accuracy(records, tolerance, target))
    return summary


def _gap_half_width(records: list, method: str, ref: str):
    """Half-width of the 95% t-interval of ``method``'s test metric minus ``ref``'s, paired
    by seed (``None`` under two common seeds or without test metrics)."""
    best = {(r["method"], r["seed"]): r["best"]["test"] for r in records}
    gaps = [best[(method, seed)] - best[(ref, seed)] for m, seed in best
            if m == method and (ref, seed) in best and best[(method, seed)] is not None
            and best[(ref, seed)] is not None]  # fmt: skip
    return t_interval(gaps)[1] if len(gaps) >= 2 else None


def _add_tta(summary: dict, tta: dict) -> None:
    """The time-to-accuracy fields of each method's summary (see the module docstring)."""
    for method, s in summary.items():
        t = tta["methods"].get(method)
        if t is None:
            s.update(tta_status="unavailable", tta_reason=tta["reason"], tta_target=None,
                     time_to_target_s=None, time_to_target_epoch=None, tta_speedup=None,
                     tta_vs_stock=None, tta_speedup_ci=None, tta_vs_stock_ci=None,
                     tta_reached=0, tta_runs=[])  # fmt: skip
            continue
        s.update(tta_status=t["status"], tta_target=tta["target"], time_to_target_s=t["time_s"],
                 time_to_target_epoch=t["epoch"], tta_speedup=t.get("vs_exact"),
                 tta_vs_stock=t.get("vs_stock"), tta_speedup_ci=t.get("vs_exact_ci"),
                 tta_vs_stock_ci=t.get("vs_stock_ci"), tta_reached=t["reached"],
                 tta_runs=t["runs"])  # fmt: skip


def _tta_cells(s: dict) -> tuple:
    """``(time to target, tta speedup, tta vs stock)`` cells of one method's row."""
    if s["tta_status"] == "unavailable":
        return ("n/a", "-", "-")
    if s["tta_status"] == "not reached":
        return (f"not reached {s['tta_reached']}/{len(s['tta_runs'])}", "-", "-")
    epoch = s["time_to_target_epoch"]
    when = f"{s['time_to_target_s']:.2f}s @{epoch:.0f}"
    return tuple([when] + [ratio_cell(s[k], s.get(f"{k}_ci"))
                           for k in ("tta_speedup", "tta_vs_stock")])  # fmt: skip


def ratio_cell(value, ci) -> str:
    """``1.12x`` or, with its interval, ``1.12x (1.04-1.18)``; ``-`` when missing."""
    if value is None:
        return "-"
    return f"{value:.2f}x" + (f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else "")


def _tta_note(summary: dict) -> str:
    """The table's line on how the time to target was measured."""
    first = next(iter(summary.values()))
    if first["tta_status"] == "unavailable":
        return (
            f"time to target unavailable: {first['tta_reason']}; set report.tta_target "
            "(an absolute validation target) or compare: true (trains the exact run)"
        )
    target = first["tta_target"]
    seeds = ", ".join(f"seed {k}: {v:.4f}" for k, v in target["per_seed"].items())
    return (f"to target: training seconds (evaluation excluded) until validation first reaches "
            f"the target ({target['rule']}; {seeds}) @ that epoch, or 'not reached k/n' (k of n "
            "seeds got there); tta exact, tta stock: that baseline's time to target over the "
            "method's")  # fmt: skip


#: how the report names a setup phase (a key of ``environment.setup_s``; ``_seedN`` apart)
SETUP_NAMES = {"saint_presample": "GraphSAINT weights", "cluster_partition": "METIS clusters",
               "int8_pick": "INT8 against fp32",
               "warm_up": "warm-up", "kernel_compile": "kernel compiles"}  # fmt: skip


def format_setup(setup_s: dict) -> str:
    """One line with the seconds of each setup phase (``environment.setup_s``).

    >>> format_setup({"dataset": 9.04, "saint_presample_seed0": 130.2, "kernel_compile": 0.0})
    'setup: dataset 9.0 s, GraphSAINT weights (seed 0) 130.2 s, kernel compiles 0.0 s'
    """
    parts = []
    for key, seconds in setup_s.items():
        name, _, seed = key.partition("_seed")
        name = SETUP_NAMES.get(name, name.replace("_", " ")) + (f" (seed {seed})" if seed else "")
        parts.append(f"{name} {seconds:.1f} s")
    return "setup: " + (", ".join(parts) or "-")


def format_partition(partition: dict) -> str:
    """One line on how the run's partition was had: method and parts, computed or read from
    the cache, its seconds, METIS's own (and its process's peak memory where it ran in one),
    the largest peak resident memory over the ranks once partitioned, and its edge cut.

    >>> line = format_partition({"method": "metis", "quality": {"parts": 2,
    ...     "edge_cut_fraction": 0.1, "halo_nodes": [5, 7]}, "report": [{"cached": False,
    ...     "partition_s": 1.25, "quality_s": 0.1, "metis_s": 1.0, "metis_peak_mb": 900.0,
    ...     "peak_rss_mb": 2100.0}, {"cached": True, "partition_s": 0.01, "quality_s": 0.0,
    ...     "peak_rss_mb": 1900.0}]})
    >>> for piece in line.split("; "):
    ...     print(piece)  # doctest: +ELLIPSIS
    partition: metis, 2 parts, computed in 1.2 s (METIS 1.0 s, 0.9 GB in its own process)...
    peak memory 2.1 GB (largest rank)
    edge cut 10.0%, halo up to 7 rows
    """
    q, reps = partition["quality"], partition.get("report") or [{}]
    r = reps[0]
    how = "read from the cache in" if r.get("cached") else "computed in"
    metis = ""
    if r.get("metis_s") is not None:
        child = r.get("metis_peak_mb")
        metis = f" (METIS {r['metis_s']:.1f} s" + (
            f", {child / 1e3:.1f} GB in its own process)" if child else ")"
        )
    peak = max((x.get("peak_rss_mb") or 0) for x in reps)
    return (
        f"partition: {partition.get('method', '?')}, {q['parts']} parts, {how} "
        f"{r.get('partition_s', 0.0):.1f} s{metis}, quality {r.get('quality_s', 0.0):.1f} s; "
        f"peak memory {peak / 1e3:.1f} GB (largest rank); edge cut "
        f"{100 * q['edge_cut_fraction']:.1f}%, halo up to {max(q['halo_nodes'])} rows"
    )


def format_table(summary: dict, metric: str) -> str:
    """The final table: one row per method; speedups against the faster exact baseline."""
    scale = 100.0 if metric in ("accuracy", "rocauc", "f1_micro") else 1.0
    stock = "stock" in summary
    head = (f"{'method':<7}{'runs':>5}{'conv':>6}  {'test ' + metric:>20}{'to target':>18}"
            f"{'tta exact':>19}"
            + (f"{'tta stock':>19}" if stock else "")
            + f"  {'epoch ms':>9}{'fwd':>8}{'bwd':>8}{'select':>8}{'speedup':>9}{'approx':>8}"
            f"{'bwd nnz':>9}")  # fmt: skip
    lines = [head, "-" * len(head)]
    for method, s in summary.items():
        test = "-"
        if s["test_mean"] is not None:
            test = f"{s['test_mean'] * scale:.2f} ± {s['test_std'] * scale:.2f}"
        speed = f"{s['speedup']:.2f}x" if "speedup" in s else "-"
        approx = f"{s['speedup_approx']:.2f}x" if "speedup_approx" in s else "-"
        when, tta, vs_stock = _tta_cells(s)
        conv = f"{s['converged']}/{s['runs']}"
        lines.append(
            f"{method:<7}{s['runs']:>5}{conv:>6}  {test:>20}{when:>18}{tta:>19}"
            + (f"{vs_stock:>19}" if stock else "")
            + f"  {s['epoch_s_mean'] * 1e3:>9.1f}"
            f"{s['forward_s_mean'] * 1e3:>8.1f}{s['backward_s_mean'] * 1e3:>8.1f}"
            f"{s['select_s_mean'] * 1e3:>8.1f}{speed:>9}{approx:>8}{s['nnz_fraction'] * 100:>8.1f}%"
        )
    base = next((s["baseline"] for s in summary.values() if "baseline" in s), None)
    if base:
        what = "the stock model" if base == "stock" else "dgl_rsc's exact backward"
        lines.append(f"speedup: epoch time of the faster baseline ({base}: {what}) over the "
                     "method's; approx: over its approximate phase")  # fmt: skip
    lines.append(_tta_note(summary))
    lines.append(_stop_note(summary))
    return "\n".join(lines)


def _stop_note(summary: dict) -> str:
    """The table's line on convergence: which runs hit the epoch cap still improving."""
    capped = [f"{m}-seed{seed}" for m, s in summary.items() for seed in s["hit_cap"]]
    rule = (
        "conv: runs whose validation metric had plateaued by their end (no better value "
        "for train.patience evaluations; train.stop: plateau stops them there)"
    )
    if not capped:
        return f"{rule}; every run converged"
    return f"{rule}; hit the epoch cap still improving (unconverged): {', '.join(capped)}"


def _csv_text(records: list) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore")
    writer.writeheader()
    for r in records:
        for h, t in zip(r["history"], cumulative_times(r["history"])):
            writer.writerow({**h, "method": r["method"], "seed": r["seed"], "train_time_s": t,
                             "wall_s": t})  # fmt: skip
    return buf.getvalue()


def write_report(out_dir: str, config: dict, records: list, env: dict, metric: str) -> dict:
    """Write results.json, metrics.csv, summary.png and table.txt; return the summary."""
    rep = config.get("report") or {}
    summary = summarize(records, rep.get("tta_tolerance", DEFAULT_TOLERANCE),
                        rep.get("tta_target"))  # fmt: skip
    table = format_table(summary, metric)
    results = {
        "environment": env,
        "config": config,
        "metric": metric,
        "summary": summary,
        "table": table,
        "runs": records,
    }
    files = [os.path.join(out_dir, f) for f in ("results.json", "metrics.csv", "table.txt")]
    plot = _deps.matplotlib_available()
    claim(out_dir, *files, *([os.path.join(out_dir, "summary.png")] if plot else []))
    atomic_write_text(files[0], strict_json(results, indent=1))
    atomic_write_text(files[1], _csv_text(records))
    atomic_write_text(files[2], table + "\n")
    if plot:
        from .report_plot import plot_summary

        plot_summary(os.path.join(out_dir, "summary.png"), records, summary, metric)
    else:
        log.warning("matplotlib is not installed: summary.png skipped (pip install matplotlib)")
    return summary
