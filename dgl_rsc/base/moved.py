"""The one warning of a deprecated module path (the shims ``dgl_rsc.graph``, ``.csr``,
``.controller`` and ``.config`` left where a module moved)."""

from __future__ import annotations

import warnings

__all__ = ["warn_moved"]


def warn_moved(old: str, new: str, name: str) -> None:
    """Warn, at the line that imported module ``old``, that it moved to ``new`` and that
    ``name`` is imported from ``dgl_rsc``; called once, from the shim's module body."""
    warnings.warn(
        f"{old} is deprecated and will be removed: use `from dgl_rsc import {name}` "
        f"(the module moved to {new})",
        DeprecationWarning,
        stacklevel=3,  # the shim's body, then the importing line (import frames are skipped)
    )
