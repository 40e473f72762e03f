"""``GraphConv``: DGL's graph convolution (Kipf and Welling) with an RSC backward."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ...int8.choose import sparse_kept
from ..interop import message_structure
from ._base import RSCLayer, check_in_degrees, expand_as_pair
from .errors import layer_error
from .messages import broadcast_to_rows

__all__ = ["GraphConv"]

NORMS = ("none", "both", "right", "left")


class GraphConv(RSCLayer):
    """Drop-in for ``dgl.nn.GraphConv``: same arguments, parameters and forward output.

    ``h_i = sum_j c_ij h_j W + b`` with ``c_ij`` from ``norm``. The aggregation's backward
    is approximated by RSC; the gradients of ``W``, ``b`` and ``edge_weight`` are exact
    given the approximate upstream gradient.

    Args:
        in_feats: input width ``D_in``.
        out_feats: output width ``D_out``.
        norm: ``"both"`` (symmetric), ``"right"`` (mean over in-edges), ``"left"`` or
            ``"none"``.
        weight: learn ``W (D_in, D_out)``.
        bias: learn ``b (D_out,)``.
        activation: callable applied last, or ``None``.
        allow_zero_in_degree: skip the zero-in-degree check.

    Shapes:
        ``forward(graph, feat, weight=None, edge_weight=None) -> (N_dst, D_out)`` with
        ``feat`` ``(N, D_in)``, a pair ``((N_src, D_in), (N_dst, D_in))`` for a bipartite
        graph, or ``(N_src, D_in)`` for a block (its first ``N_dst`` rows are the
        destination nodes, as in DGL); ``weight (D_in, D_out)`` when built with
        ``weight=False``; ``edge_weight`` ``(E,)`` or ``(E, 1)`` (approximated), or per
        feature ``(E, D)`` with ``D`` the message width (computed exactly, not approximated).

    Raises:
        RSCLayerError: (also a ``dgl.DGLError`` when DGL is installed) where DGL's layer
            raises ``DGLError``: zero-in-degree nodes without ``allow_zero_in_degree``, an
            external weight next to the module's own, an invalid ``norm``.

    RSC approximates its backward once attached (:func:`dgl_rsc.nn.attach`).

    Example:
        >>> import torch; from dgl_rsc.sparse.graph import Graph
        >>> g = Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]))
        >>> conv = GraphConv(4, 2)
        >>> conv(g, torch.randn(3, 4)).shape
        torch.Size([3, 2])
    """

    def __init__(
        self,
        in_feats,
        out_feats,
        norm="both",
        weight=True,
        bias=True,
        activation=None,
        allow_zero_in_degree=False,
    ):
        super().__init__()
        if norm not in NORMS:
            raise layer_error(
                f'Invalid norm value. Must be either "none", "both", "right" or "left". But '
                f'got "{norm}".'
            )
        self._in_feats = in_feats
        self._out_feats = out_feats
        self._norm = norm
        self._allow_zero_in_degree = allow_zero_in_degree
        if weight:
            self.weight = nn.Parameter(torch.Tensor(in_feats, out_feats))
        else:
            self.register_parameter("weight", None)
        if bias:
            self.bias = nn.Parameter(torch.Tensor(out_feats))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()
        self._activation = activation

    @classmethod
    def from_dgl(cls, conv) -> GraphConv:
        """A ``GraphConv`` with the options of ``dgl.nn.GraphConv`` ``conv`` (parameters are
        carried over by :func:`dgl_rsc.nn.convert`)."""
        return cls(
            conv._in_feats,
            conv._out_feats,
            norm=conv._norm,
            weight=conv.weight is not None,
            bias=conv.bias is not None,
            activation=conv._activation,
            allow_zero_in_degree=conv._allow_zero_in_degree,
        )

    def reset_parameters(self):
        """Glorot-uniform ``W``, zero ``b``; drops RSC's cached samples too."""
        if self.weight is not None:
            nn.init.xavier_uniform_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)
        self.clear_cache()

    def set_allow_zero_in_degree(self, set_value):
        self._allow_zero_in_degree = set_value

    def norm_scales(self, graph, feat_src, feat_dst):
        """``(col (N_src,), row (N_dst,))`` of the layer's normalization (``None``: not
        applied), in the features' dtype and device."""
        col = row = None
        if self._norm in ("left", "both"):
            degs = graph.out_degrees().to(feat_src).clamp(min=1)
            col = torch.pow(degs, -0.5) if self._norm == "both" else 1.0 / degs
        if self._norm in ("right", "both"):
            degs = graph.in_degrees().to(feat_dst).clamp(min=1)
            row = torch.pow(degs, -0.5) if self._norm == "both" else 1.0 / degs
        return col, row

    def forward(self, graph, feat, weight=None, edge_weight=None):
        if not self._allow_zero_in_degree:
            check_in_degrees(graph)
        feat_src, feat_dst = expand_as_pair(feat, graph)
        col, row = self.norm_scales(graph, feat_src, feat_dst)
        if weight is not None:
            if self.weight is not None:
                raise layer_error(
                    "External weight is provided while at the same time the module has "
                    "defined its own weight parameter. Please create the module with flag "
                    "weight=False."
                )
        else:
            weight = self.weight
        rst = self._cached_input(graph, feat, edge_weight, lambda: self._aggregate(
            graph, feat_src, edge_weight, row_scale=row, col_scale=col))  # fmt: skip
        if rst is not None:  # input aggregated once per run (.input_cache): transform only
            return self._finish(rst if weight is None else self._matmul(rst, weight))
        # DGL's order of operations, with every scaling that is adjacent to the aggregation
        # fused into the product (bit-identical: the same multiplications in the same order)
        before = weight is not None and self._in_feats > self._out_feats
        after = weight is not None and not before
        fused = {"row_scale": None if after else row}
        if before:
            if col is not None:
                feat_src = feat_src * broadcast_to_rows(col, feat_src)
            feat_src = self._matmul(feat_src, weight)
            fused["score_col_scale"] = col
        else:
            fused["col_scale"] = col
        rst = self._aggregate(graph, feat_src, edge_weight, **fused)
        if after:
            rst = self._matmul(rst, weight)
            if row is not None:
                rst = rst * broadcast_to_rows(row, feat_dst)
        return self._finish(rst)

    def pre_activation(self, graph, feat, edge_weight=None):
        """``(x (N_dst, D_out), None, bias)``: the output before bias and activation, with
        both normalization scales fused into the sparse product (``diag(r) A diag(c) X W``
        instead of scaling ``X`` or ``X W`` in separate passes; equal to :meth:`forward`
        up to floating-point reassociation). The model's one-pass epilogue
        (:func:`dgl_rsc.sparse.epilogue.bias_act_dropout`) adds the bias."""
        if not self._allow_zero_in_degree:
            check_in_degrees(graph)
        feat_src, feat_dst = expand_as_pair(feat, graph)
        col, row = self.norm_scales(graph, feat_src, feat_dst)
        weight = self.weight
        scales = {"row_scale": row, "col_scale": col}
        rst = self._cached_input(
            graph,
            feat,
            edge_weight,
            lambda: self._aggregate(graph, feat_src, edge_weight, **scales),
        )
        if rst is None and weight is not None and not self._aggregate_first(feat_src):
            h = self._matmul(feat_src, weight, reassociate=True)
            rst = self._aggregate(graph, h, edge_weight, **scales)
            weight = None  # applied
        elif rst is None:
            rst = self._aggregate(graph, feat_src, edge_weight, **scales)
        out = rst if weight is None else self._matmul(rst, weight, reassociate=True)
        return out, None, self.bias

    def int8_operand(self, graph, feat) -> Optional[tuple]:
        """``(state, col)`` when :meth:`pre_activation` of ``feat (N, D_in)`` starts with an
        INT8 sparse product of ``diag(col) feat`` whose choice is settled on INT8: the
        producer of ``feat`` may then write its codes ahead (:mod:`dgl_rsc.int8.codes`);
        else ``None``."""
        state = self._rsc_int8
        if (state is None or getattr(graph, "rsc_aggregate", None) is not None
                or not (torch.is_grad_enabled() and feat.requires_grad)
                or (self.weight is not None and not self._aggregate_first(feat))):  # fmt: skip
            return None
        A, _ = message_structure(graph, self._structures())
        if not sparse_kept(A, feat.shape[1], state.spec.sparse, feat.device):
            return None
        return state, self.norm_scales(graph, feat, feat)[0]

    def _aggregate_first(self, feat_src) -> bool:
        """The order of :meth:`pre_activation` by the sparse product's row widths it costs
        (the dense product is ``N x D_in x D_out`` either way): aggregating first reads
        ``D_in``-wide rows forward, and backward only where the input needs a gradient;
        transforming first reads ``D_out``-wide rows forward and backward (the weight's
        gradient needs ``A^T dY``). DGL's rule (``D_in > D_out``: transform first) is the
        case where both need gradients or neither."""
        grad = torch.is_grad_enabled()
        x_grad = grad and feat_src.requires_grad
        w_grad = grad and self.weight is not None and self.weight.requires_grad
        aggregate = self._in_feats * (2 if x_grad else 1)
        transform = self._out_feats * (2 if x_grad or w_grad else 1)
        return aggregate <= transform

    def _finish(self, rst):
        if self.bias is not None:
            rst = rst + self.bias
        if self._activation is not None:
            rst = self._activation(rst)
        return rst

    def extra_repr(self):
        summary = "in={_in_feats}, out={_out_feats}, normalization={_norm}"
        if "_activation" in self.__dict__:
            summary += ", activation={_activation}"
        return summary.format(**self.__dict__)
