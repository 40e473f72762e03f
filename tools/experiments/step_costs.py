"""Where the backward's sparse work goes inside training: every piece of RSC's step, timed per
call, next to the exact product of the same run.

``torch.profiler`` sees torch operators only; RSC's CPU step runs Numba kernels and Python
between them. This tool trains the config's model (first seed; ``--set`` as in ``dgl-rsc
run``) with the exact backward and with RSC, wraps the step's pieces (the exact product, the
refresh and its draw, the remainder partition and its cut, the step's product, the error
probe, the non-finite check) with wall-clock timers, and prints per piece its calls, the
median milliseconds per call and the milliseconds per epoch (its first call, which may
compile kernels, left out), with the median and the mean epoch time per phase (epochs after
the first; the mean carries the refreshes and tunes, which the median leaves out).

It also says how much faster RSC can make this config's epoch at all (``ceiling``): the exact
run's backward products are split into those RSC samples (``dY`` at least ``rsc.min_width``
columns wide) and the narrow ones it leaves exact; with ``E`` the exact epoch and ``X`` the
sampled products' milliseconds per epoch, a free sampled product gives ``E / (E - X)``, and
one that costs the visited fraction ``v`` of them (RSC's approximate phase) ``E / (E - (1 -
v) X)``. ``kept`` is the share of that saving RSC's measured approximate epoch keeps. The
numbers are the process's own: run it on a quiet machine and compare pieces within one run.

Example::

    python tools/experiments/step_costs.py yaml_configs/quickstart.yaml --epochs 60 \\
        --out docs/results/step_costs_quickstart.json
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_common import machine, write_json

import dgl_rsc.core.layer_state as layer_state
import dgl_rsc.core.slot as slot
from dgl_rsc.launcher.train import prepare, train_one, warm_up
from dgl_rsc.launcher.yaml_io import load_config
from dgl_rsc.sampling.remainder import Groups


def _targets():
    """``(owner, attribute, piece name)`` of everything timed."""
    from dgl_rsc.sampling import remainder
    from dgl_rsc.sparse import cpu_grouped

    return [
        (slot.LayerSlot, "backward_product", "backward (all)"),
        (slot, "csr_t_mm", "exact product"),
        (slot, "sample_product", "sample product (no groups)"),
        (slot, "step_product", "step product (sample + group)"),
        (remainder, "csr_mm_sum", "  of which the product"),
        (Groups, "slice", "  of which the group's slice"),
        (cpu_grouped, "group_slices", "    partition cut (once per matrix)"),
        (layer_state.LayerState, "refresh", "refresh"),
        (layer_state, "draw_sample", "  draw (score, select, cut)"),
        (layer_state.LayerState, "partition", "  partition (drawn once per matrix, then kept)"),
        (layer_state.LayerState, "probe_error", "error probe"),
        (slot, "nonfinite_rows", "non-finite check"),
    ]


@contextlib.contextmanager
def timed(calls: dict):
    """Wrap every target so that each call's seconds are appended to ``calls[name]``."""
    saved = []
    for owner, attr, name in _targets():
        fn = getattr(owner, attr)

        def wrapper(*a, _fn=fn, _name=name, **k):
            start = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                calls[_name].append(time.perf_counter() - start)

        saved.append((owner, attr, fn))
        setattr(owner, attr, wrapper)
    try:
        yield
    finally:
        for owner, attr, fn in reversed(saved):
            setattr(owner, attr, fn)


@contextlib.contextmanager
def products(rows: list):
    """Record every backward product of training: seconds, phase, ``dY``'s width, and the
    non-zeros it had and visited (the layer's counters before and after the call)."""
    fn = slot.LayerSlot.backward_product

    def wrapper(self, A, dY, *a, **k):
        stats = self.state.stats
        stats.fold()
        before, start = (stats.nnz_exact, stats.nnz_visited), time.perf_counter()
        try:
            return fn(self, A, dY, *a, **k)
        finally:
            seconds = time.perf_counter() - start
            stats.fold()
            rows.append({"s": seconds, "phase": self.step.phase, "width": int(dY.shape[1]),
                         "layer": self.state.index, "nnz": stats.nnz_exact - before[0],
                         "visited": stats.nnz_visited - before[1]})  # fmt: skip

    slot.LayerSlot.backward_product = wrapper
    try:
        yield
    finally:
        slot.LayerSlot.backward_product = fn


