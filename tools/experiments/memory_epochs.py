"""Peak resident memory of training, per method and graph size, one epoch at a time; a linear
fit per method and the largest graph it trains in a given memory.

Each (size, method) runs in a process of its own (``ru_maxrss`` is per process): the launcher's
``prepare`` (dataset and graph), then ``--epochs`` training steps, no evaluation. The record
keeps the peak after ``prepare`` and after each epoch. Sizes set ``dataset.num_nodes`` of the
config; the fit is ``peak = a + b * nodes`` (least squares) per method, and ``limit_nodes``
the size whose fitted peak reaches ``--memory-gb`` (a projection where it lies beyond the
sizes measured).

    python tools/experiments/memory_epochs.py yaml_configs/quickstart.yaml \\
        --set dataset.avg_degree=50 --set model.hidden=256 --nodes 50000 100000 \\
        --methods stock exact int8 int8-rsc --out docs/results/memory_degree50.json

Methods: the launcher's (``stock``, ``exact``, ``rsc``) and ``int8`` / ``int8-rsc`` (the same
with ``train.precision: int8``). Run anything past 3 GB under ``flock /tmp/bigmem.lock``.

The peaks include glibc's kept heap (``train.keep_freed_memory``, on by default; each row's
``allocator``): holes between longer-lived blocks stay resident, 0.8-0.95 GB at 100000 nodes
of degree 50, and vary by 0.1-0.2 GB from run to run. ``--set train.keep_freed_memory=false``
measures with glibc's defaults (closer to the tensors alive at the peak, steps slower).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench_common import machine, write_json

from dgl_rsc.base.memory import peak_rss_bytes
from dgl_rsc.launcher.train import _setup, _train_step, prepare
from dgl_rsc.launcher.yaml_io import load_config

#: method -> (launcher method, train.precision)
METHODS = {"stock": ("stock", "fp32"), "exact": ("exact", "fp32"), "rsc": ("rsc", "fp32"),
           "int8": ("exact", "int8"), "int8-rsc": ("rsc", "int8")}  # fmt: skip
GIB = 2**30


def _mb() -> float:
    return peak_rss_bytes() / 2**20


def child(cfg, method: str, epochs: int) -> dict:
    """One method in this process: peaks after ``prepare`` and after each training step."""
    launcher_method, precision = METHODS[method]
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, precision=precision))
    if launcher_method == "rsc":  # the approximate phase from the first step on
        cfg = dataclasses.replace(cfg, rsc=cfg.rsc.replace(warmup_steps=0, total_steps=10**6))
    prep = prepare(cfg)
    after_prepare = _mb()
    torch.manual_seed(0)
    run = _setup(cfg, prep, launcher_method)
    peaks = []
    with run.ctx:
        for _ in range(epochs):
            _train_step(run, prep)
            peaks.append(_mb())
    return {"peak_rss_mb": peaks[-1], "after_prepare_mb": after_prepare, "epoch_peaks_mb": peaks,
            "nodes": int(prep.data.num_nodes), "edges": int(prep.edges[0].numel()),
            "allocator": prep.allocator}  # fmt: skip


def fit(points: list) -> dict:
    """``{"a_mb", "b_mb_per_node"}``: least squares of ``peak = a + b * nodes``."""
    n = len(points)
    if n < 2:
        return {}
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return {"a_mb": my - b * mx, "b_mb_per_node": b}


def limit(f: dict, memory_gb: float):
    """Nodes at which the fitted peak reaches ``memory_gb`` GiB (``None`` without a fit)."""
    if not f or f["b_mb_per_node"] <= 0:
        return None
    return int((memory_gb * 1024 - f["a_mb"]) / f["b_mb_per_node"])


def _run_child(args, method: str, nodes: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        res = os.path.join(tmp, "child.json")
        cmd = [sys.executable, sys.argv[0], args.config, "--child", method, "--child-nodes",
               str(nodes), "--epochs", str(args.epochs), "--out", res]  # fmt: skip
        cmd += [x for s in args.sets for x in ("--set", s)]
        subprocess.run(cmd, check=True)
        with open(res) as f:
            return json.load(f)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("--set", dest="sets", action="append", default=[])
    p.add_argument("--nodes", type=int, nargs="+", default=[])
    p.add_argument("--methods", nargs="+", default=["exact", "int8"], choices=list(METHODS))
    p.add_argument("--epochs", type=int, default=2, help="training steps per process")
    p.add_argument("--memory-gb", type=float, default=24.0)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-nodes", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.epochs < 1:
        p.error("--epochs: at least 1")
    if not args.nodes and not args.child:
        p.error("--nodes: at least one size")
    base = ["train.checkpoint_every=0", *args.sets]
    if args.child:
        cfg = load_config(args.config, [*base, f"dataset.num_nodes={args.child_nodes}"])
        with open(args.out, "w") as f:
            json.dump(child(cfg, args.child, args.epochs), f)
        return 0
    rows = []
    for nodes in args.nodes:
        for method in args.methods:
            row = {"method": method, **_run_child(args, method, nodes)}
            rows.append(row)
            print(f"{nodes:>9} nodes {method:<9} peak {row['peak_rss_mb']:8.0f} MB "
                  f"(after prepare {row['after_prepare_mb']:.0f})", flush=True)  # fmt: skip
    fits = {}
    for method in args.methods:
        f = fit([(r["nodes"], r["peak_rss_mb"]) for r in rows if r["method"] == method])
        fits[method] = {**f, "limit_nodes": limit(f, args.memory_gb)}
        print(f"{method}: {fits[method]}")
    out = {"tool": "tools/experiments/memory_epochs.py",
           "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
           "config": args.config, "sets": args.sets, "epochs": args.epochs,
           "memory_gb": args.memory_gb, "machine": machine("cpu"), "rows": rows,
           "fits": fits}  # fmt: skip
    write_json(args.out, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
