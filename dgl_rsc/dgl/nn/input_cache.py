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

Under ``torch.compile`` (torch >= 2.4) the layer hands its cache to the product operator as a
memo (:mod:`dgl_rsc.core.ops_memo`) wherever its input needs no gradient. Compiled code passes
a fresh alias of the features at every call, so there the cache keys by the features' storage,
version and layout, holds the features and the matrix (no other tensor can take their memory
while the entry stands) and compares the scales and edge values by value.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Callable, Optional

import torch
from torch import nn

from ...base.flags import require_flag
from ...core.ops_memo import register

__all__ = ["InputAggregationCache", "cache_input_aggregation", "input_cache_counts"]


@dataclasses.dataclass
class _Entry:
    feat: weakref.ref  # the features (not kept alive: a dead reference is a miss)
    signature: tuple  # identities and versions of everything the product reads
    keepalive: tuple  # the graph's arrays and edge weights: their ids stay theirs
    value: Optional[torch.Tensor] = None  # the product (None: seen once, not built yet)
    version: int = 0  # the product's version counter when built (a caller may change it)


@dataclasses.dataclass
class _OpEntry:
    signature: tuple  # storage, version and layout of X; the matrix's index arrays
    keepalive: tuple  # X and the index arrays: no other tensor takes their memory meanwhile
    side: tuple  # copies of the values and scales the product was asked with
    row_divide: bool
    value: Optional[torch.Tensor] = None  # the product (None: seen once, not built yet)


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
        self._op_entry: Optional[_OpEntry] = None
        self.handle = register(self)  # the memo handle a compiled product names
        self.notify: Optional[Callable[[bool], None]] = None  # compiled reuse: notify(built)

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

    def product(self, X: torch.Tensor, A, scales, build: Callable[[], torch.Tensor]):
        """The memo of a compiled product (:mod:`dgl_rsc.core.ops_memo`): the stored
        ``A X`` (built with ``build()`` the second time the same unchanged ``X``, matrix and
        scales come), or ``None`` (the operator computes the product)."""
        if not self.enabled:
            return None
        tensors = (A.indptr, A.indices)
        sig = ((X.data_ptr(), X._version, tuple(X.shape), X.stride(), X.dtype, X.device),
               tuple((t.data_ptr(), t._version) for t in tensors))  # fmt: skip
        side = (A.values, scales.row, scales.col, scales.hint_col)
        e = self._op_entry
        if (
            e is not None
            and e.signature == sig
            and e.row_divide == scales.row_divide
            and all(
                (a is None) == (b is None) and (a is None or torch.equal(a, b))
                for a, b in zip(e.side, side)
            )
        ):
            built = e.value is None
            if built:
                e.value = build()
                self.builds += 1
            else:
                self.hits += 1
            if self.notify is not None:
                self.notify(built)
            return e.value
        kept = tuple(None if t is None else t.clone() for t in side)  # may be reused buffers
        self._op_entry = _OpEntry(sig, (X, *tensors), kept, scales.row_divide)
        return None

    def clear(self) -> None:
        """Forget the cached product (its ``(N, D_in)`` memory is released)."""
        self._entry = self._op_entry = None

    def __getstate__(self) -> dict:
        # a pickled layer (torch.save(model)) carries its switch and counters, not the
        # product: its key holds a weak reference, and the features are not pickled with it
        return {**self.__dict__, "_entry": None, "_op_entry": None, "handle": 0, "notify": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_op_entry", None)
        self.__dict__.setdefault("notify", None)
        self.handle = register(self)  # a copy is its own memo

    def nbytes(self) -> int:
        return sum(0 if e is None or e.value is None else e.value.numel() * e.value.element_size()
                   for e in (self._entry, self._op_entry))  # fmt: skip


def _caches(model: nn.Module) -> list:
    return [m._rsc_input_cache for m in model.modules() if hasattr(m, "_rsc_input_cache")]


def cache_input_aggregation(model: nn.Module, enabled: bool = True) -> nn.Module:
    """Let the drop-in layers of ``model`` cache their input's aggregation (the default) or
    not (``enabled=False``: every step aggregates afresh, in DGL's order). Returns ``model``."""
    enabled = require_flag(enabled, "cache_input_aggregation(model, enabled)")
    for cache in _caches(model):
        cache.enabled = enabled
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
