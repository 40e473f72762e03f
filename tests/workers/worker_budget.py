"""A torch.distributed worker for tests/distributed/test_budget_slow.py: each rank aggregates
its part of a random graph through a LocalGraph whose exchange follows a byte budget, many
times (one training step each), and writes per mode the mean and squared mean of its owned
rows of the output and of the input gradient, one draw, and the bytes it counted against the
bytes of the tensors it handed to ``isend``.

Modes: ``exact`` (comm_budget 1.0 through the budgeted exchange), ``halo`` (fp32 rows only,
0.6 of the bytes: the whole forward fits, the backward halo sample makes the rest fit),
``boundary`` (a fixed forward boundary rate of 0.5, no budget), ``budget`` (comm_budget 0.2,
every width) and ``rsc`` (RSC's sampled local product with its remainder groups, plus
comm_budget 0.3).

Usage (through torch's launcher): worker_budget.py OUT_DIR DRAWS
"""

import os
import sys

import torch
import torch.distributed as dist
from halo_problem import halo_problem
from leave import leave

from dgl_rsc import RSCController
from dgl_rsc.distributed.budget_exchange import BudgetedExchange
from dgl_rsc.distributed.budget_plan import CommBudget
from dgl_rsc.distributed.comm_budget import FRACTIONS
from dgl_rsc.distributed.controller import DistributedRSCController
from dgl_rsc.distributed.halo import build_local
from dgl_rsc.distributed.local_graph import LocalGraph
from dgl_rsc.distributed.partition import partition_nodes
from dgl_rsc.distributed.runtime import init_from_env

out_dir, draws = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)
handed = [0]  # bytes of every tensor this rank hands to isend
_isend = dist.isend


def counting_isend(tensor, *args, **kwargs):
    handed[0] += tensor.numel() * tensor.element_size()
    return _isend(tensor, *args, **kwargs)


dist.isend = counting_isend
ctx = init_from_env("gloo", "cpu", 60)
src, dst, n, x, gy, row = halo_problem(24)
part = partition_nodes(src, dst, n, ctx.world_size, "metis", 0)
lp = build_local(src, dst, n, part, ctx.rank, ctx.world_size)

MODES = {
    "exact": dict(fraction=1.0),
    "halo": dict(fraction=0.6, forward_bits=(32,), backward_bits=(32,)),
    "boundary": dict(fraction=1.0, forward_bits=(32,), backward_bits=(32,), boundary=(0.5,)),
    "budget": dict(fraction=0.2, boundary=FRACTIONS),
    "rsc": dict(fraction=0.3),
}
result = {"owned": lp.owned}
for mode, kw in MODES.items():
    budget = CommBudget(interval=4, rank=ctx.rank, **kw)
    graph = LocalGraph(lp, ctx, BudgetedExchange(lp, ctx, budget), overlap=True)
    ctl = None
    if mode == "rsc":
        cfg = RSCController().config.replace(
            budget=0.3, warmup_steps=0, cache_interval=1, guard=False, min_width=0,
            tune_interval=5,
        )  # fmt: skip
        ctl = DistributedRSCController(ctx, cfg)
    steps = 3 if mode == "exact" else draws  # the exact exchange is the same every step
    sums = {k: torch.zeros(lp.n_own, 24, dtype=torch.float64) for k in ("y", "y2", "g", "g2")}
    before, handed[0] = ctx.bytes.snapshot(), 0
    peers0 = ctx.bytes.by_peer()
    state_for = (lambda A: None) if ctl is None else (lambda A, c=ctl: c.slot(0))
    for i in range(steps):
        x_own = x[lp.owned].clone().requires_grad_()
        y = graph.rsc_aggregate(x_own, None, state_for, row_scale=row[lp.owned])
        y.backward(gy[lp.owned])
        if ctl is not None:
            ctl.step()
        yd, gd = y.detach().double(), x_own.grad.double()
        for k, v in (("y", yd), ("y2", yd * yd), ("g", gd), ("g2", gd * gd)):
            sums[k] += v
        if i == 0:
            result[f"{mode}_first"] = gd.clone()
    after = ctx.bytes.snapshot()
    counted = sum(after[k]["sent"] - before[k]["sent"]
                  for k in ("forward_halo", "backward_halo", "control"))  # fmt: skip
    halo = sum(after[k]["sent"] - before[k]["sent"] for k in ("forward_halo", "backward_halo"))
    backward = after["backward_halo"]["sent"] - before["backward_halo"]["sent"]
    backward_ref = steps * lp.n_halo * (4 * 24 + 4)  # every halo row's gradient in fp32
    by_peer = sum(s - peers0.get(k, (0, 0))[0] for k, (s, _) in ctx.bytes.by_peer().items())
    rep = budget.report(ctx.bytes.by_peer())
    result[mode] = {k: v / steps for k, v in sums.items()}
    result[f"{mode}_bytes"] = {
        "counted": counted, "handed": handed[0], "halo": halo, "by_peer": by_peer,
        "backward": backward, "backward_reference": backward_ref,
        "budget_sent": sum(rep["sent_per_step"]), "reference": sum(rep["reference_per_step"]),
        "max_fraction": max(s / r for s, r in zip(rep["sent_per_step"], rep["reference_per_step"])),
        "rsc_control": ctl is not None, "errors": rep["measured_error"],
        "estimated": budget.stats()[-1]["errors"] if budget.solves else {},
    }  # fmt: skip
torch.save(result, os.path.join(out_dir, f"rank{ctx.rank}.pt"))
leave()
