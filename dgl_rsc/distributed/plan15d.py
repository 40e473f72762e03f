"""The 1.5D plan of one rank, derived from its block's 1D halo plan, and the bytes it moves.

The graph is cut into ``q = P / c`` row blocks; :func:`~dgl_rsc.distributed.halo.build_local`
gives block ``i``'s 1D plan at ``q`` parts (rows central-first, the halo grouped by owner
block). Replica ``k`` of block ``i`` (rank ``i * c + k``) keeps of it:

- the rows: all of block ``i``'s, in the same order on every replica;
- the columns of the blocks it handles (``j % c == k``): its own block's when ``i % c == k``,
  and the halo blocks of the other handled blocks, in block order;
- the edges into those columns (every edge of ``A`` is kept by exactly one rank);
- what it sends: block ``i``'s rows that block ``j`` needs, to rank ``j * c + k``, only when
  it is the replica that handles block ``i`` (``i % c == k``).

The result is a :class:`~dgl_rsc.distributed.halo.LocalPartition` whose parts are the *global
ranks* (halo offsets and send lists of length ``P``, empty outside the rank's process
column), so the 1D exchange and product (:class:`~.exchange.HaloExchange`,
:class:`~.local_graph.HaloSpMM`) run on it unchanged. ``in_degree`` stays the row's full
in-degree (its edges are spread over the replicas). With ``c = 1`` the plan is the 1D plan.

:func:`replica_bytes` and :func:`planned_bytes` give the bytes the exchange moves, the
formulas the cost model and the tests check the counters against.
"""

from __future__ import annotations

import torch

from .grid import ProcessGrid
from .halo import LocalPartition, all_local, build_local

__all__ = ["replica_plan", "block_plans", "rank_plan", "replica_bytes", "planned_bytes"]


def replica_plan(block: LocalPartition, grid: ProcessGrid, replica: int) -> LocalPartition:
    """The plan of ``replica`` of block ``block.rank`` (``block``: the block's 1D plan at
    ``grid.blocks`` parts), in global ranks (see the module docstring)."""
    i, q, c = block.rank, block.num_parts, grid.replication
    if q != grid.blocks:
        raise ValueError(f"a 1D plan of {q} parts does not fit a grid of {grid.blocks} blocks.")
    n_own, p = block.n_own, grid.world_size
    handled = [j % c == replica for j in range(q)]
    off = block.halo_offsets.tolist()
    # old local column -> new local column (-1: another replica's); the owned rows keep
    # columns [0, n_own) whether this replica reads them or not, the kept halo follows
    sizes = torch.zeros(p, dtype=torch.int64)
    kept_halo = torch.zeros(block.n_halo, dtype=torch.bool)
    for j in range(q):
        if handled[j] and j != i:
            kept_halo[off[j] : off[j + 1]] = True
            sizes[grid.rank_of(j, replica)] = off[j + 1] - off[j]
    new_col = torch.full((block.n_local,), -1, dtype=torch.int64)
    if handled[i]:
        new_col[:n_own] = torch.arange(n_own)
    new_col[n_own:][kept_halo] = n_own + torch.arange(int(kept_halo.sum()))
    edge = new_col[block.local_src] >= 0
    halo_offsets = torch.zeros(p + 1, dtype=torch.int64)
    torch.cumsum(sizes, 0, out=halo_offsets[1:])
    empty = torch.zeros(0, dtype=torch.int64)
    send = [empty] * p
    if handled[i]:  # this replica sends block i's rows and receives their gradients
        for j in range(q):
            send[grid.rank_of(j, replica)] = block.send_idx[j]
    src = new_col[block.local_src[edge]]  # order kept: still sorted by (row, column)
    return LocalPartition(
        rank=grid.rank_of(i, replica),
        num_parts=p,
        num_nodes=block.num_nodes,
        owned=block.owned,
        n_central=block.n_central,
        halo=block.halo[kept_halo],
        halo_offsets=halo_offsets,
        send_idx=tuple(t.clone() for t in send),
        local_src=src,
        local_dst=block.local_dst[edge],
        edge_ids=block.edge_ids[edge],
        out_degree=block.out_degree,
        in_degree=block.in_degree,
    )


def block_plans(src, dst, num_nodes: int, part, grid: ProcessGrid) -> list[LocalPartition]:
    """Every rank's 1.5D plan (``part``: ``(N,)`` block ids in ``[0, grid.blocks)``), rank
    order; one sort of the edges for all blocks."""
    blocks = all_local(src, dst, num_nodes, part, grid.blocks)
    return [replica_plan(blocks[grid.block_of(r)], grid, grid.replica_of(r))
            for r in range(grid.world_size)]  # fmt: skip


def rank_plan(src, dst, num_nodes: int, part, grid: ProcessGrid, rank: int) -> LocalPartition:
    """The 1.5D plan of one rank (``O(E)``; :func:`block_plans` for all of them)."""
    block = build_local(src, dst, num_nodes, part, grid.block_of(rank), grid.blocks)
    return replica_plan(block, grid, grid.replica_of(rank))


def replica_bytes(n_rows: int, width: int, grid: ProcessGrid, replica: int,
                  nbytes=lambda rows, width: 4 * rows * width) -> tuple[int, int]:  # fmt: skip
    """``(sent, received)`` bytes of ``replica``'s share of one replica-group sum of an
    ``(n_rows, width)`` tensor (:class:`~.replica.ReplicaGroup`): the rows are cut into ``c``
    chunks (chunk ``m`` is rows ``[n m / c, n (m + 1) / c)``); each replica sends the others
    their chunk of its tensor and gets back the sum of its own chunk, sent to all others.
    ``nbytes(rows, width)``: a message's payload (fp32 by default, a codec's ``nbytes``).
    About ``2 (c - 1) / c * n_rows * width * 4`` each way, what a ring all-reduce moves.

    Example:
        >>> replica_bytes(10, 3, ProcessGrid(4, 2), 0)
        (120, 120)
    """
    c = grid.replication
    rows = [n_rows * (m + 1) // c - n_rows * m // c for m in range(c)]
    others = sum(nbytes(r, width) for m, r in enumerate(rows) if m != replica)
    mine = (c - 1) * nbytes(rows[replica], width)
    return others + mine, mine + others


def planned_bytes(plan: LocalPartition, grid: ProcessGrid, width: int) -> dict:
    """Bytes one exact fp32 aggregation of width ``width`` moves on ``plan``'s rank, by
    message kind: ``{"forward_halo": (sent, received), "backward_halo": ...,
    "replica_reduce": ..., "replica_grad": ...}``. The backward halo counts every halo row
    with an int32 index (what travels when every row's gradient is non-zero); the replica
    sums are those of the output and of the input's gradient, ``n_own x width`` each."""
    row = 4 * width
    fwd = (row * sum(t.numel() for t in plan.send_idx), row * plan.n_halo)
    bwd = (fwd[1] + 4 * plan.n_halo, fwd[0] + 4 * sum(t.numel() for t in plan.send_idx))
    rep = replica_bytes(plan.n_own, width, grid, grid.replica_of(plan.rank))
    return {"forward_halo": fwd, "backward_halo": bwd, "replica_reduce": rep, "replica_grad": rep}
