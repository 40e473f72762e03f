"""RSC's step product with gathered operand rows against the whole operand scaled, in a real run.

A launcher config's RSC run trains for ``--epochs``; every step product of its approximate
phase (the sample's and one remainder group's slices, :mod:`dgl_rsc.sampling.remainder`) is
computed twice, once as the package does it (each slice's operand rows gathered and scaled,
:mod:`dgl_rsc.sparse.compact`) and once with the whole of ``dY`` scaled per slice (as before
2026-11-27, evening), in alternating order, on the same inputs. It prints and writes the
per-call medians and means, their ratio, and whether the two outputs were equal bit for bit
at every call (the training itself continues with the package's output).

    python tools/experiments/step_gather_ab.py yaml_configs/tolokers_gcn.yaml --epochs 30 \\
        --out docs/results/step_gather_ab_tolokers.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_common import machine, write_json

import dgl_rsc.core.slot as slot_module
from dgl_rsc.launcher.train import _setup, _train_step, prepare
from dgl_rsc.launcher.yaml_io import load_config
from dgl_rsc.sparse import compact

MODES = {"gathered": compact.pays, "whole": lambda structure, factor: False}


def _timed_pair(step_product, times: dict, equal: list, gathers: dict):
    """A ``step_product`` that runs both ways (the order alternating) and returns the
    package's result; ``gathers`` counts the operands gathered in each mode."""
    gather = compact.gathered

    def both(*args, **kwargs):
        names = list(MODES) if len(equal) % 2 == 0 else list(MODES)[::-1]
        outs = {}
        try:
            for name in names:
                compact.pays = MODES[name]
                compact.gathered = _counting(gather, gathers, name)
                t = time.perf_counter()
                out = step_product(*args, **kwargs)
                times[name].append(time.perf_counter() - t)
                outs[name] = (out[0].clone(), out[1])
        finally:
            compact.pays, compact.gathered = MODES["gathered"], gather
        equal.append(torch.equal(outs["gathered"][0], outs["whole"][0]))
        return outs["gathered"]

    return both


def _counting(fn, counts: dict, key: str):
    def counted(*args):
        counts[key] += 1
        return fn(*args)

    return counted


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--set", dest="sets", action="append", default=[])
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    cfg = load_config(args.config, ["train.checkpoint_every=0", "train.eval_every=1000000",
                                    *args.sets])  # fmt: skip
    prep = prepare(cfg)
    times, equal, gathers = {k: [] for k in MODES}, [], dict.fromkeys(MODES, 0)
    slot_module.step_product = _timed_pair(slot_module.step_product, times, equal, gathers)
    run = _setup(cfg, prep, "rsc")
    for _ in range(args.epochs):
        with run.ctx:
            _train_step(run, prep)
    if not equal:
        p.error("no step product ran: give more --epochs than the warm-up steps")
    med = {k: 1000 * statistics.median(v) for k, v in times.items()}
    mean = {k: 1000 * statistics.mean(v) for k, v in times.items()}
    command = ["tools/experiments/step_gather_ab.py", *(argv if argv is not None else sys.argv[1:])]
    result = {"machine": machine(prep.device), "command": " ".join(command), "calls": len(equal),
              "bit_equal_every_call": all(equal), "operands_gathered": gathers,
              "median_ms": med, "mean_ms": mean,
              "whole_over_gathered_median": med["whole"] / med["gathered"],
              "cache_bytes": run.ctl.stats()["cache_bytes"]}  # fmt: skip
    write_json(args.out, result)
    print(f"{len(equal)} step products, bit-equal every call: {all(equal)}")
    for k in MODES:
        print(f"  {k:9s} median {med[k]:8.2f} ms  mean {mean[k]:8.2f} ms")
    print(
        f"  whole / gathered (median) {result['whole_over_gathered_median']:.3f}x; "
        f"RSC's cached slices {result['cache_bytes'] / 1e6:.1f} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
