"""Per-epoch time of fp32 / INT8 / RSC, eager and compiled, interleaved in one process.

Every variant trains its own model (same seed) on the config's graph; the variants take turns
one epoch at a time, the order rotating each round, so that each round sees about the same
load of a shared machine. After ``--warmup`` untimed rounds (compiles, first calls, RSC's
warm-up) the medians of ``--rounds`` timed epochs are compared with ``fp32`` (eager, exact).
The compiled variants also report their compile (their first epoch beyond their median) and
the frames dynamo compiled.

    python tools/experiments/compile_int8_epochs.py yaml_configs/quickstart.yaml \\
        --rounds 20 --out docs/results/compile_int8cpu_quickstart.json

Variants (``--only`` picks some): ``fp32``, ``rsc``, ``fp32-compiled``, ``rsc-compiled``,
``int8``, ``int8-rsc`` (INT8 runs eagerly: ``train.compile`` refuses INT8), ``int8-saved-fp32``
(``train.int8_saved: fp32``), ``int8-fp32-sparse`` (``train.int8_sparse: fp32``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench_common import machine, write_json

from dgl_rsc.launcher.train import _setup, _train_step, prepare
from dgl_rsc.launcher.yaml_io import load_config

#: name -> (method, compile, precision, other train settings)
VARIANTS = {
    "fp32": ("exact", False, "fp32", {}),
    "rsc": ("rsc", False, "fp32", {}),
    "fp32-compiled": ("exact", True, "fp32", {}),
    "rsc-compiled": ("rsc", True, "fp32", {}),
    "int8": ("exact", False, "int8", {}),
    "int8-rsc": ("rsc", False, "int8", {}),
    "int8-saved-fp32": ("exact", False, "int8", {"int8_saved": "fp32"}),
    "int8-fp32-sparse": ("exact", False, "int8", {"int8_sparse": "fp32"}),
}


def _frames() -> int:
    return int(torch._dynamo.utils.counters["stats"].get("unique_graphs", 0))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--warmup", type=int, default=6)
    p.add_argument("--only", default=",".join(VARIANTS))
    p.add_argument("--set", dest="sets", action="append", default=[])
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    base = ["train.checkpoint_every=0", "train.eval_every=1000000", *args.sets]
    cfg = load_config(args.config, base)
    total = args.rounds + args.warmup
    rsc_cfg = cfg.rsc.replace(total_steps=10**9, warmup_steps=min(cfg.rsc.warmup_steps,
                                                                   args.warmup - 1))  # fmt: skip
    prep = prepare(cfg)
    runs = {}
    for name in names:
        method, compiled, precision, other = VARIANTS[name]
        train = dataclasses.replace(cfg.train, compile=compiled, precision=precision, **other)
        torch.manual_seed(0)
        runs[name] = _setup(dataclasses.replace(cfg, train=train, rsc=rsc_cfg), prep, method)
    times = {n: [] for n in names}
    first = {}
    for r in range(total):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            run = runs[name]
            t = time.perf_counter()
            with run.ctx:
                _train_step(run, prep)
            dt = time.perf_counter() - t
            if r == 0:
                first[name] = dt
            if r >= args.warmup:
                times[name].append(dt)
        print(f"round {r + 1}/{total}", file=sys.stderr, flush=True)
    med = {n: statistics.median(v) for n, v in times.items()}
    ref = med.get("fp32")
    rows = {}
    for n in names:
        row = {"median_ms": med[n] * 1e3, "mean_ms": statistics.mean(times[n]) * 1e3,
               "first_ms": first[n] * 1e3}  # fmt: skip
        if ref is not None:
            row["speedup_vs_fp32"] = ref / med[n]
        if VARIANTS[n][1]:
            row["compile_s"] = first[n] - med[n]
        ctl = runs[n].ctl
        if ctl is not None and VARIANTS[n][0] == "rsc":
            row["visited_fraction"] = ctl.stats()["visited_fraction"]
        rows[n] = row
        print(f"{n:>14}: median {row['median_ms']:8.1f} ms"
              + (f"  x{row['speedup_vs_fp32']:.2f} vs fp32" if ref else "")
              + (f"  compile {row['compile_s']:.1f} s" if "compile_s" in row else ""))  # fmt: skip
    out = {
        "tool": "tools/experiments/compile_int8_epochs.py",
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "config": args.config, "sets": args.sets, "rounds": args.rounds,
        "warmup": args.warmup, "machine": machine(prep.device),
        "note": "ratios from one process, interleaved",
        "load_average_1min": os.getloadavg()[0],  # at the end: other jobs running?
        "frames_compiled": _frames(), "variants": rows,
    }  # fmt: skip
    write_json(args.out, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
