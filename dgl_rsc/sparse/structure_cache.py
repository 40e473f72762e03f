"""``StructureCache``: reuse the CSR built from a framework object across training steps.

Graph objects of DGL are not hashable and not weak-referenceable, and DGL makes a new graph
index for every message-passing call. Entries are therefore keyed either by ``id(obj)``
holding ``obj`` alive, or by the data pointers of the index arrays holding those arrays
alive: while an entry lives, its key cannot be taken by another object or array, so a
cached structure is never served for another graph. The cache is small (LRU), owned by a
controller, and dropped with it.

``TensorStructures``: the structures of raw index tensors (``dgl_rsc.spmm_csr`` without a
controller), each kept for as long as the caller's tensor objects live and no longer.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any, Callable

__all__ = ["StructureCache", "TensorStructures"]


class StructureCache:
    """LRU map ``obj -> value`` keyed by identity, holding ``obj`` alive while cached."""

    def __init__(self, capacity: int = 8):
        self.capacity = capacity
        self._entries: OrderedDict[tuple, tuple[Any, Any]] = OrderedDict()

    def get(self, obj: Any, build: Callable[[], Any]) -> Any:
        """The cached value for ``obj``, building it with ``build()`` on a miss."""
        return self.get_by_key(("id", id(obj)), obj, build)

    def get_by_key(self, key, keepalive: Any, build: Callable[[], Any]) -> Any:
        """The cached value for ``key``; ``keepalive`` is held with the entry.

        Use a key made of data pointers only together with ``keepalive`` holding the
        tensors they point into: then no other array can take those addresses while the
        entry lives.
        """
        hit = self._entries.get(key)
        if hit is not None and (key[0] != "id" or hit[0] is keepalive):
            self._entries.move_to_end(key)
            return hit[1]
        value = build()
        self._entries[key] = (keepalive, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return value

    def drop(self, obj: Any) -> None:
        """Forget ``obj``'s entry, if any."""
        hit = self._entries.get(("id", id(obj)))
        if hit is not None and hit[0] is obj:
            del self._entries[("id", id(obj))]

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


class TensorStructures:
    """``(indptr, indices, shape) -> value`` keyed by the identity of the two tensor objects.

    An entry holds weak references to the caller's tensors and is dropped when either is
    freed; ``build`` receives aliases of them (``detach()``: the same storage and version
    counter, other Python objects), so the cached value never keeps the caller's tensors
    alive. A tensor modified in place since (its version moved) gets a new value.
    """

    def __init__(self):
        self._entries: dict = {}

    def get(self, indptr, indices, shape: tuple, build: Callable[[Any, Any], Any]) -> Any:
        """The value for these tensors, ``build(indptr_alias, indices_alias)`` on a miss."""
        key = (id(indptr), id(indices))
        versions = (indptr._version, indices._version)
        hit = self._entries.get(key)
        if hit is not None:
            ref_p, ref_i, known, value = hit
            if ref_p() is indptr and ref_i() is indices and known == (shape, versions):
                return value
        value = build(indptr.detach(), indices.detach())
        entries = self._entries

        def drop(_ref, key=key):
            entry = entries.get(key)
            if entry is not None and (entry[0] is _ref or entry[1] is _ref):
                del entries[key]

        entries[key] = (weakref.ref(indptr, drop), weakref.ref(indices, drop),
                        (shape, versions), value)  # fmt: skip
        return value

    def __len__(self) -> int:
        return len(self._entries)
