"""A torch.distributed worker for tests/distributed/test_block15d.py (4 ranks): on one random
graph, each rank runs

- the normalized aggregation ``diag(r) A diag(s) X`` forward and backward through its 1.5D
  BlockGraph (c = 2), exactly and with RSC at budget 1.0, counting the bytes of each kind;
- a 2-layer GCN (dropout 0.5, ``dropout: global`` masks) one step on the 1.5D graph (c = 2),
  on the 1D graph (4 parts) and on the whole graph in this process, with the launcher's
  reducers: logits, loss and parameter gradients of each;
- one replica-group sum at 8 bits;

and saves them; the test compares them with the single-process results.

Usage (through torch's launcher): worker_15d.py OUT_DIR
"""

import os
import sys

import torch
from leave import leave

from dgl_rsc import RSCController
from dgl_rsc.data import load_dataset
from dgl_rsc.distributed.algorithms import rank_data_15d
from dgl_rsc.distributed.codecs import BitPolicy
from dgl_rsc.distributed.controller import DistributedRSCController
from dgl_rsc.distributed.dropout import localize_dropout
from dgl_rsc.distributed.reduce import DistReducer, LocalReducer
from dgl_rsc.distributed.replica import ReplicaGroup
from dgl_rsc.distributed.runtime import init_from_env
from dgl_rsc.distributed.setup import rank_data
from dgl_rsc.models import build_model
from dgl_rsc.nn import exact
from dgl_rsc.sparse.graph import Graph

out_dir = sys.argv[1]
torch.set_num_threads(1)
ctx = init_from_env("gloo", "cpu", 60)
data = load_dataset("synthetic", num_nodes=400, avg_degree=8.0, num_classes=4, feat_dim=12,
                    seed=3)  # fmt: skip
n = data.num_nodes
loops = torch.arange(n)
edges = (torch.cat([data.src, loops]), torch.cat([data.dst, loops]), n)
rd15, reducer15, grid = rank_data_15d(data, edges, ctx, replication=2, parts=4)
rd1 = rank_data(data, edges, ctx, parts=4)
out = {"owned15": rd15.owned, "owned1": rd1.owned}

# -- the product ---------------------------------------------------------------------------
g = torch.Generator().manual_seed(0)
x, gy = torch.randn(n, 5, generator=g), torch.randn(n, 5, generator=g)
row, col = torch.rand(n, generator=g) + 0.5, torch.rand(n, generator=g) + 0.5
graph = rd15.graph
own = rd15.owned
for mode in ("exact", "full"):
    if mode == "exact":
        state_for = lambda A: None  # noqa: E731
    else:
        ctl = DistributedRSCController(
            ctx, RSCController().config.replace(budget=1.0, warmup_steps=0)
        )
        state_for = lambda A, ctl=ctl: ctl.slot(0)  # noqa: E731
    x_own = x[own].clone().requires_grad_()
    before = ctx.bytes.snapshot()
    y = graph.rsc_aggregate(x_own, None, state_for, row_scale=row[own], col_scale=col[own])
    y.backward(gy[own])
    after = ctx.bytes.snapshot()
    out[mode] = {
        "y": y.detach(),
        "grad": x_own.grad,
        "bytes": {k: {f: after[k][f] - before[k][f] for f in after[k]} for k in after},
    }

# -- a GCN step: 1.5D, 1D, one process -------------------------------------------------------


def step(graph, feat, label, train, owned, reducer):
    torch.manual_seed(0)  # the same weights and dropout masks everywhere
    model = build_model("gcn", feat.shape[1], 4, hidden=16, layers=2, dropout=0.5)
    model.fused_epilogue = False  # op by op: one process draws dropout as the ranks do
    exact(model)
    if owned is not None:
        localize_dropout(model, owned, n, "global")
    logits = model(graph, feat)
    loss = reducer.loss(data.task, logits[train], label[train])
    loss.backward()
    reducer.after_backward(model)
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    return {"logits": logits.detach(), "loss": reducer.value(loss), "grads": grads}


out["gcn15"] = step(rd15.graph, rd15.feat, rd15.label, rd15.masks["train"], rd15.owned, reducer15)
out["gcn1"] = step(rd1.graph, rd1.feat, rd1.label, rd1.masks["train"], rd1.owned,
                   DistReducer(ctx, rd1.train_total))  # fmt: skip
if ctx.rank == 0:
    out["single"] = step(Graph(*edges), data.feat, data.label, data.train_mask, None,
                         LocalReducer())  # fmt: skip

# -- one replica sum at 8 bits -----------------------------------------------------------------
gen = torch.Generator().manual_seed(ctx.rank)
group = ReplicaGroup(grid, ctx, BitPolicy(8, generator=gen))
part = torch.randn(101, 32, generator=torch.Generator().manual_seed(100 + ctx.rank))
before = ctx.bytes.snapshot()["replica_reduce"]["sent"]
out["q8"] = {"sum": group.all_reduce(part, "replica_reduce"), "part": part,
             "sent": ctx.bytes.snapshot()["replica_reduce"]["sent"] - before}  # fmt: skip
torch.save(out, os.path.join(out_dir, f"rank{ctx.rank}.pt"))
leave()
