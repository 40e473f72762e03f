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

from typing import Optional

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


def _split(indptr: torch.Tensor, cols: torch.Tensor, values: Optional[torch.Tensor],
           code: torch.Tensor, k: int, shape: tuple) -> list:  # fmt: skip
    """Per class ``c < k``: the ``shape`` CSR of the entries of the CSR ``(indptr, cols,
    values)`` whose column's ``code`` is ``c`` (``code < 0``: in none), group-major, one count
    and one copy; fp16/bf16 values copied as float32 (exact both ways)."""
    n = shape[0]
    ti, tc, cn = indptr.numpy(), cols.numpy(), code.numpy()
    counts = np.zeros((n, k), dtype=np.int64)
    run_chunked(ti, 0, n, 1, lambda a, b: _count(ti, tc, cn, counts, a, b))
    ptrs = np.empty((k, n + 1), dtype=np.int64)
    cursor = np.empty((n, k), dtype=np.int64)
    _group_offsets(counts, ptrs, cursor)
    base = np.concatenate(([0], np.cumsum(ptrs[:, -1])))
    out_cols = np.empty(int(base[-1]), dtype=tc.dtype)
    tv, out_vals = np.empty(1, dtype=np.float32), None
    if values is not None:
        v = values.detach()
        tv = (v.float() if v.dtype in _HALF else v).contiguous().numpy()
        out_vals = np.empty(int(base[-1]), dtype=tv.dtype)
    vo = tv if out_vals is None else out_vals
    run_chunked(ti, 0, n, 1, lambda a, b: _fill(ti, tc, tv, out_vals is not None, cn, cursor,
                                                out_cols, vo, a, b))  # fmt: skip
    cols_t = torch.from_numpy(out_cols)
    vals_t = None if out_vals is None else torch.from_numpy(out_vals).to(values.dtype)
    out = []
    for c in range(k):
        lo, hi = int(base[c]), int(base[c + 1])
        ptr = torch.from_numpy(ptrs[c]).to(cols.dtype)
        out.append(CSR(ptr, cols_t[lo:hi], None if vals_t is None else vals_t[lo:hi], shape,
                       check=False))  # fmt: skip
    return out


def group_slices(A: CSR, groups) -> list:
    """``[A[R_c, :]^T for c]``: per class, an ``(N, M)`` CSR of the rows ``R_c`` of ``A (M,
    N)``, as :func:`~dgl_rsc.sampling.draw.cut_rows` cuts it (column ids are ``A``'s row ids,
    ascending in each row; ``A``'s values in its dtype, or none), all from one count and one
    copy of ``A^T``'s entries. ``groups``: a list of disjoint int64 row-id tensors, or an
    ``(M,)`` int64 label per row (``-1``: in none; classes ``0..max``). CPU only."""
    if isinstance(groups, torch.Tensor):
        code, k = groups.long(), int(groups.max()) + 1 if groups.numel() else 0
    else:
        code, k = torch.full((A.shape[0],), -1, dtype=torch.int64), len(groups)
        for c, rows in enumerate(groups):
            code[rows] = c
    t_indptr, t_rows, perm = A.transposed()
    values = None if A.values is None else A.values.detach()[perm]
    return _split(t_indptr, t_rows, values, code, k, (A.shape[1], A.shape[0]))
