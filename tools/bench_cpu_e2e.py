"""CPU end to end: stock DGL against every dgl_rsc engine, exact and RSC, in one process.

For each graph, model and thread count this trains, from the same seed and initialization:

- ``stock``: the stock ``dgl.nn`` model, no patch (what DGL users run);
- ``patch-exact`` / ``patch-rsc``: the same stock model inside ``dgl_rsc.patch`` (exact
  products only / RSC at the budget);
- ``dgl-exact`` / ``dgl-rsc``: dgl_rsc's drop-in layers on the ``DGLGraph``;
- ``native-exact`` / ``native-rsc``: the drop-in layers on the DGL-free ``Graph``.

Epoch times are means over the timed epochs (after ``--warmup``; for RSC the approximate
phase: the run never switches back), taken over ``--rounds`` interleaved rounds; every ratio
is against ``stock`` measured in the same process. ``--profile`` adds, per engine, one
profiled epoch split into sparse products, dense GEMMs, elementwise work, RSC's selection and
slicing, and the rest. ``--tta-epochs N`` adds, per engine, one training run of ``N`` epochs
(RSC engines switching to exact at ``switch_at`` of them, as the launcher does) evaluated
after every epoch, and reports each engine's time to accuracy with the launcher's definition
(:func:`dgl_rsc.launcher.tta.time_to_accuracy`): the training time, evaluation excluded, until
validation first reaches the best validation of the first exact engine run (``native-exact``,
``dgl-exact``, ``patch-exact``) minus ``--tta-tolerance`` (or ``--tta-target``), and each
engine's speedup: that engine's time and ``stock``'s over its own; ``curves`` holds each
engine's validation after every epoch and its training time. Results go to a JSON file with
the machine and the date.

Example::

    python tools/bench_cpu_e2e.py --graphs quickstart g200k --models gcn sage --threads 1 2 \\
        --out docs/results/e2e_cpu.json --profile
    python tools/bench_cpu_e2e.py --graphs quickstart --models gcn --threads 2 \\
        --engines stock native-exact native-rsc --tta-epochs 200 --out /tmp/tta.json
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))

from bench_common import machine, write_json

import dgl_rsc
import dgl_rsc.nn as rnn
from dgl_rsc import RSCController
from dgl_rsc.data import evaluate, synthetic_graph
from dgl_rsc.launcher.tta import DEFAULT_TOLERANCE, cumulative_times, time_to_accuracy
from dgl_rsc.models import build_model
from dgl_rsc.sparse.graph import Graph

# The two graphs of the engine issue: the quickstart graph (30k nodes, 1.5M edges, 128 input
# features, hidden 64) and a 200k-node graph with 8.2M edges and hidden 128.
GRAPHS = {
    "quickstart": dict(num_nodes=30_000, avg_degree=50.0, hidden=64),
    "g200k": dict(num_nodes=200_000, avg_degree=41.0, hidden=128),
    "small": dict(num_nodes=5_000, avg_degree=20.0, hidden=32),
}
ENGINES = ("stock", "patch-exact", "patch-rsc", "dgl-exact", "dgl-rsc", "native-exact",
           "native-rsc")  # fmt: skip

# profiler op names by category (self time); anything else is "other"
CATEGORIES = {
    "sparse": ("GSpMM", "GSpMMBackward", "RSCSpMM", "RSCSpMMBackward"),
    "dense": ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul"),
    "elementwise": ("aten::mul", "aten::add", "aten::div", "aten::sub", "aten::clamp_min",
                    "aten::threshold_backward", "aten::bernoulli_", "aten::fill_", "aten::relu",
                    "aten::add_", "aten::mul_", "aten::div_", "aten::pow", "aten::copy_",
                    "aten::zero_", "aten::empty", "aten::clone", "aten::sum", "aten::where"),
    "selection": ("aten::sort", "aten::cumsum", "aten::nonzero", "aten::index",
                  "aten::linalg_vector_norm", "aten::index_put_", "aten::_index_put_impl_",
                  "aten::bitwise_and", "aten::gt", "aten::ne", "aten::isinf", "aten::isfinite"),
}  # fmt: skip


def build(engine, data, graphs, hidden, model_name, seed, total_steps=None):
    """Model, graph, controller and context of ``engine``; with ``total_steps`` the RSC
    engines switch to the exact backward at ``switch_at`` of them (else they never do)."""
    torch.manual_seed(seed)
    family = engine.split("-")[0]  # native, dgl, patch or stock (dgl_rsc.models.engines)
    stock = family in ("stock", "patch")
    model = build_model(model_name, data.feat.shape[1], data.num_classes, engine=family,
                        hidden=hidden, layers=3, dropout=0.5)  # fmt: skip
    graph = graphs["native" if engine.startswith("native") else "dgl"]
    ctl, ctx = None, contextlib.nullcontext()
    if engine.startswith("patch"):
        exact = engine == "patch-exact"
        switch = 0.0 if exact else (args.switch_at if total_steps else 1.0)
        ctl = RSCController(budget=args.budget, switch_at=switch,
                            total_steps=total_steps or 10**6)  # fmt: skip
        ctx = dgl_rsc.patch(ctl)
    elif engine.endswith("-rsc"):
        ctl = rnn.attach(model, budget=args.budget, switch_at=args.switch_at,
                         total_steps=total_steps)  # fmt: skip
    elif not stock:
        rnn.exact(model)
    return model, graph, ctl, ctx


def epochs(model, graph, data, ctl, ctx, n, profile=False):
    """Seconds of each of ``n`` training epochs (and a profile of the last when asked)."""
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    mask, label, feat = data.train_mask, data.label, data.feat
    times, prof = [], None
    with ctx:
        for i in range(n):
            last = profile and i == n - 1
            pctx = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) \
                if last else contextlib.nullcontext()  # fmt: skip
            with pctx as p:
                t0 = time.perf_counter()
                loss = F.cross_entropy(model(graph, feat)[mask], label[mask])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                if ctl is not None:
                    ctl.step()
                times.append(time.perf_counter() - t0)
            if last:
                prof = categorize(p)
    return times, prof, float(loss.detach())


def tta_record(engine, model, graph, data, ctl, ctx, n):
    """One ``n``-epoch training run evaluated after every epoch (not timed), as a record of
    the launcher's shape (``method``, ``seed``, ``history``, ``best``)."""
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    mask, label, feat = data.train_mask, data.label, data.feat
    history = []
    with ctx:
        for epoch in range(1, n + 1):
            model.train()
            t0 = time.perf_counter()
            loss = F.cross_entropy(model(graph, feat)[mask], label[mask])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if ctl is not None:
                ctl.step()
            epoch_s = time.perf_counter() - t0
            model.eval()
            with torch.no_grad():
                val = float(evaluate(data.metric, model(graph, feat), label, data.val_mask))
            history.append({"epoch": epoch, "epoch_s": epoch_s, "val": val})
    return {"method": engine, "seed": 0, "history": history,
            "best": {"val": max(h["val"] for h in history)}}  # fmt: skip


