"""Conversions from DGL objects to :class:`~dgl_rsc.CSR` (imports DGL lazily).

The adjacency used for message passing is ``A`` of shape ``(num_dst, num_src)`` with
``A[v, u] = w_e`` for an edge ``e = (u -> v)``: ``update_all(copy_u, sum)`` is ``A @ X``.
"""

from __future__ import annotations

from typing import Optional

import torch

from .csr import CSR
from .structure_cache import StructureCache

__all__ = ["csr_from_sparse_matrix", "csr_from_graph_index", "csr_from_graph"]


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
    nrows, ncols, indptr, indices, eids = gidx.adjacency_matrix_tensors(0, True, "csr")

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


def csr_from_graph(g, edge_weight: Optional[torch.Tensor] = None, cache=None) -> CSR:
    """``CSR`` of a homogeneous ``DGLGraph``'s message-passing adjacency (dst x src)."""
    base, eids = csr_from_graph_index(g._graph, cache)
    if edge_weight is None:
        return base
    w = edge_weight.reshape(-1)
    return base.with_values(w if eids is None else w[eids.long()])
