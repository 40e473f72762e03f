"""The error the drop-in layers raise where DGL's layers raise ``DGLError``.

``except dgl.DGLError`` must catch what a drop-in refuses, as it catches what DGL's layer
refuses; the DGL-free path must not need DGL for that. :func:`layer_error` therefore makes an
:class:`RSCLayerError` (a ``ValueError``) whose class also derives from ``dgl.DGLError`` when
DGL imports, and a plain :class:`RSCLayerError` otherwise. DGL is asked for through
:mod:`dgl_rsc.base._deps` only, and only when an error is raised.
"""

from __future__ import annotations

import functools

from ...base import _deps

__all__ = ["RSCLayerError", "layer_error"]


class RSCLayerError(ValueError):
    """Bad input to a drop-in layer (what DGL's layer rejects with ``DGLError``).

    Catch it as ``dgl_rsc.nn.RSCLayerError``, ``ValueError`` or, when DGL is installed,
    ``dgl.DGLError``.

    Example:
        >>> try:
        ...     raise layer_error("feat must be (N, D)")
        ... except RSCLayerError as exc:
        ...     str(exc)
        'feat must be (N, D)'
    """

    def __reduce__(self):
        # the class may be the on-demand subclass: rebuild through layer_error
        return (layer_error, self.args)


@functools.cache
def _error_class() -> type:
    """:class:`RSCLayerError`, joined with ``dgl.DGLError`` when DGL imports (made once)."""
    if not _deps.dgl_available():
        return RSCLayerError
    dgl_error = _deps.require_dgl().DGLError
    return type(
        "RSCLayerError",
        (RSCLayerError, dgl_error),
        {"__module__": __name__, "__doc__": RSCLayerError.__doc__},
    )


def layer_error(message: str) -> RSCLayerError:
    """An :class:`RSCLayerError` carrying ``message`` (also a ``dgl.DGLError`` with DGL)."""
    return _error_class()(message)
