"""summary.png of a launcher run: validation against epochs and against training wall-clock
(with the time-to-accuracy target and each method's first crossing), and epoch-time bars.

Curves are means over seeds (the band in the epoch panel spans min to max); the wall-clock
axis is the training time after each epoch (evaluation excluded, :mod:`.tta`). Matplotlib is
imported here only, when the report is written (the caller checks it is installed).
"""

from __future__ import annotations

import io

import numpy as np

from .checkpoint import atomic_write
from .tta import cumulative_times

__all__ = ["plot_summary"]


def _curves(records: list, method: str) -> tuple:
    """``(epochs, val mean, val min, val max, train time mean)`` over the method's seeds,
    at the evaluated epochs they share (runs stopped on their plateau differ in length: the
    curves end with the shortest)."""
    recs = [r for r in records if r["method"] == method]
    evals = [[h for h in r["history"] if h["val"] is not None] for r in recs]
    n = min(len(e) for e in evals)
    epochs = np.array([h["epoch"] for h in evals[0][:n]], dtype=int)
    vals = np.array([[h["val"] for h in e[:n]] for e in evals], dtype=float).reshape(len(recs), n)
    last = min(len(r["history"]) for r in recs)
    walls = np.array([cumulative_times(r["history"])[:last] for r in recs]).mean(0)
    return epochs, vals.mean(0), vals.min(0), vals.max(0), walls[epochs - 1]


def _target_panel(ax, records: list, summary: dict, metric: str) -> None:
    """Validation vs training time, the target line and each method's crossing."""
    target = next((s["tta_target"] for s in summary.values() if s.get("tta_target")), None)
    level = None
    if target is not None:
        level = float(np.mean(list(target["per_seed"].values())))
        ax.axhline(level, color="0.4", linestyle="--", linewidth=1,
                   label=f"target {level:.4f}")  # fmt: skip
    for method, s in summary.items():
        epochs, mean, _, _, wall = _curves(records, method)
        (line,) = ax.plot(wall, mean, label=method)
        if level is None:
            continue
        if s["time_to_target_s"] is None:
            line.set_label(f"{method} ({s['tta_status']})")
            continue
        t = s["time_to_target_s"]
        ax.plot([t], [level], marker="o", color=line.get_color(), markersize=7,
                markeredgecolor="black", linestyle="none")  # fmt: skip
        ax.axvline(t, color=line.get_color(), linestyle=":", linewidth=1)
        line.set_label(f"{method}: {t:.2f} s (epoch {s['time_to_target_epoch']:.0f})")
    title = "vs training wall-clock" + ("" if level is not None else " (no target)")
    ax.set(xlabel="training time (s), evaluation excluded", ylabel=f"validation {metric}",
           title=title)  # fmt: skip


def plot_summary(path: str, records: list, summary: dict, metric: str) -> None:
    """Write summary.png to ``path`` (atomically)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(16, 4.6))
    FigureCanvasAgg(fig)
    ax_e, ax_t, ax_b = fig.subplots(1, 3)
    for method in summary:
        epochs, mean, lo, hi, _ = _curves(records, method)
        ax_e.plot(epochs, mean, label=method)
        ax_e.fill_between(epochs, lo, hi, alpha=0.2)
    ax_e.set(xlabel="epoch", ylabel=f"validation {metric}", title="validation vs epoch")
    _target_panel(ax_t, records, summary, metric)
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
