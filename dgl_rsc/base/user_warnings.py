"""Warnings that point at the user's line, not at dgl_rsc's (or DGL's, or torch's) own.

A warning raised deep in a product (a layer's forward, the DGL patch's wrapper, the
controller) with a fixed ``stacklevel`` lands on a line inside a library; here the warning is
attributed to the first frame of the call stack whose file lies outside the packages
``dgl_rsc``, ``dgl``, ``torch``, ``torch_geometric`` and ``torch_sparse`` (and outside
:mod:`contextlib`, which runs ``with`` blocks): the user's model, training loop or ``with
dgl_rsc.patch(...)`` line.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from types import FrameType
from typing import Optional

__all__ = ["warn_user", "user_frame"]

#: the package root (this module sits in ``dgl_rsc/base/``)
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _library_prefixes() -> tuple:
    dirs = [_OWN_DIR]
    for name in ("torch", "dgl", "torch_geometric", "torch_sparse"):
        path = getattr(sys.modules.get(name), "__file__", None)  # only if already imported
        if path:
            dirs.append(os.path.dirname(os.path.abspath(path)))
    return tuple(d + os.sep for d in dirs)


def user_frame(start: Optional[FrameType] = None) -> Optional[FrameType]:
    """The innermost frame (from ``start``, default the caller) whose file is the user's."""
    prefixes, ctx = _library_prefixes(), os.path.abspath(contextlib.__file__)
    frame = start if start is not None else sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(prefixes) and path != ctx:
            return frame
        frame = frame.f_back
    return None


def warn_user(message: str, category: type = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the user's line (see the module);
    the usual filters and once-per-location registry apply."""
    frame = user_frame(sys._getframe(1))
    if frame is None:
        warnings.warn(message, category, stacklevel=2)
        return
    g = frame.f_globals
    # no module_globals: its loader would be asked for the source, which code run by
    # ``python -c`` (a builtin-loaded __main__) cannot give; linecache reads files itself
    warnings.warn_explicit(
        message, category, frame.f_code.co_filename, frame.f_lineno,
        module=g.get("__name__", "<unknown>"), registry=g.setdefault("__warningregistry__", {}),
    )  # fmt: skip
