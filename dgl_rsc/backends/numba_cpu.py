"""Numba CPU kernels for a refresh's selection and slicing: the CPU default where Numba imports.

The torch reference sorts every row's key (``torch.sort``: 2.7 ms for 30k rows, 22 ms for
200k on the 2-core machine) and cuts ``A[S, :]^T`` with four passes over the non-zeros
(7 ms for 1.5M). Here:

- :func:`select_rows` finds the cut of the sorted order without sorting: a float32 key
  ``>= 0`` orders like its bit pattern read as an integer, so a histogram of the high 16 bits
  and one of the low 16 bits within the bucket where the cut falls (each weighted by the
  rows' non-zeros) give the key value at the cut; rows tied at that value are taken in row
  order. Two such cuts (by non-zeros for the budget, then by count for the kept-row rule
  ``kept_count``) give a mask equal to the reference's, bit for bit: the same rows, ties
  broken by the lower row id.
- :func:`slice_rows` cuts ``A[S, :]^T`` from the kept rows of ``A`` itself: a counting sort
  of their entries by column, visiting the kept rows in ascending order, so each row of the
  slice lists its row ids ascending, as the cut from the cached transpose does; it costs the
  kept non-zeros and ``N``, not ``nnz(A)`` (at budget 0.1, a tenth of the work).
  :func:`slice_transposed` (the protocol's cut from ``A^T``, which also keeps extra entries
  such as an exactly applied diagonal) counts and copies the kept entries of ``A^T`` row by
  row, in chunks of equal non-zeros over the product engine's threads.

``row_scores`` is the reference's (one vectorized pass over ``dY``).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from numba import njit

from ..sampling.rules import kept_count
from ..sparse.cpu_spmm import run_chunked, run_ranges
from . import torch_ref

__all__ = ["row_scores", "select_rows", "slice_rows", "slice_transposed"]

_OPTS = dict(boundscheck=False, nogil=True, cache=True)

row_scores = torch_ref.row_scores


@njit(**_OPTS)
def _prefix_cut(bits, weight, limit):
    """The longest prefix of the rows in (key descending, row ascending) order whose weights
    sum to at most ``limit``, as ``(value, ties, length)``: the prefix is every row with key
    bits ``> value`` and the first ``ties`` rows (by id) with bits ``== value``; ``value`` is
    -1 when the prefix holds every row. ``bits`` (M,) int64 >= 0, ``weight`` (M,) int64 >= 0.
    """
    m = bits.shape[0]
    hist = np.zeros(65536, np.int64)
    for i in range(m):
        hist[bits[i] >> 16] += weight[i]
    acc = 0
    hi = -1
    for b in range(65535, -1, -1):
        if acc + hist[b] > limit:
            hi = b
            break
        acc += hist[b]
    if hi < 0:
        return -1, 0, m
    hist[:] = 0
    for i in range(m):
        if (bits[i] >> 16) == hi:
            hist[bits[i] & 0xFFFF] += weight[i]
    value = -1
    for b in range(65535, -1, -1):
        if acc + hist[b] > limit:
            value = (hi << 16) | b
            break
        acc += hist[b]
    length = 0
    for i in range(m):
        if bits[i] > value:
            length += 1
    ties = 0
    for i in range(m):  # tied rows in row order while they fit
        if bits[i] == value:
            if acc + weight[i] > limit:
                break
            acc += weight[i]
            ties += 1
    return value, ties, length + ties


@njit(**_OPTS)
def _mask_of(bits, value, ties, mask):
    taken = 0
    for i in range(bits.shape[0]):
        if bits[i] > value:
            mask[i] = True
        elif bits[i] == value and taken < ties:
            mask[i] = True
            taken += 1
        else:
            mask[i] = False


def select_rows(
    key: torch.Tensor, row_nnz: torch.Tensor, nnz_budget: int, min_k: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """As :func:`dgl_rsc.backends.torch_ref.select_rows` (the same mask and ``k``).

    Args:
        key: ``(M,)`` float32 ``>= 0`` (``+inf`` allowed); row_nnz: ``(M,)`` int64.

    Returns:
        ``(mask (M,) bool, k 0-dim int64)``.
    """
    k32 = key.detach().contiguous().float().numpy()
    bits = np.maximum(k32.view(np.int32).astype(np.int64), 0)  # -0.0 orders as 0
    nnz = row_nnz.detach().to(torch.int64).contiguous().numpy()
    _, _, fit = _prefix_cut(bits, nnz, int(nnz_budget))
    useful = int(np.count_nonzero(k32 > 0))
    forced = int(np.count_nonzero(np.isinf(k32)))
    k = kept_count(int(fit), useful, int(min_k), forced)
    value, ties, _ = _prefix_cut(bits, np.ones_like(nnz), k)
    mask = np.empty(bits.shape[0], np.bool_)
    _mask_of(bits, value, ties, mask)
    return torch.from_numpy(mask), torch.tensor(k, dtype=torch.int64)


@njit(**_OPTS)
def _count_kept(t_indptr, t_rows, mask, keep, use_keep, counts, r0, r1):
    for j in range(r0, r1):
        c = 0
        for p in range(t_indptr[j], t_indptr[j + 1]):
            if mask[t_rows[p]] or (use_keep and keep[p]):
                c += 1
        counts[j + 1] = c


@njit(**_OPTS)
def _copy_kept(t_indptr, t_rows, t_vals, use_vals, mask, keep, use_keep, new_indptr, out_idx,
               out_vals, r0, r1):  # fmt: skip
    for j in range(r0, r1):
        q = new_indptr[j]
        if q == new_indptr[j + 1]:
            continue
        for p in range(t_indptr[j], t_indptr[j + 1]):
            if mask[t_rows[p]] or (use_keep and keep[p]):
                out_idx[q] = t_rows[p]
                if use_vals:
                    out_vals[q] = t_vals[p]
                q += 1


def slice_transposed(
    t_indptr: torch.Tensor,
    t_rows: torch.Tensor,
    t_values: Optional[torch.Tensor],
    row_mask: torch.Tensor,
    entry_keep: Optional[torch.Tensor] = None,
):
    """As :func:`dgl_rsc.backends.torch_ref.slice_transposed` (identical output)."""
    n = t_indptr.numel() - 1
    ip, rows = t_indptr.numpy(), t_rows.numpy()
    mask = row_mask.numpy()
    use_keep = entry_keep is not None
    keep = entry_keep.numpy() if use_keep else np.zeros(1, np.bool_)
    counts = np.zeros(n + 1, ip.dtype)
    run_chunked(ip, 0, n, 1, lambda a, b: _count_kept(ip, rows, mask, keep, use_keep, counts,
                                                      a, b))  # fmt: skip
    new_indptr = np.cumsum(counts).astype(ip.dtype)
    total = int(new_indptr[-1])
    out_idx = np.empty(total, rows.dtype)
    use_vals = t_values is not None
    vals = t_values.detach().contiguous().numpy() if use_vals else np.zeros(1, np.float32)
    out_vals = np.empty(total if use_vals else 1, vals.dtype)
    run_chunked(ip, 0, n, 1, lambda a, b: _copy_kept(ip, rows, vals, use_vals, mask, keep,
                                                     use_keep, new_indptr, out_idx, out_vals,
                                                     a, b))  # fmt: skip
    return (
        torch.from_numpy(new_indptr),
        torch.from_numpy(out_idx),
        torch.from_numpy(out_vals) if use_vals else None,
    )


@njit(**_OPTS)
def _count_cols(indptr, indices, rows, t0, t1, counts):
    """``counts[j] +=`` the entries in column ``j`` of the kept rows ``rows[t0:t1]``."""
    for t in range(t0, t1):
        i = rows[t]
        for p in range(indptr[i], indptr[i + 1]):
            counts[indices[p]] += 1


@njit(**_OPTS)
def _part_offsets(counts, out_indptr):
    """Column pointers of the slice from per-part column counts ``counts (P, N)``, which
    become each part's first position per column (part ``p``'s entries of a column follow
    those of parts ``< p``: lower rows first, as in the serial cut)."""
    acc = 0
    for j in range(counts.shape[1]):
        out_indptr[j] = acc
        for q in range(counts.shape[0]):
            c = counts[q, j]
            counts[q, j] = acc
            acc += c
    out_indptr[counts.shape[1]] = acc


@njit(**_OPTS)
def _scatter_rows(indptr, indices, values, use_vals, rows, t0, t1, pos, out_idx, out_vals):
    """Write the kept rows ``rows[t0:t1]`` (ascending) into their columns' next positions."""
    for t in range(t0, t1):
        i = rows[t]
        for p in range(indptr[i], indptr[i + 1]):
            j = indices[p]
            q = pos[j]
            out_idx[q] = i
            if use_vals:
                out_vals[q] = values[p]
            pos[j] = q + 1


