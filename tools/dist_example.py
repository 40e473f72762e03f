"""Distributed RSC training from your own script (the API the launcher uses).

Run one process per partition with torch's launcher, for example on this machine::

    torchrun --standalone --nproc-per-node 2 tools/dist_example.py --epochs 20

Each rank owns a METIS part of the graph (cached under ``--partitions``), trains the same
replicated model on its local graph (owned rows, owned + halo columns; the halo is exchanged
inside the aggregation), and steps one RSC controller whose budget is solved over all ranks.
Losses, gradients and metrics are reduced across ranks. Rank 0 prints the loss per epoch.
"""

from __future__ import annotations

import argparse

import torch

import dgl_rsc.nn as rnn
from dgl_rsc.data import load_dataset
from dgl_rsc.distributed.controller import DistributedRSCController
from dgl_rsc.distributed.reduce import DistReducer
from dgl_rsc.distributed.runtime import init_from_env
from dgl_rsc.distributed.setup import rank_data
from dgl_rsc.models import build_model


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=3000)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--budget", type=float, default=0.1)
    p.add_argument("--partitions", default=None, help="partition cache folder")
    args = p.parse_args()

    ctx = init_from_env()  # gloo on CPU, NCCL on CUDA; one rank per partition
    data = load_dataset("synthetic", num_nodes=args.nodes, avg_degree=10.0, num_classes=5,
                        feat_dim=32, seed=0)  # fmt: skip
    loops = torch.arange(data.num_nodes)  # GCN aggregates with self-loops
    edges = (torch.cat([data.src, loops]), torch.cat([data.dst, loops]), data.num_nodes)
    rd = rank_data(data, edges, ctx, parts=ctx.world_size, cache_dir=args.partitions)

    torch.manual_seed(0)  # the same initial weights on every rank
    model = build_model("gcn", data.feat.shape[1], data.num_classes, hidden=32, layers=2)
    rsc = rnn.attach(model, DistributedRSCController(ctx, budget=args.budget,
                                                     total_steps=args.epochs))  # fmt: skip
    reduce = DistReducer(ctx, rd.train_total)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    train = rd.masks["train"]
    for epoch in range(1, args.epochs + 1):
        logits = model(rd.graph, rd.feat)
        loss = reduce.loss(data.task, logits[train], rd.label[train])
        opt.zero_grad()
        loss.backward()
        reduce.after_backward(model)  # one all-reduce of the flat gradient
        opt.step()
        rsc.step()
        total = reduce.value(loss)
        if ctx.is_main:
            print(f"epoch {epoch:3d}  loss {total:.4f}  phase {rsc.phase()}", flush=True)


if __name__ == "__main__":
    main()
