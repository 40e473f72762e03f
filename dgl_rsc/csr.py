"""Deprecated path: ``dgl_rsc.csr`` moved to :mod:`dgl_rsc.sparse.csr`.

Import ``CSR`` from ``dgl_rsc`` instead. This module re-exports the new one and warns when
it is imported."""

import warnings

from .sparse.csr import *  # noqa: F403
from .sparse.csr import __all__  # noqa: F401

warnings.warn(
    "dgl_rsc.csr is deprecated and will be removed: use `from dgl_rsc import CSR` "
    "(the module moved to dgl_rsc.sparse.csr)",
    DeprecationWarning,
    stacklevel=2,
)
