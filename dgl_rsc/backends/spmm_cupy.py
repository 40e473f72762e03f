"""The forward sparse-dense product on CUDA (``cuda/spmm_forward.cu``), degree scaling and bias
fused: ``out = rf[:, None] * (A_cf @ X) + bias`` where ``A_cf[r, j] = v_rj * cf[j]``.

The work is planned once per matrix (:func:`plan`, cached by the caller with the matrix): rows
of at most ``chunk`` entries are one work item each, longer rows are cut into items whose fp32
partial sums a second kernel adds in order (no atomics, the same bits on every run); items run
longest first. :func:`plan_reference` computes the same thing item by item with torch, so the
plan's logic is tested on any machine; :func:`reference` is the plain product in float64.

Example (CPU, the reference of the planned kernel):
    >>> import torch
    >>> indptr = torch.tensor([0, 2, 3, 3]); indices = torch.tensor([0, 2, 1])
    >>> X = torch.arange(12.0).reshape(3, 4)
    >>> p = plan(indptr, chunk=1)
    >>> out = plan_reference(p, indices, None, X, bias=torch.ones(4))
    >>> torch.equal(out, reference(indptr, indices, None, X, bias=torch.ones(4)).float())
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from . import _cuda_source

__all__ = ["Plan", "plan", "reference", "plan_reference", "spmm_forward", "supported",
           "NAME_EXPRESSIONS", "OPTIONS"]  # fmt: skip

_SOURCE = "spmm_forward.cu"
_INDEX = {torch.int32: "int", torch.int64: "long long"}
_TYPE = {torch.float32: "float", torch.bfloat16: "rsc_fwd_bf16"}
_VEC = {torch.float32: 4, torch.bfloat16: 8}  # features per 16-byte load
_NV = (1, 2, 4)
_WARPS = 8  # items (warps) per block
CHUNK = 512  # entries per work item of a long row

OPTIONS = ("-std=c++17",)
#: every instantiation the launcher uses (tests/backends/test_cuda_compile.py builds them with nvcc)
NAME_EXPRESSIONS = tuple(
    [f"rsc_spmm_fwd<{i}, {t}, {nv}>" for i in _INDEX.values() for t in _TYPE.values() for nv in _NV]
    + [f"rsc_spmm_fwd_reduce<{t}>" for t in _TYPE.values()]
)
_MODULE = (_SOURCE, OPTIONS, NAME_EXPRESSIONS)


@dataclass(frozen=True)
class Plan:
    """The work items of one CSR matrix (all tensors on the matrix's device).

    Attributes:
        row, start, len, slot: ``(items,)`` each: the item's row, first entry, entry count and
            workspace row (``-1``: a whole row, written directly), longest items first.
        long_row: ``(L,)`` the rows cut into several items; ``first_slot (L + 1,)`` their
            workspace rows ``first_slot[h] : first_slot[h + 1]``, in entry order.
        rows: the matrix's row count; slots: the workspace's row count.
    """

    row: torch.Tensor
    start: torch.Tensor
    len: torch.Tensor
    slot: torch.Tensor
    long_row: torch.Tensor
    first_slot: torch.Tensor
    rows: int
    slots: int


def plan(indptr: torch.Tensor, chunk: int = CHUNK) -> Plan:
    """The work items of the CSR with row pointers ``indptr (M + 1,)``."""
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1, got {chunk}.")
    dev = indptr.device
    ptr = indptr.long()
    deg = ptr[1:] - ptr[:-1]
    m = deg.numel()
    pieces = torch.clamp((deg + chunk - 1) // chunk, min=1)  # an empty row is one empty item
    is_long = pieces > 1
    long_row = torch.nonzero(is_long).flatten()
    # the items of long rows: piece k of row r covers [ptr[r] + k * chunk, ...)
    n_long = pieces[long_row]
    first_slot = torch.zeros(long_row.numel() + 1, dtype=torch.long, device=dev)
    torch.cumsum(n_long, 0, out=first_slot[1:])
    slots = int(first_slot[-1])
    owner = torch.repeat_interleave(torch.arange(long_row.numel(), device=dev), n_long)
    k = torch.arange(slots, device=dev) - first_slot[owner]
    l_row = long_row[owner]
    l_start = ptr[l_row] + k * chunk
    l_len = torch.minimum(ptr[l_row + 1] - l_start, torch.full_like(l_start, chunk))
    s_row = torch.nonzero(~is_long).flatten()
    length = torch.cat([l_len, deg[s_row]])
    order = torch.argsort(length, descending=True, stable=True)
    slot = torch.cat([torch.arange(slots, device=dev), torch.full_like(s_row, -1)])
    return Plan(
        row=torch.cat([l_row, s_row])[order].int(),
        start=torch.cat([l_start, ptr[s_row]])[order],
        len=length[order].int(),
        slot=slot[order].int(),
        long_row=long_row.int(),
        first_slot=first_slot.int(),
        rows=m,
        slots=slots,
    )


def _edge_weights(indices, vals, cf, nnz, device) -> torch.Tensor:
    w = torch.ones(nnz, device=device) if vals is None else vals.float()
    return w if cf is None else w * cf.float()[indices.long()]


def reference(indptr, indices, vals, X, cf=None, rf=None, bias=None) -> torch.Tensor:
    """``(M, D)`` float64: the product the kernel computes, as a plain sum."""
    m = indptr.numel() - 1
    rows = torch.repeat_interleave(torch.arange(m), (indptr[1:] - indptr[:-1]).long().cpu())
    cpu = [None if t is None else t.cpu() for t in (indices, vals, cf)]
    w = _edge_weights(*cpu, indices.numel(), "cpu").double()
    out = torch.zeros((m, X.shape[1]), dtype=torch.float64)
    out.index_add_(0, rows, w[:, None] * X.cpu().double()[indices.cpu().long()])
    if rf is not None:
        out *= rf.cpu().double()[:, None]
    return out if bias is None else out + bias.cpu().double()


def plan_reference(p: Plan, indices, vals, X, cf=None, rf=None, bias=None) -> torch.Tensor:
    """``(M, D)`` in ``X``'s dtype: the kernel's item-by-item arithmetic (fp32 partials, long
    rows reduced from their workspace rows in order, then ``rf`` and ``bias``), with torch."""
    dev, d = X.device, X.shape[1]
    w = _edge_weights(indices, vals, cf, indices.numel(), dev)
    item_of = torch.repeat_interleave(torch.arange(p.row.numel(), device=dev), p.len.long())
    ends = torch.cumsum(p.len.long(), 0)
    entry = torch.arange(int(ends[-1]) if ends.numel() else 0, device=dev)
    entry = entry - (ends - p.len.long())[item_of] + p.start[item_of]
    part = torch.zeros((p.row.numel(), d), dtype=torch.float32, device=dev)
    part.index_add_(0, item_of, w[entry, None] * X.float()[indices[entry].long()])
    out = torch.zeros((p.rows, d), dtype=torch.float32, device=dev)
    whole = p.slot < 0
    out[p.row[whole].long()] = part[whole]
    if p.slots:
        work = torch.empty((p.slots, d), dtype=torch.float32, device=dev)
        work[p.slot[~whole].long()] = part[~whole]
        owner = torch.repeat_interleave(torch.arange(p.long_row.numel(), device=dev),
                                        (p.first_slot[1:] - p.first_slot[:-1]).long())  # fmt: skip
        sums = torch.zeros((p.long_row.numel(), d), dtype=torch.float32, device=dev)
        out[p.long_row.long()] = sums.index_add_(0, owner, work)
    if rf is not None:
        out *= rf.float()[:, None]
    if bias is not None:
        out += bias.float()
    return out.to(X.dtype)


def supported(X: torch.Tensor) -> bool:
    """Whether the kernel takes ``X``: CUDA, fp32 or bf16, contiguous, width a multiple of
    its 16-byte vector, 16-byte aligned."""
    return (X.is_cuda and X.dtype in _VEC and X.dim() == 2 and X.is_contiguous()
            and X.shape[1] % _VEC[X.dtype] == 0 and X.data_ptr() % 16 == 0)  # fmt: skip


def _ptr(t) -> np.uint64:
    return np.uint64(0) if t is None else np.uint64(t.data_ptr())


def spmm_forward(indptr, indices, vals, X, cf=None, rf=None, bias=None,
                 p: Optional[Plan] = None) -> torch.Tensor:  # fmt: skip
    """``(M, D)`` in ``X``'s dtype on ``X``'s device: ``rf * (A_cf @ X) + bias``.

    Args:
        indptr, indices: the CSR of ``A (M, N)`` (int32 or int64, one dtype); ``vals (nnz,)``
            fp32 or None (all ones). ``X (N, D)``: see :func:`supported`.
        cf (N,), rf (M,), bias (D,): fp32 factors, each optional. p: :func:`plan` of ``indptr``
            (computed here when None; cache it with the matrix).
    """
    if not supported(X):
        raise ValueError(f"spmm_forward takes a contiguous CUDA fp32 or bf16 X whose width is a "
                         f"multiple of {_VEC.get(X.dtype, 4)}; got {X.dtype} {tuple(X.shape)} on "
                         f"{X.device}. Use torch.sparse.mm for other inputs.")  # fmt: skip
    p = plan(indptr) if p is None else p
    d = X.shape[1]
    out = torch.empty((p.rows, d), dtype=X.dtype, device=X.device)
    if p.rows == 0 or d == 0:
        return out
    work = torch.empty((max(p.slots, 1), d), dtype=torch.float32, device=X.device)
    vec = _VEC[X.dtype]
    nv = next((n for n in _NV if 32 * vec * n >= d), _NV[-1])
    indices = indices.contiguous()
    f32 = [None if t is None else t.float().contiguous() for t in (vals, cf, rf, bias)]
    vals, cf, rf, bias = f32
    items = p.row.numel()
    name = f"rsc_spmm_fwd<{_INDEX[indices.dtype]}, {_TYPE[X.dtype]}, {nv}>"
    _cuda_source.launch(_MODULE, X, name, (-(-items // _WARPS),), (32, _WARPS), _ptr(indices),
                        _ptr(vals), _ptr(X), np.int64(d), _ptr(cf), _ptr(rf), _ptr(bias),
                        _ptr(p.row), _ptr(p.start), _ptr(p.len), _ptr(p.slot), np.int64(items),
                        _ptr(out), _ptr(work))  # fmt: skip
    n_long = p.long_row.numel()
    if n_long:
        name = f"rsc_spmm_fwd_reduce<{_TYPE[X.dtype]}>"
        _cuda_source.launch(_MODULE, X, name, (-(-n_long // _WARPS),), (32, _WARPS), _ptr(work),
                            np.int64(d), _ptr(p.long_row), _ptr(p.first_slot), np.int64(n_long),
                            _ptr(rf), _ptr(bias), _ptr(out))  # fmt: skip
    return out
