"""A product reused across compiled steps: ``dgl_rsc::spmm_memo`` (torch >= 2.4).

Eagerly, a drop-in layer whose input needs no gradient reuses its aggregation ``A X`` across
steps (:mod:`dgl_rsc.dgl.nn.input_cache`), keyed by the identity of the Python tensor. Compiled
code hands a custom operator a fresh alias of the same input at every call, so under
``torch.compile`` the layer names a *memo* instead: an object registered here (:func:`register`,
held by a weak reference) whose ``product(X, A, scales, build)`` returns its stored product
(built with ``build()`` when it decides to store one) or ``None``. The operator asks it at run
time, with real tensors, and computes the product itself on ``None``; what it returns is
always a fresh tensor, since compiled code may write into an operator's output.

The memo decides what a hit is; the layer's own (:class:`~dgl_rsc.dgl.nn.input_cache.
InputAggregationCache`) compares the storage, version and layout of ``X`` and of the matrix's
index arrays, and the values of the edge weights and scales.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Optional

import torch

from ..sparse.products import Scales, csr_mm
from .ops import HAS_OPS, _matrix, _scales

__all__ = ["register", "memo_spmm"]

_memos: dict[int, weakref.ref] = {}
_ids = itertools.count(1)


def register(memo) -> int:
    """A handle for ``memo`` (held weakly; call outside tracing, e.g. when the memo is made)."""
    for h in [h for h, ref in _memos.items() if ref() is None]:
        del _memos[h]
    h = next(_ids)
    _memos[h] = weakref.ref(memo)
    return h


def _product(memo: int, A, X: torch.Tensor, scales: Scales) -> torch.Tensor:
    ref = _memos.get(memo)
    obj = None if ref is None else ref()

    def build() -> torch.Tensor:
        return csr_mm(A, X, scales)

    stored = None if obj is None else obj.product(X, A, scales, build)
    return build() if stored is None else stored.clone()


if HAS_OPS:
    from torch.library import custom_op

    @custom_op("dgl_rsc::spmm_memo", mutates_args=())
    def _memo_op(indptr: torch.Tensor, indices: torch.Tensor, values: Optional[torch.Tensor],
                 X: torch.Tensor, row: Optional[torch.Tensor], col: Optional[torch.Tensor],
                 hint: Optional[torch.Tensor], m: int, n: int, row_divide: bool,
                 key: Optional[torch.Tensor], tag: int, memo: int) -> torch.Tensor:  # fmt: skip
        A = _matrix(indptr, indices, values, m, n, key, tag)
        return _product(memo, A, X, _scales(row, col, hint, row_divide))

    @_memo_op.register_fake
    def _(indptr, indices, values, X, row, col, hint, m, n, row_divide, key, tag, memo):
        return X.new_empty((m, X.shape[1]))


def memo_spmm(A, X: torch.Tensor, scales: Scales, memo: int) -> torch.Tensor:
    """``(M, D)`` ``diag(r) A diag(c) X`` (no gradient for ``X``) through
    ``dgl_rsc::spmm_memo``: memo ``memo``'s stored product where it holds one."""
    key, tag = getattr(A, "key", None), getattr(A, "tag", 0)
    return torch.ops.dgl_rsc.spmm_memo(A.indptr, A.indices, A.values, X, scales.row, scales.col,
                                       scales.hint_col, A.shape[0], A.shape[1],
                                       scales.row_divide, key, tag, memo)  # fmt: skip
