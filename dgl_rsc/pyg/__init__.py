"""RSC for PyTorch Geometric: drop-in convs, a global patch and a converter.

- :class:`GCNConv`, :class:`SAGEConv` (mean) and :class:`GCN2Conv`: PyG's classes whose
  aggregation runs on the RSC operator; :func:`attach` drives them by one controller.
- :func:`patch`: a ``with`` block in which unmodified PyG models train with RSC's backward.
- :func:`convert`: swap a model's PyG convs for the drop-ins in place, keeping the weights.

The convs need ``torch_geometric`` (loaded on first use of their names); :func:`attach`
(with a PyG hint when a model has no RSC layer), :func:`exact`, :func:`rsc_layers` and
:func:`cache_input_aggregation` (a first layer's aggregation of the dataset's features, reused
across steps: on by default) work as in :mod:`dgl_rsc.nn` (on any RSC layer).
"""

import importlib

from ..dgl.nn.convert import exact, rsc_layers
from ..dgl.nn.input_cache import cache_input_aggregation
from .convert import TWINS, attach, convert, twin
from .patch import is_patched, patch, patched_symbols

__all__ = [
    "GCN2Conv",
    "GCNConv",
    "SAGEConv",
    "TWINS",
    "attach",
    "cache_input_aggregation",
    "convert",
    "exact",
    "is_patched",
    "patch",
    "patched_symbols",
    "rsc_layers",
    "twin",
]

_CONVS = ("GCNConv", "SAGEConv", "GCN2Conv")


def __getattr__(name):
    # the convs subclass PyG's: import torch_geometric only when one is asked for
    if name in _CONVS:
        return getattr(importlib.import_module(".convs", __name__), name)
    raise AttributeError(f"module 'dgl_rsc.pyg' has no attribute {name!r}")
