"""Adapters that let :mod:`dgl_rsc.models` build its models from PyG convolutions.

The models call convolutions the DGL way, ``conv(graph, feat)`` with DGL's constructor
arguments; an adapter holds the PyG conv (``self.conv``: a :mod:`dgl_rsc.pyg` drop-in or the
stock ``torch_geometric.nn`` class) and calls it the PyG way, ``conv(feat, edge_index)``.
The launcher's graph already holds the self-loops a model wants (``SELF_LOOPS``), so the
convs normalize without adding any: ``GCNConv(add_self_loops=False)`` is DGL's
``GraphConv(norm="both")`` on a symmetric graph, ``GCN2Conv(theta=lambda_, layer=l)`` has
DGL's ``beta = log(lambda_ / l + 1)`` (PyG's GCN2Conv has no bias). Over the drop-ins, a
GCN/SAGE hidden layer's ReLU and dropout run in one pass each way
(:mod:`dgl_rsc.models.fused`; ``pre_activation`` is the conv's output, bias included).

Example (needs torch_geometric)::

    from dgl_rsc.models import build_model
    model = build_model("gcn", in_feats=16, num_classes=4, engine="pyg")
    logits = model(edge_index, x)          # (N, 4)
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

from torch import nn

from ..base import _deps

__all__ = ["adapters"]


def _unsupported(what: str) -> ValueError:
    return ValueError(
        f"train.engine pyg/pyg_patch builds models from PyG's GCNConv, SAGEConv (mean) and "
        f"GCN2Conv; {what} has no PyG counterpart here: use model gcn, sage (aggregator mean) "
        "or gcn2, or train.engine native."
    )


def adapters(stock: bool) -> SimpleNamespace:
    """``GraphConv``, ``SAGEConv`` and ``GCN2Conv`` factories with DGL's arguments over the
    stock PyG convs (``stock``) or the :mod:`dgl_rsc.pyg` drop-ins."""
    mod = _deps.require_torch_geometric().nn if stock else importlib.import_module("dgl_rsc.pyg")

    class GraphConv(nn.Module):
        """``GCNConv`` (symmetric norm, no added self-loops) called as ``GraphConv``."""

        def __init__(self, in_feats, out_feats, norm="both", weight=True, bias=True,
                     activation=None, allow_zero_in_degree=False):  # fmt: skip
            super().__init__()
            if norm != "both" or not weight or activation is not None:
                raise _unsupported(f"GraphConv(norm={norm!r}, weight={weight})")
            self.conv = mod.GCNConv(in_feats, out_feats, add_self_loops=False, bias=bias)

        def forward(self, graph, feat, edge_weight=None):
            return self.conv(feat, graph, edge_weight)

        def pre_activation(self, graph, feat, edge_weight=None):
            return self.forward(graph, feat, edge_weight), None, None

    class SAGEConv(nn.Module):
        """``SAGEConv(aggr="mean")`` called as DGL's ``SAGEConv(in, out, "mean")``."""

        def __init__(self, in_feats, out_feats, aggregator_type="mean", **kwargs):
            super().__init__()
            if aggregator_type != "mean" or kwargs:
                raise _unsupported(f"SAGEConv(aggregator_type={aggregator_type!r})")
            self.conv = mod.SAGEConv(in_feats, out_feats, aggr="mean")

        def forward(self, graph, feat, edge_weight=None):
            if edge_weight is not None:
                raise _unsupported("SAGEConv with edge weights")
            return self.conv(feat, graph)

        def pre_activation(self, graph, feat, edge_weight=None):
            return self.forward(graph, feat, edge_weight), None, None

    class GCN2Conv(nn.Module):
        """``GCN2Conv`` called as DGL's ``GCN2Conv(in_feats, layer, alpha, lambda_)``."""

        def __init__(self, in_feats, layer, alpha=0.1, lambda_=1, **kwargs):
            super().__init__()
            if kwargs:
                raise _unsupported(f"GCN2Conv({', '.join(kwargs)}=...)")
            self.conv = mod.GCN2Conv(in_feats, alpha=alpha, theta=lambda_, layer=layer,
                                     add_self_loops=False)  # fmt: skip

        def forward(self, graph, feat, feat_0):
            return self.conv(feat, feat_0, graph)

    # the drop-ins' layers end in the model's one-pass ReLU and dropout (dgl_rsc.models.fused),
    # whose dropout draws from the epilogue's hash: the stock convs keep torch's op by op
    GraphConv.rsc_pre_activation = SAGEConv.rsc_pre_activation = not stock
    return SimpleNamespace(GraphConv=GraphConv, SAGEConv=SAGEConv, GCN2Conv=GCN2Conv)
