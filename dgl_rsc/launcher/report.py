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

JSON files are strict JSON (:func:`strict_json`): a NaN or infinite number, which would
otherwise be written as a bare ``NaN`` token that JSON parsers reject, becomes ``null``.
"""

from __future__ import annotations

import csv
import datetime
import importlib.metadata
import io
import json
import logging
import math
import os
import platform

import numpy as np
import torch

from .. import __version__, _deps
from .checkpoint import atomic_write, atomic_write_text, claim

__all__ = ["environment", "summarize", "format_table", "write_report", "strict_json", "CSV_FIELDS"]

log = logging.getLogger(__name__)

CSV_FIELDS = (
    "method", "seed", "epoch", "phase", "loss", "train", "val", "test", "epoch_s",
    "forward_s", "backward_s", "step_s", "select_s", "nnz_fraction", "wall_s",
)  # fmt: skip
PACKAGES = (
    "torch",
    "dgl",
    "numpy",
    "pyyaml",
    "tqdm",
    "matplotlib",
    "cupy-cuda12x",
    "numba",
    "torch-geometric",
)
TIMES = ("epoch_s", "forward_s", "backward_s", "select_s", "step_s")


def _version(package: str):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_name() -> str:
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def environment(device: torch.device) -> dict:
    """Versions, device and machine of this run (no package is imported to read them)."""
    cuda = device.type == "cuda"
    return {
        "dgl_rsc": __version__,
        "python": platform.python_version(),
        "packages": {p: _version(p) for p in PACKAGES},
        "torch": torch.__version__,
        "dgl": _version("dgl"),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if cuda else _cpu_name(),
        "cuda_version": torch.version.cuda,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


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


def _run_times(rec: dict) -> dict:
    hist = _timed(rec)
    out = {k: _mean(h[k] for h in hist) for k in TIMES}
    approx = [h["epoch_s"] for h in hist if h["phase"] == "approx"]
    out["approx_epoch_s"] = _mean(approx) if approx else None
    out["train_s"] = sum(h["epoch_s"] for h in rec["history"])
    return out


def summarize(records: list) -> dict:
    """Per method: test/val mean and std over seeds, mean times, speedup, nnz fraction."""
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
            "test_mean": _mean(tests),
            "test_std": _std(tests),
            "val_mean": _mean(r["best"]["val"] for r in recs),
            **{f"{k}_mean": _mean(t[k] for t in times) for k in (*TIMES, "train_s")},
            "approx_epoch_s_mean": _mean(t["approx_epoch_s"] for t in times),
            "epoch_s_median": float(np.median([h["epoch_s"] for r in recs for h in _timed(r)])),
            "nnz_fraction": visited / exact if exact else 1.0,
        }
    baselines = [m for m in ("exact", "stock") if m in summary]
    if baselines:
        fastest = min(baselines, key=lambda m: summary[m]["epoch_s_mean"])
        base = summary[fastest]
        exact = summary.get("exact")
        for s in summary.values():
            s["baseline"] = fastest
            s["speedup"] = base["epoch_s_mean"] / s["epoch_s_mean"]
            approx = s["approx_epoch_s_mean"] or s["epoch_s_mean"]
            s["speedup_approx"] = base["epoch_s_mean"] / approx
            for m in baselines:
                s[f"vs_{m}"] = summary[m]["epoch_s_mean"] / s["epoch_s_mean"]
            s["backward_speedup"] = base["backward_s_mean"] / s["backward_s_mean"]
            ref = exact or base
            known = s["test_mean"] is not None and ref["test_mean"] is not None
            s["test_delta"] = s["test_mean"] - ref["test_mean"] if known else None
    return summary


def format_table(summary: dict, metric: str) -> str:
    """The final table: one row per method; speedups against the faster exact baseline."""
    scale = 100.0 if metric in ("accuracy", "rocauc", "f1_micro") else 1.0
    head = (f"{'method':<7}{'runs':>5}  {'test ' + metric:>20}  {'epoch ms':>9}{'fwd':>8}"
            f"{'bwd':>8}{'select':>8}{'speedup':>9}{'approx':>8}{'bwd nnz':>9}")  # fmt: skip
    lines = [head, "-" * len(head)]
    for method, s in summary.items():
        test = "-"
        if s["test_mean"] is not None:
            test = f"{s['test_mean'] * scale:.2f} ± {s['test_std'] * scale:.2f}"
        speed = f"{s['speedup']:.2f}x" if "speedup" in s else "-"
        approx = f"{s['speedup_approx']:.2f}x" if "speedup_approx" in s else "-"
        lines.append(
            f"{method:<7}{s['runs']:>5}  {test:>20}  {s['epoch_s_mean'] * 1e3:>9.1f}"
            f"{s['forward_s_mean'] * 1e3:>8.1f}{s['backward_s_mean'] * 1e3:>8.1f}"
            f"{s['select_s_mean'] * 1e3:>8.1f}{speed:>9}{approx:>8}{s['nnz_fraction'] * 100:>8.1f}%"
        )
    base = next((s["baseline"] for s in summary.values() if "baseline" in s), None)
    if base:
        what = "the stock model" if base == "stock" else "dgl_rsc's exact backward"
        lines.append(f"speedup: epoch time of the faster baseline ({base}: {what}) over the "
                     "method's; approx: over its approximate phase")  # fmt: skip
    return "\n".join(lines)


def _csv_text(records: list) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore")
    writer.writeheader()
    for r in records:
        wall = 0.0
        for h in r["history"]:
            wall += h["epoch_s"]
            writer.writerow({**h, "method": r["method"], "seed": r["seed"], "wall_s": wall})
    return buf.getvalue()


def _plot(path: str, records: list, summary: dict, metric: str) -> None:
    """summary.png: validation metric vs epoch and vs training time; epoch-time bars."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.2))
    FigureCanvasAgg(fig)
    ax_e, ax_t, ax_b = fig.subplots(1, 3)
    for method in summary:
        recs = [r for r in records if r["method"] == method]
        evals = [[h for h in r["history"] if h["val"] is not None] for r in recs]
        n = min(len(e) for e in evals)
        epochs = [h["epoch"] for h in evals[0][:n]]
        vals = np.array([[h["val"] for h in e[:n]] for e in evals])
        walls = np.array([np.cumsum([h["epoch_s"] for h in r["history"]]) for r in recs])
        wall = walls.mean(0)[np.array(epochs) - 1]
        ax_e.plot(epochs, vals.mean(0), label=method)
        ax_e.fill_between(epochs, vals.min(0), vals.max(0), alpha=0.2)
        ax_t.plot(wall, vals.mean(0), label=method)
    ax_e.set(xlabel="epoch", ylabel=f"validation {metric}", title="validation vs epoch")
    ax_t.set(xlabel="training time (s)", ylabel=f"validation {metric}", title="vs wall-clock")
    names = list(summary)
    bottom = np.zeros(len(names))
    parts = {
        "forward": [summary[m]["forward_s_mean"] for m in names],
        "backward (excl. select)": [
            summary[m]["backward_s_mean"] - summary[m]["select_s_mean"] for m in names
        ],
        "select": [summary[m]["select_s_mean"] for m in names],
        "optimizer": [summary[m]["step_s_mean"] for m in names],
    }
    for label, vals in parts.items():
        ms = np.array(vals) * 1e3
        ax_b.bar(names, ms, bottom=bottom, label=label)
        bottom += ms
    ax_b.set(ylabel="ms per epoch", title="mean epoch time")
    for ax in (ax_e, ax_t, ax_b):
        ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    atomic_write(path, lambda f: f.write(buf.getvalue()))


def write_report(out_dir: str, config: dict, records: list, env: dict, metric: str) -> dict:
    """Write results.json, metrics.csv, summary.png and table.txt; return the summary."""
    summary = summarize(records)
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
        _plot(os.path.join(out_dir, "summary.png"), records, summary, metric)
    else:
        log.warning("matplotlib is not installed: summary.png skipped (pip install matplotlib)")
    return summary
