"""``DistributedRSCController``: one budget for the whole graph, the same allocation on every
rank.

Each rank samples the backward of its own rows (disjoint across ranks). When the allocation
is due, the ranks gather every layer's solver inputs (each row's key, error mass and
non-zeros), every rank solves the same global problem with the same deterministic solver,
and each takes as its layer budget the non-zeros of *its* rows among the globally kept
prefix. So the kept rows are the global top rows, and the budget holds for the whole graph,
not per rank. The controllers step in lockstep (one ``step()`` per optimizer step on every
rank).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..core.controller import RSCController
from ..core.solver import LayerProblem
from ..sampling import get_rule, selection_key
from ..sampling.order import stable_order
from .runtime import DistContext

__all__ = ["DistributedRSCController", "gather_rows"]


def gather_rows(t: torch.Tensor, ctx: DistContext) -> tuple[torch.Tensor, torch.Tensor]:
    """All ranks' ``(M_r, C)`` float64 rows, concatenated in rank order, and each row's rank.

    Sizes differ by rank: the sizes are gathered first and the rows padded to the largest.
    """
    if ctx.world_size == 1:
        return t, torch.zeros(t.shape[0], dtype=torch.long, device=t.device)
    n = torch.tensor([t.shape[0]], dtype=torch.long, device=t.device)
    sizes = [torch.zeros_like(n) for _ in range(ctx.world_size)]
    try:
        dist.all_gather(sizes, n)
        big = int(max(int(s) for s in sizes))
        pad = torch.zeros(big, t.shape[1], dtype=t.dtype, device=t.device)
        pad[: t.shape[0]] = t
        parts = [torch.empty_like(pad) for _ in range(ctx.world_size)]
        dist.all_gather(parts, pad)
    except RuntimeError as exc:
        raise ctx.failure("gathering the solver's inputs", exc) from None
    nbytes = pad.numel() * pad.element_size() * (ctx.world_size - 1)
    ctx.bytes.add("control", sent=nbytes, received=nbytes)
    rows = torch.cat([p[: int(s)] for p, s in zip(parts, sizes)])
    owner = torch.cat([torch.full((int(s),), r, dtype=torch.long, device=t.device)
                       for r, s in enumerate(sizes)])  # fmt: skip
    return rows, owner


class DistributedRSCController(RSCController):
    """An :class:`~dgl_rsc.RSCController` whose budget solve spans all ranks.

    Args:
        ctx: the run's :class:`~dgl_rsc.distributed.runtime.DistContext`.
        config, overrides: as for :class:`~dgl_rsc.RSCController`.
    """

    def __init__(self, ctx: DistContext, config=None, **overrides):
        super().__init__(config, **overrides)
        self.ctx = ctx

    def solve(self) -> None:
        """Solve when every rank has scores for every layer (the same decision on every
        rank); the solves, the guard and ``budget: auto`` then agree across ranks."""
        ready = self.ready()
        flags = torch.tensor([len(ready), len(self.layers)], dtype=torch.long)
        self.ctx.all_reduce_(flags)
        if int(flags[0]) != len(ready) * self.ctx.world_size:
            return  # some rank has a layer without scores yet: solve next time
        super().solve()

    def _agree_max(self, values: list) -> list:
        """The element-wise maximum over ranks (a layer's budget and error, for every rank
        to take the same decisions)."""
        t = torch.tensor([float(v) for v in values], dtype=torch.float64)
        return self.ctx.all_reduce_(t, op="max").tolist()

    def _problems(self, ready: list) -> tuple:
        """Every rank's rows of each layer, gathered in rank order (the same problems on
        every rank), the diagonal non-zeros summed over ranks, and each row's rank."""
        cfg, rule = self.config, get_rule(self.config.rule)
        problems, fixed, owners = [], [], []
        for s in ready:
            key = selection_key(s.ema, s.row_nnz, cfg.rule).double()
            rows = torch.stack([key, rule.mass(s.ema).double(), s.row_nnz.double()], dim=1)
            rows, owner = gather_rows(rows, self.ctx)
            fixed_l = torch.tensor([float(s.fixed_nnz)], dtype=torch.float64)
            self.ctx.all_reduce_(fixed_l)
            problems.append(LayerProblem(rows[:, 0].float(), rows[:, 1], rows[:, 2].long(),
                                         s.stats.width, cfg.min_k))  # fmt: skip
            fixed.append(float(fixed_l))
            owners.append(owner)
        return problems, fixed, owners

    def _share(self, ready: list, problems: list, owners, alloc) -> dict:
        """The non-zeros of this rank's rows among each layer's globally kept prefix."""
        mine = {}
        for s, p, owner, k in zip(ready, problems, owners, alloc.k):
            order = stable_order(p.key, descending=True)[:k]
            kept = order[owner[order] == self.ctx.rank]
            mine[s.index] = (int(p.nnz[kept].sum()), s.generation)
        return mine
