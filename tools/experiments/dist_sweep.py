"""Distributed training sweep: accuracy, bytes per message kind and exchange timings.

For every config, process count, partition method, halo bit-width and budget it runs the
launcher once (``dgl-rsc run CONFIG --nproc P`` with ``compare: true``: exact and RSC on the
same seeds; ``--nproc 1`` runs the config on one process) and reads from ``results.json``:

- the test metric of exact and RSC (mean and std over seeds, in points);
- bytes per epoch by message kind (``forward_halo``, ``backward_halo``, ``allreduce``), summed
  over ranks (``sent``) and averaged over the training epochs; for RSC over its approximate
  phase only (warm-up and the exact epochs after the switch excluded), for exact over every
  epoch but the first;
- the epoch time (mean over the same epochs) and the exchange's per-phase seconds per epoch
  (posting, central rows, waiting, marginal rows, backward; mean over ranks);
- the bit-width histogram and measured codec error of the halo messages;
- under ``distributed.comm_budget`` (``--comm-budgets``): the halo bytes over the reference
  (mean and worst step) and, per layer and direction, the bytes fraction and the estimated
  and measured relative errors of the messages (``--bits 32``, the default, then leaves the
  widths to the budget; another width pins them).

Example::

    python tools/experiments/dist_sweep.py yaml_configs/cora_gcn.yaml --nproc 4 --budgets 0.1 \\
        --bits 32 8 adaptive --out docs/results/dist_cora.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_common import machine, write_json

KINDS = ("forward_halo", "backward_halo", "allreduce")


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.mean(xs) if xs else None


def _epochs(run: dict, method: str) -> list:
    """The epochs whose traffic and time represent the method: RSC's approximate phase, and
    every epoch but the first (kernel compilation, first-touch allocations) of exact."""
    hist = run["history"]
    if method == "rsc":
        approx = [h for h in hist if h.get("phase") == "approx"]
        return approx or hist
    return hist[1:] or hist


def method_row(res: dict, method: str) -> dict:
    runs = [r for r in res["runs"] if r["method"] == method]
    if not runs:
        return {}
    s = res["summary"][method]
    epochs = [h for r in runs for h in _epochs(r, method)]
    out = {
        "test_mean": 100 * s["test_mean"], "test_std": 100 * s["test_std"],
        "seeds": s["seeds"], "epoch_ms": 1e3 * _mean(h["epoch_s"] for h in epochs),
    }  # fmt: skip
    traffic = [h["dist"] for h in epochs if h.get("dist")]
    if traffic:
        for kind in KINDS:
            per_epoch = [sum(rank[kind]["sent"] for rank in t["bytes"]) for t in traffic]
            out[f"{kind}_bytes"] = statistics.mean(per_epoch)
        out["halo_bytes"] = out["forward_halo_bytes"] + out["backward_halo_bytes"]
        phases = sorted(traffic[0]["timings"][0])
        out["timings_ms"] = {
            p: 1e3 * statistics.mean(statistics.mean(rank[p] for rank in t["timings"])
                                     for t in traffic)
            for p in phases
        }  # fmt: skip
    reports = [r.get("distributed") for r in runs if r.get("distributed")]
    if reports:
        out["bits"] = {d: reports[0][f"{d}_bits"] for d in ("forward", "backward")}
        budgets = [d["comm_budget"] for d in reports if d.get("comm_budget")]
        if budgets:
            out["comm_budget"] = {
                "sent_fraction_mean": _mean(b["sent_fraction_mean"] for b in budgets),
                "sent_fraction_max": max(b["sent_fraction_max"] for b in budgets),
                "by_slot": {s: {k: _mean(b["by_slot"][s][k] for b in budgets)
                                for k in ("fraction", "estimated_error", "measured_error")}
                            for s in budgets[0]["by_slot"]},
            }  # fmt: skip
    return out


def run_cell(config, nproc, method, bits, budget, runs_dir, extra, cache=None, label="",
             comm=1.0) -> dict:  # fmt: skip
    name = os.path.splitext(os.path.basename(config))[0]
    tail = (f"-comm{comm}" if comm < 1 else "") + (f"-{label}" if label else "")
    out = os.path.join(runs_dir, f"{name}-p{nproc}-{method}-{bits}b-rsc{budget}{tail}")
    cmd = [sys.executable, "-m", "dgl_rsc", "run", config, "--out", out, "--force",
           "--no-progress", "--set", f"rsc.budget={budget}", "--set", "compare=true",
           "--set", "train.stock_baseline=false"]  # fmt: skip
    if nproc > 1:
        cmd += ["--nproc", str(nproc), "--set", f"distributed.partitions={nproc}",
                "--set", f"distributed.method={method}"]  # fmt: skip
        if comm >= 1 or str(bits) != "32":  # under a byte budget, 32 lets it pick the widths
            cmd += ["--set", f"distributed.halo_bits={bits}"]
        if cache:
            cmd += ["--set", f"distributed.partition_cache={cache}"]
        if comm < 1:
            cmd += ["--set", f"distributed.comm_budget={comm}"]
    cmd += extra
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    with open(os.path.join(out, "results.json"), encoding="utf-8") as f:
        res = json.load(f)
    return {
        "config": config, "label": label, "nproc": nproc, "method": method if nproc > 1 else None,
        "bits": bits if nproc > 1 else None, "budget": budget, "metric": res["metric"],
        "comm_budget": comm if nproc > 1 else None,
        "exact": method_row(res, "exact"), "rsc": method_row(res, "rsc"), "out": out,
    }  # fmt: skip


def _fmt_bytes(x):
    return "-" if x is None else f"{x / 1e6:8.2f}M"


def print_row(row):
    head = (f"{os.path.basename(row['config']):<26} P={row['nproc']} {row['method'] or '-':<7} "
            f"bits={row['bits'] or '-':<8} b={row['budget']} comm={row.get('comm_budget')} "
            f"{row.get('label', '')}")  # fmt: skip
    for m in ("exact", "rsc"):
        r = row[m]
        print(f"{head} {m:<5} test {r['test_mean']:6.2f} ± {r['test_std']:4.2f} "
              f"epoch {r['epoch_ms']:8.1f} ms  fwd {_fmt_bytes(r.get('forward_halo_bytes'))} "
              f"bwd {_fmt_bytes(r.get('backward_halo_bytes'))} "
              f"allreduce {_fmt_bytes(r.get('allreduce_bytes'))}", flush=True)  # fmt: skip


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("configs", nargs="+")
    p.add_argument("--nproc", type=int, nargs="+", default=[4])
    p.add_argument("--methods", nargs="+", default=["metis"])
    p.add_argument("--bits", nargs="+", default=["32"], help="32 16 8 4 2 adaptive")
    p.add_argument("--budgets", type=float, nargs="+", default=[0.1])
    p.add_argument(
        "--comm-budgets",
        type=float,
        nargs="+",
        default=[1.0],
        help="distributed.comm_budget values (1.0: no byte budget)",
    )
    p.add_argument("--set", dest="sets", action="append", default=[], help="extra --set")
    p.add_argument("--runs", default="runs/dist_sweep", help="where the launcher runs write")
    p.add_argument("--partition-cache", default=None, help="partitions shared by the cells")
    p.add_argument("--label", default="", help="names this sweep's rows (e.g. overlap-off)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    extra = [x for s in args.sets for x in ("--set", s)]
    result = {"machine": machine("cpu"), "command": " ".join(sys.argv), "rows": []}
    if os.path.exists(args.out):  # a sweep that was interrupted continues where it stopped
        with open(args.out, encoding="utf-8") as f:
            result["rows"] = json.load(f).get("rows", [])
    done = {(r["config"], r["nproc"], r["method"], r["bits"], r["budget"], r.get("label", ""),
             r.get("comm_budget") or 1.0) for r in result["rows"]}  # fmt: skip
    for config in args.configs:
        for nproc in args.nproc:
            for method in args.methods if nproc > 1 else [None]:
                for bits in args.bits if nproc > 1 else [None]:
                    for b, comm in itertools.product(args.budgets, args.comm_budgets):
                        comm = comm if nproc > 1 else 1.0
                        if (config, nproc, method, bits, b, args.label, comm) in done:
                            continue
                        done.add((config, nproc, method, bits, b, args.label, comm))
                        row = run_cell(config, nproc, method, bits, b, args.runs, extra,
                                       args.partition_cache, args.label, comm)  # fmt: skip
                        result["rows"].append(row)
                        write_json(args.out, result)
                        print_row(row)


if __name__ == "__main__":
    main()
