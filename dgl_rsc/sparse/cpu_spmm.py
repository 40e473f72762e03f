"""CPU sparse-dense product kernels (Numba), the exact engine of every CPU product.

``spmm_rows`` computes rows ``[r0, r1)`` of

    out[i] = rs(i) * sum_{p in row i} (X[indices[p]] * cs[indices[p]]) * w[p]

with ``rs`` an optional per-row scale (multiply, or divide for mean aggregation), ``cs`` an
optional per-column scale and ``w`` optional values. Each row's entries are summed in stored
order, the width ``D`` in SIMD lanes. The kernels are serial and release the GIL; rows are
split into ranges of equal non-zeros that the calling thread and a small pool of Python
threads claim one at a time (:func:`run_chunked`). (Numba's own OpenMP ``prange`` was
measured to lose up to 8 ms per call on this machine: its OpenMP runtime and torch's spin
against each other for the cores. Torch's OpenMP threads still spin for a while after each of
its parallel operations; claiming ranges lets the calling thread do all the work when a pool
thread cannot get a core in time, instead of waiting for it.)

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

__all__ = [
    "spmm_rows",
    "spmm_add",
    "coo_rows",
    "run_chunked",
    "run_ranges",
    "NUMBA_DTYPES",
    "PARALLEL_MIN_WORK",
]

#: products with fewer ``nnz * D`` multiply-adds than this run in the calling thread
PARALLEL_MIN_WORK = 1 << 18

#: row ranges per thread that the threads of a parallel product claim one at a time
CHUNKS_PER_THREAD = 8

#: dtypes the kernels take directly; others are computed in float32 by the caller
NUMBA_DTYPES = (torch.float32, torch.float64)

_OPTS = dict(boundscheck=False, nogil=True, cache=True)


@njit(**_OPTS)
def _row_start(indptr, out, i, o0, add):
    """``(o, p, e)``: row ``i``'s output row ``out[i - o0]``, zeroed unless ``add`` (the
    terms are then added to what it holds), and its entries ``[p, e)``."""
    o = out[i - o0]
    if not add:
        for k in range(o.shape[0]):
            o[k] = 0.0
    return o, indptr[i], indptr[i + 1]


@njit(**_OPTS)
def _sum_rows(indptr, indices, X, out, r0, r1, o0, rs, row_mode, skip_empty, add):
    """Unweighted, unscaled columns: ``out[i - o0] = rs(i) * sum X[indices[p]]`` for rows
    ``[r0, r1)``.

    ``row_mode``: 0 none, 1 multiply by ``rs[i]``, 2 divide by ``rs[i]``. ``skip_empty``:
    rows without entries are left as they are (the caller knows they hold zeros). ``add``:
    the terms are added to what the row holds, in stored order (``row_mode`` 0).
    """
    d = X.shape[1]
    for i in range(r0, r1):
        if skip_empty and indptr[i] == indptr[i + 1]:
            continue
        o, p, e = _row_start(indptr, out, i, o0, add)
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
        _finish_row(o, rs, i, row_mode)


@njit(**_OPTS)
def _finish_row(o, rs, i, row_mode):
    if row_mode == 1:
        s = rs[i]
        for k in range(o.shape[0]):
            o[k] = o[k] * s
    elif row_mode == 2:
        s = rs[i]
        for k in range(o.shape[0]):
            o[k] = o[k] / s


@njit(**_OPTS)
def _general_rows(indptr, indices, w, use_w, X, cs, use_cs, out, r0, r1, o0, rs, row_mode,
                  skip_empty, add):  # fmt: skip
    """Weighted and/or column-scaled: ``out[i - o0] = rs(i) * sum (X[j] * cs[j]) * w[p]``
    (each term rounded as DGL rounds it: the scaled feature first, then the weight), four
    entries per pass, added in stored order."""
    d = X.shape[1]
    for i in range(r0, r1):
        if skip_empty and indptr[i] == indptr[i + 1]:
            continue
        o, p, e = _row_start(indptr, out, i, o0, add)
        if use_cs and use_w:
            while p + 4 <= e:
                a, b, c, f = X[indices[p]], X[indices[p + 1]], X[indices[p + 2]], X[indices[p + 3]]
                ca, cb = cs[indices[p]], cs[indices[p + 1]]
                cc, cf = cs[indices[p + 2]], cs[indices[p + 3]]
                wa, wb, wc, wf = w[p], w[p + 1], w[p + 2], w[p + 3]
                for k in range(d):
                    o[k] = (
                        o[k]
                        + (a[k] * ca) * wa
                        + (b[k] * cb) * wb
                        + (c[k] * cc) * wc
                        + (f[k] * cf) * wf
                    )
                p += 4
            while p < e:
                x, cx, wx = X[indices[p]], cs[indices[p]], w[p]
                for k in range(d):
                    o[k] = o[k] + (x[k] * cx) * wx
                p += 1
        elif use_cs:
            while p + 4 <= e:
                a, b, c, f = X[indices[p]], X[indices[p + 1]], X[indices[p + 2]], X[indices[p + 3]]
                ca, cb = cs[indices[p]], cs[indices[p + 1]]
                cc, cf = cs[indices[p + 2]], cs[indices[p + 3]]
                for k in range(d):
                    o[k] = o[k] + a[k] * ca + b[k] * cb + c[k] * cc + f[k] * cf
                p += 4
            while p < e:
                x, cx = X[indices[p]], cs[indices[p]]
                for k in range(d):
                    o[k] = o[k] + x[k] * cx
                p += 1
        else:
            while p + 4 <= e:
                a, b, c, f = X[indices[p]], X[indices[p + 1]], X[indices[p + 2]], X[indices[p + 3]]
                wa, wb, wc, wf = w[p], w[p + 1], w[p + 2], w[p + 3]
                for k in range(d):
                    o[k] = o[k] + a[k] * wa + b[k] * wb + c[k] * wc + f[k] * wf
                p += 4
            while p < e:
                x, wx = X[indices[p]], w[p]
                for k in range(d):
                    o[k] = o[k] + x[k] * wx
                p += 1
        _finish_row(o, rs, i, row_mode)


@njit(**_OPTS)
def _coo_add(rows, cols, w, X, out):
    """``out[rows[e]] += X[cols[e]] * w[e]`` for every entry ``e`` in order (each term rounded
    in ``X``'s dtype before the add, as ``index_add_`` of the scaled gathered rows adds)."""
    d = X.shape[1]
    for e in range(rows.shape[0]):
        o = out[rows[e]]
        x = X[cols[e]]
        we = w[e]
        for k in range(d):
            o[k] = o[k] + x[k] * we


def coo_rows(rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor,
             X: torch.Tensor, out: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """``out[rows[e]] += values[e] * X[cols[e]]`` for every entry, in entry order, in the
    calling thread (for the few thousand entries of a probe: no gathered copy of ``X``).

    Args:
        rows, cols: ``(E,)`` int64 CPU; values: ``(E,)`` in ``X``'s dtype.
        X: ``(N, D)`` contiguous float32/float64 CPU; out: ``(R, D)`` contiguous, same dtype.

    Returns:
        ``out``, the same bits as ``out.index_add_(0, rows, X[cols] * values[:, None])``.
    """
    _coo_add(_np(rows), _np(cols), _np(values), _np(X), _np(out))
    return out


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
    skip_empty: bool = False,
    add: bool = False,
) -> torch.Tensor:
    """Rows ``[r0, r1)`` of ``diag(rs) A diag(cs) X`` into ``out (r1 - r0, D)``.

    Args:
        indptr: ``(M+1,)`` int32/int64 CPU row pointers; indices ``(nnz,)`` same dtype.
        values: ``(nnz,)`` in ``X``'s dtype, or ``None`` (all ones).
        X: ``(N, D)`` contiguous float32/float64 CPU tensor.
        out: ``(r1 - r0, D)`` contiguous tensor of ``X``'s dtype, overwritten.
        row_scale: ``(M,)`` in ``X``'s dtype or ``None``; ``row_divide`` divides by it.
        col_scale: ``(N,)`` in ``X``'s dtype or ``None``.
        skip_empty: leave the rows of ``out`` whose row of ``A`` is empty untouched (they
            already hold zeros); otherwise they are set to zero.
        add: ``out += A diag(cs) X`` instead: each entry's term added to ``out``'s row in
            stored order, as DGL's kernel adds (rows without entries untouched; no
            ``row_scale``), so products of several matrices into one zeroed ``out`` are the
            product of their sum.

    Returns:
        ``out``.
    """
    r1 = indptr.numel() - 1 if r1 is None else int(r1)
    r0 = int(r0)
    if add and row_scale is not None:
        raise ValueError("spmm_rows adds unscaled rows: apply row_scale after the sum.")
    skip_empty = skip_empty or add
    if r1 <= r0:
        return out
    dummy = out.new_empty(1)
    rs = _np(dummy if row_scale is None else row_scale)
    mode = 0 if row_scale is None else (2 if row_divide else 1)
    ip, ix, xn, on = _np(indptr), _np(indices), _np(X), _np(out)
    if values is None and col_scale is None:

        def run(a, b):
            _sum_rows(ip, ix, xn, on, a, b, r0, rs, mode, skip_empty, add)

    else:
        w = _np(dummy if values is None else values)
        cs = _np(dummy if col_scale is None else col_scale)

        def run(a, b):
            _general_rows(ip, ix, w, values is not None, xn, cs, col_scale is not None, on, a,
                          b, r0, rs, mode, skip_empty, add)  # fmt: skip

    run_chunked(ip, r0, r1, max(X.shape[1], 1), run)
    return out


def spmm_add(structure, values, X: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out (M, D) += A X`` for a structure with ``indptr``/``indices`` (``values``, ``X``
    and ``out`` as in :func:`spmm_rows`): each entry's term added to ``out``'s row in stored
    order, as DGL's kernel adds (:func:`dgl_rsc.dgl.kernels.spmm_add`)."""
    return spmm_rows(structure.indptr, structure.indices, values, X, out, add=True)


def run_chunked(indptr: np.ndarray, r0: int, r1: int, width: int, run) -> None:
    """``run(a, b)`` over row ranges of ``[r0, r1)``, in parallel over torch's thread count;
    in the calling thread alone when ``nnz * width`` is below :data:`PARALLEL_MIN_WORK`.

    The rows are cut into :data:`CHUNKS_PER_THREAD` ranges per thread of equal non-zeros,
    which the calling thread and the pool's workers claim one at a time. A worker that
    starts late (its core still held by another runtime's spinning OpenMP thread, such as
    torch's after each of its parallel operations) finds fewer ranges left, or none, and
    the call returns as soon as every range is done: it never waits for a worker that has
    not started. ``run`` must release the GIL (a ``nogil`` Numba kernel) for the ranges to
    run in parallel.
    """
    threads = torch.get_num_threads()
    work = (int(indptr[r1]) - int(indptr[r0])) * width
    if threads <= 1 or work < PARALLEL_MIN_WORK:
        run(r0, r1)
        return
    parts = max(1, min(threads * CHUNKS_PER_THREAD, work // (PARALLEL_MIN_WORK // 4)))
    run_ranges(_chunks(indptr, r0, r1, parts), run, threads)


def run_ranges(ranges: list, run, threads: int) -> None:
    """``run(*r)`` for every tuple ``r`` of ``ranges`` (row ranges ``(a, b)``, or with a part
    number first), claimed one at a time by the calling thread and ``threads - 1`` pool
    workers (see :func:`run_chunked`); returns when all are done and re-raises a worker's
    error."""
    claim = _Claims(ranges, run)
    if threads > 1:
        executor = _POOL.get(threads - 1)
        for _ in range(threads - 1):
            executor.submit(claim.work)
    claim.work()
    claim.wait()


class _Claims:
    """Row ranges handed out one at a time to the threads of one :func:`run_chunked` call."""

    def __init__(self, ranges: list, run):
        self.ranges, self.run = ranges, run
        self.next = 0
        self.done = 0
        self.error = None
        self.cond = threading.Condition()

    def work(self) -> None:
        while True:
            with self.cond:
                i = self.next
                if i >= len(self.ranges) or self.error is not None:
                    return
                self.next = i + 1
            try:
                self.run(*self.ranges[i])
            except BaseException as exc:  # handed to the calling thread by wait()
                with self.cond:
                    self.error = exc
            with self.cond:
                self.done += 1
                self.cond.notify_all()

    def wait(self) -> None:
        """Until every claimed range is done (ranges nobody claimed after an error count as
        done); re-raise a worker's error in the calling thread."""
        with self.cond:
            self.cond.wait_for(lambda: self.done == self.next)
            if self.error is not None:
                raise self.error
