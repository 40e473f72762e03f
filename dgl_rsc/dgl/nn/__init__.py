"""Drop-in approximate graph convolutions with DGL's signatures.

``GraphConv``, ``SAGEConv``, ``GCN2Conv`` and ``ChebConv`` take a ``DGLGraph`` or a DGL-free
:class:`dgl_rsc.Graph`. :func:`convert` swaps DGL's convs in a model for these (the
table is :data:`TWINS`), keeping the parameters; :func:`attach` drives them by one
:class:`~dgl_rsc.RSCController`. A layer that is never attached computes the exact backward
and warns once. Where DGL's layer raises ``DGLError``, these raise :class:`RSCLayerError`,
which ``except dgl.DGLError`` also catches when DGL is installed. A layer whose input needs
no gradient aggregates it once per run (:func:`cache_input_aggregation` turns that off).
``GraphConv.pre_activation`` / ``SAGEConv.pre_activation`` with :func:`bias_act_dropout` run
a hidden layer's bias, ReLU and dropout in one pass each way.
"""

from ...sparse.epilogue import bias_act_dropout
from ._base import RSCLayer
from .chebconv import ChebConv
from .convert import TWINS, attach, convert, exact, rsc_layers, twin
from .errors import RSCLayerError
from .gcn2conv import GCN2Conv
from .graphconv import GraphConv
from .input_cache import cache_input_aggregation, input_cache_counts
from .sageconv import SAGEConv

__all__ = [
    "TWINS",
    "ChebConv",
    "GCN2Conv",
    "GraphConv",
    "RSCLayer",
    "RSCLayerError",
    "SAGEConv",
    "attach",
    "bias_act_dropout",
    "cache_input_aggregation",
    "convert",
    "exact",
    "input_cache_counts",
    "rsc_layers",
    "twin",
]
