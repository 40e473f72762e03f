"""Per-epoch time of several RSC settings against exact, measured interleaved epoch by epoch.

On a shared machine the load changes on the scale of seconds; timing whole runs one after the
other then compares machine states, not settings. Here every setting trains its own model on
the same graph and the settings take turns one epoch at a time, so each round sees about the
same load (the order rotates from round to round, so that none always follows the same
other); the ratio of the per-setting medians is what the setting changes in a typical
epoch, the ratio of the means what it changes over the run (the refresh and tune epochs
included: time ``--rounds`` in multiples of the cache and tune intervals).

    python tools/interleaved_epochs.py yaml_configs/quickstart.yaml --rounds 40 \
        --variant c10: --variant c1:cache_interval=1 --out results/interleaved_qs.json

A variant with ``total_steps`` switches to the exact backward where the schedule says (at
``switch_at`` of it): with the switch inside ``--warmup`` the timed rounds are RSC's exact
phase, e.g. ``--warmup 20 --variant after:total_steps=20``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import time

import torch
from bench_common import parse_variant

from dgl_rsc.core import restrict
from dgl_rsc.core.config import ConfigError
from dgl_rsc.launcher.train import _setup, _train_step, prepare
from dgl_rsc.launcher.yaml_io import load_config


def _rows_fraction(run):
    """Per product, the rows of its incoming gradient computed (``RSCConfig.restrict``)."""
    return None if run.ctl is None else [
        d["backward_rows_fraction"] for d in run.ctl.stats()["layers"]]  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("--variant", action="append", default=[], help="name:key=value,...")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--warmup", type=int, default=12, help="rounds not timed (warm-up, tune)")
    p.add_argument("--set", dest="sets", action="append", default=[],
                   help="base override, e.g. train.device=cuda")  # fmt: skip
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    base = ["train.checkpoint_every=0", "train.eval_every=1000000", *args.sets]
    cfg = load_config(args.config, base)
    variants = {}  # name -> the run's RSC settings, all checked before the graph loads
    unpriced = set()  # variants whose restricted rows the solver does not price
    for text in args.variant or ["default:"]:
        name, sets = parse_variant(text)
        if sets.pop("rsc.row_cost", "on") in ("off", False):
            unpriced.add(name)
        if any(not k.startswith("rsc.") for k in sets):
            p.error(f"--variant {text!r}: only rsc keys vary here (the graph and model are "
                    "shared); give the others with --set")  # fmt: skip
        sets = {k[len("rsc.") :]: v for k, v in sets.items()}
        try:  # never switches to exact here, unless the variant gives total_steps (then the
            # schedule's switch falls where it says: the exact phase after it can be timed)
            variants[name] = cfg.rsc.replace(**{"total_steps": 10**9, **sets})
        except (ConfigError, TypeError) as e:
            p.error(f"--variant {text!r}: {e}")
    prep = prepare(cfg)
    runs = {}
    torch.manual_seed(0)
    runs["exact"] = _setup(cfg, prep, "exact")
    total = args.rounds + args.warmup
    for name, rsc in variants.items():
        torch.manual_seed(0)
        runs[name] = _setup(dataclasses.replace(cfg, rsc=rsc), prep, "rsc")
    times = {k: [] for k in runs}
    names = list(runs)
    priced = restrict.segment_row_work
    for r in range(total):
        # the order rotates every round, so that no setting always runs after the same one
        for name in names[r % len(names) :] + names[: r % len(names)]:
            run = runs[name]
            restrict.segment_row_work = (lambda *a: 0.0) if name in unpriced else priced
            with run.ctx:
                t = _train_step(run, prep)["epoch_s"]
            if r >= args.warmup:
                times[name].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    mean = {k: statistics.mean(v) for k, v in times.items()}
    result = {"config": args.config, "sets": args.sets, "machine": platform.node(),
              "date": time.strftime("%F %T"), "device": str(prep.device),
              "gpu": torch.cuda.get_device_name() if prep.device.type == "cuda" else None,
              "rounds": args.rounds, "variants": args.variant, "median_epoch_s": med,
              "ratio_to_exact": {k: med["exact"] / v for k, v in med.items()},
              "mean_epoch_s": mean,
              "mean_ratio_to_exact": {k: mean["exact"] / v for k, v in mean.items()},
              "visited_fraction": {k: (r.ctl.stats()["visited_fraction"] if r.ctl else None)
                                   for k, r in runs.items()},
              "phase_at_end": {k: (r.ctl.phase() if r.ctl else "exact")
                               for k, r in runs.items()},
              # per product: rows of its incoming gradient computed (RSCConfig.restrict)
              "backward_rows_fraction": {k: _rows_fraction(r)
                                         for k, r in runs.items()}}  # fmt: skip
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    for k in runs:
        print(
            f"{k:10s} median {med[k] * 1000:8.1f} ms  x{result['ratio_to_exact'][k]:.3f}  "
            f"mean {mean[k] * 1000:8.1f} ms  x{result['mean_ratio_to_exact'][k]:.3f}  "
            f"visited {result['visited_fraction'][k]}  phase {result['phase_at_end'][k]}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
