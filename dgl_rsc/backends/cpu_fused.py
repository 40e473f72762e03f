"""Numba CPU kernels of a hidden layer's epilogue: bias, ReLU and dropout in one pass.

A GCN or GraphSAGE hidden layer ends with ``dropout(relu(x + other + bias))``: done op by op,
that is five or more full passes over an ``(N, D)`` tensor forward (add, add, ReLU, mask
draw, mask multiply) and four backward, each over 200 MB on a 200k x 256 layer. Here the
forward is one pass that writes ``y`` and the backward one pass that reads ``y`` and ``dy``
and writes ``dx`` and the bias gradient's partial column sums; nothing else is saved: an
element is kept iff ``y > 0`` (ReLU passed it and dropout kept it), which is exactly the set
both stock backwards pass.

Dropout's mask is not drawn from a stream but computed from ``(seed, row, column)`` by a
counter-based hash (:func:`mix32`), so any pass, and the torch reference of
:mod:`dgl_rsc.sparse.epilogue`, regenerates the same mask without storing it. Element ``(i,
j)`` is kept iff ``hash(row_key(seed, i) ^ j * 0x9E3779B9) >= threshold`` with ``threshold =
round(p * 2^32)``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["mix32", "forward_rows", "backward_rows", "GOLDEN", "M1", "M2"]

_OPTS = dict(boundscheck=False, nogil=True, cache=True, fastmath=False)

#: the hash's constants (a 32-bit avalanche mixer of two multiply-xorshift rounds)
M1, M2 = 0x7FEB352D, 0x846CA68B
#: the column stride of the counter (the golden ratio in 32 bits)
GOLDEN = 0x9E3779B9


@njit(**_OPTS)
def mix32(x):
    """A uint32 -> uint32 avalanche hash (xorshift-multiply, two rounds)."""
    x = np.uint32(x)
    x ^= x >> np.uint32(16)
    x = np.uint32(x * np.uint32(M1))
    x ^= x >> np.uint32(15)
    x = np.uint32(x * np.uint32(M2))
    x ^= x >> np.uint32(16)
    return x


@njit(**_OPTS)
def _row_key(seed_lo, seed_hi, i):
    return mix32(np.uint32(mix32(np.uint32(i) ^ seed_hi)) ^ seed_lo)


@njit(**_OPTS)
def _act_row(xi, oi, bias, yi, relu):
    """``yi = act(xi + oi + bias)`` (``oi`` of length 0: none)."""
    zero = np.float32(0.0)
    if oi.shape[0] > 0:
        for j in range(xi.shape[0]):
            v = (xi[j] + oi[j]) + bias[j]
            yi[j] = zero if relu and v <= zero else v
    else:
        for j in range(xi.shape[0]):
            v = xi[j] + bias[j]
            yi[j] = zero if relu and v <= zero else v


@njit(**_OPTS)
def _drop_row(yi, key, thr, scale):
    """Dropout of row ``yi`` in place: kept elements times ``scale``, the rest 0."""
    zero = np.float32(0.0)
    gold = np.uint32(GOLDEN)
    for j in range(yi.shape[0]):
        h = mix32(key ^ np.uint32(np.uint32(j) * gold))
        yi[j] = yi[j] * scale if h >= thr else zero


@njit(**_OPTS)
def forward_rows(x, other, bias, y, r0, r1, seed_lo, seed_hi, threshold, scale, relu):
    """Rows ``[r0, r1)``: ``y = keep * scale * act((x + other) + bias)``.

    ``x``, ``y`` ``(N, D)`` float32; ``other`` ``(N, D)`` or ``(N, 0)`` (none); ``bias``
    ``(D,)`` (zeros for none). ``threshold`` 0 keeps every element (no dropout). ``relu``:
    apply ReLU (else identity).
    """
    thr = np.uint32(threshold)
    for i in range(r0, r1):
        yi = y[i]
        _act_row(x[i], other[i], bias, yi, relu)
        if threshold > 0:
            _drop_row(yi, _row_key(seed_lo, seed_hi, i), thr, scale)


@njit(**_OPTS)
def backward_rows(dy, y, dx, colsum, r0, r1, part, seed_lo, seed_hi, threshold, scale, relu):
    """Rows ``[r0, r1)``: ``dx = dy * scale`` where the element passed, else 0; ``colsum[part]``
    accumulates ``dx``'s column sums in float64 (the bias gradient; ``(P, 0)``: none).

    With ReLU an element passed iff ``y > 0``; without it (identity activation) iff dropout
    kept it, regenerated from the seed (``threshold`` 0: every element passed).
    """
    zero = np.float32(0.0)
    thr = np.uint32(threshold)
    cs = colsum[part]
    for i in range(r0, r1):
        gi, yi, di = dy[i], y[i], dx[i]
        if relu:
            for j in range(gi.shape[0]):
                di[j] = gi[j] * scale if yi[j] > zero else zero
        else:
            for j in range(gi.shape[0]):
                di[j] = gi[j] * scale
            if threshold > 0:
                _drop_row(di, _row_key(seed_lo, seed_hi, i), thr, np.float32(1.0))
        for j in range(cs.shape[0]):
            cs[j] += di[j]
