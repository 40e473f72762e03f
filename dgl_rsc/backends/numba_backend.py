"""Numba backend: RSC's sampling steps as ``numba.cuda.jit`` kernels.

Same functions and signatures as :mod:`dgl_rsc.backends.torch_ref`. On a GPU it takes CUDA
torch tensors (zero-copy through ``__cuda_array_interface__``, kernels on torch's current
stream); under Numba's simulator (``NUMBA_ENABLE_CUDASIM=1``, set before Numba is imported) it
takes CPU tensors, whose NumPy views the simulated kernels read and write in place.

What runs where:

* :func:`row_scores`: one kernel (32 lanes per row, fixed-order shared-memory reduction).
  float16/bfloat16 ``dY`` is upcast to float32 by torch first (the reference does the same
  ``dY.float()``); Numba has no bfloat16 arrays.
* :func:`slice_transposed`: kernels for the keep flags, the compaction and the new row
  pointers; the scan between them is a ``torch.cumsum``.
* :func:`select_rows`: the order is ``torch.sort`` (stable, descending) and the budget scan a
  ``torch.cumsum``, as in the reference; a kernel computes ``k`` and scatters the mask. The
  sort-free radix select lives in the CuPy backend.

Host round trips: one in :func:`slice_transposed` (the output size), none elsewhere.
"""

from __future__ import annotations

import math

import numba
import torch

from ..base import _deps
from ..sampling.rules import kept_count
from .protocol import check_dtype_and_dim

cuda = _deps.require_numba_cuda()

__all__ = ["row_scores", "select_rows", "slice_transposed", "SIMULATOR"]

#: ``True`` when Numba runs kernels in its CPU simulator (``NUMBA_ENABLE_CUDASIM=1``).
SIMULATOR = bool(numba.config.ENABLE_CUDASIM)

_ROWS = 8  # rows per block in the scoring kernel (block = 32 x _ROWS threads)
_THREADS = 256
_INDEX = (torch.int32, torch.int64)
_COPY = {2: torch.int16, 4: torch.int32, 8: torch.int64}  # values are copied as raw bits


# -- kernels ------------------------------------------------------------------------------------
@cuda.jit
def _row_scores_kernel(row_norms, dy, out):
    m = dy.shape[0]
    d = dy.shape[1]
    lane = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    row = cuda.blockIdx.x * _ROWS + ty
    buf = cuda.shared.array((_ROWS, 32), numba.float32)
    acc = numba.float32(0.0)
    if row < m:
        for c in range(lane, d, 32):
            v = numba.float32(dy[row, c])
            acc += v * v
    buf[ty, lane] = acc
    cuda.syncthreads()
    s = 16
    while s > 0:
        if lane < s:
            buf[ty, lane] += buf[ty, lane + s]
        cuda.syncthreads()
        s //= 2
    if lane == 0 and row < m:
        out[row] = row_norms[row] * math.sqrt(buf[ty, 0])


@cuda.jit
def _select_mask_kernel(order, ranks_lt, mask):
    p = cuda.grid(1)
    if p < order.shape[0]:
        mask[order[p]] = p < ranks_lt[0]


@cuda.jit
def _keep_kernel(t_rows, row_mask, entry_keep, has_entry, keep):
    e = cuda.grid(1)
    if e < t_rows.shape[0]:
        keep[e] = 1 if row_mask[t_rows[e]] or (has_entry and entry_keep[e]) else 0


@cuda.jit
def _compact_kernel(t_rows, t_vals, has_vals, keep, pos, out_rows, out_vals):
    e = cuda.grid(1)
    if e < t_rows.shape[0] and keep[e]:
        p = pos[e]
        out_rows[p] = t_rows[e]
        if has_vals:
            out_vals[p] = t_vals[e]


@cuda.jit
def _gather_indptr_kernel(t_indptr, pos, out):
    j = cuda.grid(1)
    if j < t_indptr.shape[0]:
        out[j] = pos[t_indptr[j]]


# -- plumbing -----------------------------------------------------------------------------------
def _check(name: str, t, dtypes=None, dim=1) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}.")
    if SIMULATOR:
        if t.device.type != "cpu":
            raise ValueError(
                f"under NUMBA_ENABLE_CUDASIM=1 the numba backend takes CPU tensors; {name} is "
                f"on {t.device}."
            )
    elif t.device.type != "cuda":
        raise ValueError(
            f"the numba backend needs CUDA tensors, but {name} is on {t.device}; move it to the "
            "GPU, use backend='torch', or set NUMBA_ENABLE_CUDASIM=1 for the simulator."
        )
    check_dtype_and_dim(name, t, dtypes, dim)


def _arr(t: torch.Tensor):
    """Zero-copy Numba view (device array on a GPU, NumPy array in the simulator)."""
    t = t.detach()
    if t.dtype == torch.bool:
        t = t.view(torch.uint8)
    if SIMULATOR:  # the simulator copies arrays in and out, and only contiguous ones
        return t.contiguous().numpy()
    return cuda.as_cuda_array(t, sync=False)  # same stream: no sync needed


def _stream(device: torch.device):
    if SIMULATOR:
        return 0
    ptr = torch.cuda.current_stream(device).cuda_stream
    return cuda.external_stream(ptr) if ptr else cuda.default_stream()


