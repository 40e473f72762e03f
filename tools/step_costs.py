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
The numbers are the process's own: run it on a quiet machine and compare pieces within one
run.

Example::

    python tools/step_costs.py yaml_configs/quickstart.yaml --epochs 60 \\
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

sys.path.insert(0, os.path.dirname(__file__))

from bench_common import machine, write_json

import dgl_rsc.core.layer_state as layer_state
import dgl_rsc.core.slot as slot
from dgl_rsc.launcher.train import prepare, train_one
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


def measure(cfg, prep, method: str) -> dict:
    calls = defaultdict(list)
    with timed(calls):
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
            "pieces": pieces, "test": rec["best"]["test"]}  # fmt: skip


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
    write_json(args.out, out)


if __name__ == "__main__":
    main()
