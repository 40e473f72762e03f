"""The distributed epoch's cost model: fitted here on measured runs, then projected to scale.

Each rank's work in one epoch is a sum of counted quantities times fitted rates:

    W_r = fixed + sparse_s * S_r + dense_s * D_r + elem_s * X_r + score_s * R_r
          + codec_s * Q_r + byte_s * B_r + message_s * M_r

``S_r``: edge-values of the sparse products (local edges times the aggregations' widths,
forward; backward those whose input needs a gradient, times RSC's visited fraction);
``D_r``: dense multiply-adds (owned nodes times the model's 2-D weights, three times: forward
and two backward products); ``X_r``: owned nodes times the aggregations' widths (elementwise
passes); ``R_r``: RSC's scoring (owned nodes times the backward widths; RSC runs only);
``Q_r``: values quantized or dequantized (halo values at fewer than 32 bits); ``B_r``: bytes
sent plus received (halo, all-reduce, control); ``M_r``: messages (a ring all-reduce counts
its ``2 (P - 1)`` steps). The epoch is the slowest rank's work or, where the processes
outnumber the cores, the machine's total work over its cores, whichever is larger:
``T = max(max_r W_r, sum_r W_r / cores)`` (``cores``: CPUs over threads per process).

``fit`` finds the rates (non-negative least squares of the relative error) from
``dist_calibrate.py``'s cells; ``check`` prints predicted against measured per cell.
The projection to other machines and scales is in ``comm_project.py``.

Example::

    python tools/experiments/comm_model.py docs/results/dist_calibration.json \\
        --out docs/results/comm_model_fit.json
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_common import machine, write_json

#: the rates, in the order of the formula above (seconds per counted unit)
PARAMS = ("fixed_s", "sparse_s", "dense_s", "elem_s", "score_s", "codec_s", "byte_s",
          "message_s")  # fmt: skip
FEATURES = ("fixed", "sparse", "dense", "elem", "score", "codec", "bytes", "messages")
HALO = ("forward_halo", "backward_halo")
#: the low quantile of a cell's epochs taken as its time: the least disturbed by other jobs
QUANTILE = 0.25


def rank_features(nodes: float, edges: float, shape, nnz_fraction: float, rsc: bool,
                  traffic: dict | None, parts: int, bits) -> dict:  # fmt: skip
    """The counted quantities of one rank (see the module docstring). ``shape``: the
    model's :class:`~dgl_rsc.distributed.traffic.ModelShape` (or an object with its
    fields); ``traffic``: ``{kind: {"sent", "received", "messages"}}`` of one epoch."""
    fwd = sum(shape.widths)
    bwd = sum(w for w, g in zip(shape.widths, shape.grads) if g)
    out = {"fixed": 1.0, "sparse": edges * (fwd + bwd * nnz_fraction),
           "dense": 3.0 * nodes * shape.dense_macs, "elem": nodes * fwd,
           "score": nodes * bwd if rsc else 0.0, "codec": 0.0, "bytes": 0.0,
           "messages": 0.0}  # fmt: skip
    for kind, t in (traffic or {}).items():
        out["bytes"] += t["sent"] + t["received"]
        out["messages"] += t["messages"]
        if kind == "allreduce" and t["messages"]:
            out["messages"] += t["messages"] * (2 * (parts - 1) - 1)  # the ring's steps
    if str(bits) != "32" and traffic:
        halo = sum(traffic[k]["sent"] + traffic[k]["received"] for k in HALO if k in traffic)
        out["codec"] = halo * 8.0 / (8 if bits == "adaptive" else int(bits))
    return out


def work(params: dict, feats: dict) -> float:
    return sum(params[p] * feats[f] for p, f in zip(PARAMS, FEATURES))


def epoch_time(params: dict, ranks: list, cores: float) -> float:
    """``max(max_r W_r, sum_r W_r / cores)``."""
    w = [work(params, f) for f in ranks]
    return max(max(w), sum(w) / cores)


def fit(points: list, start: dict | None = None, target: str = "wall") -> dict:
    """Non-negative rates minimizing the squared relative error over ``points``
    (``{"ranks": [features], "cores", "measured_s", "cpu_s": [per rank]}``): of
    :func:`epoch_time` against ``measured_s`` (``target="wall"``), or of each rank's work
    against its CPU seconds (``"cpu"``: what the rank computed, whatever else the machine
    ran meanwhile)."""
    import numpy as np
    from scipy.optimize import least_squares

    def residual(x):
        p = dict(zip(PARAMS, x))
        if target == "cpu":
            return np.array([work(p, f) / c - 1.0 for q in points
                             for f, c in zip(q["ranks"], q["cpu_s"])])  # fmt: skip
        return np.array([epoch_time(p, q["ranks"], q["cores"]) / q["measured_s"] - 1.0
                         for q in points])  # fmt: skip

    scale = np.array([_scale(points, f) for f in FEATURES])  # rates of order 1 after scaling
    x0 = (
        np.array([(start or {}).get(p, 0.1) for p in PARAMS])
        if start
        else np.full(len(PARAMS), 0.1)
    )
    best = None
    for guess in (x0, np.full(len(PARAMS), 0.02), np.full(len(PARAMS), 0.5)):
        sol = least_squares(lambda y: residual(y / scale), guess, bounds=(0, np.inf),
                            x_scale="jac", max_nfev=4000)  # fmt: skip
        if best is None or sol.cost < best.cost:
            best = sol
    return dict(zip(PARAMS, (best.x / scale).tolist()))


def _scale(points: list, feature: str) -> float:
    """A typical epoch's seconds over a typical count of ``feature`` (so that the solver's
    variables are of order one)."""
    vals = [max(r[feature] for r in q["ranks"]) / q["measured_s"] for q in points]
    vals = [v for v in vals if v > 0]
    return statistics.median(vals) if vals else 1.0


def quantile(xs: list, q: float = QUANTILE) -> float:
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@functools.cache
def shape_of(config: str, sets: tuple = ()):
    """``(ModelShape, train fraction)`` of a launcher config with ``--set`` values."""
    from dgl_rsc.data import load_dataset
    from dgl_rsc.distributed.traffic import model_shape
    from dgl_rsc.launcher.cli import load_config
    from dgl_rsc.models.paper import build_model

    cfg = load_config(config, [*sets, "distributed=null"])
    params = {k: v for k, v in cfg.dataset.items() if k not in ("name", "root")}
    data = load_dataset(cfg.dataset["name"], root=cfg.dataset["root"], **params)
    m = {k: v for k, v in cfg.model.items() if k != "name"}
    model = build_model(cfg.model["name"], data.feat.shape[1], int(data.num_classes), **m)
    return model_shape(model, data.feat.shape[1]), float(data.train_mask.float().mean())


def points_of(calibration: dict, cpus: int | None = None) -> list:
    """One point per (config, P, bits, method) of ``dist_calibrate.py``'s cells, the rounds
    pooled: its epochs' :data:`QUANTILE` and each rank's mean features."""
    groups: dict = {}
    for cell in calibration["cells"]:
        for method, rec in cell["methods"].items():
            key = (cell["config"], cell["nproc"], str(cell["bits"]), method)
            groups.setdefault(key, []).append((cell, rec))
    cpus = cpus or calibration["machine"]["cpus"]
    out = []
    for (config, nproc, bits, method), items in sorted(groups.items()):
        cell = items[0][0]
        sets = tuple(s for s in cell["sets"] if not s.startswith(("train.", "rsc.")))
        shape, _ = shape_of(config, sets)
        epochs = [t for _, rec in items for t in rec["epoch_s"]]
        nnz = statistics.mean(rec["nnz_fraction"] for _, rec in items)
        cpu = None
        if all("cpu_s" in rec for _, rec in items):
            cpu = [statistics.median(t for _, rec in items for t in rec["cpu_s"][r])
                   for r in range(nproc)]  # fmt: skip
        ranks = []
        for r in range(nproc):
            traffic = None
            if nproc > 1:
                traffic = {k: {f: statistics.mean(rec["per_rank"][r][k][f] for _, rec in items)
                               for f in ("sent", "received", "messages")}
                           for k in items[0][1]["per_rank"][r]}  # fmt: skip
            ranks.append(rank_features(cell["nodes"][r], cell["edges"][r], shape, nnz,
                                       method == "rsc", traffic, nproc, bits))  # fmt: skip
        out.append({"config": config, "nproc": nproc, "bits": bits, "method": method,
                    "measured_s": quantile(epochs), "epochs": len(epochs), "cpu_s": cpu,
                    "median_s": statistics.median(epochs), "nnz_fraction": nnz,
                    "cores": cpus / max(cell.get("threads") or 1, 1), "ranks": ranks})  # fmt: skip
    return out


def check(params: dict, points: list) -> list:
    """``[(point, predicted seconds, predicted / measured)]``."""
    rows = []
    for q in points:
        pred = epoch_time(params, q["ranks"], q["cores"])
        rows.append((q, pred, pred / q["measured_s"]))
    return rows


def leave_one_out(points: list, target: str = "wall") -> dict:
    """Per config: the epoch errors of a fit made without that config's points."""
    out = {}
    for config in sorted({q["config"] for q in points}):
        rest = [q for q in points if q["config"] != config]
        params = fit(rest, target=target)
        out[config] = [r for _, _, r in check(params, [q for q in points if q["config"] == config])]
    return out


