"""Deprecated path: ``dgl_rsc.controller`` moved to :mod:`dgl_rsc.core.controller`.

Import ``RSCController`` from ``dgl_rsc`` instead. This module re-exports the new one and warns when
it is imported."""

import warnings

from .core.controller import *  # noqa: F403
from .core.controller import __all__  # noqa: F401

warnings.warn(
    "dgl_rsc.controller is deprecated and will be removed: use `from dgl_rsc import RSCController` "
    "(the module moved to dgl_rsc.core.controller)",
    DeprecationWarning,
    stacklevel=2,
)