def tta_case(data, graphs, spec, model_name):
    """Time to accuracy of every engine (one run each, the launcher's definition)."""
    records = []
    for engine in args.engines:
        model, graph, ctl, ctx = build(engine, data, graphs, spec["hidden"], model_name, 0,
                                       total_steps=args.tta_epochs)  # fmt: skip
        records.append(tta_record(engine, model, graph, data, ctl, ctx, args.tta_epochs))
    exact = [e for e in ("native-exact", "dgl-exact", "patch-exact") if e in args.engines]
    ref = exact[0] if exact else "native-exact"  # absent: only --tta-target gives a target
    baselines = tuple(e for e in (ref, "stock") if e in args.engines)
    tta = time_to_accuracy(records, args.tta_tolerance, args.tta_target, ref, baselines)
    for engine, t in tta["methods"].items():
        when = t["status"]
        if t["time_s"] is not None:
            when = f"{t['time_s']:.2f} s (epoch {t['epoch']:.0f})"
        print(f"  time to target {engine:<13} {when}", flush=True)
    curves = {r["method"]: {"train_time_s": cumulative_times(r["history"]),
                            "val": [h["val"] for h in r["history"]]} for r in records}  # fmt: skip
    return {"reference": ref, **tta, "curves": curves}


def categorize(prof) -> dict:
    out = dict.fromkeys([*CATEGORIES, "other"], 0.0)
    for ev in prof.key_averages():
        cat = next((c for c, names in CATEGORIES.items() if ev.key in names), "other")
        out[cat] += ev.self_cpu_time_total / 1e3  # ms
    return {k: round(v, 2) for k, v in out.items()}


