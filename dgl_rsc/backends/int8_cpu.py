"""Numba CPU kernel of the INT8 sparse-dense product (the CPU default where Numba imports).

One pass over each row's entries with an int32 accumulator row, then the fused dequantize,
operation for operation as :mod:`dgl_rsc.backends.int8_ref` (bit-identical integers; the two fp32
products in the same order). Rows run in parallel chunks of equal non-zeros
(:func:`dgl_rsc.sparse.cpu_spmm.run_chunked`).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from numba import njit, prange

from ..sparse.cpu_spmm import run_chunked

__all__ = ["int8_spmm", "int8_spmm_acc", "quantize_codes"]

_OPTS = dict(boundscheck=False, nogil=True, cache=True)


@njit(**_OPTS)
def _rows(indptr, indices, qvals, has_vals, qX, r0, r1, acc_out, fused, rf, has_rf, cs, out):
    d = qX.shape[1]
    acc = np.zeros(d, dtype=np.int32)
    for i in range(r0, r1):
        acc[:] = 0
        for e in range(indptr[i], indptr[i + 1]):
            j = indices[e]
            v = np.int32(qvals[e]) if has_vals else np.int32(1)
            for f in range(d):
                acc[f] += v * np.int32(qX[j, f])
        if fused:
            r = rf[i] if has_rf else np.float32(1.0)
            for f in range(d):
                y = np.float32(acc[f]) * cs[f]
                out[i, f] = y * r if has_rf else y
        else:
            for f in range(d):
                acc_out[i, f] = acc[f]


def _run(indptr, indices, qvals, qX, fused, row_factor, col_scale):
    m, d = indptr.numel() - 1, qX.shape[1]
    ip, ix = indptr.numpy(), indices.numpy()
    has_vals = qvals is not None
    qv = qvals.numpy() if has_vals else np.zeros(1, np.int8)
    x = qX.contiguous().numpy()
    has_rf = row_factor is not None
    rf = row_factor.numpy() if has_rf else np.ones(1, np.float32)
    cs = col_scale.numpy() if fused else np.ones(1, np.float32)
    acc = torch.empty((0 if fused else m, d), dtype=torch.int32)
    out = torch.empty((m if fused else 0, d), dtype=torch.float32)
    a, o = acc.numpy(), out.numpy()

    def run(r0, r1):
        _rows(ip, ix, qv, has_vals, x, r0, r1, a, fused, rf, has_rf, cs, o)

    if m:
        run_chunked(ip, 0, m, d, run)
    return out if fused else acc


def int8_spmm_acc(indptr, indices, qvals: Optional[torch.Tensor], qX) -> torch.Tensor:
    """``(M, D)`` int32 accumulation (as :func:`dgl_rsc.backends.int8_ref.int8_spmm_acc`)."""
    return _run(indptr, indices, qvals, qX, False, None, None)


def int8_spmm(indptr, indices, qvals, qX, row_factor, col_scale) -> torch.Tensor:
    """``(M, D)`` fp32 fused product (as :func:`dgl_rsc.backends.int8_ref.int8_spmm`)."""
    return _run(indptr, indices, qvals, qX, True, row_factor, col_scale.float())


@njit(boundscheck=False, nogil=True, cache=True)
def _lowbias32(x):
    m = np.uint64(0xFFFFFFFF)
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(0x7FEB352D)) & m
    x = x ^ (x >> np.uint64(15))
    x = (x * np.uint64(0x846CA68B)) & m
    return x ^ (x >> np.uint64(16))


@njit(boundscheck=False, nogil=True, cache=True, parallel=True)
def _codes(x, s, stochastic, seed, q):
    m32 = np.uint64(0xFFFFFFFF)
    rows, cols = x.shape
    sr = 1 if s.shape[0] > 1 else 0
    sc = 1 if s.shape[1] > 1 else 0
    for i in prange(rows):
        for j in range(cols):
            sv = s[i * sr, j * sc]
            v = x[i, j] / (sv if sv > 0 else np.float32(1.0))
            if stochastic:
                k = np.uint64(i * cols + j) & m32
                h = _lowbias32(_lowbias32(k) ^ seed)
                v = np.floor(v + np.float32(h >> np.uint64(8)) * np.float32(2.0**-24))
            else:
                v = np.rint(v)
            if v != v:
                v = np.float32(0.0)
            q[i, j] = np.int8(min(max(v, np.float32(-127.0)), np.float32(127.0)))


def quantize_codes(x, s, rounding: str, seed: int) -> torch.Tensor:
    """As :func:`dgl_rsc.quant.rounding.torch_codes` (bit-identical), in one parallel pass."""
    q = torch.empty(x.shape, dtype=torch.int8)
    if x.numel():
        _codes(x.numpy(), s.contiguous().numpy(), rounding == "stochastic",
               np.uint64(int(seed) & 0xFFFFFFFF), q.numpy())  # fmt: skip
    return q
