"""CuPy launcher of the INT8 kernels (``cuda/int8_spmm.cu``): the functions of
:mod:`dgl_rsc.backends.int8_ref` on CUDA torch tensors.

Compiled once per device by ``cupy.RawModule``; kernels run on torch's current stream on raw
device pointers; no host synchronization. ``int8_spmm_acc`` (the bare integers, a debugging
aid) runs the reference on the device.
"""

from __future__ import annotations

import numpy as np
import torch

from . import _cuda_source
from . import int8_ref as ref

__all__ = ["int8_spmm", "int8_spmm_acc", "quantize_codes", "NAME_EXPRESSIONS", "OPTIONS"]

_SOURCE = "int8_spmm.cu"
_INDEX = {torch.int32: "int", torch.int64: "long long"}
_ROWS = 8  # warps (rows) per block
_THREADS = 256

OPTIONS = ("-std=c++17",)
#: every instantiation the launcher uses (tests/backends/test_cuda_compile.py builds them with nvcc)
NAME_EXPRESSIONS = tuple(
    [f"rsc_int8_spmm<{i}, {v}>" for i in _INDEX.values() for v in ("true", "false")]
    + ["rsc_int8_codes<true>", "rsc_int8_codes<false>"]
)

int8_spmm_acc = ref.int8_spmm_acc


#: what :func:`_cuda_source.launch` compiles
_MODULE = (_SOURCE, OPTIONS, NAME_EXPRESSIONS)


def _ptr(t) -> np.uint64:
    if t is None:
        return np.uint64(0)
    if t.device.type != "cuda":
        raise ValueError(f"backend='cupy' needs CUDA tensors, got one on {t.device}.")
    return np.uint64(t.data_ptr())


def _launch(t: torch.Tensor, name: str, grid, block, *args) -> None:  # pragma: no cover
    _cuda_source.launch(_MODULE, t, name, grid, block, *args)


def int8_spmm(indptr, indices, qvals, qX, row_factor, col_scale) -> torch.Tensor:
    """``(M, D)`` fp32, as :func:`dgl_rsc.backends.int8_ref.int8_spmm`."""
    m, d = indptr.numel() - 1, qX.shape[1]
    out = torch.empty((m, d), dtype=torch.float32, device=qX.device)
    if m == 0 or d == 0:
        return out
    indices = indices.to(indptr.dtype).contiguous()
    name = f"rsc_int8_spmm<{_INDEX[indptr.dtype]}, {'true' if qvals is not None else 'false'}>"
    grid = (-(-m // _ROWS),)
    _launch(qX, name, grid, (32, _ROWS), _ptr(indptr.contiguous()), _ptr(indices),
            _ptr(qvals), _ptr(qX.contiguous()), np.int64(m), np.int64(d), _ptr(row_factor),
            _ptr(col_scale.float().contiguous()), _ptr(out))  # fmt: skip
    return out


def quantize_codes(x, s, rounding: str, seed: int) -> torch.Tensor:
    """As :func:`dgl_rsc.quant.rounding.torch_codes`."""
    q = torch.empty(x.shape, dtype=torch.int8, device=x.device)
    n = x.numel()
    if n:
        s = s.float().contiguous()
        name = f"rsc_int8_codes<{'true' if rounding == 'stochastic' else 'false'}>"
        grid = (min(-(-n // _THREADS), 65535),)
        _launch(x, name, grid, (_THREADS,), _ptr(x.contiguous()), np.int64(x.shape[0]),
                np.int64(x.shape[1]), _ptr(s), np.int64(s.shape[0]), np.int64(s.shape[1]),
                np.uint32(int(seed) & 0xFFFFFFFF), _ptr(q))  # fmt: skip
    return q
