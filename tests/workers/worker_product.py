"""A torch.distributed worker for tests/distributed/test_distributed.py: each rank aggregates
its part of a random graph through a LocalGraph (exact, or RSC at budget 1.0, or RSC at a
small budget) and writes its owned rows of the output and of the input gradient, which the
test compares with the single-process product.

Usage (through torch's launcher): worker_product.py OUT_DIR MODE (exact | full | sampled)
"""

import os
import sys

import torch
from halo_problem import halo_problem
from leave import leave

from dgl_rsc import RSCController
from dgl_rsc.distributed.controller import DistributedRSCController
from dgl_rsc.distributed.exchange import HaloExchange
from dgl_rsc.distributed.halo import build_local
from dgl_rsc.distributed.local_graph import LocalGraph
from dgl_rsc.distributed.partition import partition_nodes
from dgl_rsc.distributed.runtime import init_from_env

out_dir, mode = sys.argv[1], sys.argv[2]
torch.set_num_threads(1)
ctx = init_from_env("gloo", "cpu", 60)
src, dst, n, x, gy, row = halo_problem(5)
part = partition_nodes(src, dst, n, ctx.world_size, "metis", 0)
lp = build_local(src, dst, n, part, ctx.rank, ctx.world_size)
graph = LocalGraph(lp, ctx, HaloExchange(lp, ctx), overlap=True)
x_own = x[lp.owned].clone().requires_grad_()
if mode == "exact":
    state_for = lambda A: None  # noqa: E731
else:
    budget = 1.0 if mode == "full" else 0.2
    ctl = DistributedRSCController(
        ctx, RSCController().config.replace(budget=budget, warmup_steps=0)
    )
    state_for = lambda A: ctl.slot(0)  # noqa: E731
y = graph.rsc_aggregate(x_own, None, state_for, row_scale=row[lp.owned])
y.backward(gy[lp.owned])
before = ctx.bytes.snapshot()["backward_halo"]["sent"]
torch.save(
    {"owned": lp.owned, "y": y.detach(), "grad": x_own.grad, "backward_sent": before},
    os.path.join(out_dir, f"rank{ctx.rank}.pt"),
)
leave()
