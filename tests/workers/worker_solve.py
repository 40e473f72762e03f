"""A torch.distributed worker for tests/distributed/test_distributed.py: each rank holds its
rows of two layers' running scores, solves the budget with the distributed controller and
writes its allocation and the global solve, which the test compares with one process holding
all rows.

Usage (through torch's launcher): worker_solve.py OUT_DIR
"""

import os
import sys

import torch

from dgl_rsc.distributed.controller import DistributedRSCController
from dgl_rsc.distributed.runtime import init_from_env

sys.path.insert(0, os.path.dirname(__file__))
from leave import leave
from solve_rows import fill_layers

out_dir = sys.argv[1]
torch.set_num_threads(1)
ctx = init_from_env("gloo", "cpu", 60)
ctl = DistributedRSCController(ctx, budget=0.2, guard=False, min_k=3)
fill_layers(ctl, ranks=[ctx.rank])
ctl.solve()
alloc = ctl.last_allocation
torch.save(
    {"mine": {i: nnz for i, (nnz, _) in ctl.allocation.items()}, "k": alloc.k, "nnz": alloc.nnz},
    os.path.join(out_dir, f"rank{ctx.rank}.pt"),
)
leave()
