"""CuPy backend: RSC's sampling steps as CUDA C++ kernels (``cuda/rsc_kernels.cu``).

Same functions and signatures as :mod:`dgl_rsc.backends.torch_ref`, on CUDA torch tensors.
The kernels are compiled once per device by ``cupy.RawModule`` and launched on torch's current
stream; they read and write torch's memory in place (device pointers of contiguous tensors) and
outputs are allocated by torch, so no memory passes through CuPy's pool. Host round trips:
none in :func:`row_scores` and :func:`select_rows`; one in :func:`slice_transposed`, to size the
output (the reference has the same one).
"""

from __future__ import annotations

import functools
from typing import Optional

import numpy as np
import torch

from ..base import _deps
from . import _cuda_source
from .protocol import check_dtype_and_dim

__all__ = [
    "row_scores",
    "select_rows",
    "slice_transposed",
    "NAME_EXPRESSIONS",
    "COMPILE_OPTIONS",
]

_SOURCE = "rsc_kernels.cu"
_INDEX = {torch.int32: "int", torch.int64: "long long"}
_SCORE_T = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "rsc_half",
    torch.bfloat16: "rsc_bf16",
}
_COPY_T = {2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}

_VEC = {"float": 4, "double": 2, "rsc_half": 8, "rsc_bf16": 8}  # elements in 16 bytes

#: every kernel instantiation the backend launches
#: (tests/backends/test_cuda_compile.py builds them all)
NAME_EXPRESSIONS = (
    [f"rsc_row_scores<{t}, {v}>" for t in _SCORE_T.values() for v in (1, _VEC[t])]
    + [f"rsc_select_{k}<{w}>" for k in ("hist", "tie") for w in ("int", "long long")]
    + ["rsc_select_init", "rsc_select_k", "rsc_select_mask"]
    + [f"{k}<{i}>" for k in ("rsc_keep_bitmap", "rsc_indptr_from_bitmap")
       for i in _INDEX.values()]
    + [f"rsc_compact<{i}, {v}>" for i in _INDEX.values() for v in _COPY_T.values()]
)  # fmt: skip

# The constants the kernels are compiled with (-D options): their one source.
_STATE_LEN = 16  # long longs per select state
_BUCKETS = 256  # histogram buckets of one 8-bit radix pass
_BLOCK = 256  # threads per block of the selection and slicing kernels (== _BUCKETS)
COMPILE_DEFINES = {"RSC_STATE_LEN": _STATE_LEN, "RSC_BUCKETS": _BUCKETS, "RSC_BLOCK": _BLOCK}
COMPILE_OPTIONS = ("-std=c++17", *(f"-D{k}={v}" for k, v in COMPILE_DEFINES.items()))

# host-side launch policy (not mirrored in the kernels, which take any value)
_MAX_TIE_BLOCKS = 1024  # blocks of the tie pass
_TIE_ROWS = 2048  # rows per tie-pass block before the block count is capped
_INT64_MAX = (1 << 63) - 1


@functools.cache
def _kernel(device_index: int, name: str):
    return _cuda_source.cupy_module(
        _SOURCE, COMPILE_OPTIONS, tuple(NAME_EXPRESSIONS), device_index
    ).get_function(name)


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _check(name: str, t: torch.Tensor, dtypes=None, dim=1) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}.")
    if t.device.type != "cuda":
        raise ValueError(
            f"the cupy backend needs CUDA tensors, but {name} is on {t.device}; move it to "
            "the GPU or use backend='torch'."
        )
    check_dtype_and_dim(name, t, dtypes, dim)


@functools.lru_cache(maxsize=64)
def _external_stream(device_index: int, ptr: int):
    return _deps.require_cupy().cuda.ExternalStream(ptr, device_index)


class _Launcher:
    """Launch kernels of one device on torch's current stream.

    Array arguments are the tensors' device pointers (:meth:`ptr`): the kernels read and write
    torch's memory in place, zero-copy, in stream order with torch's own work, which is what a
    ``cupy.from_dlpack`` view would give, without its per-tensor conversion cost on the host.
    """

    def __init__(self, device: torch.device):
        self.cp = _deps.require_cupy()
        self.index = device.index if device.index is not None else torch.cuda.current_device()
        ptr = torch.cuda.current_stream(self.index).cuda_stream
        self.stream = _external_stream(self.index, ptr)

    def __enter__(self):
        self._dev = self.cp.cuda.Device(self.index)
        self._dev.__enter__()
        self.stream.__enter__()
        return self

    def __exit__(self, *exc):
        self.stream.__exit__(*exc)
        self._dev.__exit__(*exc)

    @staticmethod
    def ptr(t: Optional[torch.Tensor]) -> np.uint64:
        """A pointer argument: the (contiguous) tensor's device address, or null for ``None``."""
        return np.uint64(0 if t is None else t.data_ptr())

    def __call__(self, name: str, grid: int, block: int, *args) -> None:
        if grid > 0:
            _kernel(self.index, name)((int(grid),), (int(block),), args)


def _i64(x) -> np.int64:
    return np.int64(x)


