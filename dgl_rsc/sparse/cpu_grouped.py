"""The remainder partition's slices cut in one pass (Numba).

RSC's step with remainder groups multiplies the sample's slice ``A[S]^T`` and one group's
slice ``A[P_g]^T`` of a fixed partition of ``A``'s rows (see
:mod:`dgl_rsc.sampling.remainder`). Cutting each group by a row mask reads the whole of
``A^T`` once per group. Here one pass counts, per row of ``A^T``, the entries of each group
and a second copies each entry to its group's place, group-major (group ``c``'s entries one
block, its rows in order within it): :func:`group_slices`, once per matrix.

Memory: one copy of the grouped entries, and an ``(N, C)`` int64 count table while cutting.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from .cpu_spmm import run_chunked
from .csr import CSR

__all__ = ["group_slices"]

_OPTS = dict(boundscheck=False, nogil=True, cache=True)
_HALF = (torch.float16, torch.bfloat16)


@njit(**_OPTS)
def _count(t_indptr, t_cols, code, counts, r0, r1):
    """``counts[j, c]`` for rows ``[r0, r1)``: entries of row ``j`` of ``A^T`` whose column (a
    row of ``A``) is in group ``c`` (``code`` < 0: in none)."""
    for j in range(r0, r1):
        for p in range(t_indptr[j], t_indptr[j + 1]):
            c = code[t_cols[p]]
            if c >= 0:
                counts[j, c] += 1


@njit(**_OPTS)
def _fill(t_indptr, t_cols, t_vals, use_v, code, cursor, cols, vals, r0, r1):
    """Copy each grouped entry of rows ``[r0, r1)`` to its slot (``cursor[j, c]``: the next
    slot of row ``j`` in group ``c``'s part of ``cols``)."""
    for j in range(r0, r1):
        for p in range(t_indptr[j], t_indptr[j + 1]):
            c = code[t_cols[p]]
            if c >= 0:
                q = cursor[j, c]
                cols[q] = t_cols[p]
                if use_v:
                    vals[q] = t_vals[p]
                cursor[j, c] = q + 1


@njit(**_OPTS)
def _group_offsets(counts, indptr, cursor):
    """From ``counts (N, K)`` (entries of row ``j`` in group ``c``): ``indptr[c]``, group
    ``c``'s CSR row pointers ``(N + 1,)``, and ``cursor[j, c]``, the slot of row ``j``'s first
    entry of group ``c`` in the group-major copy (group ``c`` after groups ``0..c-1``)."""
    n, k = counts.shape
    base = 0
    for c in range(k):
        run = 0
        indptr[c, 0] = 0
        for j in range(n):
            cursor[j, c] = base + run
            run += counts[j, c]
            indptr[c, j + 1] = run
        base += run


def group_slices(A: CSR, labels: torch.Tensor, k: int) -> list:
    """``[A[P_c, :]^T for c < k]``: per group, an ``(N, M)`` CSR of the rows ``P_c`` of ``A
    (M, N)`` whose ``labels (M,)`` (int64) is ``c`` (``< 0``: in no group), as
    :func:`~dgl_rsc.sampling.draw.cut_rows` cuts it (column ids are ``A``'s row ids, ascending
    in each row; ``A``'s values in its dtype, or none), all from one count and one copy of
    ``A^T``'s entries, group-major. fp16/bf16 values are copied as float32 (exact both ways).
    CPU only."""
    n, m = A.shape[1], A.shape[0]
    t_indptr, t_rows, perm = A.transposed()
    ti, tc, cn = t_indptr.numpy(), t_rows.numpy(), labels.long().numpy()
    counts = np.zeros((n, k), dtype=np.int64)
    run_chunked(ti, 0, n, 1, lambda a, b: _count(ti, tc, cn, counts, a, b))
    ptrs = np.empty((k, n + 1), dtype=np.int64)
    cursor = np.empty((n, k), dtype=np.int64)
    _group_offsets(counts, ptrs, cursor)
    base = np.concatenate(([0], np.cumsum(ptrs[:, -1])))
    out_cols = np.empty(int(base[-1]), dtype=tc.dtype)
    tv, out_vals = np.empty(1, dtype=np.float32), None
    if A.values is not None:
        v = A.values.detach()
        tv = (v.float() if v.dtype in _HALF else v)[perm].contiguous().numpy()
        out_vals = np.empty(int(base[-1]), dtype=tv.dtype)
    vo = tv if out_vals is None else out_vals
    run_chunked(ti, 0, n, 1, lambda a, b: _fill(ti, tc, tv, out_vals is not None, cn, cursor,
                                                out_cols, vo, a, b))  # fmt: skip
    cols_t = torch.from_numpy(out_cols)
    vals_t = None if out_vals is None else torch.from_numpy(out_vals).to(A.values.dtype)
    out = []
    for c in range(k):
        lo, hi = int(base[c]), int(base[c + 1])
        ptr = torch.from_numpy(ptrs[c]).to(A.indices.dtype)
        out.append(CSR(ptr, cols_t[lo:hi], None if vals_t is None else vals_t[lo:hi], (n, m),
                       check=False))  # fmt: skip
    return out
