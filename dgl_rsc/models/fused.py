"""The GCN/SAGE stack's forward with each hidden layer's epilogue in one pass.

A hidden layer of :class:`~dgl_rsc.models.paper.GCN` or :class:`~dgl_rsc.models.paper.SAGE`
ends with bias, ReLU and dropout: op by op, five or more full passes over its ``(N, D)``
output forward and four backward, plus the degree scaling of ``X`` or ``X W`` that a
``GraphConv`` applies outside its product. Here each layer's scalings run inside the sparse
product (:meth:`GraphConv.pre_activation <dgl_rsc.nn.GraphConv.pre_activation>`) and bias,
ReLU and dropout in one pass each way (:func:`dgl_rsc.sparse.epilogue.bias_act_dropout`).
Outputs and gradients equal the op-by-op forward up to floating-point reassociation, with
dropout drawn by the epilogue's hash instead of ``torch.nn.Dropout`` (the same distribution).

It runs only where it sees the whole layer: our ``GraphConv``/``SAGEConv`` without an
activation inside (or the PyG drop-ins' adapters, whose ``pre_activation`` is the conv's
output with its bias: ReLU and dropout fused), no batch norm, no hooks on the modules it
bypasses, CPU float32 features with the Numba engine. Under torch.compile (torch >= 2.4)
the epilogue is one custom operator (``dgl_rsc::bias_act_dropout``): inductor's
dropout draws cost more on the CPU than the whole layer. Elsewhere the op-by-op forward
runs. ``model.fused_epilogue = False`` turns it off.
"""

from __future__ import annotations

import torch
from torch import nn

from ..base.tracing import compiling
from ..dgl.nn.graphconv import GraphConv
from ..dgl.nn.sageconv import SAGEConv
from ..int8.codes import epilogue_codes
from ..sparse.epilogue import bias_act_dropout, engine_for
from .restricted import sees_every_consumer

__all__ = ["applies", "fused_forward"]


def _plain_conv(conv) -> bool:
    if type(conv) is GraphConv:
        return conv._activation is None
    if type(conv) is SAGEConv:
        return conv.activation is None and conv.norm is None
    # a front end's layer whose pre_activation is its whole output (dgl_rsc.pyg's adapters)
    return getattr(type(conv), "rsc_pre_activation", False) is True


def applies(stack, graph, feat) -> bool:
    """Whether :func:`fused_forward` computes ``stack``'s forward for this call."""
    if not getattr(stack, "fused_epilogue", False):
        return False
    if not isinstance(feat, torch.Tensor) or engine_for(feat) != "numba":
        return False
    if getattr(graph, "rsc_aggregate", None) is not None:  # distributed: its own path
        return False
    convs = list(stack.convs)
    if not all(_plain_conv(c) for c in convs) or not all(type(n) is nn.Identity
                                                        for n in stack.norms):  # fmt: skip
        return False
    if type(stack.dropout) is not nn.Dropout:
        return False
    return sees_every_consumer([stack.dropout, *convs, *stack.norms])


def _int8(convs) -> bool:
    """Whether the stack trains in INT8 (a quantized convolution) outside torch.compile."""
    return not compiling() and any(getattr(c, "rsc_int8", lambda: None)() for c in convs)


def fused_forward(stack, graph, feat: torch.Tensor, edge_weight=None) -> torch.Tensor:
    """``stack``'s forward, ``feat (N, F)`` -> logits ``(N, C)`` (:func:`applies` held).

    In INT8 training a hidden epilogue saves one bit per element instead of its output, and
    writes the next layer's INT8 operand codes where that layer asks for them
    (:func:`dgl_rsc.int8.codes.epilogue_codes`)."""
    h = stack.input_dropout(feat)
    p = float(stack.dropout.p)
    convs = list(stack.convs)
    int8 = _int8(convs)
    for i, conv in enumerate(convs):
        x, other, bias = conv.pre_activation(graph, h, edge_weight)
        if i == len(convs) - 1:
            h = x if other is None else x + other
            return h if bias is None else h + bias
        if int8:
            ask = getattr(convs[i + 1], "int8_operand", None)
            ahead = ask(graph, x) if ask is not None and edge_weight is None else None
            # written over x, the layer's own intermediate (one (N, D) tensor less at once;
            # not over a view, whose in-place backward would copy the whole base)
            inplace = x.is_contiguous() and not x._is_view()
            h = epilogue_codes(x, other, bias, p, stack.training, ahead, inplace=inplace)
        else:
            h = bias_act_dropout(x, other, bias, p=p, relu=True, training=stack.training)
        del x, other  # the epilogue's input is not kept while the next layer runs
    raise AssertionError("unreachable: the loop returns at the last layer")
