"""Compare the selection rules ``topk`` (score) and ``cost`` (score^2 / nnz) on real graphs.

1. Gradient error at equal cost: a GCN is trained exactly; every 10 epochs the output
   gradient of its last aggregation is captured, and ``A[S]^T dY[S]`` is formed with each
   rule at the same non-zero budget; the relative error against ``A^T dY`` is averaged.
2. Accuracy at equal budget: the same GCN trained with RSC under each rule (never switching
   to exact, so the rule's effect is not washed out), test metric at the best validation.

    python tools/experiments/compare_rules.py --out results/rules.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_common import machine, write_json

import dgl_rsc.nn as rnn
from dgl_rsc import RSCConfig
from dgl_rsc.backends import torch_ref
from dgl_rsc.core.slot import LayerSlot
from dgl_rsc.data import evaluate, load_dataset
from dgl_rsc.models import build_model
from dgl_rsc.sampling import row_norms, selection_key
from dgl_rsc.sparse.graph import Graph
from dgl_rsc.sparse.products import csr_t_mm

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


def graphs(names):
    for name in names:
        if name == "synthetic":
            yield name, load_dataset("synthetic", num_nodes=20000, avg_degree=30.0, homophily=0.3)
        elif (SHARED / f"{name}.npz").exists():
            yield name, load_dataset("npz", path=str(SHARED / f"{name}.npz"))


def train(data, graph, epochs, cfg=None, capture=None, seed=0):
    torch.manual_seed(seed)
    out_dim = data.num_classes if data.task != "binary" else 2
    model = build_model("gcn", data.feat.shape[1], out_dim, hidden=64, layers=2, dropout=0.5)
    rsc = rnn.attach(model, cfg) if cfg else rnn.exact(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    best_val, test = -1.0, 0.0
    for epoch in range(epochs):
        model.train()
        if capture is not None:
            capture["on"] = epoch % 10 == 9
        loss = F.cross_entropy(
            model(graph, data.feat)[data.train_mask], data.label[data.train_mask]
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        if cfg:
            rsc.step()
        model.eval()
        with torch.no_grad():
            logits = model(graph, data.feat)
        val = evaluate(data.metric, logits, data.label, data.val_mask)
        if val > best_val:
            best_val, test = val, evaluate(data.metric, logits, data.label, data.test_mask)
    return test


def gradient_errors(data, graph, budgets, epochs):
    """Mean relative error of each rule at each budget over captured gradients."""
    captured = []
    capture = {"on": False}
    original = LayerSlot.backward_product

    def spy(self, A, dY, scales):
        if capture["on"]:
            captured.append((A, dY.detach().clone(), scales))
        return original(self, A, dY, scales)

    LayerSlot.backward_product = spy  # a tool-only spy, restored below
    try:  # exact training (warm-up never ends) while recording the gradients
        train(data, graph, epochs, RSCConfig(warmup_steps=10**9), capture)
    finally:
        LayerSlot.backward_product = original
    errs = {}
    for rule in ("topk", "cost"):
        for b in budgets:
            vals = []
            for A, dY, scales in captured:
                exact = csr_t_mm(A, dY, scales)
                key = selection_key(
                    torch_ref.row_scores(row_norms(A, scales), dY), A.row_nnz(), rule
                )
                mask, _ = torch_ref.select_rows(key, A.row_nnz(), int(b * A.nnz), 0)
                approx = csr_t_mm(A, dY * mask[:, None], scales)
                vals.append(float((approx - exact).norm() / exact.norm().clamp(min=1e-30)))
            errs[f"{rule}@{b}"] = statistics.mean(vals)
    return errs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--graphs", default="cora,citeseer,tolokers,synthetic")
    ap.add_argument("--budgets", default="0.1,0.3")
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", default="results/rules.json")
    args = ap.parse_args(argv)
    budgets = [float(b) for b in args.budgets.split(",")]
    result = {"machine": machine("cpu"), "command": " ".join(sys.argv), "graphs": {}}
    for name, data in graphs(args.graphs.split(",")):
        graph = Graph(data.src, data.dst, data.num_nodes).add_self_loop()
        errs = gradient_errors(data, graph, budgets, args.epochs)
        acc = {
            "exact": statistics.mean(
                train(data, graph, args.epochs, seed=s) for s in range(args.seeds)
            )
        }
        for rule in ("topk", "cost"):
            for b in budgets:
                cfg = RSCConfig(budget=b, rule=rule, switch_at=1.0, total_steps=args.epochs)
                acc[f"{rule}@{b}"] = statistics.mean(
                    train(data, graph, args.epochs, cfg, seed=s) for s in range(args.seeds)
                )
        result["graphs"][name] = {"grad_rel_error": errs, "test_metric": acc}
        print(name, "error:", {k: round(v, 3) for k, v in errs.items()})
        print(name, "test :", {k: round(100 * v, 2) for k, v in acc.items()}, flush=True)
        write_json(args.out, result)


if __name__ == "__main__":
    main()
