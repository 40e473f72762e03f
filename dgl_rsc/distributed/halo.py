"""Per-rank halo plans: the local graph of one part and what it exchanges with the others.

Messages flow ``src -> dst``; the aggregation is ``Y = A X`` with ``A[v, u] = 1`` per edge
``u -> v`` (rows are destinations). Rank ``r`` owns the nodes with ``part == r``, their rows
of ``X`` and ``Y`` and all their in-edges. To aggregate it needs the rows of its *halo*: the
remote in-neighbours of its nodes. A forward exchange sends rank ``q``'s rows
``X_q[send_idx[r]]`` to rank ``r``, which stores them, unchanged in order, as its halo block
``halo_offsets[q]:halo_offsets[q + 1]``; the backward sends the halo block's gradient back,
and the owner adds it at ``send_idx``.

Local numbering on rank ``r`` (columns ``[0, n_own + n_halo)``, rows ``[0, n_own)``):

- ``[0, n_central)``: *central* owned nodes (no in-neighbour on another rank), ascending id;
- ``[n_central, n_own)``: *marginal* owned nodes, ascending id;
- ``[n_own, n_own + n_halo)``: the halo, grouped by owner rank ascending, ascending id within
  a group.

Local edges are sorted by (row, column), so the edges into central rows (which read only
owned columns and can be aggregated while the halo is in flight) are a prefix.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from ..sparse.graph import check_edges
from .partition import part_vector

__all__ = ["LocalPartition", "build_local", "all_local", "halo_rows"]


@dataclasses.dataclass(frozen=True, eq=False)
class LocalPartition:
    """The local graph and halo plan of rank ``rank`` of ``num_parts``.

    Every tensor is int64 on the CPU.

    Attributes:
        rank, num_parts, num_nodes: ``r``, ``P`` and the global ``N``.
        owned: ``(n_own,)`` global ids of the owned nodes in local order (central first).
        n_central: how many owned nodes are central (the first ``n_central`` of ``owned``).
        halo: ``(n_halo,)`` global ids of the halo nodes in local order.
        halo_offsets: ``(P + 1,)``; the halo rows owned by rank ``q`` are
            ``halo[halo_offsets[q]:halo_offsets[q + 1]]`` (empty for ``q == rank``).
        send_idx: ``P`` tensors; ``send_idx[q]`` holds the local (owned) indices whose rows
            rank ``q`` needs, in the order of ``q``'s halo block for this rank, so a
            received buffer is used as it is (``send_idx[rank]`` is empty).
        local_src: ``(E_r,)`` local column ids in ``[0, n_own + n_halo)``.
        local_dst: ``(E_r,)`` local row ids in ``[0, n_own)``; sorted, then ``local_src``.
        edge_ids: ``(E_r,)`` position of each local edge in the global edge list (to slice
            edge weights).
        out_degree: ``(n_own,)`` global out-degrees of the owned nodes (edges to all parts,
            as a GCN normalization needs).
        in_degree: ``(n_own,)`` in-degrees of the owned nodes (all their in-edges are local).
    """

    rank: int
    num_parts: int
    num_nodes: int
    owned: torch.Tensor
    n_central: int
    halo: torch.Tensor
    halo_offsets: torch.Tensor
    send_idx: tuple[torch.Tensor, ...]
    local_src: torch.Tensor
    local_dst: torch.Tensor
    edge_ids: torch.Tensor
    out_degree: torch.Tensor
    in_degree: torch.Tensor

    @property
    def n_own(self) -> int:
        return int(self.owned.numel())

    @property
    def n_halo(self) -> int:
        return int(self.halo.numel())

    @property
    def n_local(self) -> int:
        """Columns of the local matrix: ``n_own + n_halo``."""
        return self.n_own + self.n_halo

    @property
    def n_marginal(self) -> int:
        return self.n_own - self.n_central

    @property
    def n_central_edges(self) -> int:
        """Edges into central rows: the first ``n_central_edges`` local edges."""
        return int(torch.searchsorted(self.local_dst, self.n_central))

    @property
    def local_nodes(self) -> torch.Tensor:
        """``(n_own + n_halo,)`` global id of every local column."""
        return torch.cat([self.owned, self.halo])

    @property
    def recv_counts(self) -> list[int]:
        """Rows received from each rank per forward exchange (halo block sizes)."""
        return self.halo_offsets.diff().tolist()

    @property
    def send_counts(self) -> list[int]:
        """Rows sent to each rank per forward exchange."""
        return [int(t.numel()) for t in self.send_idx]

    def global_to_local(self, ids: torch.Tensor) -> torch.Tensor:
        """Local ids of global node ids (same shape); ``-1`` where a node is not local.

        Example:
            >>> src, dst = torch.tensor([0, 2, 1]), torch.tensor([1, 1, 2])
            >>> lp = build_local(src, dst, 3, torch.tensor([0, 0, 1]), rank=0)
            >>> lp.owned.tolist(), lp.halo.tolist()
            ([0, 1], [2])
            >>> lp.global_to_local(torch.tensor([2, 1, 0])).tolist()
            [2, 1, 0]
        """
        return _Lookup(self.local_nodes)(torch.as_tensor(ids, dtype=torch.int64))


class _Lookup:
    """Maps global ids to positions in ``keys`` (distinct ids) by binary search; ``-1`` when
    absent. Costs ``O(len(keys))`` memory, not ``O(N)``."""

    def __init__(self, keys: torch.Tensor):
        self.sorted, self.pos = torch.sort(keys)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        if self.sorted.numel() == 0:
            return torch.full_like(ids, -1)
        at = torch.searchsorted(self.sorted, ids).clamp_(max=self.sorted.numel() - 1)
        return torch.where(self.sorted[at] == ids, self.pos[at], torch.full_like(ids, -1))


def _build(rank, p, n, part, src, dst, in_ids, out_cut_ids, own_ids, out_deg) -> LocalPartition:
    """One rank's plan from its in-edge ids, its outgoing cut-edge ids and its node ids."""
    s, d = src[in_ids], dst[in_ids]
    remote = part[s] != rank
    is_marginal = torch.isin(own_ids, d[remote])
    owned = torch.cat([own_ids[~is_marginal], own_ids[is_marginal]])
    halo = torch.unique(s[remote])  # ascending ids; a stable sort by owner keeps that order
    owner = part[halo]
    halo = halo[torch.sort(owner, stable=True).indices]
    halo_offsets = torch.zeros(p + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(owner, minlength=p), 0, out=halo_offsets[1:])
    lookup = _Lookup(torch.cat([owned, halo]))
    n_own = owned.numel()
    local_src, local_dst = lookup(s), lookup(d)
    order = torch.argsort(local_dst * (n_own + halo.numel()) + local_src, stable=True)
    # rows needed elsewhere: (needing rank q, owned node u) pairs, sorted by q then u, which
    # is the order of q's halo block for this rank
    key = torch.unique(part[dst[out_cut_ids]] * n + src[out_cut_ids])
    q, u = torch.div(key, n, rounding_mode="floor"), key % n
    send = torch.split(lookup(u), torch.bincount(q, minlength=p).tolist())
    local_dst = local_dst[order]
    return LocalPartition(
        rank=rank,
        num_parts=p,
        num_nodes=n,
        owned=owned,
        n_central=int((~is_marginal).sum()),
        halo=halo,
        halo_offsets=halo_offsets,
        send_idx=tuple(t.clone() for t in send),
        local_src=local_src[order],
        local_dst=local_dst,
        edge_ids=in_ids[order],
        out_degree=out_deg[owned],
        in_degree=torch.bincount(local_dst, minlength=n_own),
    )


