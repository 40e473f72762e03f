"""The torch reference of the codec of :mod:`dgl_rsc.distributed.quant`: the CPU path and the
specification the CUDA kernels (``cuda/quant_kernels.cu``, :mod:`.quant_numba`) are tested
against bit for bit. Vectorized over rows; the random numbers ``u`` come from the caller.
"""

from __future__ import annotations

import types
from typing import Protocol

import torch

from ..quant.rounding import bf16_grid as _bf16_grid
from ..quant.rounding import bf16_scale_up

__all__ = ["HUGE", "QUANT_BITS", "RESERVED", "CodecKernels", "TORCH_KERNELS", "row_ranges"]

HUGE = 2.0**126  #: larger magnitudes (and inf, NaN) make a row special in 2/4/8-bit mode
RESERVED = {2: 1, 4: 3, 8: 3}  #: top codes of a special row: NaN, +inf, -inf (2 bits: NaN)
QUANT_BITS = (2, 4, 8)  #: the widths that quantize (16 is bf16, 32 raw)


class CodecKernels(Protocol):
    """What a codec backend provides: :data:`TORCH_KERNELS`, ``quant_cupy``, ``quant_numba``.

    ``x (R, D)`` contiguous (any of the four float dtypes), ``u (R, D)`` float32; outputs are
    contiguous views into the payload: ``meta (R, 2)`` int16, ``codes (R, ceil(D b / 8))``
    uint8, bf16 patterns ``(R, D)`` int16, decoded ``out (R, D)`` float32.
    """

    def encode_quant(self, x, u, bits: int, meta, codes) -> None: ...
    def decode_quant(self, meta, codes, bits: int, out) -> None: ...
    def encode_bf16(self, x, u, out) -> None: ...
    def decode_bf16(self, src, out) -> None: ...


def _row_frame(x: torch.Tensor):
    """``(specials, special (R,), offset (R,), range (R,))`` of fp32 ``x``: the offset is the
    minimum of the ordinary entries (finite, ``|x| <= HUGE``) rounded down to bf16, the range
    ``max - offset``; ``specials`` is ``(rows, ordinary mask of those rows)`` or None."""
    r, d = x.shape
    if d == 0:
        zero = torch.zeros(r, device=x.device)
        return None, zero.bool(), zero, zero
    mn, mx = torch.aminmax(x, dim=1)  # NaN propagates: a row with NaN is special
    special = ~((mn >= -HUGE) & (mx <= HUGE))
    specials = None
    if bool(special.any()):
        rows = torch.nonzero(special).squeeze(1)
        xs = x[rows]
        ordinary = xs.abs() <= HUGE
        inf = torch.tensor(float("inf"), device=x.device)
        lo, hi = torch.where(ordinary, xs, inf).amin(1), torch.where(ordinary, xs, -inf).amax(1)
        empty = lo > hi  # no ordinary entry at all
        mn[rows], mx[rows] = torch.where(empty, 0.0, lo), torch.where(empty, 0.0, hi)
        specials = (rows, ordinary)
    mn, mx = mn + 0.0, mx + 0.0  # -0.0 -> +0.0, as the kernels do
    off = _bf16_grid(mn, mn < 0)
    return specials, special, off, mx - off


def row_ranges(x: torch.Tensor) -> torch.Tensor:
    """``(R,)`` float32: the range each row is quantized over (``max - offset``, finite
    entries with ``|x| <= HUGE`` only), for the variance model of ``bitwidth``."""
    return _row_frame(x.float())[3]


def _ref_encode_quant(x, u, bits, meta, codes) -> None:
    x = x.float()
    full, res, per = (1 << bits) - 1, RESERVED[bits], 8 // bits
    specials, special, off, d = _row_frame(x)
    lr = torch.where(special, full - res, full).float()
    s = bf16_scale_up(d, lr)
    q = (x - off[:, None]).div_(s[:, None]).add_(u).floor_().clamp_(min=0)
    torch.minimum(q, lr[:, None], out=q)
    if not bool((s > 0).all()):
        q[s == 0] = 0.0  # constant rows (0 / 0 above)
    if specials is not None:  # reserved codes for the special rows' non-ordinary entries
        rows, ordinary = specials
        xs = x[rows]
        kind = torch.where(torch.isnan(xs), 0, torch.where(xs > 0, 1, 2)).clamp_(max=res - 1)
        q[rows] = torch.where(ordinary, q[rows], lr[rows, None] + 1 + kind)
    meta[:, 0] = off.view(torch.int32) >> 16
    meta[:, 1] = (s.view(torch.int32) >> 16) - special.int() * 0x8000
    if codes.numel():
        q = q.to(torch.uint8)
        if q.shape[1] % per:
            q = torch.cat([q, q.new_zeros(q.shape[0], per - q.shape[1] % per)], 1)
        q = q.view(q.shape[0], -1, per)
        packed = q[..., 0].clone()
        for i in range(1, per):  # the entries sharing a byte (not rows): at most 4
            packed |= q[..., i] << (i * bits)
        codes.copy_(packed)


def _ref_decode_quant(meta, codes, bits, out) -> None:
    full, per = (1 << bits) - 1, 8 // bits
    off = (meta[:, 0].int() * 0x10000).view(torch.float32)
    sc = meta[:, 1].int()
    s = ((sc & 0x7FFF) * 0x10000).view(torch.float32)
    q = torch.stack([(codes >> (i * bits)) & full for i in range(per)], -1)
    q = q.view(codes.shape[0], -1)[:, : out.shape[1]]
    torch.addcmul(off[:, None], q.float(), s[:, None], out=out)  # q * s is exact: no rounding
    if bool((sc < 0).any()):  # special rows: their top codes stand for NaN, +inf, -inf
        rows = torch.nonzero(sc < 0).squeeze(1)
        kind = q[rows].int() - (full - RESERVED[bits]) - 1
        value = torch.where(
            kind == 1, float("inf"), torch.where(kind == 2, -float("inf"), float("nan"))
        )
        out[rows] = torch.where(kind >= 0, value, out[rows])


def _ref_encode_bf16(x, u, out) -> None:
    b = x.float().view(torch.int32)
    mag = b & 0x7FFFFFFF
    r = (u * 65536.0).to(torch.int32)
    hi = torch.clamp(mag, max=0x7F7FFFFF).add_(r).bitwise_right_shift_(16).clamp_(max=0x7F7F)
    nonfinite = bool((mag >= 0x7F800000).any())
    if nonfinite:
        hi = torch.where(mag == 0x7F800000, 0x7F80, hi)
    hi.add_(b >> 31, alpha=0x8000)  # the sign: -0x8000 is bit 15 of the int16 pattern
    if nonfinite:
        hi = torch.where(mag > 0x7F800000, 0x7FC0, hi)
    out.copy_(hi)


def _ref_decode_bf16(src, out) -> None:
    out.copy_((src.int() * 0x10000).view(torch.float32))


TORCH_KERNELS = types.SimpleNamespace(
    encode_quant=_ref_encode_quant,
    decode_quant=_ref_decode_quant,
    encode_bf16=_ref_encode_bf16,
    decode_bf16=_ref_decode_bf16,
)
