"""``GCN2Conv``: DGL's GCNII layer (Chen et al., 2020) with an RSC backward."""

from __future__ import annotations

import math

import torch
from torch import nn

from ._base import RSCLayer, check_in_degrees
from .errors import layer_error

__all__ = ["GCN2Conv"]


class GCN2Conv(RSCLayer):
    """Drop-in for ``dgl.nn.GCN2Conv``: same arguments, parameters and output.

    ``h' = ((1 - a) P h + a h0) ((1 - b) I + b W)`` with ``P`` the symmetric-normalized
    adjacency, ``a = alpha``, ``b = log(lambda_ / layer + 1)``.

    Shapes:
        ``forward(graph, feat (N, D), feat_0 (N, D), edge_weight (E,) =None) -> (N, D)``;
        ``edge_weight`` is normalized like DGL's ``EdgeWeightNorm("both")`` (positive,
        one number per edge).

    Raises:
        RSCLayerError: (a ``dgl.DGLError`` with DGL) for zero-in-degree nodes without
            ``allow_zero_in_degree``, and for edge weights that are not ``(E,)`` or not
            positive.

    RSC approximates its backward once attached (:func:`dgl_rsc.nn.attach`).

    Example:
        >>> import torch; from dgl_rsc.sparse.graph import Graph
        >>> g = Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]))
        >>> x = torch.randn(3, 4)
        >>> GCN2Conv(4, layer=1)(g, x, x).shape
        torch.Size([3, 4])
    """

    def __init__(
        self,
        in_feats,
        layer,
        alpha=0.1,
        lambda_=1,
        project_initial_features=True,
        allow_zero_in_degree=False,
        bias=True,
        activation=None,
    ):
        super().__init__()
        self._in_feats = in_feats
        self._project_initial_features = project_initial_features
        self.alpha = alpha
        self.beta = math.log(lambda_ / layer + 1)
        self._bias = bias
        self._activation = activation
        self._allow_zero_in_degree = allow_zero_in_degree
        self.weight1 = nn.Parameter(torch.Tensor(in_feats, in_feats))
        if project_initial_features:
            self.register_parameter("weight2", None)
        else:
            self.weight2 = nn.Parameter(torch.Tensor(in_feats, in_feats))
        if bias:
            self.bias = nn.Parameter(torch.Tensor(in_feats))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    @classmethod
    def from_dgl(cls, conv) -> GCN2Conv:
        """A ``GCN2Conv`` with the options of ``dgl.nn.GCN2Conv`` ``conv`` (its ``beta``
        included; parameters are carried over by :func:`dgl_rsc.nn.convert`)."""
        new = cls(
            conv._in_feats,
            layer=1,
            alpha=conv.alpha,
            project_initial_features=conv._project_initial_features,
            allow_zero_in_degree=conv._allow_zero_in_degree,
            bias=conv._bias,
            activation=conv._activation,
        )
        new.beta = conv.beta
        return new

    def reset_parameters(self):
        """Normal-initialized weights, zero bias (as DGL); drops RSC's cached samples."""
        nn.init.normal_(self.weight1)
        if not self._project_initial_features:
            nn.init.normal_(self.weight2)
        if self._bias:
            nn.init.zeros_(self.bias)
        self.clear_cache()

    def set_allow_zero_in_degree(self, set_value):
        self._allow_zero_in_degree = set_value

    def forward(self, graph, feat, feat_0, edge_weight=None):
        if not self._allow_zero_in_degree:
            check_in_degrees(graph)
        if edge_weight is None:  # D^-1/2 A D^-1/2 with both scalings fused into the product
            degs = graph.in_degrees().to(feat).clamp(min=1)
            norm = torch.pow(degs, -0.5).to(feat.device)
            feat = self._aggregate(graph, feat, row_scale=norm, col_scale=norm)
        else:
            feat = self._aggregate(graph, feat, _both_norm(graph, edge_weight))
        feat = feat * (1 - self.alpha)
        feat_0 = feat_0[: feat.size(0)] * self.alpha
        feat_sum = feat + feat_0
        if self._project_initial_features:
            feat_proj_sum = feat_sum @ self.weight1
        else:
            feat_proj_sum = feat @ self.weight1 + feat_0 @ self.weight2
        rst = (1 - self.beta) * feat_sum + self.beta * feat_proj_sum
        if self._bias:
            rst = rst + self.bias
        if self._activation is not None:
            rst = self._activation(rst)
        return rst

    def extra_repr(self):
        summary = "in={_in_feats}, alpha={alpha}, beta={beta}"
        return summary.format(**self.__dict__)


def _both_norm(graph, edge_weight):
    """DGL's ``EdgeWeightNorm("both")``: ``sum_out(u)^-1/2 * sum_in(v)^-1/2 * w_uv``, with
    the sums taken in DGL's order (each node's edges by edge id) and the products in DGL's
    order, so that the result is bit-identical."""
    if edge_weight.dim() > 1:
        raise layer_error(
            "Currently the normalization is only defined on scalar edge weight: GCN2Conv "
            f"takes edge_weight of shape (E,), got {tuple(edge_weight.shape)}. Reshape it "
            "with edge_weight.reshape(-1) if it holds one number per edge."
        )
    if bool((edge_weight <= 0).any()):
        raise layer_error(
            'Non-positive edge weight detected with norm="both": the square root of zero or '
            "a negative number is undefined. Pass positive edge weights."
        )
    src, dst = _edges(graph)
    if src.numel() != edge_weight.shape[0]:
        raise layer_error(
            f"edge_weight has {edge_weight.shape[0]} entries but the graph has "
            f"{src.numel()} edges."
        )
    w = edge_weight
    by_src = torch.argsort(src, stable=True)
    by_dst = torch.argsort(dst, stable=True)
    out_sum = w.new_zeros(graph.num_src_nodes()).index_add_(0, src[by_src], w[by_src])
    in_sum = w.new_zeros(graph.num_dst_nodes()).index_add_(0, dst[by_dst], w[by_dst])
    return torch.pow(out_sum, -0.5)[src] * torch.pow(in_sum, -0.5)[dst] * w


def _edges(graph):
    """``(src, dst)`` int64 of a ``Graph`` or ``DGLGraph``, in edge-id order."""
    if hasattr(graph, "src") and hasattr(graph, "dst"):
        return graph.src, graph.dst
    src, dst = graph.edges()
    return src.long(), dst.long()
