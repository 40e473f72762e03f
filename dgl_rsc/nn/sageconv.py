"""``SAGEConv``: DGL's GraphSAGE layer (mean and gcn aggregators) with an RSC backward."""

from __future__ import annotations

import torch
from torch import nn

from ._base import RSCLayer

__all__ = ["SAGEConv"]

AGGREGATORS = ("mean", "gcn")


def _pair(x):
    return x if isinstance(x, tuple) else (x, x)


class SAGEConv(RSCLayer):
    """Drop-in for ``dgl.nn.SAGEConv`` with ``aggregator_type`` ``"mean"`` or ``"gcn"``.

    Same arguments, parameter names (``fc_self``, ``fc_neigh``, ``bias``) and output as
    DGL's; the neighbour aggregation's backward is approximated by RSC. ``"pool"`` and
    ``"lstm"`` have no sparse product to approximate: use DGL's layer for those.

    Shapes:
        ``forward(graph, feat (N, D_in) or pair, edge_weight (E,) =None) -> (N_dst, D_out)``.
    """

    def __init__(
        self,
        in_feats,
        out_feats,
        aggregator_type,
        feat_drop=0.0,
        bias=True,
        norm=None,
        activation=None,
    ):
        super().__init__()
        if aggregator_type not in AGGREGATORS:
            raise ValueError(
                f"Invalid aggregator_type {aggregator_type!r} for dgl_rsc.nn.SAGEConv: it "
                f"supports {AGGREGATORS}. The 'pool' and 'lstm' aggregators have no sparse "
                "product to approximate; keep dgl.nn.SAGEConv for them."
            )
        self._in_src_feats, self._in_dst_feats = _pair(in_feats)
        self._out_feats = out_feats
        self._aggre_type = aggregator_type
        self.norm = norm
        self.feat_drop = nn.Dropout(feat_drop)
        self.activation = activation
        self.fc_neigh = nn.Linear(self._in_src_feats, out_feats, bias=False)
        if aggregator_type != "gcn":
            self.fc_self = nn.Linear(self._in_dst_feats, out_feats, bias=bias)
        elif bias:
            self.bias = nn.parameter.Parameter(torch.zeros(self._out_feats))
        else:
            self.register_buffer("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        """Glorot-uniform linear weights (gain for ReLU); drops RSC's cached sample."""
        gain = nn.init.calculate_gain("relu")
        if self._aggre_type != "gcn":
            nn.init.xavier_uniform_(self.fc_self.weight, gain=gain)
        nn.init.xavier_uniform_(self.fc_neigh.weight, gain=gain)
        if self._rsc_ctl is not None:
            self._rsc_ctl.layer(self._rsc_index).clear_cache()

    def forward(self, graph, feat, edge_weight=None):
        if isinstance(feat, tuple):
            feat_src = self.feat_drop(feat[0])
            feat_dst = self.feat_drop(feat[1])
        else:
            feat_src = feat_dst = self.feat_drop(feat)
        lin_before_mp = self._in_src_feats > self._out_feats
        h = self.fc_neigh(feat_src) if lin_before_mp else feat_src
        mean = self._aggre_type == "mean"
        if graph.num_edges() == 0:
            neigh = torch.zeros(feat_dst.shape[0], h.shape[1]).to(h)
        elif mean:  # DGL's mean: the sum divided by the clamped in-degree, fused
            deg = graph.in_degrees().clamp(1, max(graph.num_edges(), 1)).to(h.dtype)
            neigh = self._aggregate(graph, h, edge_weight, row_scale=deg, row_divide=True)
        else:
            neigh = self._aggregate(graph, h, edge_weight)
        degs = graph.in_degrees().to(neigh).unsqueeze(-1)
        if mean:
            h_neigh = neigh
        else:
            if isinstance(feat, tuple):
                h_dst = self.fc_neigh(feat_dst) if lin_before_mp else feat_dst
            else:
                h_dst = h
            h_neigh = (neigh + h_dst) / (degs + 1)
        if not lin_before_mp:
            h_neigh = self.fc_neigh(h_neigh)
        if self._aggre_type == "gcn":
            rst = h_neigh
            if self.bias is not None:
                rst = rst + self.bias
        else:
            rst = self.fc_self(feat_dst) + h_neigh
        if self.activation is not None:
            rst = self.activation(rst)
        if self.norm is not None:
            rst = self.norm(rst)
        return rst