# -- (1) scores ---------------------------------------------------------------------------------
def row_scores(row_norms: torch.Tensor, dY: torch.Tensor) -> torch.Tensor:
    """``(M,)`` float32 scores ``row_norms[i] * ||dY[i, :]||_2`` (fp32 accumulation).

    Args:
        row_norms: ``(M,)`` float32 ``||A[i, :]||_2``.
        dY: ``(M, D)`` float32, float64, float16 or bfloat16 output gradient; rows may be
            strided, columns must be contiguous (else it is copied).
    """
    _check("row_norms", row_norms, (torch.float32,))
    _check("dY", dY, tuple(_SCORE_T), dim=2)
    m, d = dY.shape
    if row_norms.numel() != m:
        raise ValueError(f"row_norms has {row_norms.numel()} entries but dY has {m} rows.")
    if dY.stride(1) != 1 and d > 1:
        dY = dY.contiguous()
    row_norms = row_norms.contiguous()
    out = torch.empty(m, dtype=torch.float32, device=dY.device)
    if m == 0:
        return out
    if d == 0:
        return torch.mul(row_norms, 0.0, out=out)
    t = _SCORE_T[dY.dtype]
    vec = _VEC[t]
    ld = dY.stride(0) if m > 1 else d
    aligned = dY.data_ptr() % 16 == 0 and d % vec == 0 and ld % vec == 0
    if not aligned:
        vec = 1
    per_lane = max(1, -(-d // vec))
    group = 1
    while group < 32 and group < per_lane:
        group *= 2
    block = _BLOCK
    rows_per_block = block // group
    with _Launcher(dY.device) as launch:
        launch(
            f"rsc_row_scores<{t}, {vec}>",
            -(-m // rows_per_block),
            block,
            launch.ptr(row_norms),
            launch.ptr(dY),
            _i64(m),
            _i64(d),
            _i64(ld),
            np.int32(group),
            launch.ptr(out),
        )
    return out


# -- (2) selection -------------------------------------------------------------------------------
def select_rows(
    key: torch.Tensor, row_nnz: torch.Tensor, nnz_budget: int, min_k: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the rows with the largest ``key`` while their non-zeros fit ``nnz_budget``.

    Same contract as :func:`dgl_rsc.backends.torch_ref.select_rows` (ties by lower row id, key
    0 never kept, ``min_k`` floor, every ``inf`` key kept), computed without a sort: radix
    select on the key bits weighted by ``row_nnz`` finds how many rows fit the budget, then a
    count-weighted radix select finds the ``k``-th row. No host synchronization.

    Args:
        key: ``(M,)`` float32 ranking key.
        row_nnz: ``(M,)`` int64 (or int32) non-zeros per row, non-negative.
        nnz_budget: the most non-zeros the kept rows may hold.
        min_k: floor on the number of kept rows.

    Returns:
        ``(mask (M,) bool, k)`` with ``k`` a 0-dim int64 CUDA tensor.
    """
    _check("key", key, (torch.float32,))
    _check("row_nnz", row_nnz, (torch.int64, torch.int32))
    m = key.numel()
    if row_nnz.numel() != m:
        raise ValueError(f"row_nnz has {row_nnz.numel()} entries but key has {m}.")
    key, row_nnz = key.contiguous(), row_nnz.contiguous()
    device = key.device
    k_out = torch.empty((), dtype=torch.int64, device=device)
    mask = torch.empty(m, dtype=torch.bool, device=device)
    if m == 0:
        return mask, k_out.zero_()
    budget = max(-_INT64_MAX - 1, min(int(nnz_budget), _INT64_MAX))
    min_k = max(-_INT64_MAX - 1, min(int(min_k), _INT64_MAX))
    w = _INDEX[row_nnz.dtype]
    n_tie = min(_MAX_TIE_BLOCKS, -(-m // _TIE_ROWS))
    chunk = -(-m // n_tie)
    # workspace: two select states, the histogram, the tie pass's per-block partials
    ws = torch.empty(2 * _STATE_LEN + 2 * _BUCKETS + 2 * n_tie, dtype=torch.int64, device=device)
    st1, st2 = ws[:_STATE_LEN], ws[_STATE_LEN : 2 * _STATE_LEN]
    hist = ws[2 * _STATE_LEN : 2 * _STATE_LEN + 2 * _BUCKETS]
    part = ws[2 * _STATE_LEN + 2 * _BUCKETS :]
    grid = min(-(-m // 1024), 2 * _num_sms(device.index or 0))
    with _Launcher(device) as launch:
        k_arr, w_arr, ws_arr = launch.ptr(key), launch.ptr(row_nnz), launch.ptr(ws)
        s1, s2, h, p = launch.ptr(st1), launch.ptr(st2), launch.ptr(hist), launch.ptr(part)
        launch("rsc_select_init", 1, _BLOCK, ws_arr, _i64(ws.numel()), _i64(budget))
        # select 1: weights row_nnz, budget nnz_budget -> fit; select 2: unit weights, budget k
        for sel, (weight, state) in enumerate(((w_arr, s1), (np.uint64(0), s2))):
            for p_i in range(4):
                first = sel == 0 and p_i == 0
                args = (k_arr, weight, _i64(m), state, h, np.int32(first))
                launch(f"rsc_select_hist<{w}>", grid, _BUCKETS, *args)
            launch(f"rsc_select_tie<{w}>", n_tie, _BLOCK, k_arr, weight, _i64(m), _i64(chunk),
                   state, p)  # fmt: skip
            if sel == 0:
                launch("rsc_select_k", 1, 1, s1, s2, _i64(min_k), launch.ptr(k_out))
        launch("rsc_select_mask", -(-m // _BLOCK), _BLOCK, k_arr, _i64(m), s2, launch.ptr(mask))
    return mask, k_out


# -- (3) slicing ---------------------------------------------------------------------------------
def _values_view(values):
    if values is None:
        return None, "unsigned int"
    if values.element_size() not in _COPY_T:
        raise TypeError(f"values of dtype {values.dtype} are not supported.")
    return values.contiguous(), _COPY_T[values.element_size()]


def slice_transposed(t_indptr, t_rows, t_values, row_mask, entry_keep=None):
    """CSR of ``A[S, :]^T`` (shape ``(N, M)``) from ``A^T``'s CSR and the kept-row mask.

    Entries of ``A^T`` whose row id ``t_rows[e]`` is not kept are dropped, order preserved.
    A keep bitmap with per-word and per-1024-entry counts replaces the reference's full
    ``nnz``-long cumsum. One host synchronization: the kept count sizes the output.

    Args:
        t_indptr: ``(N+1,)`` int32/int64 row pointers of ``A^T``.
        t_rows: ``(nnz,)`` column ids of ``A^T`` (row ids of ``A``), same dtype.
        t_values: ``(nnz,)`` values of ``A^T`` (any dtype of 2, 4 or 8 bytes) or ``None``.
        row_mask: ``(M,)`` bool, the kept rows ``S`` of ``A``.
        entry_keep: ``(nnz,)`` bool entries kept whatever the row mask says, or ``None``.

    Returns:
        ``(indptr (N+1,), indices (nnz_S,), values (nnz_S,) or None)``, in the input dtypes.
    """
    _check("t_indptr", t_indptr, tuple(_INDEX))
    _check("t_rows", t_rows, (t_indptr.dtype,))
    _check("row_mask", row_mask, (torch.bool,))
    if t_values is not None:
        _check("t_values", t_values)
        if t_values.numel() != t_rows.numel():
            raise ValueError("t_values must have one entry per entry of t_rows.")
    t_indptr, t_rows, row_mask = t_indptr.contiguous(), t_rows.contiguous(), row_mask.contiguous()
    if entry_keep is not None:
        _check("entry_keep", entry_keep, (torch.bool,))
        entry_keep = entry_keep.contiguous()
    t_values, vt = _values_view(t_values)
    it = _INDEX[t_indptr.dtype]
    nnz, n1, device = t_rows.numel(), t_indptr.numel(), t_rows.device
    if nnz == 0:
        vals = None if t_values is None else t_values[:0]
        return torch.zeros_like(t_indptr), t_rows[:0], vals
    nchunks = -(-nnz // 1024)
    bitmap = torch.empty(nchunks * 32, dtype=torch.int32, device=device)
    word_excl = torch.empty(nchunks * 32, dtype=torch.int16, device=device)
    chunk_cnt = torch.empty(nchunks, dtype=torch.int64, device=device)
    warps_grid = -(-nchunks // (_BLOCK // 32))  # a warp per chunk of 1024 entries
    with _Launcher(device) as launch:
        bm, wx = launch.ptr(bitmap), launch.ptr(word_excl)
        launch(f"rsc_keep_bitmap<{it}>", warps_grid, _BLOCK, launch.ptr(t_rows), _i64(nnz),
               launch.ptr(row_mask), launch.ptr(entry_keep), bm, wx, launch.ptr(chunk_cnt),
               _i64(nchunks))  # fmt: skip
        chunk_incl = torch.cumsum(chunk_cnt, 0)
        total = int(chunk_incl[-1])  # host sync: sizes the output
        out_rows = torch.empty(total, dtype=t_rows.dtype, device=device)
        out_vals = None if t_values is None else torch.empty(total, dtype=t_values.dtype,
                                                              device=device)  # fmt: skip
        out_indptr = torch.empty_like(t_indptr)
        ci = launch.ptr(chunk_incl)
        if total:
            launch(f"rsc_compact<{it}, {vt}>", warps_grid, _BLOCK, launch.ptr(t_rows),
                   launch.ptr(t_values), bm, wx, ci, _i64(nchunks), launch.ptr(out_rows),
                   launch.ptr(out_vals))  # fmt: skip
        launch(f"rsc_indptr_from_bitmap<{it}>", -(-n1 // _BLOCK), _BLOCK, launch.ptr(t_indptr),
               _i64(n1), _i64(nnz), bm, wx, ci, _i64(nchunks), launch.ptr(out_indptr))  # fmt: skip
    return out_indptr, out_rows, out_vals
