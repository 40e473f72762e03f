"""CPU sparse-dense product kernels (Numba), the exact engine of every CPU product.

``spmm_rows`` computes rows ``[r0, r1)`` of

    out[i] = rs(i) * sum_{p in row i} (X[indices[p]] * cs[indices[p]]) * w[p]

with ``rs`` an optional per-row scale (multiply, or divide for mean aggregation), ``cs`` an
optional per-column scale and ``w`` optional values. Each row's entries are summed in stored
order, the width ``D`` in SIMD lanes. The kernels are serial and release the GIL; rows are
split into as many chunks of equal non-zeros as torch uses threads, run on a small pool of
Python threads. (Numba's own OpenMP ``prange`` was measured to lose up to 8 ms per call on
this machine: its OpenMP runtime and torch's spin against each other for the cores.)

The arithmetic is the one DGL's message passing performs (the column scale is applied to the
source features first, the edge weight next, the sum in stored order, the row scale last, no
fused multiply-add), so for the same CSR the result is bit-identical to ``update_all(copy_u /
u_mul_e, sum)`` followed by DGL's elementwise normalizations.

Measured on the 2-core development machine against DGL 2.1's kernel (``docs/benchmarks.md``):
the plain sum runs within a few percent of DGL's libxsmm kernel and 1.3-2x faster than
``torch.sparse.mm`` (MKL). The kernels compile on first use (a few seconds per index and
value dtype) and are cached on disk by Numba.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from numba import njit

__all__ = ["spmm_rows", "NUMBA_DTYPES", "PARALLEL_MIN_WORK"]

#: products with fewer ``nnz * D`` multiply-adds than this run in the calling thread
PARALLEL_MIN_WORK = 1 << 18

#: dtypes the kernels take directly; others are computed in float32 by the caller
NUMBA_DTYPES = (torch.float32, torch.float64)

_OPTS = dict(boundscheck=False, nogil=True, cache=True)


@njit(**_OPTS)
def _sum_rows(indptr, indices, X, out, r0, r1, o0, rs, row_mode):
    """Unweighted, unscaled columns: ``out[i - o0] = rs(i) * sum X[indices[p]]`` for rows
    ``[r0, r1)``.

    ``row_mode``: 0 none, 1 multiply by ``rs[i]``, 2 divide by ``rs[i]``.
    """
    d = X.shape[1]
    for i in range(r0, r1):
        o = out[i - o0]
        p = indptr[i]
        e = indptr[i + 1]
        for k in range(d):
            o[k] = 0.0
        while p + 4 <= e:
            a = X[indices[p]]
            b = X[indices[p + 1]]
            c = X[indices[p + 2]]
            f = X[indices[p + 3]]
            for k in range(d):
                o[k] = o[k] + a[k] + b[k] + c[k] + f[k]
            p += 4
        while p < e:
            x = X[indices[p]]
            for k in range(d):
                o[k] += x[k]
            p += 1
        if row_mode == 1:
            s = rs[i]
            for k in range(d):
                o[k] = o[k] * s
        elif row_mode == 2:
            s = rs[i]
            for k in range(d):
                o[k] = o[k] / s


@njit(**_OPTS)
def _general_rows(indptr, indices, w, use_w, X, cs, use_cs, out, r0, r1, o0, rs, row_mode):
    """Weighted and/or column-scaled: ``out[i - o0] = rs(i) * sum (X[j] * cs[j]) * w[p]``."""
    d = X.shape[1]
    for i in range(r0, r1):
        o = out[i - o0]
        for k in range(d):
            o[k] = 0.0
        for p in range(indptr[i], indptr[i + 1]):
            j = indices[p]
            x = X[j]
            if use_cs and use_w:
                c = cs[j]
                v = w[p]
                for k in range(d):
                    o[k] += (x[k] * c) * v
            elif use_cs:
                c = cs[j]
                for k in range(d):
                    o[k] += x[k] * c
            else:
                v = w[p]
                for k in range(d):
                    o[k] += x[k] * v
        if row_mode == 1:
            s = rs[i]
            for k in range(d):
                o[k] = o[k] * s
        elif row_mode == 2:
            s = rs[i]
            for k in range(d):
                o[k] = o[k] / s


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


class _Pool:
    """The worker threads of the CPU products (created on first use, resized to torch's
    thread count). They run Numba kernels that release the GIL."""

    def __init__(self):
        self._lock = threading.Lock()
        self._executor = None
        self._size = 0

    def get(self, size: int) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None or self._size != size:
                if self._executor is not None:
                    self._executor.shutdown(wait=False)
                self._executor = ThreadPoolExecutor(size, thread_name_prefix="dgl-rsc-spmm")
                self._size = size
            return self._executor


_POOL = _Pool()  # a cache of OS threads, like torch's own intra-op pool


def _chunks(indptr: np.ndarray, r0: int, r1: int, parts: int) -> list:
    """``parts`` row ranges of ``[r0, r1)`` holding about equal numbers of non-zeros."""
    lo, hi = indptr[r0], indptr[r1]
    cuts = np.searchsorted(indptr[r0 : r1 + 1], np.linspace(lo, hi, parts + 1)) + r0
    cuts = np.clip(cuts, r0, r1)
    cuts[0], cuts[-1] = r0, r1
    return [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


def spmm_rows(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    values,
    X: torch.Tensor,
    out: torch.Tensor,
    r0: int = 0,
    r1=None,
    row_scale=None,
    row_divide: bool = False,
    col_scale=None,
) -> torch.Tensor:
    """Rows ``[r0, r1)`` of ``diag(rs) A diag(cs) X`` into ``out (r1 - r0, D)``.

    Args:
        indptr: ``(M+1,)`` int32/int64 CPU row pointers; indices ``(nnz,)`` same dtype.
        values: ``(nnz,)`` in ``X``'s dtype, or ``None`` (all ones).
        X: ``(N, D)`` contiguous float32/float64 CPU tensor.
        out: ``(r1 - r0, D)`` contiguous tensor of ``X``'s dtype, overwritten.
        row_scale: ``(M,)`` in ``X``'s dtype or ``None``; ``row_divide`` divides by it.
        col_scale: ``(N,)`` in ``X``'s dtype or ``None``.

    Returns:
        ``out``.
    """
    r1 = indptr.numel() - 1 if r1 is None else int(r1)
    r0 = int(r0)
    if r1 <= r0:
        return out
    dummy = out.new_empty(1)
    rs = _np(dummy if row_scale is None else row_scale)
    mode = 0 if row_scale is None else (2 if row_divide else 1)
    ip, ix, xn, on = _np(indptr), _np(indices), _np(X), _np(out)
    if values is None and col_scale is None:

        def run(a, b):
            _sum_rows(ip, ix, xn, on, a, b, r0, rs, mode)

    else:
        w = _np(dummy if values is None else values)
        cs = _np(dummy if col_scale is None else col_scale)

        def run(a, b):
            _general_rows(ip, ix, w, values is not None, xn, cs, col_scale is not None, on, a,
                          b, r0, rs, mode)  # fmt: skip

    threads = torch.get_num_threads()
    work = (int(ip[r1]) - int(ip[r0])) * max(X.shape[1], 1)
    if threads <= 1 or work < PARALLEL_MIN_WORK:
        run(r0, r1)
        return out
    first, *rest = _chunks(ip, r0, r1, threads)
    futures = [_POOL.get(threads - 1).submit(run, a, b) for a, b in rest]
    run(*first)
    for f in futures:
        f.result()
    return out