#: the most parts a parallel cut splits its rows into (each keeps ``N`` column counts)
MAX_CUT_PARTS = 4
#: kept non-zeros below which the cut runs in the calling thread
PARALLEL_CUT_MIN = 1 << 18


def _cut(ip, ix, vals, use_vals, rows, lens, n_cols, parts, out_idx, out_vals):
    """A counting sort of the kept rows' entries by column, in ``parts`` runs of kept rows of
    about equal non-zeros (run at once by ``parts`` threads): each counts its columns, the
    counts give every part its positions, each writes its rows. Returns the column pointers."""
    ptr = np.concatenate(([0], np.cumsum(lens)))
    cuts = np.searchsorted(ptr, np.linspace(0, ptr[-1], parts + 1))
    cuts[0], cuts[-1] = 0, rows.size
    ranges = [(q, int(a), int(b)) for q, (a, b) in enumerate(zip(cuts[:-1], cuts[1:]))]
    counts = np.zeros((len(ranges), n_cols), ip.dtype)
    run_ranges(ranges, lambda q, a, b: _count_cols(ip, ix, rows, a, b, counts[q]), parts)
    out_indptr = np.empty(n_cols + 1, ip.dtype)
    _part_offsets(counts, out_indptr)
    run_ranges(ranges, lambda q, a, b: _scatter_rows(ip, ix, vals, use_vals, rows, a, b,
                                                     counts[q], out_idx, out_vals),
               parts)  # fmt: skip
    return out_indptr


