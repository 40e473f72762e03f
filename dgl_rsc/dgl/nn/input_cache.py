"""The first layer's aggregation computed once per run, when nothing it reads changes.

A layer whose input features need no gradient (the dataset's ``X``) and whose graph and edge
weights do not change aggregates the same ``A X`` at every step. When that holds, the drop-in
convs aggregate first and reuse ``A X`` (normalized as the layer normalizes it) across steps:
the forward has no sparse product for that layer and the backward needs only the weight
gradient ``(A X)^T dY``, a dense GEMM. Exact up to floating-point reassociation (aggregating
before the transform instead of after, where DGL's order transforms first).

Detected, not configured: the layer keys the cached product by the identity and version
counter (``tensor._version``, bumped by every in-place change) of the features, the graph's
index arrays and the edge weights. Features that need a gradient, edge weights that need one,
blocks, bipartite pairs and distributed graphs never use it. On an INT8 layer the cached
product is computed in fp32 (once per run, INT8 would save nothing and keep one draw of its
rounding error); the layer's transform stays as its INT8 spec says. A feature tensor is
cached only when the same tensor, unchanged, comes back on the next call: input dropout (or
any other fresh tensor per step) never builds a cache and keeps the plain path.
:func:`cache_input_aggregation` turns it off for a model (to compare, or to save its
``(N, D_in)`` of memory).
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Callable, Optional

import torch
from torch import nn

__all__ = ["InputAggregationCache", "cache_input_aggregation", "input_cache_counts"]


@dataclasses.dataclass
class _Entry:
    feat: weakref.ref  # the features (not kept alive: a dead reference is a miss)
    signature: tuple  # identities and versions of everything the product reads
    keepalive: tuple  # the graph's arrays and edge weights: their ids stay theirs
    value: Optional[torch.Tensor] = None  # the product (None: seen once, not built yet)
    version: int = 0  # the product's version counter when built (a caller may change it)


def _signature(feat: torch.Tensor, reads: tuple) -> tuple:
    tensors = tuple((id(t), t._version) for t in reads if t is not None)
    return (tensors, feat._version, feat.dtype, feat.device, tuple(feat.shape))


class InputAggregationCache:
    """One layer's cached aggregation of its input (see the module docstring).

    ``hits``: calls served from the cache; ``builds``: products computed into it.
    """

    def __init__(self):
        self.enabled = True
        self.hits = self.builds = 0
        self._entry: Optional[_Entry] = None

    def get(self, feat: torch.Tensor, reads: tuple, build: Callable[[], torch.Tensor],
            used: Optional[Callable[[bool], None]] = None):  # fmt: skip
        """The cached product for ``feat`` and ``reads`` (the graph's index arrays, edge
        weights; ``None`` entries skipped), built with ``build()`` (under ``no_grad``) the
        second time the same unchanged ``feat`` comes; ``None``: use the plain path.
        ``used(built)`` is called when a product is returned (``built``: computed now)."""
        if not self.enabled or feat.requires_grad:
            return None
        sig = _signature(feat, reads)
        e = self._entry
        if e is not None and e.feat() is feat and e.signature == sig:
            if e.value is None or e.value._version != e.version:  # not built, or changed
                with torch.no_grad():  # in place by whoever got it: built again
                    e.value = build()
                e.version = e.value._version
                self.builds += 1
                built = True
            else:
                self.hits += 1
                built = False
            if used is not None:
                used(built)
            return e.value
        self._entry = _Entry(weakref.ref(feat), sig, tuple(t for t in reads if t is not None))
        return None

    def clear(self) -> None:
        """Forget the cached product (its ``(N, D_in)`` memory is released)."""
        self._entry = None

    def __getstate__(self) -> dict:
        # a pickled layer (torch.save(model)) carries its switch and counters, not the
        # product: its key holds a weak reference, and the features are not pickled with it
        return {**self.__dict__, "_entry": None}

    def nbytes(self) -> int:
        e = self._entry
        return 0 if e is None or e.value is None else e.value.numel() * e.value.element_size()


def _caches(model: nn.Module) -> list:
    return [m._rsc_input_cache for m in model.modules() if hasattr(m, "_rsc_input_cache")]


def cache_input_aggregation(model: nn.Module, enabled: bool = True) -> nn.Module:
    """Let the drop-in layers of ``model`` cache their input's aggregation (the default) or
    not (``enabled=False``: every step aggregates afresh, in DGL's order). Returns ``model``."""
    for cache in _caches(model):
        cache.enabled = bool(enabled)
        cache.clear()
    return model


def input_cache_counts(model: nn.Module) -> dict:
    """``{"layers", "hits", "builds", "bytes"}`` summed over the drop-in layers of ``model``:
    layers whose input aggregation is cached now, calls served from a cache, products built."""
    caches = _caches(model)
    return {
        "layers": sum(c.nbytes() > 0 for c in caches),
        "hits": sum(c.hits for c in caches),
        "builds": sum(c.builds for c in caches),
        "bytes": sum(c.nbytes() for c in caches),
    }
