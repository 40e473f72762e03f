"""The native GCN's training forward with the row-restricted backward
(:mod:`dgl_rsc.core.restrict`), when its controller's config asks for it (``restrict``).

It runs the same operations as ``GCN.forward`` through its ``GraphConv`` layers (the same
output bit for bit, the same random numbers), but cuts the model between its sparse products:
the ReLU, dropout and bias after product ``l``, an aggregate-first layer's weight before
them and a transform-first next layer's weight after them form one
:class:`~dgl_rsc.core.restrict.RestrictedSegment`, whose backward computes only the rows
product ``l``'s sampled backward reads. Only where the package sees every consumer of those
tensors: each intermediate tensor here has one consumer, and the path is refused (the plain
forward runs, every row computed) for batch norm, hooks on the layers, a layer that is not
exactly :class:`dgl_rsc.nn.GraphConv`, activations inside the layers, edge weights, INT8,
blocks, distributed graphs and layers attached to different controllers.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torch.nn.modules import module as _module

from ..core.restrict import RestrictedSegment, RowPlan, SegmentSpec
from ..dgl.interop import message_structure
from ..dgl.nn._base import check_in_degrees
from ..dgl.nn.graphconv import GraphConv

__all__ = ["restricted_forward", "applies"]


def _hooked(m: nn.Module) -> bool:
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                or getattr(m, "_backward_pre_hooks", None))  # fmt: skip


def sees_every_consumer(mods) -> bool:
    """No hook on any of ``mods`` and no global module hook: nothing the package cannot see
    reads the tensors that bypassing these modules' calls would hide."""
    if any(_hooked(m) for m in mods):
        return False
    return not (_module._global_forward_hooks or _module._global_forward_pre_hooks
                or _module._global_backward_hooks)  # fmt: skip


def applies(stack, graph, feat, edge_weight=None) -> Optional[object]:
    """The controller whose ``restrict`` config applies to ``stack`` (a GCN ``_Stack``) for
    this call, or ``None`` (the plain forward runs)."""
    if not (stack.training and torch.is_grad_enabled()) or edge_weight is not None:
        return None
    convs = list(stack.convs)
    if not convs or not all(type(c) is GraphConv for c in convs):
        return None
    ctl = convs[0].rsc_controller()
    if ctl is None or getattr(ctl.config, "restrict", "off") == "off":
        return None
    if any(c.rsc_controller() is not ctl or c._rsc_mode != "attached" for c in convs):
        return None
    if any(c.weight is None or c._activation is not None or c.rsc_int8() is not None
           for c in convs):  # fmt: skip
        return None
    if not all(type(n) is nn.Identity for n in stack.norms):
        return None
    if not isinstance(feat, torch.Tensor) or getattr(graph, "is_block", False):
        return None
    if getattr(graph, "rsc_aggregate", None) is not None or not 0 <= stack.dropout.p < 1:
        return None
    mods = [stack, stack.dropout, stack.input_dropout, *convs, *stack.norms]
    return ctl if sees_every_consumer(mods) else None


def _scales(conv: GraphConv, graph, feat: torch.Tensor):
    """``(col, row)`` of ``conv``'s normalization, as ``GraphConv.forward`` computes them."""
    return conv.norm_scales(graph, feat, feat)


def _first(conv: GraphConv) -> bool:
    """``conv`` multiplies by its weight before the aggregation (transform-first)."""
    return conv._in_feats > conv._out_feats


def _fused(col, row, after: bool) -> dict:
    """The scales ``GraphConv.forward`` fuses into the product (``after``: the weight comes
    after it)."""
    if not after:
        return {"row_scale": row, "score_col_scale": col}
    return {"row_scale": None, "col_scale": col}


def _cached_first(conv: GraphConv, graph, h: torch.Tensor, col, row):
    """The first layer's aggregation ``diag(row) A diag(col) h`` from its input cache
    (:mod:`dgl_rsc.dgl.nn.input_cache`, both scales applied, as ``GraphConv`` caches it), or
    ``None`` where the cache does not apply (then the layer aggregates at every step)."""
    return conv._cached_input(graph, h, None, lambda: conv._aggregate(
        graph, h, row_scale=row, col_scale=col))  # fmt: skip


def restricted_forward(stack, graph, feat: torch.Tensor, ctl) -> torch.Tensor:
    """``stack``'s forward (``feat (N, F)`` -> ``(N, C)``) with restricted segments; ``ctl``:
    what :func:`applies` returned."""
    convs = list(stack.convs)
    if not all(c._allow_zero_in_degree for c in convs):
        check_in_degrees(graph)
    h = stack.input_dropout(feat)
    scales = [_scales(c, graph, h) for c in convs]
    after = [not _first(c) for c in convs]  # the layer's weight applied after its product
    cached = _cached_first(convs[0], graph, h, *scales[0])
    if cached is not None:  # the first product once per run: aggregate-first, no row scale
        after[0], scales[0] = True, (scales[0][0], None)
    col = scales[0][0]
    x = h if after[0] else torch.matmul(h if col is None else h * col.reshape(-1, 1),
                                        convs[0].weight)  # fmt: skip
    mode = ctl.config.restrict
    for i, conv in enumerate(convs):
        col, row = scales[i]
        approximated = x.requires_grad  # False for a cached first product (x: the input)
        if i == 0 and cached is not None:
            z = cached
        else:
            z = conv._aggregate(graph, x, **_fused(col, row, after[i]))
        if i == len(convs) - 1:
            if after[i]:
                z = torch.matmul(z, conv.weight)
                z = z if row is None else z * row.reshape(-1, 1)
            return z if conv.bias is None else z + conv.bias
        plan = None
        if approximated:
            A = message_structure(graph, conv._structures())[0]
            index = conv.rsc_slots()[0]
            plan = RowPlan(ctl.layer(index), ctl.step_info(index), A, mode)
        spec = SegmentSpec(
            row if after[i] else None,
            None if after[i + 1] else scales[i + 1][0],
            float(stack.dropout.p),
        )
        x = RestrictedSegment.apply(
            z,
            conv.weight if after[i] else None,
            conv.bias,
            None if after[i + 1] else convs[i + 1].weight,
            spec,
            plan,
        )
    raise AssertionError("unreachable: the loop returns at the last layer")
