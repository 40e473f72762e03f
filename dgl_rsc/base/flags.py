"""On/off arguments of the public API: ``True`` or ``False``, nothing else.

A string such as ``"false"`` or ``"no"`` is truthy in Python, so an ``if`` on it would turn on
what the user meant to turn off; every switch of the public API goes through
:func:`require_flag` instead.
"""

from __future__ import annotations

import numpy as np

__all__ = ["require_flag"]


def require_flag(value, what: str) -> bool:
    """``value`` as a ``bool`` where it is ``True`` or ``False`` (NumPy's ``bool_``
    included).

    Args:
        value: the argument as given.
        what: how the user wrote it, for the message (``"dgl_rsc.patch(enabled=...)"``).

    Raises:
        TypeError: ``value`` is anything else (a string, a number, ``None``).
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    raise TypeError(f"{what} takes True or False, got {value!r} ({type(value).__name__}).")
