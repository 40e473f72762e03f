"""Deprecated path: ``dgl_rsc.graph`` moved to :mod:`dgl_rsc.sparse.graph`.

Import ``Graph`` from ``dgl_rsc`` instead. This module re-exports the new one and warns when
it is imported."""

from .base.moved import warn_moved
from .sparse.graph import *  # noqa: F403
from .sparse.graph import __all__  # noqa: F401

warn_moved(__name__, "dgl_rsc.sparse.graph", "Graph")