def build_local(
    src, dst, num_nodes: int, part, rank: int, parts: Optional[int] = None
) -> LocalPartition:
    """The halo plan of rank ``rank`` (see the module docstring for the numbering).

    Args:
        src, dst: ``(E,)`` global edge list ``src -> dst`` (repeats are kept as edges).
        num_nodes: ``N``.
        part: ``(N,)`` part ids in ``[0, P)``.
        rank: ``r`` in ``[0, P)``.
        parts: ``P``; default ``part.max() + 1``.

    Returns:
        A :class:`LocalPartition`. Costs ``O(E)`` time: to build every rank's plan, use
        :func:`all_local`, which sorts the edges once.
    """
    src, dst, n = check_edges(src, dst, num_nodes)
    part, p = part_vector(part, n, parts)
    if not 0 <= int(rank) < p:
        raise ValueError(f"rank={rank} must lie in [0, {p}) for a partition into {p} parts.")
    rank = int(rank)
    ps, pd = part[src], part[dst]
    in_ids = torch.nonzero(pd == rank).flatten()
    out_cut = torch.nonzero((ps == rank) & (pd != rank)).flatten()
    own_ids = torch.nonzero(part == rank).flatten()
    out_deg = torch.bincount(src, minlength=n)
    return _build(rank, p, n, part, src, dst, in_ids, out_cut, own_ids, out_deg)


