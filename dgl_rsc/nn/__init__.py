"""Drop-in approximate graph convolutions with DGL's signatures.

``GraphConv``, ``SAGEConv`` and ``GCN2Conv`` take a ``DGLGraph`` or a DGL-free
:class:`dgl_rsc.graph.Graph`. :func:`convert` swaps DGL's convs in a model for these,
keeping the weights; :func:`attach` drives them by one :class:`~dgl_rsc.RSCController`.
"""

from ._base import RSCLayer
from .convert import attach, convert, exact, rsc_layers
from .gcn2conv import GCN2Conv
from .graphconv import GraphConv
from .sageconv import SAGEConv

__all__ = [
    "GCN2Conv",
    "GraphConv",
    "RSCLayer",
    "SAGEConv",
    "attach",
    "convert",
    "exact",
    "rsc_layers",
]
