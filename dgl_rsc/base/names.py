"""Names users type (datasets, models, backends, engines, config keys): the one helper that
turns an unknown name into an error naming the nearest known one.

Example:
    >>> did_you_mean("metsi", ["metis", "random"])
    " Did you mean 'metis'?"
    >>> str(unknown("engine", "dlg", ["native", "dgl"]))
    "unknown engine='dlg'. Did you mean 'dgl'? Choose one of: native, dgl."
"""

from __future__ import annotations

import difflib
from typing import Iterable

__all__ = ["did_you_mean", "unknown"]


def did_you_mean(value, choices: Iterable) -> str:
    """``" Did you mean 'x'?"`` for the choice nearest ``value``, or ``""`` if none is near."""
    near = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
    return f" Did you mean {near[0]!r}?" if near else ""


def unknown(kind: str, value, choices: Iterable, fix: str = "") -> ValueError:
    """``ValueError("unknown KIND='value'. Did you mean ...? Choose one of: a, b. FIX")``."""
    choices = [str(c) for c in choices]
    tail = f" {fix}" if fix else ""
    return ValueError(
        f"unknown {kind}={value!r}.{did_you_mean(value, choices)} "
        f"Choose one of: {', '.join(choices)}.{tail}"
    )