def all_local(src, dst, num_nodes: int, part, parts: Optional[int] = None) -> list[LocalPartition]:
    """:func:`build_local` for every rank (``parts`` of them; default ``part.max() + 1``),
    sharing one sort of the edges.

    Example:
        >>> src, dst = torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 0])
        >>> plans = all_local(src, dst, 4, torch.tensor([0, 0, 1, 1]))
        >>> [(lp.owned.tolist(), lp.halo.tolist(), lp.send_counts) for lp in plans]
        [([1, 0], [3], [0, 1]), ([3, 2], [1], [1, 0])]
    """
    src, dst, n = check_edges(src, dst, num_nodes)
    part, p = part_vector(part, n, parts)
    ps, pd = part[src], part[dst]
    by_dst = torch.sort(pd, stable=True).indices.split(torch.bincount(pd, minlength=p).tolist())
    cut = torch.nonzero(ps != pd).flatten()
    ps_cut = ps[cut]
    by_src = cut[torch.sort(ps_cut, stable=True).indices].split(
        torch.bincount(ps_cut, minlength=p).tolist()
    )
    nodes = torch.sort(part, stable=True).indices.split(torch.bincount(part, minlength=p).tolist())
    out_deg = torch.bincount(src, minlength=n)
    return [
        _build(r, p, n, part, src, dst, by_dst[r], by_src[r], nodes[r], out_deg) for r in range(p)
    ]


def halo_rows(
    src, dst, num_nodes: int, part, parts: Optional[int] = None, rows=None
) -> torch.Tensor:
    """Rows exchanged per pair of ranks: ``M[q, r]`` = distinct nodes owned by ``q`` with an
    edge into a node owned by ``r`` (``q != r``; the diagonal is 0).

    ``M[q, r]`` rows go from ``q`` to ``r`` in a forward halo exchange; in the backward the
    same rows' gradients go from ``r`` back to ``q``. With ``rows`` (an ``(N,)`` bool mask of
    destination rows, e.g. the rows RSC keeps), only edges into those rows count: the halo
    columns that carry a non-zero gradient.

    Args:
        src, dst, num_nodes, part: as in :func:`build_local`.
        parts: ``P``; default ``part.max() + 1``.
        rows: optional ``(N,)`` bool mask of destination nodes.

    Returns:
        ``(P, P)`` int64; row sums are rows sent per rank, column sums are halo sizes.

    Example:
        >>> src, dst = torch.tensor([0, 0, 2]), torch.tensor([2, 3, 1])
        >>> halo_rows(src, dst, 4, torch.tensor([0, 0, 1, 1])).tolist()
        [[0, 1], [1, 0]]
    """
    src, dst, n = check_edges(src, dst, num_nodes)
    part, p = part_vector(part, n, parts)
    keep = part[src] != part[dst]
    if rows is not None:
        rows = torch.as_tensor(rows)
        if rows.shape != (n,) or rows.dtype != torch.bool:
            raise ValueError(
                f"rows must be an (N,) = ({n},) bool mask, got {rows.dtype} "
                f"{tuple(rows.shape)}."
            )
        keep &= rows.cpu()[dst]
    key = torch.unique(part[dst[keep]] * n + src[keep])  # (needing rank, node), distinct
    pair = part[key % n] * p + torch.div(key, n, rounding_mode="floor")
    return torch.bincount(pair, minlength=p * p).view(p, p)
