"""StructureCache: identity keys held alive, data-pointer keys, LRU, drop and clear."""

from dgl_rsc.sparse.structure_cache import StructureCache


class Obj:
    pass


def test_identity_entries_are_held_and_rebuilt_for_other_objects():
    cache = StructureCache(capacity=2)
    a, b = Obj(), Obj()
    calls = []
    assert cache.get(a, lambda: calls.append("a") or 1) == 1
    assert cache.get(a, lambda: calls.append("again") or 2) == 1  # hit
    assert cache.get(b, lambda: calls.append("b") or 3) == 3
    assert calls == ["a", "b"] and len(cache) == 2


def test_lru_eviction_and_drop():
    cache = StructureCache(capacity=2)
    objs = [Obj() for _ in range(3)]
    for i, o in enumerate(objs):
        cache.get(o, lambda i=i: i)
    assert len(cache) == 2
    assert cache.get(objs[0], lambda: "rebuilt") == "rebuilt"  # the oldest was evicted
    cache.drop(objs[0])
    assert cache.get(objs[0], lambda: "new") == "new"
    cache.clear()
    assert len(cache) == 0


def test_data_pointer_keys_keep_their_arrays_alive():
    import torch

    cache = StructureCache()
    x = torch.arange(5)
    key = ("ptr", x.data_ptr())
    assert cache.get_by_key(key, x, lambda: "v") == "v"
    assert cache.get_by_key(key, x, lambda: "other") == "v"
    held = cache._entries[key][0]
    assert held is x  # the keepalive is stored with the entry
