"""Accuracy parity of RSC against exact training, and the switch to exact, through the launcher.

For every config and budget it runs ``dgl-rsc run CONFIG --set rsc.budget=B`` (exact and RSC
on the same seeds; the stock DGL baseline off: this measures accuracy, not time) and reports
the test metric (mean and std over seeds) of both, their difference in points, and the jump of
the training loss at the switch to exact: the largest loss in the 3 epochs after the switch
over the mean loss of the 3 epochs before (1.0 = no jump). It reports the time to accuracy
too, as the launcher computes it (:func:`dgl_rsc.launcher.tta.time_to_accuracy`, the
``report`` section: ``--set report.tta_tolerance=...``): the training time, evaluation
excluded, until validation first reaches exact's best validation of the seed minus the
tolerance, for both methods, and exact's time over RSC's (``null`` with ``rsc_tta_status:
"not reached"`` when RSC never gets there). Results go to a JSON file.

Example::

    python tools/experiments/accuracy_parity.py yaml_configs/cora_gcn.yaml --budgets 0.1 0.3 \\
        --out docs/results/parity_cora.json
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


def switch_jump(history: list, switch_epoch: int) -> float:
    before = [h["loss"] for h in history if switch_epoch - 3 <= h["epoch"] < switch_epoch]
    after = [h["loss"] for h in history if switch_epoch <= h["epoch"] < switch_epoch + 3]
    if not before or not after:
        return float("nan")
    return max(after) / statistics.mean(before)


def run(config: str, budget: float, out_dir: str, extra: list) -> dict:
    out = os.path.join(out_dir, f"{os.path.splitext(os.path.basename(config))[0]}-b{budget}")
    cmd = [sys.executable, "-m", "dgl_rsc", "run", config, "--out", out, "--force",
           "--no-progress", "--set", f"rsc.budget={budget}", "--set",
           "train.stock_baseline=false", "--set", "compare=true", *extra]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    with open(os.path.join(out, "results.json"), encoding="utf-8") as f:
        res = json.load(f)
    scale = 100.0
    s = res["summary"]
    epochs = res["config"]["train"]["epochs"]
    switch = int(res["config"]["rsc"]["switch_at"] * epochs) + 1  # first exact epoch
    jumps = [switch_jump(r["history"], switch) for r in res["runs"] if r["method"] == "rsc"]
    ref = [switch_jump(r["history"], switch) for r in res["runs"] if r["method"] == "exact"]
    return {
        "config": config, "budget": budget, "metric": res["metric"],
        "seeds": s["rsc"]["seeds"],
        "exact_mean": s["exact"]["test_mean"] * scale, "exact_std": s["exact"]["test_std"] * scale,
        "rsc_mean": s["rsc"]["test_mean"] * scale, "rsc_std": s["rsc"]["test_std"] * scale,
        "delta": (s["rsc"]["test_mean"] - s["exact"]["test_mean"]) * scale,
        "switch_epoch": switch, "loss_jump_rsc": max(jumps), "loss_jump_exact": max(ref),
        "nnz_fraction": s["rsc"]["nnz_fraction"],
        "epoch_ms_exact": s["exact"]["epoch_s_mean"] * 1e3,
        "epoch_ms_rsc": s["rsc"]["epoch_s_mean"] * 1e3,
        **tta_fields(s), "out": out,
    }  # fmt: skip


def tta_fields(summary: dict) -> dict:
    """Time to accuracy of exact and RSC from the launcher's summary (its definition)."""
    out = {"tta_target": summary["rsc"]["tta_target"], "tta_speedup": summary["rsc"]["tta_speedup"]}
    for m in ("exact", "rsc"):
        s = summary[m]
        out.update({f"{m}_tta_s": s["time_to_target_s"],
                    f"{m}_tta_epoch": s["time_to_target_epoch"],
                    f"{m}_tta_status": s["tta_status"]})  # fmt: skip
    return out


def tta_text(row: dict) -> str:
    """``tta exact 12.3 s @60, rsc 10.1 s @58 (1.22x)``, or what was not reached."""
    cells = []
    for m in ("exact", "rsc"):
        t = row[f"{m}_tta_s"]
        cells.append(f"{m} {t:.1f} s @{row[f'{m}_tta_epoch']:.0f}" if t is not None
                     else f"{m} {row[f'{m}_tta_status']}")  # fmt: skip
    speed = f" ({row['tta_speedup']:.2f}x)" if row["tta_speedup"] is not None else ""
    return "tta " + ", ".join(cells) + speed


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("configs", nargs="+")
    p.add_argument("--budgets", type=float, nargs="+", default=[0.1])
    p.add_argument("--set", dest="sets", action="append", default=[], help="extra --set")
    p.add_argument("--runs", default="runs/parity", help="where the launcher runs write")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    extra = [x for s in args.sets for x in ("--set", s)]
    result = {"machine": machine("cpu"), "command": " ".join(sys.argv), "rows": []}
    for config in args.configs:
        for b in args.budgets:
            row = run(config, b, args.runs, extra)
            result["rows"].append(row)
            write_json(args.out, result)
            print(f"{os.path.basename(config):<24} b={b:<5} exact {row['exact_mean']:.2f} ± "
                  f"{row['exact_std']:.2f}  rsc {row['rsc_mean']:.2f} ± {row['rsc_std']:.2f}  "
                  f"delta {row['delta']:+.2f}  jump {row['loss_jump_rsc']:.2f} "
                  f"(exact {row['loss_jump_exact']:.2f})  {tta_text(row)}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
