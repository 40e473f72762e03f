"""``GCN2Conv``: DGL's GCNII layer (Chen et al., 2020) with an RSC backward."""

from __future__ import annotations

import math

import torch
from torch import nn

from ._base import RSCLayer, check_in_degrees

__all__ = ["GCN2Conv"]


class GCN2Conv(RSCLayer):
    """Drop-in for ``dgl.nn.GCN2Conv``: same arguments, parameters and output.

    ``h' = ((1 - a) P h + a h0) ((1 - b) I + b W)`` with ``P`` the symmetric-normalized
    adjacency, ``a = alpha``, ``b = log(lambda_ / layer + 1)``.

    Shapes:
        ``forward(graph, feat (N, D), feat_0 (N, D), edge_weight (E,) =None) -> (N, D)``.
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

    def reset_parameters(self):
        """Normal-initialized weights, zero bias (as DGL); drops RSC's cached sample."""
        nn.init.normal_(self.weight1)
        if not self._project_initial_features:
            nn.init.normal_(self.weight2)
        if self._bias:
            nn.init.zeros_(self.bias)
        if self._rsc_ctl is not None:
            self._rsc_ctl.layer(self._rsc_index).clear_cache()

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
    """DGL's ``EdgeWeightNorm("both")``: ``w_uv * sum_out(u)^-1/2 * sum_in(v)^-1/2``."""
    if edge_weight.dim() > 1:
        raise ValueError(
            "GCN2Conv normalizes scalar edge weights only; got shape "
            f"{tuple(edge_weight.shape)}."
        )
    if bool((edge_weight <= 0).any()):
        raise ValueError(
            'Non-positive edge weight detected with norm="both": the square '
            "root of zero or a negative number is undefined."
        )
    src, dst = _edges(graph)
    n = graph.num_nodes()
    w = edge_weight
    out_sum = torch.zeros(n, dtype=w.dtype, device=w.device).index_add_(0, src, w)
    in_sum = torch.zeros(n, dtype=w.dtype, device=w.device).index_add_(0, dst, w)
    return w * out_sum.pow(-0.5)[src] * in_sum.pow(-0.5)[dst]


def _edges(graph):
    """``(src, dst)`` int64 of a ``Graph`` or ``DGLGraph``."""
    if hasattr(graph, "src") and hasattr(graph, "dst"):
        return graph.src, graph.dst
    src, dst = graph.edges()
    return src.long(), dst.long()
