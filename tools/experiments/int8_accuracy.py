"""Accuracy of INT8 training through the launcher: fp32 vs INT8 (round-to-nearest and
stochastic rounding), each with the exact backward and with RSC, on the same seeds.

For every config and precision variant it runs ``dgl-rsc run CONFIG --set train.precision=...
--set compare=true`` (exact and RSC; the stock DGL baseline off) and records the test metric
per seed, mean and std, and the difference in points from fp32 exact training. The targets of
issue 26: INT8 within 0.5 points of fp32, INT8 + RSC within 0.8. Results go to a JSON file,
rewritten after every run (a long sweep can be read while it runs). Epoch times are recorded
but were taken on whatever machine ran this: they are not benchmarks.

Example::

    python tools/experiments/int8_accuracy.py yaml_configs/cora_gcn.yaml --seeds 0 1 2 \\
        --set dataset.path=/data/cora.npz --out docs/results/int8_accuracy.json
    python tools/experiments/int8_accuracy.py --render docs/results/int8_accuracy*.json  # table
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

#: name -> launcher settings (INT8 whatever it measured: this tool measures its accuracy)
VARIANTS = {
    "fp32": ["train.precision=fp32"],
    "int8-nearest": [
        "train.precision=int8",
        "train.int8_rounding=nearest",
        "train.int8_pick=always",
    ],
    "int8-stochastic": [
        "train.precision=int8",
        "train.int8_rounding=stochastic",
        "train.int8_pick=always",
    ],
}


def run(config: str, variant: str, seeds: list, out_dir: str, extra: list) -> dict:
    name = os.path.splitext(os.path.basename(config))[0]
    out = os.path.join(out_dir, f"{name}-{variant}")
    sets = [*VARIANTS[variant], "train.stock_baseline=false", "compare=true",
            f"train.seeds=[{', '.join(map(str, seeds))}]", *extra]  # fmt: skip
    cmd = [sys.executable, "-m", "dgl_rsc", "run", config, "--out", out, "--force",
           "--no-progress"] + [x for s in sets for x in ("--set", s)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    with open(os.path.join(out, "results.json"), encoding="utf-8") as f:
        res = json.load(f)
    rows = {}
    for method in ("exact", "rsc"):
        runs = [r for r in res["runs"] if r["method"] == method]
        tests = [100.0 * r["best"]["test"] for r in runs]
        s = res["summary"][method]
        rows[method] = {
            "test_per_seed": tests,
            "test_mean": 100.0 * s["test_mean"],
            "test_std": 100.0 * s["test_std"],
            "epoch_ms_mean": 1e3 * s["epoch_s_mean"],
            "precision": runs[0].get("precision"),
        }
    return {"config": config, "variant": variant, "metric": res["metric"], "seeds": seeds,
            "out": out, **rows}  # fmt: skip


def deltas(result: dict) -> None:
    """Add, per config, each row's difference from fp32 exact (points) and the targets."""
    base = {r["config"]: r["exact"]["test_mean"] for r in result["rows"] if r["variant"] == "fp32"}
    for r in result["rows"]:
        ref = base.get(r["config"])
        if ref is None:
            continue
        r["delta_exact"] = r["exact"]["test_mean"] - ref
        r["delta_rsc"] = r["rsc"]["test_mean"] - ref
        if r["variant"] != "fp32":
            r["meets_int8_target"] = r["delta_exact"] >= -0.5
            r["meets_int8_rsc_target"] = r["delta_rsc"] >= -0.8


def render(paths: list) -> str:
    """A markdown table of the rows of the result files ``paths`` (test metric in %); the
    differences are from the fp32 exact row of the same config and seeds in any file."""
    rows = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            rows += json.load(f)["rows"]
    key = lambda r: (r["config"], tuple(r["seeds"]))  # noqa: E731
    base = {key(r): r["exact"]["test_mean"] for r in rows if r["variant"] == "fp32"}
    lines = ["| config | precision | seeds | exact | RSC | exact - fp32 exact | "
             "RSC - fp32 exact |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        e, q, ref = r["exact"], r["rsc"], base.get(key(r))
        d_e = "n/a" if ref is None else f"{e['test_mean'] - ref:+.2f}"
        d_r = "n/a" if ref is None else f"{q['test_mean'] - ref:+.2f}"
        lines.append(
            f"| {os.path.basename(r['config'])} | {r['variant']} | "
            f"{','.join(map(str, r['seeds']))} | {e['test_mean']:.2f} ± {e['test_std']:.2f} | "
            f"{q['test_mean']:.2f} ± {q['test_std']:.2f} | {d_e} | {d_r} |"
        )
    return "\n".join(lines)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--render":
        print(render(sys.argv[2:]))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("configs", nargs="+")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--set", dest="sets", action="append", default=[],
                   help="extra launcher --set; STEM:key=value for config STEM only")  # fmt: skip
    p.add_argument("--runs", default="runs/int8", help="where the launcher runs write")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    result = {"machine": machine("cpu"), "command": " ".join(sys.argv), "rows": []}
    for config in args.configs:
        stem = os.path.splitext(os.path.basename(config))[0]
        extra = [s.split(":", 1)[1] if ":" in s.split("=")[0] else s for s in args.sets
                 if ":" not in s.split("=")[0] or s.split(":", 1)[0] == stem]  # fmt: skip
        for variant in args.variants:
            row = run(config, variant, args.seeds, args.runs, extra)
            result["rows"].append(row)
            deltas(result)
            write_json(args.out, result)
            e, r = row["exact"], row["rsc"]
            print(f"{stem:<20} {variant:<16} exact {e['test_mean']:.2f} ± {e['test_std']:.2f}  "
                  f"rsc {r['test_mean']:.2f} ± {r['test_std']:.2f}  "
                  f"(per seed {statistics.mean(e['test_per_seed']):.2f})", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
