"""CPU sparse-dense product kernels (Numba), the exact engine of every CPU product.

``spmm_rows`` computes rows ``[r0, r1)`` of

    out[i] = rs(i) * sum_{p in row i} (X[indices[p]] * cs[indices[p]]) * w[p]

with ``rs`` an optional per-row scale (multiply, or divide for mean aggregation), ``cs`` an
optional per-column scale and ``w`` optional values. Rows are processed in parallel (one
row per iteration of a ``prange``), each row's entries in stored order, the width ``D`` in
SIMD lanes. The arithmetic is the one DGL's message passing performs (the column scale is
applied to the source features first, the edge weight next, the sum in stored order, the row
scale last, no fused multiply-add), so for the same CSR the result is bit-identical to
``update_all(copy_u / u_mul_e, sum)`` followed by DGL's elementwise normalizations.

Measured on the 2-core development machine against DGL 2.1's kernel (``docs/benchmarks.md``):
the plain sum runs within a few percent of DGL's libxsmm kernel and 1.3-2x faster than
``torch.sparse.mm`` (MKL). The kernels compile on first use (a few seconds per index and
value dtype) and are cached on disk by Numba.
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from numba import njit, prange

__all__ = ["spmm_rows", "NUMBA_DTYPES"]

#: dtypes the kernels take directly; others are computed in float32 by the caller
NUMBA_DTYPES = (torch.float32, torch.float64)

_OPTS = dict(parallel=True, boundscheck=False, nogil=True, cache=True)


@njit(**_OPTS)
def _sum_rows(indptr, indices, X, out, r0, r1, rs, row_mode):
    """Unweighted, unscaled columns: ``out[i - r0] = rs(i) * sum X[indices[p]]``.

    ``row_mode``: 0 none, 1 multiply by ``rs[i]``, 2 divide by ``rs[i]``.
    """
    d = X.shape[1]
    for i in prange(r0, r1):
        o = out[i - r0]
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
def _general_rows(indptr, indices, w, use_w, X, cs, use_cs, out, r0, r1, rs, row_mode):
    """Weighted and/or column-scaled: ``out[i - r0] = rs(i) * sum (X[j] * cs[j]) * w[p]``."""
    d = X.shape[1]
    for i in prange(r0, r1):
        o = out[i - r0]
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


class _Threads:
    """Run Numba's parallel loops on as many threads as torch uses, restoring Numba's count."""

    def __enter__(self):
        self.before = numba.get_num_threads()
        want = max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
        if want != self.before:
            numba.set_num_threads(want)
        return self

    def __exit__(self, *exc):
        if numba.get_num_threads() != self.before:
            numba.set_num_threads(self.before)


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
    if r1 <= r0:
        return out
    dummy = out.new_empty(1)
    rs = _np(dummy if row_scale is None else row_scale)
    mode = 0 if row_scale is None else (2 if row_divide else 1)
    args = (_np(indptr), _np(indices))
    with _Threads():
        if values is None and col_scale is None:
            _sum_rows(*args, _np(X), _np(out), int(r0), r1, rs, mode)
        else:
            w = _np(dummy if values is None else values)
            cs = _np(dummy if col_scale is None else col_scale)
            _general_rows(*args, w, values is not None, _np(X), cs, col_scale is not None,
                          _np(out), int(r0), r1, rs, mode)  # fmt: skip
    return out
