"""``SAGEConv``: DGL's GraphSAGE layer (mean and gcn aggregators) with an RSC backward."""

from __future__ import annotations

import torch
from torch import nn

from ._base import RSCLayer
from .errors import layer_error

__all__ = ["SAGEConv"]

AGGREGATORS = ("mean", "gcn")


def _pair(x):
    return x if isinstance(x, tuple) else (x, x)


def _check_eq_shape(feat_src, feat_dst) -> None:
    """DGL's ``check_eq_shape``: the "gcn" aggregator adds a node's own features to its
    neighbours', so both must have one width."""
    src, dst = tuple(feat_src.shape[1:]), tuple(feat_dst.shape[1:])
    if src != dst:
        raise layer_error(
            f"The feature shape of source nodes: {src} should be equal to the feature shape "
            f"of destination nodes: {dst}. The 'gcn' aggregator adds a node's own features "
            "to its neighbours': build SAGEConv with one input width, or use 'mean'."
        )


class SAGEConv(RSCLayer):
    """Drop-in for ``dgl.nn.SAGEConv`` with ``aggregator_type`` ``"mean"`` or ``"gcn"``.

    Same arguments, parameter names (``fc_self``, ``fc_neigh``, ``bias``) and output as
    DGL's; the neighbour aggregation's backward is approximated by RSC (once the layer is
    attached with :func:`dgl_rsc.nn.attach`; unattached it is exact and warns once).
    ``"pool"`` and ``"lstm"`` have no sparse product to approximate: use DGL's layer for
    those.

    Shapes:
        ``forward(graph, feat, edge_weight=None) -> (N_dst, D_out)`` with ``feat``
        ``(N, D_in)``, a pair ``((N_src, D_src), (N_dst, D_dst))`` for a bipartite graph, or
        ``(N_src, D_in)`` for a block (its first ``N_dst`` rows are the destination nodes);
        ``edge_weight`` ``(E,)`` or ``(E, 1)`` (approximated), or per feature ``(E, D)``
        with ``D`` the message width (computed exactly).

    Raises:
        RSCLayerError: (a ``dgl.DGLError`` with DGL) for an unknown ``aggregator_type`` and,
            with ``"gcn"``, source and destination features of different widths.

    Example:
        >>> import torch; from dgl_rsc.sparse.graph import Graph
        >>> g = Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]))
        >>> SAGEConv(4, 2, "mean")(g, torch.randn(3, 4)).shape
        torch.Size([3, 2])
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
            raise layer_error(
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

    @classmethod
    def from_dgl(cls, conv):
        """A ``SAGEConv`` with the options of ``dgl.nn.SAGEConv`` ``conv``, or ``None`` for
        the ``"pool"`` and ``"lstm"`` aggregators (no sparse product to approximate)."""
        if conv._aggre_type not in AGGREGATORS:
            return None
        own_bias = getattr(conv, "bias", None) is not None
        self_bias = getattr(getattr(conv, "fc_self", None), "bias", None) is not None
        return cls(
            (conv._in_src_feats, conv._in_dst_feats),
            conv._out_feats,
            conv._aggre_type,
            feat_drop=conv.feat_drop.p,
            bias=own_bias or self_bias,
            norm=conv.norm,
            activation=conv.activation,
        )

    def reset_parameters(self):
        """Glorot-uniform linear weights (gain for ReLU); drops RSC's cached samples."""
        gain = nn.init.calculate_gain("relu")
        if self._aggre_type != "gcn":
            nn.init.xavier_uniform_(self.fc_self.weight, gain=gain)
        nn.init.xavier_uniform_(self.fc_neigh.weight, gain=gain)
        self.clear_cache()

    def forward(self, graph, feat, edge_weight=None):
        x, other, bias = self.pre_activation(graph, feat, edge_weight)
        rst = x + other if other is not None else x
        if bias is not None:
            rst = rst + bias
        if self.activation is not None:
            rst = self.activation(rst)
        if self.norm is not None:
            rst = self.norm(rst)
        return rst

    def pre_activation(self, graph, feat, edge_weight=None):
        """``(x, other, bias)`` whose sum ``(x + other) + bias`` (``None`` terms left out) is
        the output before activation and norm, bit for bit: ``mean``: ``(fc_self(h_dst),
        h_neigh, None)``; ``gcn``: ``(h_neigh, None, bias)``. All ``(N_dst, D_out)`` /
        ``(D_out,)``. The model's one-pass epilogue
        (:func:`dgl_rsc.sparse.epilogue.bias_act_dropout`) adds them."""
        if isinstance(feat, tuple):
            feat_src = self.feat_drop(feat[0])
            feat_dst = self.feat_drop(feat[1])
        else:
            feat_src = feat_dst = self.feat_drop(feat)
            if getattr(graph, "is_block", False):
                feat_dst = feat_src[: graph.num_dst_nodes()]
        if self._aggre_type != "mean":
            _check_eq_shape(feat_src, feat_dst)
        h_neigh = None
        if not isinstance(feat, tuple):  # input aggregated once per run (.input_cache)
            h_neigh = self._cached_input(graph, feat_src, edge_weight, lambda: self._neighbours(
                graph, feat, feat_src, feat_dst, edge_weight, False))  # fmt: skip
        if h_neigh is not None:
            h_neigh = self.fc_neigh(h_neigh)
        else:
            lin_before_mp = self._in_src_feats > self._out_feats
            h_neigh = self._neighbours(graph, feat, feat_src, feat_dst, edge_weight, lin_before_mp)
            if not lin_before_mp:
                h_neigh = self.fc_neigh(h_neigh)
        if self._aggre_type == "gcn":
            return h_neigh, None, self.bias
        return self.fc_self(feat_dst), h_neigh, None

    def _neighbours(self, graph, feat, feat_src, feat_dst, edge_weight, lin_before_mp: bool):
        """The aggregated neighbourhood, before ``fc_neigh`` unless ``lin_before_mp``."""
        mean = self._aggre_type == "mean"
        h = self.fc_neigh(feat_src) if lin_before_mp else feat_src
        if mean:  # DGL's mean: the sum divided by the clamped in-degree, fused
            deg = graph.in_degrees().clamp(1, max(graph.num_edges(), 1)).to(h.dtype)
            neigh = self._aggregate(graph, h, edge_weight, row_scale=deg, row_divide=True)
        else:
            neigh = self._aggregate(graph, h, edge_weight)
        if mean:
            h_neigh = neigh
        else:
            if isinstance(feat, tuple):
                h_dst = self.fc_neigh(feat_dst) if lin_before_mp else feat_dst
            elif getattr(graph, "is_block", False):
                h_dst = h[: graph.num_dst_nodes()]
            else:
                h_dst = h
            degs = graph.in_degrees().to(feat_dst)
            h_neigh = (neigh + h_dst) / (degs.unsqueeze(-1) + 1)
        return h_neigh
