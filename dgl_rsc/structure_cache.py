"""``StructureCache``: reuse the CSR built from a framework object across training steps.

Graph objects of DGL are not hashable and not weak-referenceable, so entries are keyed by
``id(obj)`` and hold a strong reference to ``obj``: while an entry lives its ``id`` cannot be
reused by another object, so a cached structure is never served for another graph. The
cache is small (LRU), owned by a controller, and dropped with it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

__all__ = ["StructureCache"]


class StructureCache:
    """LRU map ``obj -> value`` keyed by identity, holding ``obj`` alive while cached."""

    def __init__(self, capacity: int = 8):
        self.capacity = capacity
        self._entries: OrderedDict[int, tuple[Any, Any]] = OrderedDict()

    def get(self, obj: Any, build: Callable[[], Any]) -> Any:
        """The cached value for ``obj``, building it with ``build()`` on a miss."""
        key = id(obj)
        hit = self._entries.get(key)
        if hit is not None and hit[0] is obj:
            self._entries.move_to_end(key)
            return hit[1]
        value = build()
        self._entries[key] = (obj, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return value

    def drop(self, obj: Any) -> None:
        """Forget ``obj``'s entry, if any."""
        hit = self._entries.get(id(obj))
        if hit is not None and hit[0] is obj:
            del self._entries[id(obj)]

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
