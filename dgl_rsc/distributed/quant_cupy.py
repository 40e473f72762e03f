"""CuPy launcher of the message codec kernels (``cuda/quant_kernels.cu``).

The functions of :class:`dgl_rsc.distributed.quant_ref.CodecKernels` on CUDA torch tensors. The
module is compiled once per device by ``cupy.RawModule``; the bit width and the reserved code
count are template arguments and ``quant.HUGE`` a kernel argument (one source for every
constant); kernels run on torch's current stream and read and write torch's memory through
raw device pointers. fp16/bf16/fp64 inputs are read as they are (converted in the kernel, as
the reference's ``x.float()`` does). No host synchronization.
"""

from __future__ import annotations

import numpy as np
import torch

from ..backends import _cuda_source
from .quant_ref import HUGE, QUANT_BITS, RESERVED

__all__ = [
    "encode_quant",
    "decode_quant",
    "encode_bf16",
    "decode_bf16",
    "NAME_EXPRESSIONS",
    "OPTIONS",
]

_SOURCE = "quant_kernels.cu"
_IN_T = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "qz_half",
    torch.bfloat16: "qz_bf16",
}
_ROWS = 8  # rows (warps) per block of the row kernels
_THREADS = 256

OPTIONS = ("-std=c++17",)
#: every instantiation the launcher uses
#: (tests/distributed/test_quant_cuda.py builds them all with nvcc)
NAME_EXPRESSIONS = (
    [f"qz_encode<{t}, {b}, {RESERVED[b]}>" for t in _IN_T.values() for b in QUANT_BITS]
    + [f"qz_decode<{b}, {RESERVED[b]}>" for b in QUANT_BITS]
    + [f"qz_encode_bf16<{t}>" for t in _IN_T.values()]
    + ["qz_decode_bf16"]
)


#: what :func:`~dgl_rsc.backends._cuda_source.launch` compiles
_MODULE = (_SOURCE, OPTIONS, tuple(NAME_EXPRESSIONS))


def _launch(t: torch.Tensor, name: str, grid, block, *args) -> None:
    """Run kernel ``name`` on the device of ``t``, on torch's current stream."""
    _cuda_source.launch(_MODULE, t, name, grid, block, *args)


def _ptr(t: torch.Tensor) -> np.uint64:
    if t.device.type != "cuda":
        raise ValueError(
            f"the cupy codec needs CUDA tensors, got one on {t.device}; use backend='torch'."
        )
    if not t.is_contiguous():
        raise ValueError("the cupy codec needs contiguous tensors.")
    return np.uint64(t.data_ptr())


def _rows_grid(rows: int):
    return (-(-rows // _ROWS),), (32, _ROWS)


def _flat_grid(n: int):
    return (min(-(-n // _THREADS), 65535 * 8),), (_THREADS,)


def encode_quant(x, u, bits, meta, codes) -> None:
    """Quantize and pack ``x (R, D)`` with ``u (R, D)`` into ``meta (R, 2)`` int16 and
    ``codes (R, ceil(D bits / 8))`` uint8 (one kernel)."""
    r, d = x.shape
    name = f"qz_encode<{_IN_T[x.dtype]}, {bits}, {RESERVED[bits]}>"
    _launch(
        x,
        name,
        *_rows_grid(r),
        _ptr(x),
        _ptr(u),
        np.int64(r),
        np.int64(d),
        np.int64(codes.shape[1]),
        np.float32(HUGE),
        _ptr(meta),
        _ptr(codes),
    )


def decode_quant(meta, codes, bits, out) -> None:
    """Unpack and dequantize into ``out (R, D)`` float32 (one kernel)."""
    r, d = out.shape
    _launch(
        out,
        f"qz_decode<{bits}, {RESERVED[bits]}>",
        *_rows_grid(r),
        _ptr(meta),
        _ptr(codes),
        np.int64(r),
        np.int64(d),
        np.int64(codes.shape[1]),
        _ptr(out),
    )


def encode_bf16(x, u, out) -> None:
    """Stochastic rounding of ``x (R, D)`` to bf16 bit patterns ``out (R, D)`` int16."""
    n = x.numel()
    _launch(
        x,
        f"qz_encode_bf16<{_IN_T[x.dtype]}>",
        *_flat_grid(n),
        _ptr(x),
        _ptr(u),
        np.int64(n),
        _ptr(out),
    )


def decode_bf16(src, out) -> None:
    """bf16 bit patterns ``src (R, D)`` int16 to ``out (R, D)`` float32."""
    n = out.numel()
    _launch(out, "qz_decode_bf16", *_flat_grid(n), _ptr(src), np.int64(n), _ptr(out))
