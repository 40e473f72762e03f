"""Gradient error of INT8 training against fp32 on one model state: nearest vs stochastic
rounding, single draws and averaged over seeds (a biased rounding keeps its error when
averaged; an unbiased one shrinks it as 1/sqrt(draws)).

Loads an npz graph (``dgl_rsc.data.npz`` format), builds the GCN of ``yaml_configs/cora_gcn.yaml``
(2 x GraphConv, hidden 16; dropout off so every draw sees the same activations), and compares
the gradients of every parameter with every convolution in INT8 (``keep_last=False``) with the
fp32 gradients: relative Frobenius error ``||g8 - g32|| / ||g32||``.

    python tools/experiments/int8_errors.py /path/cora.npz --draws 16 \
        --out docs/results/int8_errors.json
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_common import machine, write_json

from dgl_rsc.int8 import dequantize_model, quantize_model
from dgl_rsc.models import build_model
from dgl_rsc.nn import exact
from dgl_rsc.sparse.graph import Graph


def grads(model, g, x, label, mask) -> list:
    model.zero_grad(set_to_none=True)
    out = model(g, x)
    torch.nn.functional.cross_entropy(out[mask], label[mask]).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def rel(a: list, b: list) -> float:
    num = sum(float((x - y).square().sum()) for x, y in zip(a, b))
    return (num / sum(float(y.square().sum()) for y in b)) ** 0.5


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("npz")
    p.add_argument("--draws", type=int, default=16)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    d = np.load(args.npz)
    src, dst = torch.from_numpy(d["src"]).long(), torch.from_numpy(d["dst"]).long()
    x = torch.from_numpy(d["feat"]).float()
    x = x / x.sum(1, keepdim=True).clamp(min=1e-12)  # row-normalized, as the config
    n = x.shape[0]
    loops = torch.arange(n)
    g = Graph(torch.cat([src, loops]), torch.cat([dst, loops]), n)
    label = torch.from_numpy(d["label"]).long()
    mask = torch.from_numpy(d["train_mask"]).bool()
    torch.manual_seed(0)
    model = build_model("gcn", in_feats=x.shape[1], num_classes=int(label.max()) + 1,
                        hidden=16, layers=2, dropout=0.0)  # fmt: skip
    exact(model)
    ref = grads(model, g, x, label, mask)
    result = {"machine": machine("cpu"), "command": " ".join(sys.argv), "rows": []}
    for rounding in ("nearest", "stochastic"):
        draws = []
        for seed in range(args.draws if rounding == "stochastic" else 1):
            quantize_model(model, rounding, seed=seed, keep_last=False)
            draws.append(grads(model, g, x, label, mask))
        dequantize_model(model)
        mean = [torch.stack(gs).mean(0) for gs in zip(*draws)]
        row = {"rounding": rounding, "draws": len(draws),
               "single_draw_rel_error": rel(draws[0], ref),
               "mean_of_draws_rel_error": rel(mean, ref)}  # fmt: skip
        result["rows"].append(row)
        print(row, flush=True)
    write_json(args.out, result)


if __name__ == "__main__":
    main()
