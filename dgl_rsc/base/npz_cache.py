"""The one on-disk format of the package's caches (graph partitions, Cluster-GCN clusters): an
``.npz`` archive, read without pickle, holding a ``format`` marker (whose file it is, and which
layout), the full ``key`` of what it was computed from, and the arrays. Written atomically.

Reading says why an entry cannot be used: ``missing``, ``foreign`` (a readable archive without
a marker: not ours, so it is never overwritten), ``stale`` (another marker or key) or
``corrupt`` (unreadable, or an array missing).

Example:
    >>> import numpy as np, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "entry.npz")
    >>> write_entry(path, "demo/1", "k", {"x": np.arange(3)})
    >>> status, arrays = read_entry(path, "demo/1", "k", ("x",))
    >>> status, arrays["x"].tolist(), read_entry(path, "demo/1", "other", ("x",))[0]
    ('hit', [0, 1, 2], 'stale')
"""

from __future__ import annotations

import os
import zipfile
from typing import Optional, Sequence

import numpy as np

from .atomic import atomic_write

__all__ = ["read_entry", "write_entry"]


def write_entry(path: str, fmt: str, key: str, arrays: dict, compressed: bool = False) -> None:
    """Write ``arrays`` (name -> ndarray) with the marker ``fmt`` and ``key`` to ``path``."""
    payload = {"format": np.array(fmt), "key": np.array(key), **arrays}
    save = np.savez_compressed if compressed else np.savez
    atomic_write(path, lambda f: save(f, **payload))


def read_entry(path: str, fmt: str, key: str,
               names: Sequence[str]) -> tuple[str, Optional[dict]]:  # fmt: skip
    """``("hit", {name: ndarray})`` for the arrays ``names`` of the entry at ``path`` made with
    ``fmt`` and ``key``, or ``(why not, None)``."""
    if not os.path.exists(path):
        return "missing", None
    try:
        with np.load(path, allow_pickle=False) as z:
            if "format" not in z.files:
                return "foreign", None
            if str(z["format"]) != fmt or str(z["key"]) != key:
                return "stale", None
            return "hit", {name: np.asarray(z[name]) for name in names}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile):
        return "corrupt", None
