"""Edge weights of a message-passing sum, resolved like DGL's ``u_mul_e``.

DGL broadcasts the node features ``(N, *F)`` against the edge weights ``(E, *W)`` after
padding the shorter trailing shape with ones on the left. A weight with one number per edge
(``(E,)``, ``(E, 1)``, ...) makes the sum a sparse-dense product that RSC approximates; a
weight per edge and feature (``(E, D)``) makes one product per feature column: that sum is
computed exactly, in DGL's order (:func:`feature_weighted_sum`), and not approximated.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch

from ...sparse.csr import CSR
from .errors import layer_error

__all__ = ["EdgeWeights", "resolve_edge_weight", "feature_weighted_sum", "broadcast_to_rows"]


class EdgeWeights(NamedTuple):
    """How a sum over in-edges weights its messages.

    ``values``: ``(E,)`` one weight per edge (``per_feature`` false), the ``(E, *W)`` weights
    (``per_feature`` true), or ``None``. ``out_tail``: trailing shape of the output rows.
    """

    values: Optional[torch.Tensor]
    per_feature: bool
    out_tail: tuple


def _pad(shape: tuple, ndim: int) -> tuple:
    return (1,) * (ndim - len(shape)) + tuple(shape)


def resolve_edge_weight(edge_weight, num_edges: int, feat: torch.Tensor) -> EdgeWeights:
    """Check ``edge_weight`` against ``feat (N, *F)`` and classify it (see module doc).

    Raises :class:`~dgl_rsc.nn.RSCLayerError` naming the shapes when the weights cannot be
    broadcast to the messages or have another dtype than ``feat``.

    Example:
        >>> import torch
        >>> w = resolve_edge_weight(torch.ones(5, 1), 5, torch.zeros(3, 4))
        >>> w.values.shape, w.per_feature, w.out_tail
        (torch.Size([5]), False, (4,))
    """
    tail = tuple(feat.shape[1:])
    if edge_weight is None:
        return EdgeWeights(None, False, tail)
    if not isinstance(edge_weight, torch.Tensor) or edge_weight.dim() == 0:
        raise layer_error(
            f"edge_weight must be a tensor of shape (E,), (E, 1) or (E, D) with E = "
            f"{num_edges}, got {edge_weight!r:.80}."
        )
    if edge_weight.shape[0] != num_edges:
        raise layer_error(
            f"edge_weight has {edge_weight.shape[0]} entries but the graph has {num_edges} "
            f"edges; pass one weight (or one row of weights) per edge, in edge-id order."
        )
    if edge_weight.dtype != feat.dtype:
        raise layer_error(
            f"edge_weight is {edge_weight.dtype} but the node features are {feat.dtype}; "
            f"convert them to one type, e.g. edge_weight.to({feat.dtype})."
        )
    w_tail = tuple(edge_weight.shape[1:])
    ndim = max(len(tail), len(w_tail))
    f_pad, w_pad = _pad(tail, ndim), _pad(w_tail, ndim)
    try:
        out_tail = tuple(torch.broadcast_shapes(f_pad, w_pad))
    except RuntimeError:
        raise layer_error(
            f"edge_weight of shape {tuple(edge_weight.shape)} does not broadcast with the "
            f"messages of shape (E, {', '.join(map(str, tail))}): per-feature weights need "
            f"the message width (the layer's input width, or its output width when the "
            f"layer multiplies by W before aggregating); scalar weights are (E,) or (E, 1)."
        ) from None
    if math.prod(w_pad) == 1:
        return EdgeWeights(edge_weight.reshape(num_edges), False, f_pad)
    return EdgeWeights(edge_weight.reshape((num_edges,) + w_pad), True, out_tail)


def broadcast_to_rows(scale: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``scale (N,)`` reshaped to ``(N, 1, ...)`` to broadcast over ``like (N, *)``."""
    return scale.reshape(scale.shape + (1,) * (like.dim() - 1))


def feature_weighted_sum(
    A: CSR,
    eids: Optional[torch.Tensor],
    feat: torch.Tensor,
    weights: EdgeWeights,
    row_scale: Optional[torch.Tensor] = None,
    row_divide: bool = False,
    col_scale: Optional[torch.Tensor] = None,
    score_col_scale: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``(M, *B)`` ``out[v] = r_v * sum_{e=(u->v)} (c_u * feat[u]) * w[e]``, exact.

    ``A (M, N)`` lists each row's in-edges in DGL's order, ``eids (nnz,)`` their edge ids
    (``None``: identity), ``weights`` per-feature (from :func:`resolve_edge_weight`). The
    sum starts at zero and adds the messages of a row in stored order, as DGL's CPU kernel
    does; autograd gives the exact backward. ``score_col_scale`` only steers RSC's row
    scores and has no use here.
    """
    del score_col_scale
    x = feat if col_scale is None else feat * broadcast_to_rows(col_scale, feat)
    ndim = len(weights.out_tail) + 1
    x = x.reshape((x.shape[0],) + _pad(tuple(x.shape[1:]), ndim - 1))
    w = weights.values
    entry_w = w if eids is None else w[eids]
    messages = x[A.indices.long()] * entry_w
    out = messages.new_zeros((A.shape[0],) + tuple(messages.shape[1:]))
    out = out.index_add(0, A.row_ids(), messages)
    if row_scale is not None:
        r = broadcast_to_rows(row_scale, out)
        out = out / r if row_divide else out * r
    return out
