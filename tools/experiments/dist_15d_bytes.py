"""Measured bytes per rank and message kind of 1D and 1.5D training, for the cost model.

For every config and replication ``c`` it runs the launcher once on ``--nproc P`` processes
(``c = 1``: ``distributed.algorithm: 1d``; ``c > 1``: ``1.5d`` with ``replication: c``),
exact and RSC on the same seed, and reads from ``results.json``, per rank and message kind
(``forward_halo``, ``backward_halo``, ``replica_reduce``, ``replica_grad``, ``allreduce``,
``control``), the bytes sent and received and the messages per training epoch: the mean over
exact's epochs but the first, and over RSC's approximate phase (``rsc.switch_at`` is set to
1.0, so every epoch after the warm-up is approximate). Evaluation runs once, after the last
epoch, so no epoch record holds its bytes. Beside the bytes, each rank's plan: its rows, its
halo rows received and rows sent per product, its local edges (what the model's formulas take).

Example::

    python tools/experiments/dist_15d_bytes.py yaml_configs/quickstart.yaml --nproc 4 \\
        --replication 1 2 --epochs 5 --out docs/results/dist_15d_bytes.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_common import machine, write_json

KINDS = ("forward_halo", "backward_halo", "replica_reduce", "replica_grad", "allreduce",
         "control")  # fmt: skip
FIELDS = ("sent", "received", "messages")


def _epochs(run: dict) -> list:
    """The training epochs whose traffic represents the method (see the module docstring)."""
    hist = run["history"]
    if run["method"] == "rsc":
        return [h for h in hist if h.get("phase") == "approx"] or hist[1:] or hist
    return hist[1:] or hist


def method_bytes(run: dict) -> dict:
    """Per rank ``{kind: {sent, received, messages}}`` means per epoch, their sums over
    ranks, the epochs counted, the epoch time and the test metric."""
    epochs = _epochs(run)
    ranks = range(len(epochs[0]["dist"]["bytes"]))
    per_rank = [{k: {f: statistics.mean(h["dist"]["bytes"][r][k][f] for h in epochs)
                     for f in FIELDS} for k in KINDS} for r in ranks]  # fmt: skip
    return {
        "epochs": [h["epoch"] for h in epochs],
        "epoch_ms": 1e3 * statistics.mean(h["epoch_s"] for h in epochs),
        "per_rank": per_rank,
        "all_ranks_sent": {k: sum(p[k]["sent"] for p in per_rank) for k in KINDS},
        "test": run["final"]["test"],
        "replica_bits": run["distributed"].get("replica_bits"),
    }


def plan_rows(out: str, config: dict, nproc: int, c: int) -> list:
    """Each rank's plan, from the partition the run cached (the graph loaded again here)."""
    import torch

    from dgl_rsc.data import load_dataset
    from dgl_rsc.distributed.grid import ProcessGrid
    from dgl_rsc.distributed.partition import load_or_partition
    from dgl_rsc.distributed.plan15d import block_plans
    from dgl_rsc.models.paper import MODELS

    d = config["dataset"]
    data = load_dataset(d["name"], root=d.get("root"),
                        **{k: v for k, v in d.items() if k not in ("name", "root")})  # fmt: skip
    src, dst, n = data.src, data.dst, int(data.num_nodes)
    if MODELS[config["model"]["name"]].SELF_LOOPS:
        loops = torch.arange(n, dtype=src.dtype)
        src, dst = torch.cat([src, loops]), torch.cat([dst, loops])
    grid = ProcessGrid(nproc, c)
    dist = config["distributed"]
    cache = dist["partition_cache"] or os.path.join(out, "partitions")
    part, _, _ = load_or_partition(src, dst, n, grid.blocks, dist["method"], dist["seed"], cache)
    return [{"rank": p.rank, "rows": p.n_own, "halo_rows": p.n_halo,
             "sent_rows": sum(p.send_counts), "local_edges": int(p.local_src.numel())}
            for p in block_plans(src, dst, n, part, grid)]  # fmt: skip


def run_cell(config: str, nproc: int, c: int, epochs: int, runs: str, extra: list) -> dict:
    name = os.path.splitext(os.path.basename(config))[0]
    out = os.path.join(runs, f"{name}-p{nproc}-c{c}")
    algo = "1d" if c == 1 else "1.5d"
    cmd = [sys.executable, "-m", "dgl_rsc", "run", config, "--out", out, "--force",
           "--no-progress", "--nproc", str(nproc), "--set", f"distributed.algorithm={algo}",
           "--set", f"distributed.replication={c}", "--set", f"train.epochs={epochs}",
           "--set", f"train.eval_every={epochs}", "--set", "rsc.switch_at=1.0",
           "--set", "compare=true", "--set", "train.stock_baseline=false", *extra]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    with open(os.path.join(out, "results.json"), encoding="utf-8") as f:
        res = json.load(f)
    resolved = res["config"]
    runs_by = {r["method"]: r for r in res["runs"]}
    first = res["runs"][0]["distributed"]
    return {
        "config": config, "nproc": nproc, "replication": c, "algorithm": algo,
        "blocks": first["blocks"], "partition": first["partition"]["quality"],
        "model": resolved["model"], "feat_dim": resolved["dataset"].get("feat_dim"),
        "plan": plan_rows(out, resolved, nproc, c),
        **{m: method_bytes(runs_by[m]) for m in ("exact", "rsc") if m in runs_by},
        "out": out,
    }  # fmt: skip


def print_row(row: dict) -> None:
    head = f"{os.path.basename(row['config']):<24} P={row['nproc']} c={row['replication']}"
    for m in ("exact", "rsc"):
        r = row.get(m)
        if r:
            mb = "  ".join(f"{k} {r['all_ranks_sent'][k] / 1e6:9.3f}M" for k in KINDS[:5])
            print(f"{head} {m:<5} {mb}  epoch {r['epoch_ms']:8.1f} ms", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("configs", nargs="+")
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--replication", type=int, nargs="+", default=[1, 2])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--set", dest="sets", action="append", default=[], help="extra --set")
    p.add_argument("--runs", default="runs/dist_15d_bytes", help="where the launcher runs write")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    extra = [x for s in args.sets for x in ("--set", s)]
    result = {"machine": machine("cpu"), "kinds": list(KINDS), "rows": []}
    if os.path.exists(args.out):  # an interrupted sweep continues where it stopped
        with open(args.out, encoding="utf-8") as f:
            result["rows"] = json.load(f).get("rows", [])
    command = " ".join(sys.argv)
    done = {(r["config"], r["nproc"], r["replication"]) for r in result["rows"]}
    for config in args.configs:
        for c in args.replication:
            if (config, args.nproc, c) in done:
                continue
            row = run_cell(config, args.nproc, c, args.epochs, args.runs, extra)
            row.update(command=command, machine=machine("cpu"))  # each row: when, how
            result["rows"].append(row)
            write_json(args.out, result)
            print_row(row)


if __name__ == "__main__":
    main()
