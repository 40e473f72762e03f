"""Scale rounding and counter-based random numbers, written so that a CUDA kernel can
reproduce them bit for bit.

* :func:`bf16_grid` and :func:`bf16_scale_up`: a quantization step ``s`` for a span ``d``
  over ``L`` levels is ``d / L`` rounded *up* to the bfloat16 grid, one bf16 step more when
  ``s * L`` still falls short of ``d`` (so ``|x| / s <= L`` holds after fp32 rounding and no
  code is ever clamped away from its value). The halo codec stores ``s`` as bf16; the INT8
  products keep it in fp32, where a bf16-grid ``s`` (8 significant bits) makes ``q * s``
  exact for ``|q| < 256``.
* :func:`hash_uniform`: ``u in [0, 1)`` for stochastic rounding from a 32-bit seed and the
  element's flat index, through Wellons' ``lowbias32`` integer hash (two rounds). Every step is
  a 32-bit unsigned operation (xor, shift, multiply modulo ``2^32``), emulated here in int64
  with the 32x32-bit product split into two 32x16-bit halves, so no int64 product overflows.
  The CUDA version is ``rsc_lowbias32`` in ``cuda/int8_spmm.cu``.
* :func:`torch_codes`: the int8 codes of ``x`` for given scales, nearest or stochastic (the
  reference of every INT8 kernel module's ``quantize_codes``, :mod:`dgl_rsc.int8.quantize`).

>>> hex(lowbias32(1))
'0x688990c0'
>>> bf16_scale_up(torch.tensor([1.0]), 127.0)
tensor([0.0079])
"""

from __future__ import annotations

import torch

__all__ = ["MASK32", "QMAX", "bf16_grid", "bf16_scale_up", "lowbias32", "hash_uniform",
           "stream_seed", "torch_codes"]  # fmt: skip

QMAX = 127  #: int8 codes are symmetric in [-QMAX, QMAX] (-128 is never used)

MASK32 = 0xFFFFFFFF
_C1, _C2 = 0x7FEB352D, 0x846CA68B  # lowbias32's multipliers
_U24 = 2.0**-24


def bf16_grid(v: torch.Tensor, up) -> torch.Tensor:
    """fp32 ``v`` rounded to bf16 (low 16 bits cleared), away from zero where ``up``."""
    b = v.contiguous().view(torch.int32)
    lo = b & 0xFFFF
    return torch.where((lo != 0) & up, b - lo + 0x10000, b - lo).view(torch.float32)


def bf16_scale_up(span: torch.Tensor, levels) -> torch.Tensor:
    """The step for ``span`` (fp32, ``>= 0``) over ``levels`` (fp32 tensor or number): ``span
    / levels`` rounded up to bf16, one bf16 step more where ``s * levels < span``."""
    s = bf16_grid(span / levels, True)
    short = s * levels < span
    return torch.where(short, (s.view(torch.int32) + 0x10000).view(torch.float32), s)


def _mul32(x, c: int):
    """``x * c mod 2^32`` for ``0 <= x < 2^32`` (int64 tensor or int), no int64 overflow."""
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & MASK32


def lowbias32(x):
    """Wellons' ``lowbias32`` hash of ``x`` (an int in ``[0, 2^32)`` or an int64 tensor of
    them): ``x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16``."""
    x = x ^ (x >> 16)
    x = _mul32(x, _C1)
    x = x ^ (x >> 15)
    x = _mul32(x, _C2)
    return x ^ (x >> 16)


def stream_seed(*parts: int) -> int:
    """One 32-bit seed from integers (a run seed, a layer id, a call counter), by chained
    hashing; any change of a part changes the seed."""
    h = 0x9E3779B9
    for p in parts:
        h = lowbias32((h ^ (int(p) & MASK32)) & MASK32)
    return h


def hash_uniform(seed: int, numel: int, device=None) -> torch.Tensor:
    """``(numel,)`` float32 in ``[0, 1)`` (24-bit): element ``i`` gets
    ``(lowbias32(lowbias32(i mod 2^32) ^ seed) >> 8) * 2^-24``."""
    i = torch.arange(numel, dtype=torch.int64, device=device) & MASK32
    h = lowbias32(lowbias32(i) ^ (int(seed) & MASK32))
    return (h >> 8).to(torch.float32) * _U24


def torch_codes(x: torch.Tensor, s: torch.Tensor, rounding: str, seed: int) -> torch.Tensor:
    """The codes of fp32 ``x (R, C)`` for scales ``s`` (broadcastable: ``(R, 1)``,
    ``(1, C)`` or ``(1, 1)``): the reference of every kernel module's ``quantize_codes``."""
    v = x / torch.where(s > 0, s, 1.0)
    if rounding == "nearest":
        v = torch.round(v)
    else:
        v = (v + hash_uniform(seed, x.numel(), x.device).view(x.shape)).floor_()
    v = torch.nan_to_num_(v, nan=0.0).clamp_(-QMAX, QMAX)
    return v.to(torch.int8)
