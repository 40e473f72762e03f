"""Deprecated path: ``dgl_rsc.graph`` moved to :mod:`dgl_rsc.sparse.graph`.

Import ``Graph`` from ``dgl_rsc`` instead. This module re-exports the new one and warns when
it is imported."""

import warnings

from .sparse.graph import *  # noqa: F403
from .sparse.graph import __all__  # noqa: F401

warnings.warn(
    "dgl_rsc.graph is deprecated and will be removed: use `from dgl_rsc import Graph` "
    "(the module moved to dgl_rsc.sparse.graph)",
    DeprecationWarning,
    stacklevel=2,
)
