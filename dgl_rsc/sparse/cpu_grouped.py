"""The transposed matrix's entries ordered by row class, and a step's product read from them (CPU).

RSC's step with remainder groups multiplies ``A[S]^T`` (the sample) plus ``K * A[R_g]^T``
(this step's group). Cutting a group's slice at each step, writing its product and adding the
sample's into it are three passes over memory; on the CPU each costs about what the product
does (``docs/benchmarks.md``, *The CPU step in context*). Here one pass at the refresh sorts
the entries of ``A^T`` of every row by class (class 0 the sample's rows, class ``1 + g`` group
``g``'s, the other rows dropped), so that a step's matrix ``A[S ∪ R_g]^T`` is two contiguous
segments per row, which the product reads in place (:meth:`GroupedSlices.product`: one
output written, nothing cut per step); the factor ``K`` on the group's rows is a scale of
``dY``'s rows.

Memory: one copy of the kept entries (the sample's and the groups', at most ``A``'s non-zeros)
and an ``(N, C + 1)`` int64 offset table for ``C`` classes (``K + 1``: 88 bytes per node at
``K = 10``), held while the sample is.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from numba import njit

from .cpu_spmm import run_chunked
from .csr import CSR

__all__ = ["GroupedSlices"]

_OPTS = dict(boundscheck=False, nogil=True, cache=True)


@njit(**_OPTS)
def _count(t_indptr, t_cols, code, counts, r0, r1):
    """``counts[j, c]`` for rows ``[r0, r1)``: entries of row ``j`` of ``A^T`` whose column (a
    row of ``A``) has class ``c`` (``code`` < 0: none)."""
    for j in range(r0, r1):
        for p in range(t_indptr[j], t_indptr[j + 1]):
            c = code[t_cols[p]]
            if c >= 0:
                counts[j, c] += 1


@njit(**_OPTS)
def _fill(t_indptr, t_cols, t_vals, use_v, code, cursor, cols, vals, r0, r1):
    """Copy each kept entry of rows ``[r0, r1)`` to its row's class segment (``cursor[j, c]``:
    the next slot)."""
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


class GroupedSlices:
    """``A^T``'s entries of the sample's rows and of each group's, grouped per row by class.

    Args:
        A: ``(M, N)`` CPU CSR.
        sample_rows: ``(M,)`` bool, the sample's rows (class 0).
        groups: per group, ``(R_g,)`` int64 row ids of ``A`` (class ``1 + g``).
    """

    def __init__(self, A: CSR, sample_rows: torch.Tensor, groups: list):
        t_indptr, t_rows, perm = A.transposed()
        code = torch.full((A.shape[0],), -1, dtype=torch.int64)
        code[sample_rows] = 0
        for g, rows in enumerate(groups):
            code[rows] = 1 + g
        classes = 1 + len(groups)
        n = A.shape[1]
        ti, tc = t_indptr.numpy(), t_rows.numpy()
        off = np.zeros((n, classes + 1), dtype=np.int64)  # counts first, then offsets
        counts = off[:, 1:]
        cn = code.numpy()
        run_chunked(ti, 0, n, 1, lambda a, b: _count(ti, tc, cn, counts, a, b))
        np.cumsum(off, axis=1, out=off)
        starts = np.zeros(n, dtype=np.int64)
        np.cumsum(off[:-1, -1], out=starts[1:])
        off += starts[:, None]
        total = int(off[-1, -1]) if n else 0
        values = A.values
        self.cols = np.empty(total, dtype=tc.dtype)
        self.vals = None
        tv = np.empty(1, dtype=np.float32)
        if values is not None:
            vals = values.detach()
            vals = vals.float() if vals.dtype in (torch.float16, torch.bfloat16) else vals
            tv = vals[perm].numpy()
            self.vals = np.empty(total, dtype=tv.dtype)
        cursor = off[:, :-1].copy()
        vo = tv if self.vals is None else self.vals
        run_chunked(ti, 0, n, 1, lambda a, b: _fill(ti, tc, tv, values is not None, cn, cursor,
                                                    self.cols, vo, a, b))  # fmt: skip
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
