"""Measured distributed epochs for the cost model (``comm_model.py fit``): launcher runs of
each config at each process count, in rounds (every cell once per round, the order reversed
every other round, so the machine's drift and other jobs' load fall on every cell alike).

Each cell is one ``dgl-rsc run CONFIG --nproc P`` (``--nproc 1`` included: one process on
the distributed path, so its epoch is the same code without exchanges) with ``compare: true``
(exact and RSC on one seed). From its ``results.json`` the record keeps, per method:

- ``epoch_s``: every epoch's seconds (RSC: its approximate phase; exact: all but the first);
- ``per_rank``: per rank, the mean per epoch of bytes sent and received and messages by kind;
- ``nnz_fraction``: the share of the exact backward's non-zeros visited;
- ``cpu_s``: per rank, each epoch's CPU seconds of the process (its work, waits excluded);
- the partition's quality (nodes, local edges, halo nodes per rank), the model's widths
  (:func:`dgl_rsc.distributed.traffic.model_shape`) and the load average around the run.

Example::

    python tools/experiments/dist_calibrate.py yaml_configs/cora_gcn.yaml --nproc 1 2 4 \\
        --rounds 2 --set train.epochs=30 --out docs/results/dist_calibration.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_common import machine, write_json

KINDS = ("forward_halo", "backward_halo", "allreduce", "control")


def _epochs(run: dict) -> list:
    """RSC's approximate epochs, or every epoch but the first (exact)."""
    hist = run["history"]
    if run["method"] == "rsc":
        return [h for h in hist if h.get("phase") == "approx"] or hist
    return hist[1:] or hist


def method_record(run: dict) -> dict:
    """What the model needs of one run (see the module docstring)."""
    epochs = _epochs(run)
    out = {"epoch_s": [h["epoch_s"] for h in epochs],
           "nnz_fraction": statistics.mean(h["nnz_fraction"] for h in epochs)}  # fmt: skip
    traffic = [h["dist"] for h in epochs if h.get("dist")]
    if traffic:
        ranks = len(traffic[0]["bytes"])
        out["per_rank"] = [
            {k: {f: statistics.mean(t["bytes"][r][k][f] for t in traffic)
                 for f in ("sent", "received", "messages")} for k in KINDS}
            for r in range(ranks)
        ]  # fmt: skip
        if "process_cpu" in traffic[0]["timings"][0]:
            out["cpu_s"] = [[t["timings"][r]["process_cpu"] for t in traffic]
                            for r in range(ranks)]  # fmt: skip
    dist = run.get("distributed") or {}
    if dist:
        out["bits"] = {d: dist[f"{d}_bits"].get("spec") for d in ("forward", "backward")}
    return out


def run_cell(config, nproc, bits, sets, runs_dir, label) -> dict:
    """One launcher run; its record (raises SystemExit with the launcher's error)."""
    name = os.path.splitext(os.path.basename(config))[0]
    out = os.path.join(runs_dir, f"{name}-p{nproc}-{bits}b-{label}")
    cmd = [
        sys.executable,
        "-m",
        "dgl_rsc",
        "run",
        config,
        "--out",
        out,
        "--force",
        "--no-progress",
        "--nproc",
        str(nproc),
        "--set",
        "compare=true",
        "--set",
        "train.stock_baseline=false",
        "--set",
        f"distributed.halo_bits={bits}",
    ]
    for s in sets:
        cmd += ["--set", s]  # fmt: skip
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    with open(os.path.join(out, "results.json"), encoding="utf-8") as f:
        res = json.load(f)
    runs = {r["method"]: r for r in res["runs"]}
    first = next(iter(runs.values()))
    quality = first["distributed"]["partition"]["quality"]
    model = res["config"]["model"]
    return {
        "config": config, "nproc": nproc, "bits": bits, "label": label, "sets": sets,
        "num_nodes": quality["num_nodes"], "num_edges": quality["num_edges"],
        "nodes": quality["nodes"], "edges": quality["edges"],
        "halo_nodes": quality["halo_nodes"], "model": model,
        "threads": res["config"]["train"]["threads"],
        "feat_dim": res["config"]["dataset"].get("feat_dim"),
        "load_before": load, "load_after": os.getloadavg()[0],
        "wall_s": time.perf_counter() - t0,
        "methods": {m: method_record(r) for m, r in runs.items()},
    }  # fmt: skip


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("configs", nargs="+")
    p.add_argument("--nproc", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--bits", nargs="+", default=["32"], help="halo widths (32 8 ...)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--set", dest="sets", action="append", default=[], help="extra --set")
    p.add_argument("--runs", default="runs/dist_calibrate", help="where the runs write")
    p.add_argument("--tag", default="", help="names this batch's cells (resuming skips them)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    result = {"machine": machine("cpu"), "command": " ".join(sys.argv), "cells": []}
    if os.path.exists(args.out):  # an interrupted batch continues; other batches are kept
        with open(args.out, encoding="utf-8") as f:
            old = json.load(f)
        result["cells"] = old.get("cells", [])
        result["command"] = old.get("command", "") + " ; " + result["command"]
    done = {(c["config"], c["nproc"], str(c["bits"]), c["label"]) for c in result["cells"]}
    grid = [(c, n, b) for c in args.configs for n in args.nproc for b in args.bits
            if n > 1 or b == args.bits[0]]  # fmt: skip
    for r in range(args.rounds):
        label = f"{args.tag}r{r}"
        for config, nproc, bits in grid if r % 2 == 0 else grid[::-1]:
            if (config, nproc, str(bits), label) in done:
                continue
            cell = run_cell(config, nproc, bits, args.sets, args.runs, label)
            result["cells"].append(cell)
            write_json(args.out, result)
            ex = cell["methods"].get("exact", {})
            print(f"{label} {os.path.basename(config)} P={nproc} bits={bits}: exact epoch "
                  f"{1e3 * statistics.median(ex.get('epoch_s') or [0]):.0f} ms, load "
                  f"{cell['load_before']:.1f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
