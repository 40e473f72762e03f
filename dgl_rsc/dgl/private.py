"""Every private DGL interface the package uses, in one module, behind one version gate.

DGL's public API does not reach what the patch and the fast paths need: a graph's index
(``g._graph``, a ``HeteroGraphIndex``) and its cached in-edge CSR, DGL's C SpMM kernel
(``dgl._sparse_ops._CAPI_DGLKernelSpMM``), the message-passing function the patch replaces
(``dgl.ops.spmm.gspmm_internal``), DGL's autocast helpers (``dgl.backend.pytorch.sparse``)
and ``GraphConv``'s ``_norm``. Such names may change in any DGL release, so they are read here
only, on the DGL versions they were checked on (:data:`CHECKED`; DGL stops at torch 2.4).
``tests/dgl/test_private.py`` checks each against DGL's public behaviour.

Outside :data:`CHECKED`, :func:`require` raises an ``ImportError`` that says so (the patch
refuses to open), and :func:`available` is ``False``: the exact products leave DGL's kernel
for the package's own, and the drop-in layers read a ``DGLGraph`` through the public
``g.edges(order="eid")``.
"""

from __future__ import annotations

import contextlib
import importlib
from types import ModuleType
from typing import Callable, Optional

import torch

from ..base import _deps

__all__ = [
    "CHECKED",
    "GSPMM",
    "available",
    "autocast_operands",
    "graphconv_norm",
    "build_index",
    "graph_index",
    "has_in_csr",
    "in_csr_tensors",
    "index_counts",
    "require",
    "spmm_into",
    "version_checked",
]

#: ``(oldest, newest)`` DGL ``(major, minor)`` whose private interfaces were checked
CHECKED = ((2, 1), (2, 4))
#: ``(module, attribute)`` of DGL's message-passing SpMM, which the patch replaces
GSPMM = ("dgl.ops.spmm", "gspmm_internal")


def version_checked(version: str) -> bool:
    """``True`` when DGL ``version`` (like ``"2.1.0+cu121"``) lies within :data:`CHECKED`.

    >>> version_checked("2.1.0"), version_checked("2.4.0+cu124"), version_checked("3.0.0")
    (True, True, False)
    """
    try:
        major, minor = (int(p) for p in version.split("+")[0].split(".")[:2])
    except ValueError:
        return False
    return CHECKED[0] <= (major, minor) <= CHECKED[1]


def available() -> bool:
    """``True`` when DGL imports and its version is one the private interfaces were checked
    on."""
    return _deps.dgl_available() and version_checked(_deps.require_dgl().__version__)


def require() -> ModuleType:
    """The ``dgl`` module, or an ``ImportError`` naming the DGL version and what to do."""
    dgl = _deps.require_dgl()
    if not version_checked(dgl.__version__):
        lo, hi = (".".join(map(str, v)) for v in CHECKED)
        raise ImportError(
            f"dgl_rsc reads DGL internals that were checked on DGL {lo} to {hi}; DGL "
            f"{dgl.__version__} is installed. Install a checked DGL (`pip install "
            "dgl==2.1.0`), or use the drop-in layers (dgl_rsc.nn) and dgl_rsc.spmm_csr, "
            "which need no internals."
        )
    return dgl


def graph_index(g):
    """``g``'s ``HeteroGraphIndex`` (``g._graph``): what DGL's kernels take."""
    return g._graph


def has_in_csr(gidx) -> bool:
    """``True`` when the graph index may hold its in-edge CSR (DGL's CSC), which DGL's
    message passing then uses; a graph restricted to other formats (``g.formats("coo")``)
    passes messages over its COO edges instead."""
    formats = gidx.formats()
    return "csc" in formats["created"] or "csc" in formats["not created"]


def in_csr_tensors(gidx) -> tuple:
    """``(num_dst, num_src, indptr, indices, eids)``: DGL's own cached in-edge CSR of the
    homogeneous graph index ``gidx`` (no copy: the data pointers identify the structure)."""
    return gidx.adjacency_matrix_tensors(0, True, "csr")


def index_counts(gidx) -> tuple[int, int]:
    """``(edge types, edges of the first type)`` of a graph index."""
    return gidx.number_of_etypes(), gidx.num_edges(0)


def build_index(indptr: torch.Tensor, indices: torch.Tensor, num_src: int, num_dst: int):
    """A bipartite graph index whose in-edge CSR is ``(indptr (num_dst + 1,), indices)``,
    entry ``p`` being edge ``p`` (sources: ``num_src`` columns, destinations: rows): DGL's
    unit graph index straight from the CSR (no graph object around it: a tenth of
    ``dgl.heterograph``'s 0.25 ms on a 150k-entry slice, which a step pays per new slice)."""
    require()
    index = importlib.import_module("dgl.heterograph_index")
    return index.create_unitgraph_from_csr(
        2, num_src, num_dst, indptr.long(), indices.long(),
        torch.arange(indices.numel()), ["csc"], True,
    )  # fmt: skip


def spmm_into(gidx, X: torch.Tensor, e: Optional[torch.Tensor], out: torch.Tensor) -> None:
    """``out (M, D) += sum over in-edges`` of ``X[src] (* e)`` on DGL's C kernel (``out``
    zeroed by the caller); ``e (nnz, 1)`` or ``None`` for unweighted."""
    ops = importlib.import_module("dgl._sparse_ops")
    ops._CAPI_DGLKernelSpMM(
        gidx, "copy_lhs" if e is None else "mul", "sum", ops.to_dgl_nd(X), ops.to_dgl_nd(e),
        ops.to_dgl_nd_for_write(out), ops.to_dgl_nd_for_write(None),
        ops.to_dgl_nd_for_write(None),
    )  # fmt: skip


def autocast_operands(lhs, rhs) -> tuple[tuple, Callable[[], contextlib.AbstractContextManager]]:
    """DGL's cast of a message product's operands under CUDA autocast, and the context that
    turns autocast off while the product runs (as DGL's own ``gspmm`` does)."""
    amp = importlib.import_module("dgl.backend.pytorch.sparse")
    return amp._cast_if_autocast_enabled(lhs, rhs), amp._disable_autocast_if_enabled


def graphconv_norm(conv) -> str:
    """The ``norm`` a ``dgl.nn.GraphConv`` was built with (``"both"``, ``"right"``, ...)."""
    return conv._norm


def graphconv_aggregates_input(conv, weight) -> bool:
    """A ``dgl.nn.GraphConv`` forward (with external ``weight`` or ``None``) aggregates its
    normalized input before any weight: DGL transforms first only when ``in > out`` and a
    weight is there."""
    has_weight = weight is not None or conv.weight is not None
    return not (has_weight and conv._in_feats > conv._out_feats)