def slice_rows(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    values: Optional[torch.Tensor],
    shape,
    row_mask: torch.Tensor,
):
    """CSR ``(indptr (N+1,), indices, values or None)`` of ``A[S, :]^T`` (shape ``(N, M)``)
    from ``A``'s own CSR and the kept-row mask ``row_mask (M,)``: identical to
    :func:`slice_transposed` on ``A``'s cached transpose (without ``entry_keep``). With
    several threads and many kept non-zeros the rows are cut in up to
    :data:`MAX_CUT_PARTS` parts at once, with the same result."""
    ip, ix = indptr.numpy(), indices.numpy()
    mask = row_mask.numpy()
    rows = np.nonzero(mask)[0]
    lens = ip[rows + 1] - ip[rows]
    kept = int(lens.sum()) if rows.size else 0
    n_cols = int(shape[1])
    out_idx = np.empty(kept, ix.dtype)
    use_vals = values is not None
    vals = values.detach().contiguous().numpy() if use_vals else np.zeros(1, np.float32)
    out_vals = np.empty(kept if use_vals else 1, vals.dtype)
    parts = min(torch.get_num_threads(), MAX_CUT_PARTS) if kept >= PARALLEL_CUT_MIN else 1
    parts = max(min(parts, rows.size), 1)
    out_indptr = _cut(ip, ix, vals, use_vals, rows, lens, n_cols, parts, out_idx, out_vals)
    return (
        torch.from_numpy(out_indptr),
        torch.from_numpy(out_idx),
        torch.from_numpy(out_vals) if use_vals else None,
    )
