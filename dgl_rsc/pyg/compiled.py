"""PyG's GCN normalization under ``torch.compile``: one custom operator per graph input.

``gcn_norm`` adds the missing self-loops through a boolean mask, an operator whose output
shape depends on the data, so dynamo splits a stock 2-layer ``GCN`` into six graphs (five
breaks, torch 2.15, PyG 2.8.1). Without edge weights the normalized matrix depends on
``edge_index`` alone: ``dgl_rsc::pyg_gcn_csr`` computes it with PyG's own ``gcn_norm`` the
first time a graph input comes in and caches it, values included, under that input
(:func:`dgl_rsc.core.ops.keyed_entry`); the traced model holds no normalization and no break,
and the product operator finds the same matrix (and RSC's cached sample of it) at every step.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..core.ops import HAS_OPS, KEYED_VALUES, OpMatrix, keyed_entry
from ..sparse.graph import csr_by_destination

__all__ = ["gcn_matrix"]

_DTYPES = (torch.float32, torch.float64)


def _tag(improved: bool, loops: bool, flow: str, dtype: torch.dtype) -> int:
    flow_bit = flow == "source_to_target"
    return KEYED_VALUES + 8 * _DTYPES.index(dtype) + 4 * improved + 2 * loops + flow_bit


def _build(edge_index, n, improved, loops, flow, dtype):
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    norm_ei, norm_w = gcn_norm(edge_index, None, n, improved, loops, flow, dtype)
    i, j = (1, 0) if flow == "source_to_target" else (0, 1)
    A, perm = csr_by_destination(norm_ei[j], norm_ei[i], n, n)
    return (A.with_values(norm_w[perm]),)


if HAS_OPS:

    @torch.library.custom_op("dgl_rsc::pyg_gcn_csr", mutates_args=())
    def _gcn_csr(edge_index: torch.Tensor, n: int, improved: bool, loops: bool, flow: str,
                 double: bool) -> torch.Tensor:  # fmt: skip
        """The cached normalized matrix's ``indptr`` (a copy; its shape is static): the
        product operator takes it, so it runs after this one, and finds the matrix (values
        included) by ``edge_index``."""
        dtype = torch.float64 if double else torch.float32
        (A,) = keyed_entry(edge_index, _tag(improved, loops, flow, dtype), n, n,
                           lambda: _build(edge_index, n, improved, loops, flow, dtype))  # fmt: skip
        return A.indptr.clone()

    @_gcn_csr.register_fake
    def _(edge_index, n, improved, loops, flow, double):
        return edge_index.new_empty((n + 1,))


def gcn_matrix(conv, edge_index: torch.Tensor, n: int, dtype: torch.dtype,
               improved: bool) -> Optional[OpMatrix]:  # fmt: skip
    """``A (n, n)``: ``conv``'s (a ``GCNConv``/``GCN2Conv``) normalization of ``edge_index``
    without edge weights as an :class:`~dgl_rsc.core.ops.OpMatrix` (its values included), or
    ``None`` where the operator does not take it (``dtype`` not fp32/fp64)."""
    if dtype not in _DTYPES:
        return None
    improved, loops = bool(improved), bool(conv.add_self_loops)
    indptr = torch.ops.dgl_rsc.pyg_gcn_csr(edge_index, n, improved, loops, conv.flow,
                                           dtype == torch.float64)  # fmt: skip
    tag = _tag(improved, loops, conv.flow, dtype)
    # values None: the product operator uses the cached matrix's (no indices traced either)
    return OpMatrix(indptr, indptr, None, (n, n), edge_index, tag)
