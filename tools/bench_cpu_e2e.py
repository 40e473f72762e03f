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
slicing, and the rest. Results go to a JSON file with the machine and the date.

Example::

    python tools/bench_cpu_e2e.py --graphs quickstart g200k --models gcn sage --threads 1 2 \\
        --out docs/results/e2e_cpu.json --profile
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
from dgl_rsc.data import synthetic_graph
from dgl_rsc.graph import Graph
from dgl_rsc.models import build_model

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


def build(engine, data, graphs, hidden, model_name, seed):
    torch.manual_seed(seed)
    family = engine.split("-")[0]  # native, dgl, patch or stock (dgl_rsc.engines)
    stock = family in ("stock", "patch")
    model = build_model(model_name, data.feat.shape[1], data.num_classes, engine=family,
                        hidden=hidden, layers=3, dropout=0.5)  # fmt: skip
    graph = graphs["native" if engine.startswith("native") else "dgl"]
    ctl, ctx = None, contextlib.nullcontext()
    if engine.startswith("patch"):
        exact = engine == "patch-exact"
        ctl = RSCController(budget=args.budget, switch_at=0.0 if exact else 1.0,
                            total_steps=10**6)  # fmt: skip
        ctx = dgl_rsc.patch(ctl)
    elif engine.endswith("-rsc"):
        ctl = rnn.attach(model, budget=args.budget)
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
    return times, prof, float(loss)


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
    p.add_argument("--out", required=True)
    args = p.parse_args()
    cases = []
    result = {"machine": machine("cpu"), "command": " ".join(sys.argv), "budget": args.budget,
              "cpu_engine": dgl_rsc.products.cpu_engine(), "cases": cases}  # fmt: skip
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
