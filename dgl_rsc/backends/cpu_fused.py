"""Numba CPU kernels of a hidden layer's epilogue: bias, ReLU and dropout in one pass.

A GCN or GraphSAGE hidden layer ends with ``dropout(relu(x + other + bias))``: done op by op,
that is five or more full passes over an ``(N, D)`` tensor forward (add, add, ReLU, mask
draw, mask multiply) and four backward, each over 200 MB on a 200k x 256 layer. Here the
forward is one pass that writes ``y`` and the backward one pass that reads ``y`` and ``dy``
and writes ``dx`` (the bias gradient is its column sum); nothing else is saved: an
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
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

__all__ = ["mix32", "forward_rows", "backward_rows", "forward_rows_bits", "backward_rows_bits",
           "GOLDEN", "M1", "M2"]  # fmt: skip

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


@intrinsic
def _kept(typingctx, key, j, thr):
    """``mix32(key ^ (j * GOLDEN mod 2^32)) >= thr`` (uint32 ``key``, ``thr``; ``j`` cast to
    int64), emitted as 32-bit LLVM operations: the same value as :func:`mix32`, but Numba
    would widen each ``uint32`` product to 64 bits, which halves the vector lanes
    (``vpmuludq`` on four lanes instead of ``vpmulld`` on eight) and made dropout's mask three
    times slower."""
    sig = types.boolean(types.uint32, types.int64, types.uint32)

    def codegen(context, builder, signature, args):
        k, jj, t = args
        i32 = ir.IntType(32)
        x = builder.xor(k, builder.mul(builder.trunc(jj, i32), ir.Constant(i32, GOLDEN)))
        for shift, mult in ((16, M1), (15, M2)):
            x = builder.xor(x, builder.lshr(x, ir.Constant(i32, shift)))
            x = builder.mul(x, ir.Constant(i32, mult))
        x = builder.xor(x, builder.lshr(x, ir.Constant(i32, 16)))
        return builder.icmp_unsigned(">=", x, t)

    return sig, codegen


@njit(**_OPTS)
def _row_key(seed_lo, seed_hi, i):
    return mix32(np.uint32(mix32(np.uint32(i) ^ seed_hi)) ^ seed_lo)


@njit(**_OPTS)
def forward_rows(x, other, bias, y, r0, r1, seed_lo, seed_hi, threshold, scale, relu):
    """Rows ``[r0, r1)``: ``y = keep * scale * act((x + other) + bias)``.

    ``x``, ``y`` ``(N, D)`` float32; ``other`` ``(N, D)`` or ``(N, 0)`` (none); ``bias``
    ``(D,)`` (zeros for none). ``threshold`` 0 keeps every element (no dropout). ``relu``:
    apply ReLU (else identity). Elements are indexed ``[i, j]`` in one loop per row: views of
    rows kept LLVM from vectorizing (twice slower).
    """
    zero = np.float32(0.0)
    thr = np.uint32(threshold)
    with_other = other.shape[1] > 0
    for i in range(r0, r1):
        key = _row_key(seed_lo, seed_hi, i) if threshold > 0 else np.uint32(0)
        for j in range(x.shape[1]):
            v = x[i, j]
            if with_other:
                v = v + other[i, j]
            v = v + bias[j]
            if relu and v <= zero:
                v = zero
            if threshold > 0:
                v = v * scale if _kept(key, j, thr) else zero
            y[i, j] = v


@njit(**_OPTS)
def backward_rows(dy, y, dx, r0, r1, seed_lo, seed_hi, threshold, scale, relu):
    """Rows ``[r0, r1)``: ``dx = dy * scale`` where the element passed, else 0.

    With ReLU an element passed iff ``y > 0``; without it (identity activation) iff dropout
    kept it, regenerated from the seed (``threshold`` 0: every element passed). The bias
    gradient is ``dx``'s column sum, left to torch (the op-by-op layer's own reduction).
    """
    zero = np.float32(0.0)
    thr = np.uint32(threshold)
    for i in range(r0, r1):
        if relu:
            for j in range(dy.shape[1]):
                dx[i, j] = dy[i, j] * scale if y[i, j] > zero else zero
        elif threshold > 0:
            key = _row_key(seed_lo, seed_hi, i)
            for j in range(dy.shape[1]):
                dx[i, j] = dy[i, j] * scale if _kept(key, j, thr) else zero
        else:
            for j in range(dy.shape[1]):
                dx[i, j] = dy[i, j] * scale


@njit(**_OPTS)
def forward_rows_bits(x, other, bias, y, r0, r1, seed_lo, seed_hi, threshold, scale, bits,
                      col, has_col, amax, nan):  # fmt: skip
    """Rows ``[r0, r1)`` of :func:`forward_rows` with ReLU (the same values; ``y`` may be
    ``x`` itself: each element is read before it is written), and per row, while it is in
    cache: ``bits[i, j >> 3]`` bit ``j & 7`` set iff ``y[i, j] > 0`` (the elements whose
    gradient flows: ReLU passed them and dropout kept them), and, where ``amax`` has columns,
    the running maxima ``amax[j] = max |y[i, j] * col[i]|`` over the non-NaN terms (``col``
    1 without ``has_col``) with ``nan[j]`` set where a term is NaN (a select and an or: both
    vectorize, where a NaN-sticky maximum did not)."""
    zero = np.float32(0.0)
    thr = np.uint32(threshold)
    with_other = other.shape[1] > 0
    measure = amax.shape[0] > 0
    d = x.shape[1]
    full = d // 8
    for i in range(r0, r1):
        key = _row_key(seed_lo, seed_hi, i) if threshold > 0 else np.uint32(0)
        for j in range(d):  # forward_rows' loop, which LLVM vectorizes
            v = x[i, j]
            if with_other:
                v = v + other[i, j]
            v = v + bias[j]
            if v <= zero:
                v = zero
            if threshold > 0:
                v = v * scale if _kept(key, j, thr) else zero
            y[i, j] = v
        for b in range(full):
            byte = np.uint8(0)
            for k in range(8):
                byte |= np.uint8(y[i, 8 * b + k] > zero) << np.uint8(k)
            bits[i, b] = byte
        if full < bits.shape[1]:
            byte = np.uint8(0)
            for k in range(d - 8 * full):
                byte |= np.uint8(y[i, 8 * full + k] > zero) << np.uint8(k)
            bits[i, full] = byte
        if measure:
            c = col[i] if has_col else np.float32(1.0)
            for j in range(d):
                a = abs(y[i, j] * c) if has_col else abs(y[i, j])
                m = amax[j]
                amax[j] = a if a > m else m
                nan[j] |= a != a


@njit(**_OPTS)
def backward_rows_bits(dy, bits, dx, r0, r1, scale):
    """Rows ``[r0, r1)``: ``dx = dy * scale`` where the element's bit is set, else +0 (the
    backward of :func:`forward_rows_bits`, equal to :func:`backward_rows` with ReLU, Inf and
    NaN included). The bit selects by a 32-bit mask on ``dy``'s bits, which vectorizes (a
    branch or select on the bit did not: 20x slower)."""
    dyu = dy.view(np.uint32)
    dxu = dx.view(np.uint32)
    d = dy.shape[1]
    one = np.float32(1.0)
    for i in range(r0, r1):
        for j in range(d):
            bit = (np.uint32(bits[i, j >> 3]) >> np.uint32(j & 7)) & np.uint32(1)
            dxu[i, j] = dyu[i, j] & (np.uint32(0) - bit)
        if scale != one:
            for j in range(d):
                dx[i, j] = dx[i, j] * scale
