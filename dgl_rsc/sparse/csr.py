"""``CSR``: the DGL-free sparse matrix that every dgl_rsc operator takes.

A ``CSR`` holds ``A`` of shape ``(M, N)`` as ``indptr (M+1,)``, ``indices (nnz,)`` (column ids)
and optional ``values (nnz,)`` (``None`` means all ones). Structure-derived data (row lengths,
the transposed structure) is computed once per structure and shared by every ``CSR`` made
from it with :meth:`CSR.with_values`, so a graph that is reused across training steps pays
for its transpose once.
"""

from __future__ import annotations

import itertools
from typing import Optional, Sequence

import torch

from ..backends import spmm_cupy
from .csr_checks import check_csr, check_csr_data, check_shape

__all__ = ["CSR", "check_csr", "check_csr_data", "check_shape", "StaleStructureError"]

_TOKENS = itertools.count(1)


class StaleStructureError(RuntimeError):
    """The index tensors of a cached sparse structure were modified in place."""


class _Structure:
    """Index tensors of one sparsity pattern plus what is derived from them, lazily.

    Structures are immutable: what is derived (row lengths, the transpose, cached samples)
    is only valid for the index tensors as they were. An in-place change of ``indptr`` or
    ``indices`` is detected through their version counters and raises
    :class:`StaleStructureError` on the next use.
    """

    def __init__(self, indptr, indices, shape):
        self.indptr = indptr
        self.indices = indices
        self.shape = shape
        self.token = next(_TOKENS)
        self._versions = (indptr._version, indices._version)
        self._row_nnz = None
        self._transposed = None
        self._t_structure = None
        self._ones = {}
        self._pool = None
        self._plan = None
        self._diag = None
        self.t_values = None  # (values, their version, values in A^T's order): the last gather
        # (structure_c, cols), or (None,) where not worth it: sparse/compact.py's compacted()
        self._compact = None

    def diagonal(self):
        """``(mask (nnz,) bool, per_row (M,) int64, t_mask (nnz,) bool)`` of the diagonal
        entries (row id == column id), in ``A``'s and in ``A^T``'s entry order; ``None`` when
        the matrix stores none. Computed once."""
        if self._diag is None:
            mask = self.row_ids() == self.indices.long()
            if not bool(mask.any()):
                self._diag = (None,)
            else:
                per_row = torch.zeros(self.shape[0], dtype=torch.long, device=mask.device)
                per_row.index_add_(0, self.row_ids(), mask.long())
                self._diag = (mask, per_row, mask[self.transposed()[2]])
        return None if self._diag[0] is None else self._diag

    def check_unchanged(self) -> None:
        """Raise :class:`StaleStructureError` if the index tensors were modified in place."""
        if (self.indptr._version, self.indices._version) != self._versions:
            raise StaleStructureError(
                "the indptr/indices tensors of a sparse matrix were modified in place after "
                "it was built; cached data (its transpose, RSC's sampled rows) would be stale. "
                "Sparse structures are immutable: build a new graph or CSR from new tensors "
                "instead of editing them in place."
            )

    def pool(self):
        """The :class:`~dgl_rsc.sparse.buffers.OutputPool` of this structure's product outputs."""
        if self._pool is None:
            from .buffers import OutputPool

            self._pool = OutputPool()
        return self._pool

    def forward_plan(self):
        """The CUDA product kernel's work plan (``backends.spmm_cupy.plan``), made once."""
        if self._plan is None:
            self._plan = spmm_cupy.plan(self.indptr)
        return self._plan

    def transposed_structure(self):
        """``(structure of A^T, perm (nnz,))``; ``A^T``'s values are ``values[perm]``."""
        self.check_unchanged()
        if self._t_structure is None:
            t_indptr, t_rows, perm = self.transposed()
            t = _Structure(t_indptr, t_rows, (self.shape[1], self.shape[0]))
            self._t_structure = (t, perm)
        return self._t_structure

    def ones(self, dtype: torch.dtype) -> torch.Tensor:
        """``(nnz,)`` ones in ``dtype``, made once per dtype (values of an unweighted A)."""
        if dtype not in self._ones:
            self._ones[dtype] = torch.ones(self.nnz, dtype=dtype, device=self.indptr.device)
        return self._ones[dtype]

    def row_nnz(self) -> torch.Tensor:
        if self._row_nnz is None:
            self._row_nnz = (self.indptr[1:] - self.indptr[:-1]).long()
        return self._row_nnz

    def row_ids(self) -> torch.Tensor:
        """``(nnz,)`` row id of every stored entry (int64)."""
        m = self.shape[0]
        return torch.repeat_interleave(
            torch.arange(m, device=self.indptr.device), self.row_nnz(), output_size=self.nnz
        )

    @property
    def nnz(self) -> int:
        return self.indices.numel()

    def transposed(self):
        """``(t_indptr (N+1,), t_rows (nnz,), perm (nnz,))`` of ``A^T`` in CSR form.

        ``perm`` maps positions of ``A^T``'s entries to positions in ``A``: the values of
        ``A^T`` are ``values[perm]``. Entries of a column keep ascending row order.
        """
        self.check_unchanged()
        if self._transposed is None:
            n = self.shape[1]
            cols = self.indices.long()
            perm = torch.sort(cols, stable=True).indices
            counts = torch.bincount(cols, minlength=n) if cols.numel() else cols.new_zeros(n)
            t_indptr = torch.zeros(n + 1, dtype=torch.long, device=cols.device)
            torch.cumsum(counts, 0, out=t_indptr[1:])
            t_rows = self.row_ids()[perm]
            idt = self.indices.dtype
            self._transposed = (t_indptr.to(idt), t_rows.to(idt), perm)
        return self._transposed