def sampled_side(rows: list, min_width: int, epochs: int) -> dict:
    """The products RSC samples (``dY`` at least ``min_width`` wide) and the narrow ones:
    their calls, milliseconds per epoch (per product, its median call times its calls per
    epoch, so that a first, compiling, call does not count) and, in the approximate phase,
    the visited fraction of the sampled ones' non-zeros."""
    out = {}
    for side, keep in (("sampled", True), ("narrow", False)):
        per_layer = defaultdict(list)
        for r in rows:
            if (r["width"] >= min_width) == keep:
                per_layer[r["layer"]].append(r["s"])
        ms = sum(statistics.median(t) * len(t) for t in per_layer.values())
        out[side] = {"calls": sum(len(t) for t in per_layer.values()),
                     "ms_per_epoch": 1e3 * ms / epochs}  # fmt: skip
    approx = [r for r in rows if r["phase"] == "approx" and r["width"] >= min_width]
    nnz = sum(r["nnz"] for r in approx)
    out["visited_approx"] = sum(r["visited"] for r in approx) / nnz if nnz else None
    return out


def ceiling(exact: dict, rsc: dict) -> dict:
    """How much faster the approximate epoch can be than exact's, and how much of it RSC keeps
    (see the module docstring); ``None`` where the runs give no basis for it."""
    e = exact["epoch_ms_mean"]["exact"]
    x = exact["products"]["sampled"]["ms_per_epoch"]
    v = rsc["products"]["visited_approx"]
    r = rsc["epoch_ms_mean"].get("approx")
    out = {"exact_epoch_ms": e, "sampled_ms_per_epoch": x, "sampled_share": x / e,
           "visited": v, "free": e / (e - x) if x < e else None,
           "at_visited": None, "measured_mean": e / r if r else None, "kept": None}  # fmt: skip
    if v is not None and x > 0:
        saving = (1 - v) * x
        out["at_visited"] = e / (e - saving)
        out["kept"] = (e - r) / saving if r and saving > 0 else None
    return out


def measure(cfg, prep, method: str) -> dict:
    calls, rows = defaultdict(list), []
    with timed(calls), products(rows):
        rec = train_one(cfg, prep, method, cfg.train.seeds[0], progress=False)
    hist = rec["history"]
    epochs = len(hist)
    phases = defaultdict(list)
    for h in hist[1:]:
        phases[h["phase"]].append(1e3 * h["epoch_s"])
    pieces = {}
    for _, _, name in _targets():
        t = calls.get(name)
        if not t:
            continue
        pieces[name] = {
            "calls": len(t),
            "median_ms": 1e3 * statistics.median(t),
            "ms_per_epoch": 1e3 * sum(t[1:]) / epochs,
            "first_ms": 1e3 * t[0],
        }
    return {"epoch_ms": {p: statistics.median(v) for p, v in phases.items()},
            "epoch_ms_mean": {p: statistics.mean(v) for p, v in phases.items()},
            "pieces": pieces, "test": rec["best"]["test"],
            "products": sampled_side(rows, cfg.rsc.min_width, epochs)}  # fmt: skip


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("--set", dest="sets", action="append", default=[])
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    sets = [*args.sets, f"train.epochs={args.epochs}", f"train.eval_every={args.epochs}",
            "train.checkpoint_every=0"]  # fmt: skip
    cfg = load_config(args.config, sets)
    prep = prepare(cfg)
    # untimed epochs of both methods first, as the launcher does: the first approximate step
    # loads RSC's kernels (about 0.25 s), which would land in the measured epochs
    warm_up(cfg, prep, [(cfg.train.seeds[0], m) for m in ("exact", "rsc")])
    out = {"machine": machine(prep.device), "command": " ".join(sys.argv),
           "config": args.config, "threads": torch.get_num_threads(), "methods": {}}  # fmt: skip
    for method in ("exact", "rsc"):
        row = measure(cfg, prep, method)
        out["methods"][method] = row
        phases = "  ".join(f"{k} {v:.1f} (mean {row['epoch_ms_mean'][k]:.1f}) ms"
                           for k, v in row["epoch_ms"].items())  # fmt: skip
        print(f"{method}: median epoch {phases}", flush=True)
        for name, r in row["pieces"].items():
            print(f"   {name:44s} {r['calls']:5d} calls  median {r['median_ms']:8.2f} ms  "
                  f"{r['ms_per_epoch']:8.2f} ms/epoch", flush=True)  # fmt: skip
    out["ceiling"] = c = ceiling(out["methods"]["exact"], out["methods"]["rsc"])
    print(_ceiling_line(c), flush=True)
    write_json(args.out, out)


def _ceiling_line(c: dict) -> str:
    def x(value):
        return "n/a" if value is None else f"{value:.3f}x"

    v = "n/a" if c["visited"] is None else f"{c['visited']:.2f}"
    kept = "n/a" if c["kept"] is None else f"{100 * c['kept']:.0f}%"
    return (
        f"ceiling: the products RSC samples take {c['sampled_ms_per_epoch']:.1f} ms of the "
        f"{c['exact_epoch_ms']:.1f} ms exact epoch ({100 * c['sampled_share']:.1f}%); free "
        f"they would make it {x(c['free'])} faster, at the visited fraction {v} "
        f"{x(c['at_visited'])}; measured (mean epochs) {x(c['measured_mean'])}, "
        f"{kept} of that saving kept"
    )


if __name__ == "__main__":
    main()
