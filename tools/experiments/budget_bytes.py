"""Halo bytes of launcher runs under ``distributed.comm_budget`` against an exact fp32 1D run.

Reads the ``results.json`` of one reference run directory (exact fp32 1D: ``comm_budget`` 1.0,
32-bit halos) and of the budgeted runs, and writes, per run and method:

- the halo bytes per epoch summed over ranks, forward and backward (mean and the largest
  epoch), and their ratios to the reference's: total, forward, backward;
- the budget's own report: its fraction, the worst step's bytes over its reference, and per
  layer and direction the bytes fraction with the estimated and measured relative errors;
- the test metric of every seed (best validation epoch's test, as the launcher reports it)
  and the number of epochs run.

Example::

    python tools/experiments/budget_bytes.py --reference runs/b200k_exact \\
        --runs runs/b200k_b02 --label "RSC, comm_budget 0.2" --run-commands "..." \\
        --out docs/results/dist_budget_200k.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_common import machine, write_json


def _load(run_dir: str) -> dict:
    with open(os.path.join(run_dir, "results.json"), encoding="utf-8") as f:
        return json.load(f)


def halo_per_epoch(run: dict) -> dict:
    """Forward and backward halo bytes of each epoch, summed over ranks."""
    out = {"forward": [], "backward": []}
    for h in run["history"]:
        ranks = h["dist"]["bytes"]
        out["forward"].append(sum(r["forward_halo"]["sent"] for r in ranks))
        out["backward"].append(sum(r["backward_halo"]["sent"] for r in ranks))
    return out


def summarize(run_dir: str, ref: Optional[dict] = None) -> list:
    res = _load(run_dir)
    rows = []
    for run in res["runs"]:
        b = halo_per_epoch(run)
        total = [f + k for f, k in zip(b["forward"], b["backward"])]
        row = {"dir": run_dir, "method": run["method"], "seed": run["seed"],
               "epochs": len(run["history"]), "test": run["best"]["test"],
               "final_test": run["final"]["test"],
               "epoch_s": statistics.mean(h["epoch_s"] for h in run["history"]),
               "forward_bytes": statistics.mean(b["forward"]),
               "backward_bytes": statistics.mean(b["backward"]),
               "halo_bytes": statistics.mean(total), "halo_bytes_max": max(total),
               "config": res["config"]["distributed"]}  # fmt: skip
        if ref:
            row["vs_exact"] = {
                "halo": row["halo_bytes"] / ref["halo_bytes"],
                "halo_worst_epoch": row["halo_bytes_max"] / ref["halo_bytes"],
                "forward": row["forward_bytes"] / ref["forward_bytes"],
                "backward": row["backward_bytes"] / ref["backward_bytes"],
            }
        cb = (run.get("distributed") or {}).get("comm_budget")
        if cb:
            row["comm_budget"] = {k: cb[k] for k in ("fraction", "sent_fraction_mean",
                                                     "sent_fraction_max", "by_slot",
                                                     "over_budget")}  # fmt: skip
            row["comm_budget"]["last_solve"] = [r["last_solve"] for r in cb["ranks"]]
        rows.append(row)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reference", required=True, help="the exact fp32 1D run's directory")
    p.add_argument("--runs", nargs="+", default=[], help="budgeted runs' directories")
    p.add_argument("--label", nargs="*", default=[], help="a name per --runs directory")
    p.add_argument("--run-commands", default="", help="the commands that made the runs")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    ref_rows = summarize(args.reference)
    ref = {k: statistics.mean(r[k] for r in ref_rows)
           for k in ("forward_bytes", "backward_bytes", "halo_bytes")}  # fmt: skip
    labels = dict(zip(args.runs, args.label))
    rows = [{**r, "label": labels.get(d, d)} for d in args.runs for r in summarize(d, ref)]
    write_json(args.out, {"machine": machine("cpu"), "command": " ".join(sys.argv),
                          "run_commands": args.run_commands,
                          "reference": {**ref, "runs": ref_rows}, "rows": rows})  # fmt: skip
    for r in rows:
        v = r.get("vs_exact", {})
        mb = r["halo_bytes"] / 1e6
        print(f"{r['dir']} {r['method']} seed {r['seed']}: halo {mb:.1f} MB/epoch "
              f"({v.get('halo', 0):.3f} of exact, backward {v.get('backward', 0):.3f}), "
              f"test {r['test']}")  # fmt: skip


if __name__ == "__main__":
    main()
