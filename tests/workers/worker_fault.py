"""A torch.distributed worker for the fault tests: rank 1 raises (or dies) after joining the
group while rank 0 waits in a collective. Usage: worker_fault.py raise|die"""

import os
import sys

import torch

from dgl_rsc.distributed.runtime import init_from_env

ctx = init_from_env("gloo", "cpu", 30)
if ctx.rank == 1:
    if sys.argv[1] == "die":
        os._exit(9)
    raise RuntimeError("rank 1 fails on purpose")
ctx.all_reduce_(torch.ones(4))  # rank 0 waits here for a peer that is gone
