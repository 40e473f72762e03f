"""PyG's graph inputs as dgl_rsc :class:`~dgl_rsc.CSR` matrices, and the RSC aggregation.

PyG passes a graph to a convolution as an ``edge_index (2, E)`` LongTensor (messages flow
``edge_index[j] -> edge_index[i]``, ``(i, j) = (1, 0)`` for ``flow="source_to_target"``) or
as a *transposed* sparse adjacency ``adj_t (N_dst, N_src)`` (a ``torch.sparse`` tensor or a
``torch_sparse.SparseTensor``). Both become the message-passing matrix ``A (N_dst, N_src)``
the RSC operator takes, a CSR by destination; the structure of an ``edge_index`` is built
once and kept in a :class:`~dgl_rsc.sparse.structure_cache.StructureCache` while the same tensor
comes in (keyed by identity and version counter, holding the tensor alive).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..base import _deps
from ..core.ops import compiling, keyed_csr
from ..core.spmm import spmm_matrix
from ..sparse.csr import CSR
from ..sparse.graph import csr_by_destination
from ..sparse.structure_cache import StructureCache

__all__ = ["edge_csr", "sparse_csr", "sparse_reads", "aggregate", "takes_features", "flow_indices"]

#: dtypes the product engine computes as PyG does, per device type (fp16/bf16 on the CPU go
#: to PyG, which computes them in their own precision)
_DTYPES = {
    "cpu": (torch.float32, torch.float64),
    "cuda": (torch.float16, torch.bfloat16, torch.float32, torch.float64),
}


def flow_indices(flow: str) -> tuple[int, int]:
    """``(i, j)``: the rows of ``edge_index`` holding targets and sources for ``flow``."""
    return (1, 0) if flow == "source_to_target" else (0, 1)


def takes_features(x) -> bool:
    """``x`` is a dense ``(N, D)`` floating tensor the engine multiplies exactly as PyG."""
    return (
        isinstance(x, torch.Tensor)
        and x.layout == torch.strided
        and x.dim() == 2
        and x.dtype in _DTYPES.get(x.device.type, ())
    )


def edge_csr(
    edge_index: torch.Tensor,
    num_src: int,
    num_dst: int,
    flow: str,
    cache: StructureCache,
    key: Optional[tuple] = None,
    build_from: Optional[torch.Tensor] = None,
):
    """``(A, perm)``: the unweighted ``A (num_dst, num_src)`` of ``edge_index`` and ``perm
    (E,)``, the edge id of each stored entry (``weights[perm]`` are the values in ``A``'s
    order).

    ``key``/``build_from``: cache the structure of ``build_from`` (an edge list derived from
    ``edge_index`` deterministically, e.g. with self-loops added) under ``key`` and the
    identity of ``edge_index``, so that a derived edge list made afresh every call is sorted
    once.
    """
    source = edge_index if build_from is None else build_from
    i, j = flow_indices(flow)

    def build():
        return csr_by_destination(source[j], source[i], num_src, num_dst)

    def cached():
        full_key = ("pyg", id(edge_index), edge_index._version, int(num_src), int(num_dst),
                    flow, edge_index.device, key)  # fmt: skip
        return cache.get_by_key(full_key, edge_index, build)

    # under torch.compile: a custom operator keyed on edge_index (a variant per key and flow)
    tag = 2 * (0 if key is None else 1 + bool(key[-1])) + (flow == "source_to_target")
    return keyed_csr(edge_index, source[j], source[i], num_src, num_dst, tag, cached)


def _index_tensors(adj) -> tuple:
    """The index tensors that identify the structure of a sparse ``adj``."""
    st = _deps.sparse_tensor_class()
    if st is not None and isinstance(adj, st):
        return adj.storage.rowptr(), adj.storage.col()
    if adj.layout == torch.sparse_csr:
        return adj.crow_indices(), adj.col_indices()
    if adj.layout == torch.sparse_csc:
        return adj.ccol_indices(), adj.row_indices()
    return (adj._indices(),)


def sparse_reads(adj) -> tuple:
    """The tensors whose identity and version counters stand for a sparse ``adj``'s entries
    (a cache key part): a ``SparseTensor``'s stored arrays, a ``torch.sparse`` tensor
    itself (its index and value accessors return new views at every call)."""
    st = _deps.sparse_tensor_class()
    if st is not None and isinstance(adj, st):
        return adj.storage.rowptr(), adj.storage.col(), adj.storage.value()
    return (adj,)


def _key(tag, parts: tuple, shape, device) -> tuple:
    # a COO's indices count a version per coalescing check (gcn_norm makes some): not in it
    versions = [t._version for t in parts] if len(parts) > 1 else []
    return (tag, *(t.data_ptr() for t in parts), *versions, tuple(shape), device)


def _torch_sparse_parts(adj: torch.Tensor, cache: StructureCache, key_of=None):
    """``(A structure, values in A's order)`` of a 2-D ``torch.sparse`` ``adj``."""
    if adj.layout == torch.sparse_csr:
        crow, col = adj.crow_indices(), adj.col_indices()
        values = adj.values()
    else:  # COO (coalesced by the conversion) or CSC
        csr = adj.to_sparse_csr()
        crow, col, values = csr.crow_indices(), csr.col_indices(), csr.values()
    if key_of is None and adj.layout != torch.sparse_csr:
        return CSR(crow, col, None, tuple(adj.shape)), values
    parts = (crow, col) if key_of is None else _index_tensors(key_of[0])
    key = _key(("pyg-csr",) if key_of is None else key_of[1], parts, adj.shape, adj.device)
    A = cache.get_by_key(key, parts, lambda: CSR(crow, col, None, tuple(adj.shape)))
    return _checked(A, crow, col, tuple(adj.shape)), values


def sparse_csr(adj, cache: StructureCache, key_of=None) -> Optional[CSR]:
    """``A (N_dst, N_src)`` with values (``None``: all ones) of a transposed adjacency
    ``adj_t``; ``None`` where the engine does not take it exactly (values that need a
    gradient or are not one number per entry, batched or hybrid tensors): PyG then does.

    ``key_of``: ``(source adjacency, tag)`` when ``adj`` is derived from ``source`` afresh at
    every call and its structure depends on the source's only (``gcn_norm``'s self-loops):
    the structure is then cached under the source's index tensors and ``tag``, so that it
    (and RSC's sample of it) is reused across steps."""
    if compiling():  # sparse inputs under torch.compile: PyG's own (exact) product
        return None
    st = _deps.sparse_tensor_class()
    if st is not None and isinstance(adj, st):
        rowptr, col, value = adj.csr()
        if value is not None and (value.requires_grad or value.dim() != 1):
            return None
        shape = (int(adj.size(0)), int(adj.size(1)))
        parts = (rowptr, col) if key_of is None else _index_tensors(key_of[0])
        key = _key(("pyg-st",) if key_of is None else key_of[1], parts, shape, rowptr.device)
        A = cache.get_by_key(key, parts, lambda: CSR(rowptr, col, None, shape))
        return _checked(A, rowptr, col, shape).with_values(value)
    if not isinstance(adj, torch.Tensor) or adj.layout not in (
        torch.sparse_coo,
        torch.sparse_csr,
        torch.sparse_csc,
    ):
        return None
    if adj.dim() != 2 or adj.dense_dim() != 0 or adj.requires_grad:
        return None
    A, values = _torch_sparse_parts(adj, cache, key_of)
    if values.requires_grad or not values.is_floating_point():
        return None
    return A.with_values(values)


def _checked(A: CSR, rowptr, col, shape) -> CSR:
    """``A`` where it has the entries of ``(rowptr, col)`` (a cached structure always does;
    a cheap guard against a key that outlived its meaning), else a fresh structure."""
    if A.nnz == col.numel() and A.shape == shape:
        return A
    return CSR(rowptr, col, None, shape)


def aggregate(A: CSR, x: torch.Tensor, rsc, mean: bool = False) -> torch.Tensor:
    """``(N_dst, D)``: ``A @ x`` (``mean``: divided by each row's stored entries, at least
    one, as PyG's mean aggregation and ``torch.sparse.mm(..., "mean")``), exact forward and
    the backward of ``x`` approximated per ``rsc`` (see :func:`dgl_rsc.spmm_csr`)."""
    if A.values is not None and A.values.dtype != x.dtype:
        A = A.with_values(A.values.to(x.dtype))
    if not mean:
        return spmm_matrix(A, x, rsc)
    deg = A.row_nnz().clamp(min=1).to(x.dtype)
    return spmm_matrix(A, x, rsc, row_scale=deg, row_divide=True)