def run_case(graph_name, model_name, threads):
    spec = GRAPHS[graph_name]
    torch.set_num_threads(threads)
    data = synthetic_graph(spec["num_nodes"], avg_degree=spec["avg_degree"], feat_dim=128,
                           num_classes=10, homophily=0.25, feature_noise=4.0, seed=0)  # fmt: skip
    src, dst, n = data.src, data.dst, data.num_nodes
    if model_name == "gcn":  # GCN takes self-loops, as the launcher adds
        loops = torch.arange(n)
        src, dst = torch.cat([src, loops]), torch.cat([dst, loops])
    import dgl

    graphs = {"native": Graph(src, dst, n), "dgl": dgl.graph((src, dst), num_nodes=n)}
    res = {e: [] for e in args.engines}
    profiles, losses = {}, {}
    total = args.warmup + args.epochs
    for r in range(args.rounds):
        for engine in args.engines:
            model, graph, ctl, ctx = build(engine, data, graphs, spec["hidden"], model_name, 0)
            t, prof, loss = epochs(model, graph, data, ctl, ctx, total,
                                   profile=args.profile and r == 0)  # fmt: skip
            res[engine].append(statistics.mean(t[args.warmup :]))
            losses[engine] = loss
            if prof:
                profiles[engine] = prof
            print(f"  {graph_name} {model_name} t={threads} {engine:<13} "
                  f"{res[engine][-1] * 1e3:8.1f} ms", flush=True)  # fmt: skip
    ms = {e: statistics.mean(v) * 1e3 for e, v in res.items()}
    base = ms.get("stock")
    case = {"graph": graph_name, "model": model_name, "threads": threads,
            "nodes": n, "edges": int(src.numel()), "hidden": spec["hidden"],
            "epoch_ms": {e: round(v, 2) for e, v in ms.items()},
            "rounds_ms": {e: [round(x * 1e3, 2) for x in v] for e, v in res.items()},
            "vs_stock": {e: round(base / v, 3) for e, v in ms.items()} if base else None,
            "final_loss": losses, "profile_ms": profiles}  # fmt: skip
    if args.tta_epochs:
        case["time_to_accuracy"] = tta_case(data, graphs, spec, model_name)
    return case


def main():
    global args
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--graphs", nargs="+", default=["quickstart", "g200k"], choices=GRAPHS)
    p.add_argument("--models", nargs="+", default=["gcn", "sage"], choices=["gcn", "sage"])
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    p.add_argument("--budget", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=3, help="untimed epochs (incl. RSC warm-up)")
    p.add_argument("--epochs", type=int, default=8, help="timed epochs per round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--profile", action="store_true")
    p.add_argument(
        "--tta-epochs",
        type=int,
        default=0,
        help="also train each engine this many epochs and report time to accuracy",
    )
    p.add_argument(
        "--tta-tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help="target: the reference's best validation minus this (metric units)",
    )
    p.add_argument("--tta-target", type=float, default=None, help="an absolute target instead")
    p.add_argument("--switch-at", type=float, default=0.8, help="RSC's switch to exact (tta)")
    p.add_argument("--lr", type=float, default=0.02, help="Adam's learning rate (tta runs)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    cases = []
    result = {"machine": machine("cpu"), "command": " ".join(sys.argv), "budget": args.budget,
              "cpu_engine": dgl_rsc.sparse.products.cpu_engine(), "cases": cases}  # fmt: skip
    for g in args.graphs:
        for m in args.models:
            for t in args.threads:
                cases.append(run_case(g, m, t))
                write_json(args.out, result)  # partial results survive an interruption
    for c in cases:
        print(f"{c['graph']:<11}{c['model']:<5} t={c['threads']} " + "  ".join(
            f"{e} {v:.2f}x" for e, v in (c["vs_stock"] or {}).items()))  # fmt: skip


if __name__ == "__main__":
    main()