def table(d: dict) -> str:
    """Measured against predicted epochs, per config and method (``d``: this tool's JSON)."""
    rows = d["rows"]
    cols = sorted({(r["nproc"], str(r["bits"])) for r in rows}, key=lambda x: (x[1] != "32", x))
    head = " | ".join(f"P={p}" + ("" if b == "32" else f", {b}-bit halos") for p, b in cols)
    out = [f"| config | method | {head} |", "|---|---|" + "---|" * len(cols)]
    for config in dict.fromkeys(r["config"] for r in rows):
        for method in ("exact", "rsc"):
            by = {(r["nproc"], str(r["bits"])): r for r in rows
                  if (r["config"], r["method"]) == (config, method)}  # fmt: skip
            cells = [f"{1e3 * by[k]['measured_s']:.0f} / {1e3 * by[k]['predicted_s']:.0f}"
                     if k in by else "-" for k in cols]  # fmt: skip
            out.append(f"| {os.path.basename(config)} | {method} | " + " | ".join(cells) + " |")
    worst = 100 * d["max_error_distributed"]
    out.append(
        f"\nEpoch ms, measured / predicted (measured: the {d['quantile']:.0%} quantile of "
        f"the epochs over the rounds); largest error on 2 and 4 processes {worst:.0f}%."
    )
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("calibration", help="dist_calibrate.py's JSON")
    p.add_argument(
        "--target",
        choices=("cpu", "wall"),
        default="cpu",
        help="fit each rank's CPU seconds (default) or the epochs themselves",
    )
    p.add_argument("--out", required=True)
    p.add_argument("--loo", action="store_true", help="also fit leaving each config out")
    args = p.parse_args(argv)
    import json

    with open(args.calibration, encoding="utf-8") as f:
        cal = json.load(f)
    points = points_of(cal)
    if args.target == "cpu" and any(q["cpu_s"] is None for q in points):
        p.error("--target cpu: some cells have no CPU seconds (runs of an older launcher)")
    params = fit(points, target=args.target)
    rows = check(params, points)
    print("rates: " + ", ".join(f"{k} {v:.3g}" for k, v in params.items()))
    print(f"{'config':<26}{'P':>3}{'bits':>6}{'method':>7}{'measured ms':>13}"
          f"{'predicted ms':>14}{'ratio':>7}{'cpu ratio':>10}")  # fmt: skip
    for q, pred, ratio in rows:
        cpu = "-"
        if q["cpu_s"]:
            cpu = f"{max(work(params, f) / c for f, c in zip(q['ranks'], q['cpu_s'])):.2f}"
        print(f"{os.path.basename(q['config']):<26}{q['nproc']:>3}{q['bits']:>6}"
              f"{q['method']:>7}{1e3 * q['measured_s']:>13.1f}{1e3 * pred:>14.1f}"
              f"{ratio:>7.2f}{cpu:>10}")  # fmt: skip
    dist = [abs(r - 1) for q, _, r in rows if q["nproc"] > 1]
    print(f"largest error on 2 and 4 processes: {100 * max(dist):.1f}%")
    keep = ("config", "nproc", "bits", "method", "measured_s", "median_s", "epochs",
            "nnz_fraction", "cores", "cpu_s")  # fmt: skip
    record = {"machine": machine("cpu"), "command": " ".join(sys.argv),
              "calibration": os.path.basename(args.calibration), "quantile": QUANTILE,
              "target": args.target, "params": params,
              "rows": [{k: q[k] for k in keep} | {"predicted_s": pred, "ratio": ratio,
                        "predicted_cpu_s": [work(params, f) for f in q["ranks"]]}
                       for q, pred, ratio in rows],
              "max_error_distributed": max(dist)}  # fmt: skip
    if args.loo:
        record["leave_one_out"] = leave_one_out(points, args.target)
    write_json(args.out, record)


if __name__ == "__main__":
    main()
