"""``BlockGraph``: one rank's share of a 1.5D product (CAGNET), which the drop-in layers and
the models take unchanged, as they take the 1D :class:`~.local_graph.LocalGraph`.

Rank ``i * c + k`` holds row block ``i`` (replicated on the block's ``c`` ranks) and computes
the part of ``Y_i = sum_j A_ij X_j`` over the column blocks it handles (``j % c == k``,
:mod:`.grid`). Per aggregation:

- forward: the partial product is the 1D halo product (:class:`~.local_graph.HaloSpMM`) on the
  rank's 1.5D plan (:func:`~.plan15d.replica_plan`): the rows of ``X_j`` that ``A_ij`` reads
  come from replica ``k`` of block ``j`` (process column ``k``), through the halo codecs; then
  the partial sums are added over the replica group (:class:`~.replica.ReplicaGroup`, message
  kind ``replica_reduce``; ``eval_replica`` without gradients), so every replica holds ``Y_i``;
- backward: every replica holds the same ``dY_i`` and computes ``A_ij^T dY_i`` for its blocks
  (RSC's sampled product on the rank's local matrix); the halo rows' gradients go back to
  replica ``k`` of block ``j`` (``backward_halo``, through
  :meth:`~.local_graph.LocalGraph.halo_backward`: the one seam where a halo sample under a
  byte budget acts, for both algorithms), and the gradient of ``X_i`` is summed over the
  replica group (``replica_grad``), so every replica holds ``dX_i``.

With ``c = 1`` both sums are the identity and the product is the 1D product.
"""

from __future__ import annotations

from typing import Optional

import torch

from .codecs import BitPolicy
from .exchange import HaloExchange
from .grid import ProcessGrid
from .halo import LocalPartition
from .local_graph import LocalGraph
from .replica import ReplicaGroup
from .runtime import DistContext

__all__ = ["BlockGraph", "ReplicaSum", "ReplicaGrad"]


class ReplicaSum(torch.autograd.Function):
    """Forward: the sum of the replicas' partial outputs. Backward: the output's gradient as
    it is (it is the same on every replica, and each partial contributes it whole)."""

    @staticmethod
    def forward(ctx, partial, group: ReplicaGroup, kind: str):
        return group.all_reduce(partial, kind)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class ReplicaGrad(torch.autograd.Function):
    """Forward: the input as it is. Backward: the input's gradient summed over the replica
    group (each replica holds the part its column blocks contribute)."""

    @staticmethod
    def forward(ctx, x, group: ReplicaGroup):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.group.all_reduce(grad.contiguous(), "replica_grad"), None


class BlockGraph(LocalGraph):
    """The 1.5D share of rank ``plan.rank`` (see the module docstring).

    Args:
        plan: the rank's 1.5D plan (:func:`~.plan15d.replica_plan`).
        ctx: the :class:`~.runtime.DistContext`.
        grid: the :class:`~.grid.ProcessGrid`.
        exchange: a :class:`~.exchange.HaloExchange` on ``plan`` (default 32 bits).
        replica_policy: the fixed-width :class:`~.codecs.BitPolicy` of the replica sums
            (default 32 bits).
        overlap: aggregate the block's central rows while the halo is in flight.

    Attributes:
        replicas: the rank's :class:`~.replica.ReplicaGroup` (its seconds are the exchange's
            ``timings["replica"]``).
    """

    def __init__(self, plan: LocalPartition, ctx: DistContext, grid: ProcessGrid,
                 exchange: Optional[HaloExchange] = None,
                 replica_policy: Optional[BitPolicy] = None, overlap: bool = True):  # fmt: skip
        if grid.world_size != plan.num_parts or grid.world_size != ctx.world_size:
            raise ValueError(f"a plan of {plan.num_parts} ranks does not fit a grid of "
                             f"{grid.world_size} and {ctx.world_size} processes.")  # fmt: skip
        super().__init__(plan, ctx, exchange, overlap)
        self.replicas = ReplicaGroup(grid, ctx, replica_policy, self.exchange.timings)

    def num_edges(self) -> int:
        """The block's edges (every in-edge of its rows, over all its replicas), as a layer
        sees the graph; this rank computes ``part.local_src.numel()`` of them."""
        return int(self.part.in_degree.sum())

    def __repr__(self) -> str:
        g, p = self.replicas.grid, self.part
        return (f"BlockGraph(rank={p.rank}/{p.num_parts}, block={g.block_of(p.rank)}/{g.blocks}, "
                f"replica={g.replica_of(p.rank)}/{g.replication}, rows={p.n_own}, "
                f"halo={p.n_halo}, local edges={p.local_src.numel()})")  # fmt: skip

    def rsc_aggregate(self, feat, edge_weight, state_for, row_scale=None, row_divide=False,
                      col_scale=None, score_col_scale=None):  # fmt: skip
        """``(n_own, *F)`` aggregation of the block's rows ``feat (n_own, *F)``: this
        replica's partial product, summed over the replica group."""
        kind = "replica_reduce" if torch.is_grad_enabled() else "eval_replica"
        x = ReplicaGrad.apply(feat, self.replicas) if feat.requires_grad else feat
        partial = super().rsc_aggregate(x, edge_weight, state_for, row_scale, row_divide,
                                        col_scale, score_col_scale)  # fmt: skip
        return ReplicaSum.apply(partial, self.replicas, kind)
