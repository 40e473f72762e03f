"""Deprecated path: ``dgl_rsc.config`` moved to :mod:`dgl_rsc.core.config`.

Import ``RSCConfig`` from ``dgl_rsc`` instead. This module re-exports the new one and warns when
it is imported."""

import warnings

from .core.config import *  # noqa: F403
from .core.config import __all__  # noqa: F401

warnings.warn(
    "dgl_rsc.config is deprecated and will be removed: use `from dgl_rsc import RSCConfig` "
    "(the module moved to dgl_rsc.core.config)",
    DeprecationWarning,
    stacklevel=2,
)
