"""Numba-CUDA kernels of the INT8 product and codes (the functions of
:mod:`dgl_rsc.backends.int8_ref`).

On a GPU the functions take CUDA torch tensors; under Numba's simulator
(``NUMBA_ENABLE_CUDASIM=1`` before Numba is imported) they take CPU tensors, which is how the
tests check them against the reference. The product is a warp per row with int32
accumulators and the fused dequantize (as ``cuda/int8_spmm.cu``); the codes kernel is one
thread per entry with the same ``lowbias32`` hash.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch

from ..base import _deps
from . import int8_ref as ref

cuda = _deps.require_numba_cuda()

__all__ = ["int8_spmm", "int8_spmm_acc", "quantize_codes", "SIMULATOR"]

SIMULATOR = bool(numba.config.ENABLE_CUDASIM)
_ROWS = 4
_THREADS = 128

int8_spmm_acc = ref.int8_spmm_acc


@cuda.jit
def _spmm_kernel(indptr, indices, qvals, has_vals, qx, row_factor, has_rf, col_scale, out):
    rows, dim = out.shape[0], out.shape[1]
    r = cuda.blockIdx.x * _ROWS + cuda.threadIdx.y
    if r >= rows:
        return
    for f in range(cuda.threadIdx.x, dim, 32):
        acc = numba.int32(0)
        for e in range(indptr[r], indptr[r + 1]):
            v = numba.int32(qvals[e]) if has_vals else numba.int32(1)
            acc += v * numba.int32(qx[indices[e], f])
        y = numba.float32(acc) * col_scale[f]
        out[r, f] = y * row_factor[r] if has_rf else y


@cuda.jit(device=True)
def _lowbias32(x):
    m = numba.uint64(0xFFFFFFFF)
    x = x ^ (x >> numba.uint64(16))
    x = (x * numba.uint64(0x7FEB352D)) & m
    x = x ^ (x >> numba.uint64(15))
    x = (x * numba.uint64(0x846CA68B)) & m
    return x ^ (x >> numba.uint64(16))


@cuda.jit
def _codes_kernel(x, s, stochastic, seed, q):
    rows, cols = x.shape[0], x.shape[1]
    i = cuda.grid(1)
    if i >= rows * cols:
        return
    r, c = i // cols, i % cols
    sr = r if s.shape[0] > 1 else 0
    sc = c if s.shape[1] > 1 else 0
    sv = s[sr, sc]
    v = x[r, c] / (sv if sv > 0 else numba.float32(1.0))
    # NaN -> 0 and the clamp come first here (the same codes: both commute with the
    # rounding), so that math.floor/round never see NaN or Inf (the simulator's raise)
    if v != v:
        v = numba.float32(0.0)
    v = min(max(v, numba.float32(-127.0)), numba.float32(127.0))
    if stochastic:
        h = _lowbias32(_lowbias32(numba.uint64(i) & numba.uint64(0xFFFFFFFF)) ^ seed)
        u = numba.float32(h >> numba.uint64(8)) * numba.float32(2.0**-24)
        v = numba.float32(math.floor(v + u))
    else:
        v = numba.float32(round(v))  # half to even, as torch.round
    q[r, c] = min(v, numba.float32(127.0))  # 127 + u can round up to 128


def _arr(t: torch.Tensor):
    want = "cpu" if SIMULATOR else "cuda"
    if t.device.type != want:
        raise ValueError(
            f"backend='numba' takes {want} tensors here (simulator: {SIMULATOR}); got one on "
            f"{t.device}. Use backend='torch' or 'auto'."
        )
    t = t.detach().contiguous()
    return t.numpy() if SIMULATOR else cuda.as_cuda_array(t, sync=False)


def int8_spmm(indptr, indices, qvals, qX, row_factor, col_scale) -> torch.Tensor:
    """``(M, D)`` fp32, as :func:`dgl_rsc.backends.int8_ref.int8_spmm`."""
    m, d = indptr.numel() - 1, qX.shape[1]
    out = torch.empty((m, d), dtype=torch.float32, device=qX.device)
    if m == 0 or d == 0:
        return out
    dummy8 = torch.zeros(1, dtype=torch.int8, device=qX.device)
    dummyf = torch.ones(1, dtype=torch.float32, device=qX.device)
    qv = qvals if qvals is not None else dummy8
    rf = row_factor if row_factor is not None else dummyf
    _spmm_kernel[-(-m // _ROWS), (32, _ROWS)](
        _arr(indptr), _arr(indices), _arr(qv), qvals is not None, _arr(qX), _arr(rf),
        row_factor is not None, _arr(col_scale.float()), _arr(out),
    )  # fmt: skip
    return out


def quantize_codes(x, s, rounding: str, seed: int) -> torch.Tensor:
    """As :func:`dgl_rsc.quant.rounding.torch_codes`."""
    q = torch.empty(x.shape, dtype=torch.int8, device=x.device)
    n = x.numel()
    if n:
        _codes_kernel[-(-n // _THREADS), _THREADS](
            _arr(x), _arr(s.float()), rounding == "stochastic",
            np.uint64(int(seed) & 0xFFFFFFFF), _arr(q),
        )  # fmt: skip
    return q
