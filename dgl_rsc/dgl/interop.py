"""Conversions from DGL objects to :class:`~dgl_rsc.CSR` (imports DGL lazily), and
:func:`message_structure`, the one function that turns either a :class:`~dgl_rsc.Graph`
or a ``DGLGraph`` into the message-passing adjacency.

The adjacency used for message passing is ``A`` of shape ``(num_dst, num_src)`` with
``A[v, u] = w_e`` for an edge ``e = (u -> v)``: ``update_all(copy_u, sum)`` is ``A @ X``.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..base import _deps
from ..sparse.csr import CSR
from ..sparse.graph import Graph, csr_by_destination
from ..sparse.structure_cache import StructureCache
from . import private as dgl_private

__all__ = [
    "csr_from_sparse_matrix",
    "csr_from_graph_index",
    "csr_from_graph",
    "message_structure_of_dgl",
    "message_structure",
]


def csr_from_sparse_matrix(A, cache: Optional[StructureCache] = None) -> CSR:
    """``CSR`` of a ``dgl.sparse.SparseMatrix`` with scalar values; ``A.val`` keeps its grad."""
    if A.val.dim() != 1:
        raise ValueError(
            f"A must have scalar values, got values of shape {tuple(A.val.shape)}; for "
            "vector values use dgl.sparse.bspmm."
        )

    def build():
        indptr, indices, vid = A.csr()
        return CSR(indptr, indices, None, A.shape, check=False), vid

    base, vid = cache.get(A, build) if cache is not None else build()
    val = A.val if vid is None else A.val[vid]
    return base.with_values(val)


def csr_from_graph_index(gidx, cache: Optional[StructureCache] = None):
    """``(CSR (num_dst, num_src) unweighted, eids (nnz,) or None)`` of a homogeneous graph
    index; ``eids[p]`` is the edge id of stored entry ``p`` (``None`` when identity).

    DGL returns its own cached in-edge CSR arrays here (no copy), so their data pointers
    identify the structure across the fresh graph-index objects DGL makes per call.
    """
    nrows, ncols, indptr, indices, eids = dgl_private.in_csr_tensors(gidx)

    def build():
        ids = eids
        if ids.numel() == 0 or bool(
            (ids == torch.arange(ids.numel(), device=ids.device, dtype=ids.dtype)).all()
        ):
            ids = None
        return CSR(indptr, indices, None, (nrows, ncols), check=False), ids

    if cache is None:
        return build()
    key = ("csr", indptr.data_ptr(), indices.data_ptr(), nrows, ncols, indices.numel())
    return cache.get_by_key(key, (indptr, indices, eids), build)


def message_structure_of_dgl(g, cache: Optional[StructureCache] = None):
    """``(A (N_dst, N_src), eids (nnz,) int64 or None)`` of a ``DGLGraph`` with one edge type
    (see :func:`message_structure`). A graph without an in-edge CSR is read
    from its edges, in edge-id order (the order of DGL's COO kernel on one thread)."""
    if len(g.canonical_etypes) != 1:
        raise ValueError(
            "dgl_rsc layers take graphs with one edge type; got edge types "
            f"{g.canonical_etypes}. Use dgl.to_homogeneous(g) or dgl.nn.HeteroGraphConv."
        )
    gidx = dgl_private.graph_index(g) if dgl_private.available() else None
    if gidx is None or not dgl_private.has_in_csr(gidx):

        def build():
            src, dst = g.edges(order="eid")
            return csr_by_destination(src, dst, g.num_src_nodes(), g.num_dst_nodes())

        return cache.get(g, build) if cache is not None else build()
    base, eids = csr_from_graph_index(gidx, cache)
    return base, None if eids is None else eids.long()


def csr_from_graph(g, edge_weight: Optional[torch.Tensor] = None, cache=None) -> CSR:
    """``CSR`` of a homogeneous ``DGLGraph``'s message-passing adjacency (dst x src)."""
    dgl_private.require()
    base, eids = csr_from_graph_index(dgl_private.graph_index(g), cache)
    if edge_weight is None:
        return base
    w = edge_weight.reshape(-1)
    return base.with_values(w if eids is None else w[eids.long()])


def message_structure(graph, cache: Optional[StructureCache] = None):
    """``(A, eids)``: the unweighted message-passing adjacency ``A (N_dst, N_src)`` of a
    ``Graph`` or of a ``DGLGraph`` with one edge type (blocks and bipartite graphs included),
    and ``eids (nnz,)`` int64, the edge id of each stored entry (``None`` when identity)."""
    if isinstance(graph, Graph):
        return graph.adj, graph.edge_ids()
    _deps.require_dgl()
    return message_structure_of_dgl(graph, cache)
