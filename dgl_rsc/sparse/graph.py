"""``Graph``: a DGL-free homogeneous graph for the drop-in layers
(:func:`dgl_rsc.dgl.interop.message_structure` turns it, or a ``DGLGraph``, into the
message-passing adjacency).

Messages flow ``src -> dst``; the adjacency is ``A (num_nodes, num_nodes)`` with
``A[v, u] = w_e`` for each edge ``e = (u -> v)``. Method names follow ``DGLGraph`` so that a
layer can call ``graph.in_degrees()`` on either kind.
"""

from __future__ import annotations

import operator
from typing import Optional

import torch

from .csr import CSR

__all__ = ["Graph", "check_edges", "csr_by_destination"]


def csr_by_destination(src: torch.Tensor, dst: torch.Tensor, num_src: int, num_dst: int):
    """``(A (num_dst, num_src), eids (E,))``: the unweighted message-passing adjacency of the
    edges ``src[e] -> dst[e]``, each row listing its in-edges in edge-id order (DGL's order),
    and the edge id of each stored entry.

    Example:
        >>> import torch
        >>> A, eids = csr_by_destination(torch.tensor([2, 0, 1]), torch.tensor([1, 0, 1]), 3, 2)
        >>> A.indptr.tolist(), A.indices.tolist(), eids.tolist()
        ([0, 1, 3], [0, 2, 1], [1, 0, 2])
    """
    src, dst = src.long(), dst.long()
    eids = torch.argsort(dst, stable=True)
    counts = torch.bincount(dst, minlength=num_dst)
    indptr = torch.zeros(num_dst + 1, dtype=torch.long, device=dst.device)
    torch.cumsum(counts, 0, out=indptr[1:])
    return CSR(indptr, src[eids], None, (num_dst, num_src)), eids


def check_edges(src, dst, num_nodes) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Validated ``(src, dst, N)`` of an edge list handed in by a user: ``(E,)`` int64 CPU
    tensors of equal length with ids in ``[0, N)``, or a ``ValueError`` that says which."""
    src, dst = torch.as_tensor(src), torch.as_tensor(dst)
    for name, t in (("src", src), ("dst", dst)):
        if t.dim() != 1 or t.is_floating_point() or t.dtype == torch.bool:
            raise ValueError(
                f"{name} must be a 1-D integer tensor, got {t.dtype} {tuple(t.shape)}."
            )
    if src.numel() != dst.numel():
        raise ValueError(f"src has {src.numel()} edges but dst has {dst.numel()}; pass pairs.")
    try:
        n = -1 if isinstance(num_nodes, bool) else operator.index(num_nodes)
    except TypeError:
        n = -1
    if n < 1:
        raise ValueError(f"num_nodes must be an integer >= 1, got {num_nodes!r}.")
    src, dst = src.to("cpu", torch.int64), dst.to("cpu", torch.int64)
    if src.numel() and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= n):
        raise ValueError(f"node ids must lie in [0, num_nodes={n}); raise num_nodes or fix ids.")
    return src, dst, n


class Graph:
    """A homogeneous directed graph held as CSR by destination.

    A row lists its in-edges in edge-id order, as DGL's in-edge CSR does, so that a sum over
    in-edges adds the same numbers in the same order on a ``Graph`` and on a ``DGLGraph``.

    Args:
        src: ``(E,)`` int source node of each edge.
        dst: ``(E,)`` int destination node of each edge.
        num_nodes: number of nodes ``N`` (default: ``max(src, dst) + 1``).

    Example:
        >>> import torch
        >>> g = Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]))
        >>> g.num_nodes(), g.num_edges(), g.in_degrees().tolist()
        (3, 3, [1, 1, 1])
    """

    is_block = False
    batch_size = 1

    def __init__(self, src: torch.Tensor, dst: torch.Tensor, num_nodes: Optional[int] = None):
        if src.shape != dst.shape or src.dim() != 1:
            raise ValueError(
                f"src and dst must be 1-D of equal length, got {tuple(src.shape)} and "
                f"{tuple(dst.shape)}."
            )
        for name, t in (("src", src), ("dst", dst)):
            if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
                raise TypeError(f"{name} must hold integer node ids, got {t.dtype}.")
        if num_nodes is None:
            num_nodes = int(torch.cat([src, dst]).max()) + 1 if src.numel() else 0
        if src.numel():
            lo = int(torch.minimum(src.min(), dst.min()))
            hi = int(torch.maximum(src.max(), dst.max()))
            if lo < 0 or hi >= int(num_nodes):
                bad = lo if lo < 0 else hi
                raise ValueError(
                    f"node id {bad} in src/dst is out of range for num_nodes={int(num_nodes)}; "
                    f"ids must lie in [0, {int(num_nodes)}) (pass a larger num_nodes or fix "
                    "the edge list)."
                )
        self.src, self.dst = src.long(), dst.long()
        self._n = int(num_nodes)
        self.adj, self._eids = csr_by_destination(self.src, self.dst, self._n, self._n)
        # computed here, not on first use: torch.compile then traces no data-dependent
        # shape (bincount) and checks a constant (the zero in-degree flag)
        self._out_degrees = torch.bincount(self.src, minlength=self._n)
        #: a node has no in-edge
        self.zero_in_degree = bool((self.adj.row_nnz() == 0).any())

    @classmethod
    def from_dgl(cls, g) -> Graph:
        """Copy the edges of a homogeneous ``DGLGraph``."""
        src, dst = g.edges()
        return cls(src, dst, g.num_nodes())

    # DGLGraph-like queries ---------------------------------------------------------------
    def num_nodes(self) -> int:
        return self._n

    num_src_nodes = num_dst_nodes = num_nodes

    def num_edges(self) -> int:
        return self.src.numel()

    def batch_num_nodes(self) -> torch.Tensor:
        """``(1,)`` int64: one graph of ``N`` nodes (``DGLGraph``'s batch API)."""
        return torch.tensor([self._n], device=self.device)

    @property
    def device(self) -> torch.device:
        return self.src.device

    def in_degrees(self) -> torch.Tensor:
        """``(N,)`` int64 in-degree of each node."""
        return self.adj.row_nnz()

    def out_degrees(self) -> torch.Tensor:
        """``(N,)`` int64 out-degree of each node (computed once; the graph is immutable)."""
        return self._out_degrees

    def add_self_loop(self) -> Graph:
        """A new graph with one self-loop added to every node."""
        loops = torch.arange(self._n, device=self.device)
        return Graph(torch.cat([self.src, loops]), torch.cat([self.dst, loops]), self._n)

    def to(self, device) -> Graph:
        return Graph(self.src.to(device), self.dst.to(device), self._n)

    def adjacency(self, edge_weight: Optional[torch.Tensor] = None) -> CSR:
        """``CSR (N, N)`` by destination; ``edge_weight (E,)`` (edge-id order) as values."""
        if edge_weight is None:
            return self.adj
        if edge_weight.shape[0] != self.num_edges():
            raise ValueError(
                f"edge_weight has {edge_weight.shape[0]} entries but the graph has "
                f"{self.num_edges()} edges."
            )
        return self.adj.with_values(edge_weight.reshape(-1)[self._eids])

    def edge_ids(self) -> torch.Tensor:
        """``(E,)`` int64 edge id of every stored entry of :attr:`adj`."""
        return self._eids

    def __repr__(self) -> str:
        return f"Graph(num_nodes={self._n}, num_edges={self.num_edges()}, device={self.device})"