class CSR:
    """A sparse matrix ``A`` of shape ``(M, N)`` in CSR form.

    Args:
        indptr: ``(M+1,)`` int32 or int64 row pointers.
        indices: ``(nnz,)`` column ids, same dtype and device as ``indptr``.
        values: ``(nnz,)`` floating values, or ``None`` for an all-ones (unweighted) matrix.
        shape: ``(M, N)``.
        check: validate the arguments: types, shapes and (one pass over the index arrays)
            that ``indptr`` starts at 0, never decreases and ends at ``nnz`` and that every
            column id is in range. Structures are cached, so this is paid once per graph.

    Example:
        >>> import torch
        >>> A = CSR(torch.tensor([0, 2, 3]), torch.tensor([0, 1, 1]), None, (2, 2))
        >>> A.nnz, A.shape
        (3, (2, 2))
        >>> A.row_nnz().tolist()
        [2, 1]
    """

    def __init__(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        values: Optional[torch.Tensor] = None,
        shape: Optional[Sequence[int]] = None,
        check: bool = True,
        _structure: Optional[_Structure] = None,
    ):
        if shape is None:
            ncols = int(indices.max()) + 1 if indices.numel() else 0
            shape = (indptr.numel() - 1, ncols)
        if check:
            shape = check_csr(indptr, indices, values, shape)
            check_csr_data(indptr, indices, shape)
        shape = (int(shape[0]), int(shape[1]))
        self._s = _structure if _structure is not None else _Structure(indptr, indices, shape)
        self.values = values

    # -- structure ---------------------------------------------------------------------
    @property
    def indptr(self) -> torch.Tensor:
        return self._s.indptr

    @property
    def indices(self) -> torch.Tensor:
        return self._s.indices

    @property
    def shape(self) -> tuple[int, int]:
        return self._s.shape

    @property
    def nnz(self) -> int:
        return self._s.nnz

    @property
    def device(self) -> torch.device:
        return self._s.indptr.device

    @property
    def token(self) -> int:
        """Unique id of the sparsity structure (caches key on it, never on ``id()``)."""
        return self._s.token

    def row_nnz(self) -> torch.Tensor:
        """``(M,)`` int64 number of stored entries per row."""
        return self._s.row_nnz()

    def row_ids(self) -> torch.Tensor:
        """``(nnz,)`` int64 row id of each stored entry."""
        return self._s.row_ids()

    def with_values(self, values: Optional[torch.Tensor]) -> CSR:
        """Same structure (and cached transpose), other values."""
        if values is not None:
            check_csr(self.indptr, self.indices, values, self.shape)
        return CSR(self.indptr, self.indices, values, self.shape, check=False, _structure=self._s)

    def transposed(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Structure of ``A^T``: ``(t_indptr (N+1,), t_rows (nnz,), perm (nnz,))``."""
        return self._s.transposed()

    def transpose(self) -> CSR:
        """``A^T`` as a ``CSR`` of shape ``(N, M)`` on the cached transposed structure."""
        t, perm = self._s.transposed_structure()
        return CSR(t.indptr, t.indices, self._transposed_values(perm), t.shape, check=False,
                   _structure=t)  # fmt: skip

    def _transposed_values(self, perm: torch.Tensor) -> Optional[torch.Tensor]:
        """``values[perm]``, gathered once per structure while the same values tensor comes
        back unchanged and needs no gradient (values kept across steps, e.g. PyG's
        normalized adjacency, which each backward wraps in a new ``CSR``)."""
        v = self.values
        if v is None or v.requires_grad:
            return None if v is None else v[perm]
        kept = self._s.t_values
        if kept is None or kept[0] is not v or kept[1] != v._version:
            kept = self._s.t_values = (v, v._version, v[perm])
        return kept[2]

    def pool(self):
        """The output-buffer pool of this matrix's structure (CPU products)."""
        return self._s.pool()

    def diagonal(self):
        """Diagonal entries of the structure (see ``_Structure.diagonal``), or ``None``."""
        return self._s.diagonal()

    def transpose_pool(self):
        """The output-buffer pool of the transposed structure (outputs of ``A^T @ Y``)."""
        return self._s.transposed_structure()[0].pool()

    def check_unchanged(self) -> None:
        """Raise if the index tensors were modified in place since the matrix was built."""
        self._s.check_unchanged()

    # -- values ------------------------------------------------------------------------
    def row_norms(self) -> torch.Tensor:
        """``(M,)`` float32 Euclidean norm of each row, ``||A[i, :]||_2``."""
        if self.values is None:
            return self.row_nnz().float().sqrt()
        sq = self.values.detach().float().square()
        out = torch.zeros(self.shape[0], dtype=torch.float32, device=self.device)
        out.index_add_(0, self.row_ids(), sq)
        return out.sqrt()

    def values_or_ones(self, dtype: torch.dtype) -> torch.Tensor:
        """``(nnz,)`` values in ``dtype`` (ones when the matrix is unweighted)."""
        if self.values is None:
            return self._s.ones(dtype)
        return self.values.to(dtype)

    def to_dense(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``(M, N)`` dense copy, for tests and small examples."""
        out = torch.zeros(self.shape, dtype=dtype, device=self.device)
        out.index_put_(
            (self.row_ids(), self.indices.long()), self.values_or_ones(dtype), accumulate=True
        )
        return out

    def nbytes(self) -> int:
        """Bytes held by the index and value tensors (and a renumbered copy of the indices,
        :mod:`dgl_rsc.sparse.compact`, where one was made)."""
        total = self.indptr.numel() * self.indptr.element_size()
        copy = self._s._compact
        if copy is not None and copy[0] is not None:
            total += sum(t.numel() * t.element_size() for t in (copy[0].indices, copy[1]))
        total += self.indices.numel() * self.indices.element_size()
        if self.values is not None:
            total += self.values.numel() * self.values.element_size()
        return total

    @classmethod
    def from_coo(cls, row, col, values=None, shape=None) -> CSR:
        """Build from COO arrays (any order; duplicates are kept as separate entries)."""
        row, col = row.long(), col.long()
        if shape is None:
            shape = (
                int(row.max()) + 1 if row.numel() else 0,
                int(col.max()) + 1 if col.numel() else 0,
            )
        order = torch.argsort(row * max(int(shape[1]), 1) + col, stable=True)
        counts = (
            torch.bincount(row, minlength=int(shape[0]))
            if row.numel()
            else row.new_zeros(int(shape[0]))
        )
        indptr = torch.zeros(int(shape[0]) + 1, dtype=torch.long, device=row.device)
        torch.cumsum(counts, 0, out=indptr[1:])
        vals = None if values is None else values[order]
        return cls(indptr, col[order], vals, shape)

    def __repr__(self) -> str:
        kind = "unweighted" if self.values is None else str(self.values.dtype)
        return (
            f"CSR(shape={self.shape}, nnz={self.nnz}, index={self.indices.dtype}, "
            f"values={kind}, device={self.device})"
        )
