"""Measured bytes per rank against the cost model's prediction, run by run.

For each launcher run folder (``results.json`` and its ``partitions/``), the exact run's
bytes per training epoch, per rank and message kind (every epoch but the first), are set
beside :func:`dgl_rsc.distributed.traffic.rank_traffic` on the same graph, partition, model and
settings (1D, or 1.5D with ``distributed.replication``). The deviation of a kind is
``|predicted - measured| / measured`` of its bytes sent plus received; the check passes when
every rank's halo and replica kinds are within ``--tolerance`` (10%). ``--from`` reads the
run folders of ``dist_15d_bytes.py``'s or ``dist_calibrate.py``'s JSON.

Example::

    python tools/experiments/comm_bytes_check.py runs/dist_15d_bytes/quickstart-p4-c2 \\
        --out docs/results/comm_bytes_check.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np
import torch
import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_common import machine, write_json

CHECKED = ("forward_halo", "backward_halo", "replica_reduce", "replica_grad", "allreduce")


def _graph_of(config: dict):
    """``(src, dst, n, train_mask, shape)`` as the launcher trained on (self-loops added
    where the model wants them)."""
    from dgl_rsc.distributed.traffic import model_shape
    from dgl_rsc.launcher.cli import load_config
    from dgl_rsc.launcher.prepare import prepare

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "config.yaml")
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(config, f)
        cfg = load_config(path, ["distributed=null", "train.device=cpu"])
    prep = prepare(cfg)
    from dgl_rsc.models.paper import build_model

    m = {k: v for k, v in cfg.model.items() if k != "name"}
    model = build_model(cfg.model["name"], prep.feat.shape[1], int(prep.data.num_classes), **m)
    src, dst, n = prep.edges
    return src, dst, n, prep.data.train_mask, model_shape(model, prep.feat.shape[1])


def _measured(run: dict) -> list:
    hist = run["history"][1:] or run["history"]
    ranks = len(hist[0]["dist"]["bytes"])
    out = []
    for r in range(ranks):
        kinds = hist[0]["dist"]["bytes"][r]
        out.append({k: float(np.mean([h["dist"]["bytes"][r][k]["sent"]
                                      + h["dist"]["bytes"][r][k]["received"] for h in hist]))
                    for k in kinds})  # fmt: skip
    return out


def check_run(folder: str) -> dict:
    """The comparison for one run folder (see the module docstring)."""
    from dgl_rsc.distributed.partition import load_or_partition
    from dgl_rsc.distributed.traffic import rank_traffic

    with open(os.path.join(folder, "results.json"), encoding="utf-8") as f:
        res = json.load(f)
    run = next(r for r in res["runs"] if r["method"] == "exact")
    d = res["config"]["distributed"]
    c = int(d.get("replication") or 1) if d.get("algorithm", "1d") == "1.5d" else 1
    nproc = len(run["history"][0]["dist"]["bytes"])
    src, dst, n, train, shape = _graph_of(res["config"])
    cache = d.get("partition_cache") or os.path.join(folder, "partitions")
    part, _, _ = load_or_partition(src, dst, n, nproc // c, d["method"], d["seed"],
                                   cache if os.path.isdir(cache) else None)  # fmt: skip
    bits = d.get("forward_bits", 32)
    pred = rank_traffic(src, dst, n, part, shape, train, replication=c,
                        bits=bits, backward_bits=d.get("backward_bits", bits))  # fmt: skip
    meas = _measured(run)
    ranks, worst = [], 0.0
    for r, (m, p) in enumerate(zip(meas, pred)):
        row = {"rank": r}
        for kind in CHECKED:
            got = p[kind]["sent"] + p[kind]["received"]
            have = m.get(kind, 0.0)
            dev = abs(got - have) / have if have else (0.0 if got == 0 else float("inf"))
            row[kind] = {"measured": have, "predicted": got, "deviation": dev}
            worst = max(worst, dev)
        ranks.append(row)
    return {"folder": folder, "config": res["config"].get("dataset", {}), "nproc": nproc,
            "replication": c, "bits": bits, "ranks": ranks, "max_deviation": worst}  # fmt: skip


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="*", help="launcher run folders")
    p.add_argument("--from", dest="sweep", help="a dist_15d_bytes.py / dist_calibrate.py JSON")
    p.add_argument("--tolerance", type=float, default=0.10)
    p.add_argument("--out")
    args = p.parse_args(argv)
    folders = list(args.folders)
    if args.sweep:
        with open(args.sweep, encoding="utf-8") as f:
            sweep = json.load(f)
        folders += [r["out"] for r in sweep.get("rows", []) if r.get("out")]
    if not folders:
        p.error("give run folders or --from JSON")
    rows = [check_run(f) for f in folders]
    torch.set_printoptions(precision=3)
    for row in rows:
        print(f"{row['folder']}: P={row['nproc']} c={row['replication']} bits={row['bits']}, "
              f"largest deviation {100 * row['max_deviation']:.2f}%")  # fmt: skip
        for r in row["ranks"]:
            shown = [k for k in CHECKED if r[k]["measured"] or r[k]["predicted"]]
            cells = "  ".join(
                f"{k} {r[k]['measured'] / 1e6:.3f}/{r[k]['predicted'] / 1e6:.3f}M" for k in shown
            )
            print(f"  rank {r['rank']}: {cells} (measured/predicted)")
    ok = all(r["max_deviation"] <= args.tolerance for r in rows)
    print("within" if ok else "NOT within", f"{100 * args.tolerance:.0f}% on every rank and kind")
    if args.out:
        write_json(args.out, {"machine": machine("cpu"), "command": " ".join(sys.argv),
                              "tolerance": args.tolerance, "rows": rows, "ok": ok})  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
