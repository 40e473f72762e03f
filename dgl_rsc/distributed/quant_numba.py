"""Numba-CUDA kernels of the message codec (the functions of ``quant_ref.CodecKernels``).

On a GPU the functions take CUDA torch tensors (zero-copy, kernels on torch's current stream);
under Numba's simulator (``NUMBA_ENABLE_CUDASIM=1`` before Numba is imported) they take CPU
tensors. Inputs are upcast to float32 by torch first (Numba has no bfloat16 arrays; the
reference does the same ``x.float()``). Quantize+pack is one kernel (32 lanes per row, a
shared-memory min/max reduction), unpack+dequantize another. The kernels follow the torch
reference in ``quant.py`` operation by operation, so the bytes are identical for the same
``u``; ``HUGE`` and ``RESERVED`` come from there (compile-time constants of each kernel).

Float bit patterns go through libdevice's ``float_as_int``/``int_as_float`` on the GPU and
NumPy views in the simulator (which has no libdevice).
"""

from __future__ import annotations

import functools
import math

import numba
import numpy as np
import torch

from ..base import _deps
from .quant_ref import HUGE, RESERVED

cuda = _deps.require_numba_cuda()

__all__ = ["encode_quant", "decode_quant", "encode_bf16", "decode_bf16", "SIMULATOR"]

#: ``True`` when Numba runs kernels in its CPU simulator.
SIMULATOR = bool(numba.config.ENABLE_CUDASIM)
_ROWS = 8  # rows per block of the row kernels (block = 32 x _ROWS threads)
_THREADS = 256

if SIMULATOR:

    def _f2i(v):
        return int(np.float32(v).view(np.int32))

    def _i2f(i):
        return np.int32(i).view(np.float32)

else:  # pragma: no cover - needs a GPU
    from numba.cuda import libdevice

    _f2i = libdevice.float_as_int
    _i2f = libdevice.int_as_float


@cuda.jit(device=True)
def _bf16_grid(v, away):
    """``v`` rounded to the bf16 grid, away from zero when ``away`` (as ``quant.bf16_grid``)."""
    b = _f2i(v)
    lo = b & 0xFFFF
    if lo != 0 and away:
        return _i2f(numba.int32(b - lo + 0x10000))
    return _i2f(numba.int32(b - lo))


@functools.cache
def _encode_kernel(bits: int):
    full, res, per, huge = (1 << bits) - 1, RESERVED[bits], 8 // bits, HUGE

    @cuda.jit
    def kernel(x, u, meta, codes):
        rows, dim, nb = x.shape[0], x.shape[1], codes.shape[1]
        lane, ty = cuda.threadIdx.x, cuda.threadIdx.y
        r = cuda.blockIdx.x * _ROWS + ty
        smin = cuda.shared.array((_ROWS, 32), numba.float32)
        smax = cuda.shared.array((_ROWS, 32), numba.float32)
        sflag = cuda.shared.array((_ROWS, 32), numba.int32)
        mn, mx, flag = numba.float32(math.inf), numba.float32(-math.inf), 0
        if r < rows:
            for j in range(lane, dim, 32):
                v = x[r, j]
                if abs(v) <= huge:
                    mn, mx = min(mn, v), max(mx, v)
                else:
                    flag = 1
        smin[ty, lane], smax[ty, lane], sflag[ty, lane] = mn, mx, flag
        cuda.syncthreads()
        step = 16
        while step > 0:
            if lane < step:
                smin[ty, lane] = min(smin[ty, lane], smin[ty, lane + step])
                smax[ty, lane] = max(smax[ty, lane], smax[ty, lane + step])
                sflag[ty, lane] = max(sflag[ty, lane], sflag[ty, lane + step])
            cuda.syncthreads()
            step //= 2
        if r >= rows:
            return
        mn, mx, special = smin[ty, 0], smax[ty, 0], sflag[ty, 0]
        if mn > mx:
            mn, mx = numba.float32(0.0), numba.float32(0.0)
        mn = mn + numba.float32(0.0)  # -0.0 -> +0.0
        mx = mx + numba.float32(0.0)
        lr = full - res if special else full
        lrf = numba.float32(lr)
        off = _bf16_grid(mn, mn < 0)
        d = mx - off
        s = _bf16_grid(d / lrf, True)
        if s * lrf < d:
            s = _i2f(numba.int32(_f2i(s) + 0x10000))
        if lane == 0:
            meta[r, 0] = _f2i(off) >> 16
            meta[r, 1] = (_f2i(s) >> 16) - (0x8000 if special else 0)
        for k in range(lane, nb, 32):
            byte = 0
            for i in range(per):
                j = k * per + i
                if j < dim:
                    v = x[r, j]
                    if abs(v) <= huge:
                        q = 0
                        if s > 0:  # numba-cuda's floor may return a float: q stays int
                            t = math.floor((v - off) / s + u[r, j])
                            q = numba.int32(min(max(t, 0), lr))
                    else:
                        kind = 0 if v != v else (1 if v > 0 else 2)
                        q = lr + 1 + min(kind, res - 1)
                    byte |= q << (i * bits)
            codes[r, k] = byte

    return kernel


