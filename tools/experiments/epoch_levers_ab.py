"""The whole epoch's levers (issue 45) A/B, interleaved epoch by epoch in one process.

Each variant trains its own model (same seed) on the config's graph: ``method`` ``exact``
(dgl_rsc's exact path), ``rsc`` (approximate phase throughout: no switch) or ``stock`` (the
stock ``dgl.nn`` model, no dgl_rsc); ``alloc`` ``kept`` (:func:`dgl_rsc.keep_freed_memory`,
set before each of the variant's epochs) or ``default`` (glibc's settings, restored likewise);
``cache`` ``on`` or ``off`` (the drop-in layers' input aggregation reused,
:func:`dgl_rsc.nn.cache_input_aggregation`). The variants take turns one epoch at a time, the
order rotating each round, so that each round sees about the same machine load; per variant
the median and mean epoch, minor page faults per epoch, and the ratio to the first variant.

    python tools/experiments/epoch_levers_ab.py yaml_configs/quickstart.yaml --rounds 20 \\
        --variant base:method=exact,alloc=default,cache=off \\
        --variant alloc:method=exact,alloc=kept,cache=off --out docs/results/epoch_x.json
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

from bench_common import machine, write_json

from dgl_rsc.base.memory import keep_freed_memory
from dgl_rsc.dgl.nn.input_cache import cache_input_aggregation, input_cache_counts
from dgl_rsc.launcher.train import _setup, _train_step, prepare
from dgl_rsc.launcher.yaml_io import load_config

CHOICES = {"method": ("exact", "rsc", "stock"), "alloc": ("kept", "default"),
           "cache": ("on", "off")}  # fmt: skip


def parse(text: str) -> tuple:
    name, _, rest = text.partition(":")
    opts = {"method": "exact", "alloc": "kept", "cache": "on"}
    for item in filter(None, rest.split(",")):
        k, _, v = item.partition("=")
        if k not in CHOICES or v not in CHOICES[k]:
            raise SystemExit(f"--variant {text!r}: {k}={v!r}; choices {CHOICES}")
        opts[k] = v
    return name, opts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("--variant", action="append", required=True, help="name:method=,alloc=,cache=")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--warmup", type=int, default=6, help="rounds not timed")
    p.add_argument("--set", dest="sets", action="append", default=[])
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    sets = ["train.checkpoint_every=0", "train.eval_every=1000000",
            "train.keep_freed_memory=false", *args.sets]  # fmt: skip
    cfg = load_config(args.config, sets)
    if cfg.rsc is not None:  # RSC in its approximate phase throughout: no switch to exact
        cfg = dataclasses.replace(cfg, rsc=cfg.rsc.replace(total_steps=10**9))
    prep = prepare(cfg)
    variants = dict(parse(v) for v in args.variant)
    runs = {}
    for name, o in variants.items():
        torch.manual_seed(0)
        runs[name] = run = _setup(cfg, prep, o["method"])
        cache_input_aggregation(run.model, enabled=o["cache"] == "on")
    times = {k: [] for k in runs}
    faults = {k: [] for k in runs}
    names = list(runs)
    for r in range(args.rounds + args.warmup):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            keep_freed_memory(variants[name]["alloc"] == "kept")
            run = runs[name]
            with run.ctx:
                step = _train_step(run, prep)
            if r >= args.warmup:
                times[name].append(step["epoch_s"])
                faults[name].append(step["minor_faults"])
    first = names[0]
    med = {k: statistics.median(v) for k, v in times.items()}
    mean = {k: statistics.mean(v) for k, v in times.items()}
    out = {"machine": machine(prep.device), "command": " ".join(sys.argv), "config": args.config,
           "sets": args.sets, "rounds": args.rounds, "warmup": args.warmup,
           "note": "2-core VM shared with other agents' jobs: ratios are interleaved",
           "variants": {}}  # fmt: skip
    for k, o in variants.items():
        ctl = runs[k].ctl
        out["variants"][k] = {
            **o,
            "median_epoch_ms": 1e3 * med[k],
            "mean_epoch_ms": 1e3 * mean[k],
            f"speedup_vs_{first}_median": med[first] / med[k],
            f"speedup_vs_{first}_mean": mean[first] / mean[k],
            "minor_faults_per_epoch": statistics.median(faults[k]),
            "input_cache": input_cache_counts(runs[k].model),
            "visited_fraction": ctl.stats()["visited_fraction"] if ctl else None,
        }
        v = out["variants"][k]
        ratio = v[f"speedup_vs_{first}_median"]
        print(f"{k:14s} median {v['median_epoch_ms']:8.1f} ms  x{ratio:.3f}  mean "
              f"{v['mean_epoch_ms']:8.1f} ms  faults/epoch {v['minor_faults_per_epoch']:.0f}",
              flush=True)  # fmt: skip
    write_json(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