def _launch(kernel, n: int, device, *args, block=_THREADS) -> None:
    if n > 0:
        kernel[(n + block - 1) // block, block, _stream(device)](*args)


def _raw(values):
    """``values`` as raw bits of the same size (bf16/fp16 have no Numba array type)."""
    if values.element_size() not in _COPY:
        raise TypeError(f"values of dtype {values.dtype} are not supported.")
    return values.contiguous().view(_COPY[values.element_size()])


# -- public functions ---------------------------------------------------------------------------
def row_scores(row_norms: torch.Tensor, dY: torch.Tensor) -> torch.Tensor:
    """``(M,)`` float32 scores ``row_norms[i] * ||dY[i, :]||_2`` (fp32 accumulation).

    Args:
        row_norms: ``(M,)`` float32 ``||A[i, :]||_2``.
        dY: ``(M, D)`` output gradient, float32/float64 (float16/bfloat16 upcast first).
    """
    _check("row_norms", row_norms, (torch.float32,))
    _check("dY", dY, (torch.float32, torch.float64, torch.float16, torch.bfloat16), dim=2)
    m = dY.shape[0]
    if row_norms.numel() != m:
        raise ValueError(f"row_norms has {row_norms.numel()} entries but dY has {m} rows.")
    if dY.dtype in (torch.float16, torch.bfloat16):
        dY = dY.float()
    out = torch.empty(m, dtype=torch.float32, device=dY.device)
    if m and dY.shape[1] == 0:
        return torch.mul(row_norms, 0.0, out=out)
    if m:
        grid = (m + _ROWS - 1) // _ROWS
        _row_scores_kernel[grid, (32, _ROWS), _stream(dY.device)](
            _arr(row_norms.contiguous()), _arr(dY), _arr(out)
        )
    return out


def select_rows(
    key: torch.Tensor, row_nnz: torch.Tensor, nnz_budget: int, min_k: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the rows with the largest ``key`` while their non-zeros fit ``nnz_budget``.

    Same contract as :func:`dgl_rsc.backends.torch_ref.select_rows`. The order and the budget
    scan are torch's (``sort`` + ``cumsum``); a kernel scatters the mask. No host sync.

    Returns:
        ``(mask (M,) bool, k 0-dim int64)``.
    """
    _check("key", key, (torch.float32,))
    _check("row_nnz", row_nnz, _INDEX)
    m = key.numel()
    if row_nnz.numel() != m:
        raise ValueError(f"row_nnz has {row_nnz.numel()} entries but key has {m}.")
    order = torch.sort(key, descending=True, stable=True).indices
    useful = (key > 0).sum()
    fit = (torch.cumsum(row_nnz.long()[order], 0) <= nnz_budget).sum()
    k = kept_count(fit, useful, min_k, torch.isinf(key).sum())
    mask = torch.empty(m, dtype=torch.bool, device=key.device)
    if m == 0:
        return mask, k
    _launch(_select_mask_kernel, m, key.device, _arr(order), _arr(k.reshape(1)), _arr(mask))
    return mask, k


def slice_transposed(t_indptr, t_rows, t_values, row_mask, entry_keep=None):
    """CSR of ``A[S, :]^T`` (shape ``(N, M)``) from ``A^T``'s CSR and the kept-row mask.

    Args:
        t_indptr: ``(N+1,)`` int32/int64 row pointers of ``A^T``.
        t_rows: ``(nnz,)`` column ids of ``A^T`` (row ids of ``A``), same dtype.
        t_values: ``(nnz,)`` values of ``A^T`` or ``None``.
        row_mask: ``(M,)`` bool, the kept rows ``S`` of ``A``.
        entry_keep: ``(nnz,)`` bool entries kept whatever the row mask says, or ``None``.

    Returns:
        ``(indptr (N+1,), indices (nnz_S,), values (nnz_S,) or None)``. One host sync (size).
    """
    _check("t_indptr", t_indptr, _INDEX)
    _check("t_rows", t_rows, (t_indptr.dtype,))
    _check("row_mask", row_mask, (torch.bool,))
    device, nnz = t_rows.device, t_rows.numel()
    if t_values is not None:
        _check("t_values", t_values)
    if nnz == 0:
        return torch.zeros_like(t_indptr), t_rows[:0], None if t_values is None else t_values[:0]
    t_rows, row_mask = t_rows.contiguous(), row_mask.contiguous()
    keep = torch.empty(nnz, dtype=torch.uint8, device=device)
    if entry_keep is not None:
        _check("entry_keep", entry_keep, (torch.bool,))
    ek = _arr(entry_keep.contiguous() if entry_keep is not None else row_mask)
    _launch(_keep_kernel, nnz, device, _arr(t_rows), _arr(row_mask), ek,
            entry_keep is not None, _arr(keep))  # fmt: skip
    pos = torch.zeros(nnz + 1, dtype=torch.int64, device=device)
    torch.cumsum(keep, 0, out=pos[1:])
    total = int(pos[-1])  # host sync: sizes the output
    out_rows = torch.empty(total, dtype=t_rows.dtype, device=device)
    out_vals = None
    if t_values is not None:
        out_vals = torch.empty(total, dtype=t_values.dtype, device=device)
    if total:
        vals_in = _raw(t_values) if t_values is not None else keep
        vals_out = _raw(out_vals) if out_vals is not None else keep
        args = (_arr(t_rows), _arr(vals_in), t_values is not None, _arr(keep), _arr(pos))
        _launch(_compact_kernel, nnz, device, *args, _arr(out_rows), _arr(vals_out))
    out_indptr = torch.empty_like(t_indptr)
    _launch(_gather_indptr_kernel, t_indptr.numel(), device, _arr(t_indptr.contiguous()),
            _arr(pos), _arr(out_indptr))  # fmt: skip
    return out_indptr, out_rows, out_vals