@functools.cache
def _decode_kernel(bits: int):
    full, res, per = (1 << bits) - 1, RESERVED[bits], 8 // bits

    @cuda.jit
    def kernel(meta, codes, out):
        rows, dim = out.shape[0], out.shape[1]
        r = cuda.blockIdx.x * _ROWS + cuda.threadIdx.y
        if r >= rows:
            return
        off = _i2f(numba.int32(int(meta[r, 0]) * 0x10000))
        sc = int(meta[r, 1])
        s = _i2f(numba.int32((sc & 0x7FFF) * 0x10000))
        lr = full - res if sc < 0 else full
        for j in range(cuda.threadIdx.x, dim, 32):
            q = (int(codes[r, j // per]) >> ((j % per) * bits)) & full
            if q > lr:
                kind = q - lr - 1
                out[r, j] = math.inf if kind == 1 else (-math.inf if kind == 2 else math.nan)
            else:
                out[r, j] = off + numba.float32(q) * s

    return kernel


@cuda.jit
def _encode_bf16_kernel(x, u, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        b = _f2i(x[i])
        mag = b & 0x7FFFFFFF
        if mag > 0x7F800000:
            out[i] = 0x7FC0
            return
        hi = 0x7F80
        if mag < 0x7F800000:
            hi = min((mag + int(u[i] * numba.float32(65536.0))) >> 16, 0x7F7F)
        out[i] = hi - 0x8000 if b < 0 else hi


@cuda.jit
def _decode_bf16_kernel(src, out):
    i = cuda.grid(1)
    if i < src.shape[0]:
        out[i] = _i2f(numba.int32(int(src[i]) * 0x10000))


# -- plumbing -----------------------------------------------------------------------------------
def _arr(t: torch.Tensor):
    """Zero-copy Numba view of a contiguous tensor (a NumPy array in the simulator)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}.")
    want = "cpu" if SIMULATOR else "cuda"
    if t.device.type != want:
        raise ValueError(
            f"the numba codec takes {want} tensors here (simulator: {SIMULATOR}); got one on "
            f"{t.device}. Use backend='torch' or 'auto'."
        )
    if not t.is_contiguous():
        raise ValueError("the numba codec needs contiguous tensors.")
    return t.detach().numpy() if SIMULATOR else cuda.as_cuda_array(t.detach(), sync=False)


def _stream(t: torch.Tensor):
    if SIMULATOR:
        return 0
    ptr = torch.cuda.current_stream(t.device).cuda_stream
    return cuda.external_stream(ptr) if ptr else cuda.default_stream()


def encode_quant(x, u, bits, meta, codes) -> None:
    """Quantize and pack ``x (R, D)`` into ``meta (R, 2)`` int16 and ``codes`` uint8."""
    x = x.float().contiguous()
    grid = -(-x.shape[0] // _ROWS)
    _encode_kernel(bits)[grid, (32, _ROWS), _stream(x)](_arr(x), _arr(u), _arr(meta), _arr(codes))


def decode_quant(meta, codes, bits, out) -> None:
    """Unpack and dequantize into ``out (R, D)`` float32."""
    grid = -(-out.shape[0] // _ROWS)
    _decode_kernel(bits)[grid, (32, _ROWS), _stream(out)](_arr(meta), _arr(codes), _arr(out))


def encode_bf16(x, u, out) -> None:
    """Stochastic rounding of ``x (R, D)`` to bf16 patterns ``out (R, D)`` int16."""
    x = x.float().contiguous().view(-1)
    grid = -(-x.numel() // _THREADS)
    _encode_bf16_kernel[grid, _THREADS, _stream(x)](_arr(x), _arr(u.view(-1)), _arr(out.view(-1)))


def decode_bf16(src, out) -> None:
    """bf16 patterns ``src (R, D)`` int16 to ``out (R, D)`` float32."""
    grid = -(-out.numel() // _THREADS)
    _decode_bf16_kernel[grid, _THREADS, _stream(out)](_arr(src.view(-1)), _arr(out.view(-1)))
