"""Node orders (issue 45, locality; ``train.node_order``) A/B: the exact epoch on the dataset's
order against the same epoch on renumbered nodes, interleaved in blocks in one process.

The dataset is loaded once; each order gets its own prepared graph (``prepare`` with
``train.node_order``, so its one-time cost is the launcher's ``setup_s``) and its own run of
dgl_rsc's exact path (``train.engine`` of the config). All runs share one weight trajectory:
before each block the run whose turn it is takes the model and optimizer state of the run that
trained last, so every order trains the same weights. The orders take turns ``--block``
epochs at a time, the turn order rotating each round; the first ``--warmup`` rounds are not
timed. Per order: median and mean epoch (wall seconds, and the process's CPU seconds, which
another job on a shared machine disturbs less: it does not count the time spent waiting for a
core), the ratio to the first order (above 1: faster), the spread of the per-round ratios,
the one-time cost (as ``prepare`` timed it, and a second call) and the mean ``|src - dst|``
of the renumbered edges (how near neighbours sit).

    python tools/experiments/reorder_ab.py yaml_configs/quickstart.yaml --rounds 40 \\
        --block 1 --warmup 2 --out docs/results/epoch_reorder_quickstart.json
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

from bench_common import machine, write_json

import dgl_rsc.data as data_api
from dgl_rsc.base.memory import peak_rss_bytes
from dgl_rsc.data.reorder import NODE_ORDERS, reorder
from dgl_rsc.launcher.train import _setup, _train_step, prepare
from dgl_rsc.launcher.yaml_io import load_config


def _spread(d) -> float:
    """Mean ``|src - dst|`` over the edges: how far apart neighbours are numbered."""
    return float((d.src - d.dst).abs().double().mean())


def _quartiles(values) -> list:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return [min(values), *q, max(values)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("--orders", default="none,degree,rcm", help="the first is the reference")
    p.add_argument("--rounds", type=int, default=8, help="timed rounds")
    p.add_argument("--block", type=int, default=2, help="epochs per order per round")
    p.add_argument("--warmup", type=int, default=1, help="rounds not timed")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--set", dest="sets", action="append", default=[])
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    orders = args.orders.split(",")
    for o in orders:
        if o not in NODE_ORDERS:
            raise SystemExit(f"--orders: {o!r} is not one of {', '.join(NODE_ORDERS)}")
    sets = ["train.checkpoint_every=0", "train.eval_every=1000000", *args.sets]
    loaded = functools.lru_cache(maxsize=1)(data_api.load_dataset)
    data_api.load_dataset = lambda name, root=None, **kw: loaded(name, root, **kw)  # once
    preps, runs, cost = {}, {}, {}
    for o in orders:
        cfg = load_config(args.config, [*sets, f"train.node_order={o}"])
        preps[o] = prep = prepare(cfg)
        first = prep.__dict__.get("setup_s", {}).get(f"node_order_{o}", 0.0)
        start = time.perf_counter()
        reorder(loaded(cfg.dataset["name"], cfg.dataset["root"], **_params(cfg)), o)
        cost[o] = {"first_s": first, "again_s": time.perf_counter() - start,
                   "edge_spread": _spread(prep.data)}  # fmt: skip
        torch.manual_seed(0)
        runs[o] = _setup(cfg, prep, "exact")
        print(f"{o:8s} prepared: order {first:.2f} s (again {cost[o]['again_s']:.2f} s), "
              f"mean |src - dst| {cost[o]['edge_spread']:.0f}", flush=True)  # fmt: skip
    times = {o: [] for o in orders}
    cpu = {o: [] for o in orders}
    per_round = {o: [] for o in orders}
    cpu_round = {o: [] for o in orders}
    last = None
    for r in range(args.rounds + args.warmup):
        for o in orders[r % len(orders) :] + orders[: r % len(orders)]:
            run = runs[o]
            if last is not None and last is not run:  # one weight trajectory for all orders
                run.model.load_state_dict(last.model.state_dict())
                run.opt.load_state_dict(last.opt.state_dict())
            block, cpu_block = [], []
            with run.ctx:
                for _ in range(args.block):
                    start = time.process_time()
                    block.append(_train_step(run, preps[o])["epoch_s"])
                    cpu_block.append(time.process_time() - start)
            last = run
            if r >= args.warmup:
                times[o].extend(block)
                cpu[o].extend(cpu_block)
                per_round[o].append(statistics.median(block))
                cpu_round[o].append(statistics.median(cpu_block))
    ref = orders[0]
    med = {o: statistics.median(v) for o, v in times.items()}
    cpu_med = {o: statistics.median(v) for o, v in cpu.items()}
    out = {"machine": machine(preps[ref].device), "command": " ".join(sys.argv),
           "config": args.config, "sets": args.sets, "rounds": args.rounds,
           "block": args.block, "warmup": args.warmup, "reference": ref,
           "threads": torch.get_num_threads(),
           "graph": preps[ref].data.summary(),
           "note": "ratios are interleaved",
           "orders": {}}  # fmt: skip
    for o in orders:
        ratios = [a / b for a, b in zip(per_round[ref], per_round[o])]
        cpu_ratios = [a / b for a, b in zip(cpu_round[ref], cpu_round[o])]
        v = out["orders"][o] = {
            "epochs_timed": len(times[o]),
            "median_epoch_ms": 1e3 * med[o],
            "mean_epoch_ms": 1e3 * statistics.mean(times[o]),
            "speedup_vs_reference_median": med[ref] / med[o],
            "round_ratio_min_q1_median_q3_max": _quartiles(ratios),
            "median_epoch_cpu_ms": 1e3 * cpu_med[o],
            "cpu_speedup_vs_reference_median": cpu_med[ref] / cpu_med[o],
            "cpu_round_ratio_min_q1_median_q3_max": _quartiles(cpu_ratios),
            "order_first_s": cost[o]["first_s"],
            "order_again_s": cost[o]["again_s"],
            "edge_spread": cost[o]["edge_spread"],
        }
        ratio = v["speedup_vs_reference_median"]
        print(f"{o:8s} median {v['median_epoch_ms']:8.1f} ms  x{ratio:.3f}"
              f"  rounds {' '.join(f'{x:.3f}' for x in v['round_ratio_min_q1_median_q3_max'])}"
              f"  cpu x{v['cpu_speedup_vs_reference_median']:.3f}"
              f"  order {v['order_first_s']:.2f} s", flush=True)  # fmt: skip
    out["peak_rss_mb"] = peak_rss_bytes() / 2**20
    write_json(args.out, out)
    return 0


def _params(cfg) -> dict:
    """The loader's parameters of ``cfg.dataset`` (as ``prepare`` passes them)."""
    return {k: v for k, v in cfg.dataset.items() if k not in ("name", "root")}


if __name__ == "__main__":
    sys.exit(main())
