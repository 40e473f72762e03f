"""Deprecated path: ``dgl_rsc.config`` moved to :mod:`dgl_rsc.core.config`.

Import ``RSCConfig`` from ``dgl_rsc`` instead. This module re-exports the new one and warns when
it is imported."""

from .base.moved import warn_moved
from .core.config import *  # noqa: F403
from .core.config import __all__  # noqa: F401

warn_moved(__name__, "dgl_rsc.core.config", "RSCConfig")
