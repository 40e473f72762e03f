"""The whole epoch's levers (issue 45) A/B, interleaved epoch by epoch in one process.

Each variant trains its own model (same seed) on the config's graph: ``method`` ``exact``
(dgl_rsc's exact path), ``rsc`` (approximate phase throughout: no switch) or ``stock`` (the
stock ``dgl.nn`` model, no dgl_rsc); ``alloc`` ``kept`` (:func:`dgl_rsc.keep_freed_memory`,
set before each of the variant's epochs, or once when every variant has the same) or
``default`` (glibc's settings, restored likewise, which trims the heap);
``cache`` ``on`` or ``off`` (the drop-in layers' input aggregation reused,
:func:`dgl_rsc.nn.cache_input_aggregation`); ``fused`` ``on`` or ``off`` (GCN/SAGE hidden
layers' one-pass epilogue, :mod:`dgl_rsc.models.fused`); ``engine`` ``auto``, ``dgl`` or
``numba`` (the exact CPU products' engine, :mod:`dgl_rsc.sparse.engine_pick`); ``narrow``
``on`` or ``off`` (a classifier's narrow weight product padded, :mod:`dgl_rsc.backends.narrow_mm`,
in the fused path); ``order`` ``none``, ``degree`` or ``rcm`` (``train.node_order``: the
variant trains on the graph renumbered once, :mod:`dgl_rsc.data.reorder`; each order is
prepared once and shared by the variants that name it); and any ``rsc.KEY=VALUE`` of the
config (the variant's controller only, e.g. ``rsc.min_width=1``). The variants
take turns one epoch at a time, the order rotating each round, so that each round sees about
the same machine load; per variant the median and mean epoch, minor page faults per epoch,
and the ratio to the first variant.

Toggling the allocator per epoch distorts it (restoring the default trims the heap, so the
next kept epoch faults its pages in again): ``--alloc-blocks N`` times every variant under
both settings instead, switching all of them every ``N`` rounds and leaving the first round
after each switch untimed.

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

from dgl_rsc.backends import narrow_mm
from dgl_rsc.base.memory import keep_freed_memory, peak_rss_bytes
from dgl_rsc.data.reorder import NODE_ORDERS
from dgl_rsc.dgl.nn.input_cache import cache_input_aggregation, input_cache_counts
from dgl_rsc.launcher.train import _PATCHES, _setup, _train_step, prepare
from dgl_rsc.launcher.yaml_io import load_config
from dgl_rsc.models.engines import get_engine
from dgl_rsc.sparse import engine_pick

CHOICES = {"method": ("exact", "rsc", "stock"), "alloc": ("kept", "default"),
           "cache": ("on", "off"), "fused": ("on", "off"),
           "engine": ("auto", "dgl", "numba"), "narrow": ("on", "off"),
           "order": tuple(NODE_ORDERS)}  # fmt: skip


def parse(text: str) -> tuple:
    name, _, rest = text.partition(":")
    opts = {"method": "exact", "alloc": "kept", "cache": "on", "fused": "on", "engine": "auto",
            "narrow": "on", "order": "none"}  # fmt: skip
    opts["rsc"] = []
    for item in filter(None, rest.split(",")):
        k, _, v = item.partition("=")
        if k.startswith("rsc.") and v:
            opts["rsc"].append(item)
            continue
        if k not in CHOICES or v not in CHOICES[k]:
            raise SystemExit(f"--variant {text!r}: {k}={v!r}; choices {CHOICES}")
        opts[k] = v
    return name, opts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument(
        "--variant",
        action="append",
        required=True,
        help="name:method=,alloc=,cache=,fused=,engine=,narrow=,order=,rsc.KEY=",
    )
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--warmup", type=int, default=6, help="rounds not timed")
    p.add_argument("--alloc-blocks", type=int, default=0, help="time every variant with "
                   "glibc's default and with freed blocks kept, switching every N rounds "
                   "(the variants' alloc ignored)")  # fmt: skip
    p.add_argument("--set", dest="sets", action="append", default=[])
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    sets = ["train.checkpoint_every=0", "train.eval_every=1000000",
            "train.keep_freed_memory=false", *args.sets]  # fmt: skip
    variants = dict(parse(v) for v in args.variant)

    def config(o):
        cfg = load_config(args.config, [*sets, f"train.node_order={o['order']}", *o["rsc"]])
        if cfg.rsc is not None:  # RSC in its approximate phase throughout: no switch to exact
            cfg = dataclasses.replace(cfg, rsc=cfg.rsc.replace(total_steps=10**9))
        return cfg

    preps = {}  # node order -> prepared data (the rsc keys do not change it)
    for o in variants.values():
        if o["order"] not in preps:
            preps[o["order"]] = prepare(config(o))
    runs = {}
    for name, o in variants.items():
        torch.manual_seed(0)
        cfg, prep = config(o), preps[o["order"]]
        runs[name] = run = _setup(cfg, prep, o["method"])
        cache_input_aggregation(run.model, enabled=o["cache"] == "on")
        if hasattr(run.model, "fused_epilogue"):
            run.model.fused_epilogue = o["fused"] == "on"
    names = list(runs)
    family = get_engine(cfg.train.engine)

    def epoch_ctx(run):
        """The run's context for one epoch: a patch is a one-shot context manager (and
        patches do not nest), so a patched variant opens a fresh one on its controller."""
        if family.patched and run.ctl is not None:
            return _PATCHES[family.family](run.ctl, keep_freed_memory=False)  # set here
        return run.ctx

    if args.alloc_blocks:  # every variant under both settings, block by block
        keys = [(n, a) for n in names for a in ("default", "kept")]
    else:
        keys = [(n, variants[n]["alloc"]) for n in names]
        allocs = {a for _, a in keys}
        if len(allocs) == 1:  # one setting for the whole process: set once, never toggled
            keep_freed_memory(allocs.pop() == "kept")
    times = {k: [] for k in keys}
    faults = {k: [] for k in keys}
    setting = None
    for r in range(args.rounds + args.warmup):
        transition = False
        if args.alloc_blocks:
            want = "kept" if (r // args.alloc_blocks) % 2 else "default"
            transition, setting = want != setting, want
            if transition:  # restoring the default trims the heap; a round after a switch
                keep_freed_memory(want == "kept")  # is not timed
        for name in names[r % len(names) :] + names[: r % len(names)]:
            alloc = setting or variants[name]["alloc"]
            if not args.alloc_blocks and len({a for _, a in keys}) > 1:
                keep_freed_memory(alloc == "kept")  # per epoch: faults of kept overstated
            run = runs[name]
            engine_pick.CPU_ENGINE = variants[name]["engine"]
            narrow_mm.NARROW = 16 if variants[name]["narrow"] == "on" else 0
            with epoch_ctx(run):
                step = _train_step(run, preps[variants[name]["order"]])
            if r >= args.warmup and not transition:
                times[name, alloc].append(step["epoch_s"])
                faults[name, alloc].append(step["minor_faults"])
    first = keys[0]
    med = {k: statistics.median(v) for k, v in times.items()}
    mean = {k: statistics.mean(v) for k, v in times.items()}
    device = next(iter(preps.values())).device
    out = {"machine": machine(device), "command": " ".join(sys.argv), "config": args.config,
           "sets": args.sets, "rounds": args.rounds, "warmup": args.warmup,
           "alloc_blocks": args.alloc_blocks,
           "load_average_1min": os.getloadavg()[0],  # at the end: other jobs running?
           "reference": "/".join(first), "variants": {}}  # fmt: skip
    for k in keys:
        name, alloc = k
        ctl = runs[name].ctl
        label = f"{name}/{alloc}" if args.alloc_blocks else name
        v = out["variants"][label] = {
            **variants[name],
            "alloc": alloc,
            "epochs_timed": len(times[k]),
            "median_epoch_ms": 1e3 * med[k],
            "mean_epoch_ms": 1e3 * mean[k],
            "speedup_vs_reference_median": med[first] / med[k],
            "speedup_vs_reference_mean": mean[first] / mean[k],
            "minor_faults_per_epoch": statistics.median(faults[k]),
            "input_cache": input_cache_counts(runs[name].model),
            "visited_fraction": ctl.stats()["visited_fraction"] if ctl else None,
        }
        if args.alloc_blocks:
            v["speedup_kept_vs_default"] = med[name, "default"] / med[name, "kept"]
        ratio = v["speedup_vs_reference_median"]
        print(f"{label:20s} median {v['median_epoch_ms']:8.1f} ms  x{ratio:.3f}  mean "
              f"{v['mean_epoch_ms']:8.1f} ms  faults/epoch {v['minor_faults_per_epoch']:.0f}",
              flush=True)  # fmt: skip
    out["peak_rss_mb"] = peak_rss_bytes() / 2**20  # the process's, over every variant
    write_json(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
