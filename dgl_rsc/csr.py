"""Deprecated path: ``dgl_rsc.csr`` moved to :mod:`dgl_rsc.sparse.csr`.

Import ``CSR`` from ``dgl_rsc`` instead. This module re-exports the new one and warns when
it is imported."""

from .base.moved import warn_moved
from .sparse.csr import *  # noqa: F403
from .sparse.csr import __all__  # noqa: F401

warn_moved(__name__, "dgl_rsc.sparse.csr", "CSR")
