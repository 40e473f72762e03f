"""Numba CPU kernel of the INT8 sparse-dense product (the CPU default where Numba imports).

One pass over each row's entries, then the fused dequantize, operation for operation as
:mod:`dgl_rsc.backends.int8_ref` (bit-identical integers; the two fp32 products in the same
order). Without values the gathered int8 rows are summed in int16 over spans of
:data:`INT16_SPAN` entries (exact: no span can overflow) and widened once per span: the
product reads a quarter of the fp32 product's bytes and adds 16 lanes per AVX2 instruction,
2.3x faster than the fp32 row kernel on a 200000-node graph of degree 100 at width 256
(2 threads, ``tools/experiments/int8_spmm_cpu.py``). With values, int32 sums. Rows run in
parallel chunks of equal non-zeros (:func:`dgl_rsc.sparse.cpu_spmm.run_chunked`).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from numba import njit, prange

from ..quant.rounding import QMAX, bf16_scale_up
from ..sparse.cpu_spmm import run_chunked

__all__ = ["INT16_SPAN", "int8_spmm", "int8_spmm_acc", "quantize_codes", "quantize_columns",
           "column_amax", "scaled_codes", "row_amax", "dequantize_rows"]  # fmt: skip

_OPTS = dict(boundscheck=False, nogil=True, cache=True)


#: Entries summed in int16 before a row's partial sums are widened to int32: without values
#: every term is a code in ``[-127, 127]``, and ``258 * 127 = 32766`` fits an int16, so each
#: partial sum is exact and the row's integers equal the int32 accumulation's bit for bit.
INT16_SPAN = 256


@njit(**_OPTS)
def _rows_plain(indptr, indices, qX, r0, r1, acc_out, fused, rf, has_rf, cs, out):
    """Rows ``[r0, r1)`` of an unweighted product: int16 sums of up to :data:`INT16_SPAN`
    gathered int8 rows (four at a time), widened into the int32 row once per span."""
    d = qX.shape[1]
    acc = np.zeros(d, dtype=np.int32)
    part = np.zeros(d, dtype=np.int16)
    for i in range(r0, r1):
        acc[:] = 0
        p, e = indptr[i], indptr[i + 1]
        while p < e:
            stop = min(e, p + INT16_SPAN)
            part[:] = 0
            while p + 4 <= stop:
                a = qX[indices[p]]
                b = qX[indices[p + 1]]
                c = qX[indices[p + 2]]
                g = qX[indices[p + 3]]
                for f in range(d):
                    part[f] += np.int16(a[f]) + np.int16(b[f]) + np.int16(c[f]) + np.int16(g[f])
                p += 4
            while p < stop:
                a = qX[indices[p]]
                for f in range(d):
                    part[f] += np.int16(a[f])
                p += 1
            for f in range(d):
                acc[f] += np.int32(part[f])
        _finish(acc, i, acc_out, fused, rf, has_rf, cs, out)


@njit(**_OPTS)
def _rows_valued(indptr, indices, qvals, qX, r0, r1, acc_out, fused, rf, has_rf, cs, out):
    """Rows ``[r0, r1)`` with int8 value codes: int32 sums of ``v_e * qX[j]`` (products up
    to ``127^2`` leave no room for int16), two entries at a time."""
    d = qX.shape[1]
    acc = np.zeros(d, dtype=np.int32)
    for i in range(r0, r1):
        acc[:] = 0
        p, e = indptr[i], indptr[i + 1]
        while p + 2 <= e:
            a, va = qX[indices[p]], np.int32(qvals[p])
            b, vb = qX[indices[p + 1]], np.int32(qvals[p + 1])
            for f in range(d):
                acc[f] += va * np.int32(a[f]) + vb * np.int32(b[f])
            p += 2
        if p < e:
            a, va = qX[indices[p]], np.int32(qvals[p])
            for f in range(d):
                acc[f] += va * np.int32(a[f])
        _finish(acc, i, acc_out, fused, rf, has_rf, cs, out)


@njit(**_OPTS)
def _finish(acc, i, acc_out, fused, rf, has_rf, cs, out):
    """Row ``i``: the fused dequantize ``(float(acc) * cs) * rf[i]`` into ``out``, or the
    bare integers into ``acc_out``."""
    d = acc.shape[0]
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

    if has_vals:

        def run(r0, r1):
            _rows_valued(ip, ix, qv, x, r0, r1, a, fused, rf, has_rf, cs, o)

    else:

        def run(r0, r1):
            _rows_plain(ip, ix, x, r0, r1, a, fused, rf, has_rf, cs, o)

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


@njit(boundscheck=False, nogil=True, cache=True)
def _code(v, index, stochastic, seed):
    """The int8 code of ``v = x / s`` for element ``index`` (row-major) of the tensor:
    ``floor(v + u)`` with ``u`` from the hash of ``(index, seed)``, or round half to even;
    NaN to 0, clamped to ``[-127, 127]``."""
    if stochastic:
        k = np.uint64(index) & np.uint64(0xFFFFFFFF)
        h = _lowbias32(_lowbias32(k) ^ seed)
        v = np.floor(v + np.float32(h >> np.uint64(8)) * np.float32(2.0**-24))
    else:
        v = np.rint(v)
    if v != v:
        v = np.float32(0.0)
    return np.int8(min(max(v, np.float32(-127.0)), np.float32(127.0)))


@njit(boundscheck=False, nogil=True, cache=True, parallel=True)
def _codes(x, s, stochastic, seed, q):
    rows, cols = x.shape
    sr = 1 if s.shape[0] > 1 else 0
    sc = 1 if s.shape[1] > 1 else 0
    for i in prange(rows):
        for j in range(cols):
            sv = s[i * sr, j * sc]
            v = x[i, j] / (sv if sv > 0 else np.float32(1.0))
            q[i, j] = _code(v, i * cols + j, stochastic, seed)


def quantize_codes(x, s, rounding: str, seed: int) -> torch.Tensor:
    """As :func:`dgl_rsc.quant.rounding.torch_codes` (bit-identical), in one parallel pass."""
    q = torch.empty(x.shape, dtype=torch.int8)
    if x.numel():
        _codes(x.numpy(), s.contiguous().numpy(), rounding == "stochastic",
               np.uint64(int(seed) & 0xFFFFFFFF), q.numpy())  # fmt: skip
    return q


@njit(boundscheck=False, nogil=True, cache=True, parallel=True)
def _column_amax(x, col, has_col, parts, out):
    """``out[p, j] = max |x[i, j] * col[i]|`` over the rows of part ``p`` (NaN where one is
    NaN)."""
    rows, cols = x.shape
    step = (rows + parts - 1) // parts
    for p in prange(parts):
        m = out[p]
        for i in range(p * step, min(rows, (p + 1) * step)):
            c = col[i] if has_col else np.float32(1.0)
            for j in range(cols):
                v = abs(x[i, j] * c) if has_col else abs(x[i, j])
                if v > m[j] or v != v:
                    m[j] = v


@njit(boundscheck=False, nogil=True, cache=True, parallel=True)
def _scaled_codes(x, col, has_col, s, stochastic, seed, q):
    rows, cols = x.shape
    for i in prange(rows):
        c = col[i] if has_col else np.float32(1.0)
        for j in range(cols):
            sv = s[j]
            xv = x[i, j] * c if has_col else x[i, j]
            v = xv / (sv if sv > 0 else np.float32(1.0))
            q[i, j] = _code(v, i * cols + j, stochastic, seed)


def column_amax(x, col) -> torch.Tensor:
    """``(1, C)`` fp32: ``max_i |x[i, j] * col[i]|`` (``col (R,)`` or ``None``; NaN where a
    term is NaN), in one parallel pass without the scaled copy."""
    rows, cols = x.shape
    has_col = col is not None
    c = col.contiguous().numpy() if has_col else np.ones(1, np.float32)
    parts = max(1, min(64, rows // 1024))
    amax = np.zeros((parts, cols), np.float32)
    if rows:
        _column_amax(x.numpy(), c, has_col, parts, amax)
    return torch.from_numpy(amax).amax(0, keepdim=True)  # NaN propagates, as torch's amax


def scaled_codes(x, col, s, rounding: str, seed: int) -> torch.Tensor:
    """``(R, C)`` int8: the codes of ``diag(col) x`` for the per-column scales ``s (1, C)``,
    computed from ``x`` (no scaled copy), as :func:`quantize_codes` of ``x * col[:, None]``."""
    rows, cols = x.shape
    has_col = col is not None
    c = col.contiguous().numpy() if has_col else np.ones(1, np.float32)
    q = torch.empty((rows, cols), dtype=torch.int8)
    if x.numel():
        seed64 = np.uint64(int(seed) & 0xFFFFFFFF)
        _scaled_codes(x.numpy(), c, has_col, s.reshape(-1).contiguous().numpy(),
                      rounding == "stochastic", seed64, q.numpy())  # fmt: skip
    return q


def quantize_columns(x, col, rounding: str, seed: int):
    """``(q, s)``: the codes and per-column scales of ``diag(col) x`` (``x (R, C)`` fp32,
    ``col (R,)`` or ``None``), bit-identical to :func:`dgl_rsc.int8.quantize.quantize` of
    ``x * col[:, None]`` with ``dim=0``, without materializing the scaled copy: one pass for
    the column maxima (:func:`column_amax`), one for the codes (:func:`scaled_codes`)."""
    x = x.contiguous()
    col = None if col is None else col.contiguous()
    s = bf16_scale_up(column_amax(x, col), float(QMAX))
    return scaled_codes(x, col, s, rounding, seed), s


@njit(boundscheck=False, nogil=True, cache=True, parallel=True)
def _row_amax(x, out):
    """``out[i] = max_j |x[i, j]|``, NaN where the row holds one (a select and a flag per
    element: both vectorize)."""
    rows, cols = x.shape
    for i in prange(rows):
        m = np.float32(0.0)
        nan = False
        for j in range(cols):
            a = abs(x[i, j])
            m = a if a > m else m
            nan |= a != a
        out[i] = np.float32(np.nan) if nan else m


def row_amax(x) -> torch.Tensor:
    """``(R, 1)`` fp32: ``x.abs().amax(1, keepdim=True)`` (the same values, NaN included) in
    one pass without the ``|x|`` copy."""
    out = torch.empty((x.shape[0], 1), dtype=torch.float32)
    if x.shape[0] and x.shape[1]:
        _row_amax(x.contiguous().numpy(), out.numpy().reshape(-1))
    elif x.shape[0]:
        out.zero_()
    return out


@njit(boundscheck=False, nogil=True, cache=True, parallel=True)
def _dequantize_rows(q, s, r0, out):
    for i in prange(out.shape[0]):
        f = s[r0 + i, 0]
        for j in range(q.shape[1]):
            out[i, j] = np.float32(q[r0 + i, j]) * f


def dequantize_rows(q, s, r0: int, out) -> torch.Tensor:
    """``out (r, C) = q[r0 : r0 + r] * s[r0 : r0 + r]`` in fp32 (``q (R, C)`` int8, ``s (R,
    1)``), one pass: the same values as ``q.float() * s``."""
    if out.numel():
        _dequantize_rows(q.numpy(), s.numpy(), int(r0), out.numpy())
    return out
