"""What a sampling backend provides: the three steps of a refresh on one kind of device.

Every function takes and returns torch tensors on the backend's device; integer results
(masks, counts, slices) are bit-identical to :mod:`dgl_rsc.backends.torch_ref`, the
specification, and float scores equal to float32 rounding.
"""

from __future__ import annotations

from typing import Optional, Protocol, runtime_checkable

import torch

__all__ = ["SamplingBackend", "check_dtype_and_dim"]


@runtime_checkable
class SamplingBackend(Protocol):
    """The functions of a backend module (``torch_ref``, ``cupy_backend``, ``numba_backend``)."""

    def row_scores(self, row_norms: torch.Tensor, dY: torch.Tensor) -> torch.Tensor:
        """``(M,)`` float32 ``row_norms[i] * ||dY[i, :]||_2`` (fp32 accumulation)."""

    def select_rows(
        self, key: torch.Tensor, row_nnz: torch.Tensor, nnz_budget: int, min_k: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mask (M,) bool, k 0-dim int64)``: the rows with the largest ``key`` (float32,
        ``>= 0``, ``+inf`` allowed: see :func:`dgl_rsc.sampling.selection_key`) whose
        non-zeros fit ``nnz_budget``, ties by lower row id, at least
        :func:`~dgl_rsc.sampling.kept_count` rows."""

    def slice_transposed(
        self,
        t_indptr: torch.Tensor,
        t_rows: torch.Tensor,
        t_values: Optional[torch.Tensor],
        row_mask: torch.Tensor,
        entry_keep: Optional[torch.Tensor] = None,
    ) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """CSR ``(indptr, indices, values)`` of ``A[S, :]^T`` cut from ``A^T``'s CSR.

        A backend may also provide ``slice_rows(indptr, indices, values, shape, row_mask)``:
        the same slice (without extra kept entries) cut from ``A``'s own CSR, for a cost in
        the kept non-zeros; :func:`~dgl_rsc.sampling.draw_sample` prefers it."""


def check_dtype_and_dim(name: str, t: torch.Tensor, dtypes=None, dim: int = 1) -> None:
    """A kernel backend's check of its argument ``name``: one of ``dtypes`` (any when
    ``None``) and ``dim`` dimensions, or an error naming both."""
    if dtypes is not None and t.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype {allowed}; got {t.dtype}.")
    if t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}.")
