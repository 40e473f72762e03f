"""Where a launcher config's epoch goes: sparse products, dense GEMMs, elementwise work, RSC's
selection, and the rest, for exact and RSC training on one process.

It trains the config's model (the first seed; ``--set`` overrides as in ``dgl-rsc run``) with
the exact backward and with RSC, and profiles one epoch of each with ``torch.profiler`` (for
RSC an epoch of its approximate phase; no evaluation in that epoch). Full-graph and mini-batch
(``train.mode: cluster | saint``) configs alike: a mini-batch epoch is all of its batches. It
prints, per method, the mean epoch time over the approximate-phase epochs and the profiled
epoch's milliseconds per category with the sparse share, and writes them to a JSON file.

Example::

    python tools/profile_run.py yaml_configs/cora_cluster_gcn.yaml --epochs 30 \\
        --out docs/results/profile_cora_cluster.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))

from bench_common import machine, write_json
from bench_cpu_e2e import categorize

from dgl_rsc.launcher.train import prepare, train_one, warm_up
from dgl_rsc.launcher.yaml_io import load_config


def profile_method(cfg, prep, method: str, profile_epoch: int) -> dict:
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    seen = {}

    def on_epoch_end(name, epoch):
        if epoch == profile_epoch - 1:
            prof.start()
        elif epoch == profile_epoch:
            prof.stop()
            seen["profile"] = categorize(prof)

    rec = train_one(cfg, prep, method, cfg.train.seeds[0], progress=False,
                    on_epoch_end=on_epoch_end)  # fmt: skip
    hist = rec["history"]
    timed = [h for h in hist if h["phase"] == "approx"] if method == "rsc" else hist[1:]
    timed = [h for h in timed if h["val"] is None] or timed  # epochs without evaluation
    profile = seen["profile"]
    total = sum(profile.values())
    return {
        "epoch_ms": 1e3 * statistics.mean(h["epoch_s"] for h in timed),
        "profile_ms": profile,
        "sparse_share": profile["sparse"] / total if total else None,
        "test": rec["best"]["test"],
        "graph_hits": hist[-1].get("graph_hits"),
        "cache_hits": (rec["rsc_stats"] or {}).get("cache_hits"),
        "cache_misses": (rec["rsc_stats"] or {}).get("cache_misses"),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("--set", dest="sets", action="append", default=[])
    p.add_argument("--epochs", type=int, default=20, help="epochs per run (shorter than the "
                   "config's: this measures time, not accuracy)")  # fmt: skip
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    sets = [*args.sets, f"train.epochs={args.epochs}", f"train.eval_every={args.epochs}",
            "train.checkpoint_every=0"]  # fmt: skip
    cfg = load_config(args.config, sets)
    prep = prepare(cfg)
    # untimed epochs of both methods first, as the launcher does: the first approximate step
    # loads RSC's kernels (about 0.25 s), which would land in the measured epochs
    warm_up(cfg, prep, [(cfg.train.seeds[0], m) for m in ("exact", "rsc")])
    profile_epoch = max(4, int(0.8 * args.epochs) - 2)  # inside RSC's approximate phase
    out = {"machine": machine("cpu"), "command": " ".join(sys.argv), "config": args.config,
           "mode": cfg.train.mode, "threads": torch.get_num_threads(), "methods": {}}  # fmt: skip
    for method in ("exact", "rsc"):
        row = profile_method(cfg, prep, method, profile_epoch)
        out["methods"][method] = row
        cats = "  ".join(f"{k} {v:.1f}" for k, v in row["profile_ms"].items())
        print(
            f"{os.path.basename(args.config)} {method:<5} epoch {row['epoch_ms']:8.1f} ms  "
            f"sparse share {100 * row['sparse_share']:5.1f}%  [{cats}]",
            flush=True,
        )
    e, r = out["methods"]["exact"], out["methods"]["rsc"]
    out["speedup"] = e["epoch_ms"] / r["epoch_ms"]
    print(f"speedup (exact / rsc epoch): {out['speedup']:.2f}x")
    write_json(args.out, out)


if __name__ == "__main__":
    main()
