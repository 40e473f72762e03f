"""Deprecated path: ``dgl_rsc.controller`` moved to :mod:`dgl_rsc.core.controller`.

Import ``RSCController`` from ``dgl_rsc`` instead. This module re-exports the new one and warns when
it is imported."""

from .base.moved import warn_moved
from .core.controller import *  # noqa: F403
from .core.controller import __all__  # noqa: F401

warn_moved(__name__, "dgl_rsc.core.controller", "RSCController")
