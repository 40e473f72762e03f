"""Time to accuracy of RSC variants against exact training, in one process on one graph.

Each variant is a set of ``rsc.*`` (or ``train.*``) overrides of one config; every variant and
the exact baseline train with the same seeds on the same prepared data, evaluating every
epoch (evaluation is not training time). Per run it records the per-epoch training loss,
validation metric and cumulative training seconds; per variant the epoch and training time at
which validation first reaches the exact run's best minus ``--tolerance`` points, and the
speedup over exact in time and in epochs. Before the first seed each method trains
``--warmup-epochs`` untimed epochs, so that no timed run pays the process's one-off costs
(DGL's first call, Numba's start: 0.3-0.8 s on the 2-core VM, which the first run of the
process paid before; :func:`dgl_rsc.launcher.train.warm_up`, as the launcher does: with
``--exact-only`` nothing is compared and nothing warms up).

    python tools/experiments/tta_sweep.py yaml_configs/quickstart.yaml --seeds 0 1 \
        --variant default: --variant topk:rule=topk,rescale=none --out results/tta_qs.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_common import machine, parse_variant

from dgl_rsc.base.atomic import atomic_write
from dgl_rsc.launcher.schema import resolve
from dgl_rsc.launcher.train import prepare, train_one, warm_up
from dgl_rsc.launcher.tta import first_crossing
from dgl_rsc.launcher.yaml_io import apply_overrides, load_yaml
from dgl_rsc.sparse import products


def _config(path: str, sets: dict, base_sets: list):
    raw = apply_overrides(load_yaml(path), base_sets)
    raw = apply_overrides(raw, [f"{k}={json.dumps(v)}" for k, v in sets.items()])
    return resolve(raw)


KEEP = ("epoch", "loss", "val", "test", "epoch_s", "nnz_fraction", "phase")
STATS = ("visited_fraction", "guard", "budgets")


def _summary(rec: dict) -> dict:
    """A run record cut to what the sweep reports."""
    stats = rec["rsc_stats"] or {}
    return {
        "history": [{k: h[k] for k in KEEP} for h in rec["history"]],
        "best": rec["best"],
        "rsc_stats": {k: stats[k] for k in STATS if k in stats},
    }


def _device_name(device: torch.device) -> str:
    """``"cpu"`` or the CUDA device's name (the machine a sweep's times come from)."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _write(path: str, result: dict) -> None:
    """Write ``result`` after every run, atomically, so that a long sweep cut short loses
    nothing it finished."""
    atomic_write(path, lambda f: json.dump(result, f), mode="w")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("--variant", action="append", default=[], help="name:key=value,...")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--set", action="append", default=[], dest="sets", help="base override")
    p.add_argument("--tolerance", type=float, default=0.3, help="points below exact's best")
    p.add_argument("--eval-every", type=int, default=1)
    p.add_argument(
        "--exact-only",
        action="store_true",
        help="train only the exact baseline (to tune a preset's difficulty)",
    )
    p.add_argument(
        "--warmup-epochs",
        type=int,
        default=12,
        help="untimed epochs of each method before the first seed (0: none), so that the "
        "process's one-off costs (DGL's first call, Numba's start) fall in no timed run",
    )
    p.add_argument(
        "--cusparse",
        action="store_true",
        help="CUDA products on cuSPARSE instead of dgl_rsc's kernel (an A/B of the kernel)",
    )
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    products.CUDA_KERNEL = not args.cusparse
    base = [*args.sets, f"train.eval_every={args.eval_every}", "train.checkpoint_every=0"]
    cfg0 = _config(args.config, {}, base)
    prep = prepare(cfg0)
    variants = [parse_variant(v) for v in args.variant] or [("default", {})]
    variants = [] if args.exact_only else variants
    result = {"config": args.config, "sets": base, "seeds": args.seeds,
              "tolerance": args.tolerance, "machine": platform.node(),
              "date": time.strftime("%Y-%m-%d"), "threads": os.cpu_count(),
              "device": _device_name(prep.device), "torch": torch.__version__,
              "warmup_epochs": args.warmup_epochs if variants else 0,
              "cuda_products": "cusparse" if args.cusparse else "dgl_rsc kernel",
              "environment": machine(prep.device), "runs": {}}  # fmt: skip
    methods = ["exact"] + (["rsc"] if variants else [])
    warm = _config(args.config, {}, [*base, f"train.warmup_epochs={args.warmup_epochs}"])
    warm_up(warm, prep, [(args.seeds[0], m) for m in methods])  # as the launcher does
    for seed in args.seeds:
        exact = _summary(train_one(cfg0, prep, "exact", seed, progress=False))
        result["runs"][f"exact-seed{seed}"] = exact
        _write(args.out, result)
        target = exact["best"]["val"] - args.tolerance / 100
        e_cross = first_crossing(exact["history"], target)
        line = [f"seed {seed} target {target:.4f} exact@{e_cross} test {exact['best']['test']}"]
        for name, sets in variants:
            cfg = _config(args.config, sets, base)
            rec = _summary(train_one(cfg, prep, "rsc", seed, progress=False))
            cross = first_crossing(rec["history"], target)
            rec["tta"] = cross
            if cross and e_cross:
                rec["tta_speedup"] = e_cross["time_s"] / cross["time_s"]
            result["runs"][f"{name}-seed{seed}"] = rec
            line.append(f"{name}@{cross} x{rec.get('tta_speedup')}")
            _write(args.out, result)
        print(" | ".join(str(x) for x in line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
