"""The remainder groups' entries of ``A^T`` cut in one pass, for the CPU step (Numba).

RSC's step with remainder groups multiplies the sample's slice ``A[S]^T`` plus ``K *
A[R_g]^T`` (this step's group). Cutting a group's slice by a row mask reads all of ``A^T``
(about 2 ms on quickstart's graph, as much as the product it saves), once per group and so
once per step. Here one pass counts, per row of ``A^T``, the entries of each class and a
second copies each entry to its class's place, in one of two layouts:

- :func:`group_slices`: every group's slice as a CSR of its own (group-major), for products
  on DGL's kernel, which add the sample's and the group's into one output
  (:func:`~dgl_rsc.sparse.products.csr_mm_sum`);
- :class:`GroupedSlices`: each row's entries by class (row-major, the sample's first), so
  that one Numba kernel reads a step's ``A[S ∪ R_g]^T`` in place: the CPU engine without
  DGL, where it beats two products (Numba's threads and torch's OpenMP ones contend).

Memory: one copy of the kept entries (at most ``A``'s non-zeros), plus for
:class:`GroupedSlices` an ``(N, C + 1)`` int64 offset table for ``C`` classes (``K + 1``: 88
bytes per node at ``K = 10``), held while the sample is.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from numba import njit

from .cpu_spmm import run_chunked
from .csr import CSR

__all__ = ["group_slices", "GroupedSlices"]

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


@njit(**_OPTS)
def _product_rows(off, g, cols, vals, use_v, X, cs, out, r0, r1, rs, use_rs):
    """Rows ``[r0, r1)`` of ``out[j] = rs[j] * sum_p (X[i] * cs[i]) * w[p]`` over the entries
    ``p = (j, i)`` of classes 0 and ``g`` of row ``j``; rows without such entries are set to
    zero."""
    d = X.shape[1]
    for j in range(r0, r1):
        o = out[j]
        for k in range(d):
            o[k] = 0.0
        for c in (0, g):
            for p in range(off[j, c], off[j, c + 1]):
                i = cols[p]
                a = cs[i] * vals[p] if use_v else cs[i]
                x = X[i]
                for k in range(d):
                    o[k] = o[k] + x[k] * a
        if use_rs:
            s = rs[j]
            for k in range(d):
                o[k] = o[k] * s


def _count_classes(A: CSR, classes: list, counts: np.ndarray) -> tuple:
    """``counts[j, c]`` (``(N, C)``, zeroed by the caller): entries of row ``j`` of ``A^T``
    whose column is one of ``classes[c]`` (row ids or an ``(M,)`` mask of ``A``'s rows, later
    classes over earlier ones); returns what :func:`_copy_classes` reads."""
    t_indptr, t_rows, perm = A.transposed()
    code = torch.full((A.shape[0],), -1, dtype=torch.int64)
    for c, rows in enumerate(classes):
        code[rows] = c
    ti, tc, cn = t_indptr.numpy(), t_rows.numpy(), code.numpy()
    run_chunked(ti, 0, A.shape[1], 1, lambda a, b: _count(ti, tc, cn, counts, a, b))
    return ti, tc, cn, perm


def _copy_classes(A: CSR, counted: tuple, cursor: np.ndarray, total: int) -> tuple:
    """``(cols, vals)``: the classed entries of ``A^T`` copied to their slots (``cursor[j,
    c]``: row ``j``'s first slot in class ``c``, advanced as it fills), ``total`` of them;
    ``vals`` ``None`` without values, fp16/bf16 values as float32 (exact both ways)."""
    ti, tc, cn, perm = counted
    cols = np.empty(total, dtype=tc.dtype)
    tv, vals = np.empty(1, dtype=np.float32), None
    if A.values is not None:
        v = A.values.detach()
        tv = (v.float() if v.dtype in _HALF else v)[perm].numpy()
        vals = np.empty(total, dtype=tv.dtype)
    vo = tv if vals is None else vals
    run_chunked(ti, 0, A.shape[1], 1, lambda a, b: _fill(ti, tc, tv, vals is not None, cn,
                                                         cursor, cols, vo, a, b))  # fmt: skip
    return cols, vals


def group_slices(A: CSR, groups: list) -> list:
    """``[A[R_g, :]^T for g]``: per group, an ``(N, M)`` CSR of the rows ``R_g`` of ``A (M,
    N)`` (``groups[g]``: int64 row ids, disjoint), as :func:`~dgl_rsc.sampling.draw.cut_rows`
    cuts it (column ids are ``A``'s row ids, ascending in each row; ``A``'s values in its
    dtype, or none), all from one count and one copy of ``A^T``'s entries. CPU only."""
    n, m, k = A.shape[1], A.shape[0], len(groups)
    counts = np.zeros((n, k), dtype=np.int64)
    counted = _count_classes(A, groups, counts)
    # group-major: group g's entries are one block, its rows in order within it
    indptr = np.empty((k, n + 1), dtype=np.int64)
    cursor = np.empty((n, k), dtype=np.int64)
    _group_offsets(counts, indptr, cursor)
    base = np.concatenate(([0], np.cumsum(indptr[:, -1])))
    cols, vals = _copy_classes(A, counted, cursor, int(base[-1]))
    cols_t = torch.from_numpy(cols)
    vals_t = None if vals is None else torch.from_numpy(vals).to(A.values.dtype)
    out = []
    for g in range(k):
        lo, hi = int(base[g]), int(base[g + 1])
        ptr = torch.from_numpy(indptr[g]).to(A.indices.dtype)
        v = None if vals_t is None else vals_t[lo:hi]
        out.append(CSR(ptr, cols_t[lo:hi], v, (n, m), check=False))
    return out


class GroupedSlices:
    """``A^T``'s entries of the sample's rows and of each group's, grouped per row by class.

    Args:
        A: ``(M, N)`` CPU CSR.
        sample_rows: ``(M,)`` bool, the sample's rows (class 0).
        groups: per group, ``(R_g,)`` int64 row ids of ``A`` (class ``1 + g``).
    """

    def __init__(self, A: CSR, sample_rows: torch.Tensor, groups: list):
        n = A.shape[1]
        off = np.zeros((n, len(groups) + 2), dtype=np.int64)  # counts first, then offsets
        counted = _count_classes(A, [sample_rows, *groups], off[:, 1:])
        np.cumsum(off, axis=1, out=off)
        starts = np.zeros(n, dtype=np.int64)
        np.cumsum(off[:-1, -1], out=starts[1:])
        off += starts[:, None]
        total = int(off[-1, -1]) if n else 0
        self.cols, self.vals = _copy_classes(A, counted, off[:, :-1].copy(), total)
        self.off = off  # (N, C + 1): row j's class c is off[j, c]:off[j, c + 1]
        self.starts = np.append(off[:, 0], total)  # row starts, to split the work
        self.shape = (n, A.shape[0])

    def nbytes(self) -> int:
        extra = 0 if self.vals is None else self.vals.nbytes
        return self.cols.nbytes + extra + self.off.nbytes + self.starts.nbytes

    def product(self, g: int, X: torch.Tensor, row: Optional[torch.Tensor], col: torch.Tensor,
                out: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """``out (N, D) = diag(row) A[S ∪ R_g, :]^T diag(col) X`` (``X (M, D)`` float32/64,
        ``row (N,)`` or ``None``, ``col (M,)``), straight from the grouped entries: the
        sample's and group ``g``'s of each row, nothing merged or cut. Returns ``out``."""
        dt = X.dtype
        xn, on = X.detach().contiguous().numpy(), out.numpy()
        cs = col.to(dt).contiguous().numpy()
        rs = cs if row is None else row.to(dt).contiguous().numpy()
        use_v = self.vals is not None
        vals = self.vals.astype(xn.dtype, copy=False) if use_v else cs

        def run(a, b):
            _product_rows(self.off, 1 + g, self.cols, vals, use_v, xn, cs, on, a, b, rs,
                          row is not None)  # fmt: skip

        run_chunked(self.starts, 0, self.shape[0], max(X.shape[1], 1), run)
        return out
