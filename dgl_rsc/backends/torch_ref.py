"""Reference implementation of RSC's sampling steps in vectorized torch.

This is the CPU path and the specification the CuPy and Numba kernels are tested against.
Every function is loop-free over rows and edges and runs on any device torch supports.

The four steps of one refresh of a layer's sample:

1. :func:`row_scores` -- ``s_i = ||A[i, :]||_2 * ||dY[i, :]||_2``.
2. :func:`select_rows` -- keep the best rows by a key (a rule of
   :mod:`dgl_rsc.sampling.rules`) while their non-zeros fit a budget.
3. :func:`slice_transposed` -- the structure of ``A[S, :]^T`` in CSR form, made from the
   cached ``A^T`` by masking its entries with the row set and compacting.
4. The product ``A[S, :]^T @ dY`` on torch's sparse engine (``dgl_rsc.sparse.products``).
"""

from __future__ import annotations

import torch

from ..sampling.rules import kept_count

__all__ = ["row_scores", "select_rows", "slice_transposed"]


def row_scores(row_norms: torch.Tensor, dY: torch.Tensor) -> torch.Tensor:
    """``(M,)`` float32 scores ``row_norms[i] * ||dY[i, :]||_2``.

    Args:
        row_norms: ``(M,)`` float32 ``||A[i, :]||_2``.
        dY: ``(M, D)`` output gradient, any floating dtype; accumulated in fp32.

    NaN or Inf in ``dY`` give a NaN/Inf score; :func:`select_rows` keeps such rows, so the
    non-finite value reaches the gradient as it does on the exact path.
    """
    return row_norms * torch.linalg.vector_norm(dY.float(), dim=1)


def select_rows(
    key: torch.Tensor, row_nnz: torch.Tensor, nnz_budget: int, min_k: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the rows with the largest ``key`` while their non-zeros fit ``nnz_budget``.

    Ties are broken by the lower row id. Rows with ``key == 0`` are never kept. At least
    ``min(min_k, #rows with key > 0)`` rows are kept, even over the budget, and so is every
    row with ``key == +inf`` (a non-finite score), so that NaN/Inf reach the gradient.

    Args:
        key: ``(M,)`` float32 ranking key (see :func:`dgl_rsc.sampling.selection_key`).
        row_nnz: ``(M,)`` int64 non-zeros per row.
        nnz_budget: the most non-zeros the kept rows may hold.
        min_k: floor on the number of kept rows.

    Returns:
        ``(mask, k)``: ``(M,)`` bool mask of kept rows and a 0-dim int64 tensor ``k``
        (kept on the device, so no host synchronization is forced).
    """
    m = key.numel()
    order = torch.sort(key, descending=True, stable=True).indices
    useful = (key > 0).sum()
    csum = torch.cumsum(row_nnz[order], 0)
    fit = (csum <= nnz_budget).sum()
    k = kept_count(fit, useful, min_k, torch.isinf(key).sum())
    ranks = torch.arange(m, device=key.device)
    mask = torch.zeros(m, dtype=torch.bool, device=key.device)
    mask[order] = ranks < k
    return mask, k


def slice_transposed(t_indptr, t_rows, t_values, row_mask, entry_keep=None):
    """CSR of ``A[S, :]^T`` (shape ``(N, M)``) from ``A^T``'s CSR and the kept-row mask.

    Entries of ``A^T`` whose row id (``t_rows``, a column of ``A^T``) is not in ``S`` are
    dropped, unless ``entry_keep`` keeps them (RSC applies a self-loop diagonal exactly by
    keeping its entries whatever rows are sampled); column ids stay the original row ids, so
    the product can read ``dY`` in place without gathering ``dY[S]``.

    Args:
        t_indptr: ``(N+1,)`` row pointers of ``A^T``.
        t_rows: ``(nnz,)`` column ids of ``A^T`` (row ids of ``A``).
        t_values: ``(nnz,)`` values of ``A^T`` or ``None``.
        row_mask: ``(M,)`` bool, the kept rows ``S`` of ``A``.
        entry_keep: ``(nnz,)`` bool entries of ``A^T`` kept in any case, or ``None``.

    Returns:
        ``(indptr (N+1,), indices (nnz_S,), values (nnz_S,) or None)``.
    """
    keep = row_mask[t_rows.long()]
    if entry_keep is not None:
        keep = keep | entry_keep
    csum = torch.zeros(keep.numel() + 1, dtype=torch.long, device=keep.device)
    torch.cumsum(keep, 0, out=csum[1:])
    new_indptr = csum[t_indptr.long()].to(t_indptr.dtype)
    idx = torch.nonzero(keep).squeeze(1)
    vals = None if t_values is None else t_values[idx]
    return new_indptr, t_rows[idx], vals
