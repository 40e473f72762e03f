"""Message codec for the halo exchange: AdaQP-style stochastic quantization of rows.

A message is ``x (R, D)``, one row per node. :func:`encode` turns it into one uint8 tensor,
:func:`decode` turns that back into ``(R, D)`` in the input dtype (or ``dtype=``). Bit widths:

* 2, 4, 8: per row an offset ``o`` and a scale ``s``, 16 bits each, and per entry the code
  ``q = floor((x - o) / s + u)``, ``u ~ U[0, 1)``, in ``[0, 2^b - 1]``; decoded ``o + q s``.
  ``o`` and ``s`` are **bfloat16** (fp32's exponent range, so rows near 1e30 or 1e-30 work;
  fp16 overflows at 65504): ``o`` is the row minimum rounded down, ``s = (max - o) / (2^b - 1)``
  rounded up (one bf16 step more if ``s (2^b - 1)`` still falls short of ``max - o``), and both
  sides use exactly these values, so every code is in range and ``E[decode] = x`` up to fp32
  rounding. Per-entry variance ``<= s^2 / 4``. A constant row (``s = 0``) is exact.
* 16: bfloat16 with stochastic rounding (``u`` decides between the two neighbours), unbiased
  like the quantized widths. A finite value never becomes inf: above bf16's largest finite
  value (3.39e38) it rounds down to it. NaN is sent as the canonical NaN.
* 32: the fp32 bytes, exact.

The codec works on ``x.float()``: fp16 and bf16 exactly, fp64 rounded, with values beyond
fp32's range becoming +-inf as in a fp32 exchange. Decoding to fp16/bf16 rounds to nearest
(unbiased up to half an ulp of that dtype; ask for ``dtype=torch.float32`` to avoid it) and
saturates finite values at the dtype's largest finite value instead of overflowing to inf.

Non-finite values (2/4/8 bits): a row holding NaN, +-inf or a finite ``|x| > HUGE`` (2^126,
4x below fp32's overflow) is *special*: the top ``RESERVED[b]`` codes mark those entries and
the other entries are quantized, still unbiased, on the remaining ``2^b - 1 - RESERVED[b]``
steps; the sign bit of the scale flags the row. With 4 and 8 bits the receiver gets NaN, +inf
and -inf (``|x| > HUGE`` as +-inf) in the same positions; with 2 bits every such entry
becomes NaN. The message size never depends on the data.

Wire format (little-endian): a message is one *section* per group of rows, each
:func:`payload_bytes` long, zero-padded to a multiple of 16 bytes:

* header, 16 bytes: ``b"QZ"``, version (1), bits, rows (u32), dim (u32), group index (u16),
  group count (u16);
* bits 2/4/8: per row ``(offset, scale)`` as two bf16 bit patterns (scale bit 15: special
  row), then per row ``ceil(D b / 8)`` code bytes; entry ``j`` sits in byte ``j // (8 / b)``
  at bit ``(j % (8 / b)) * b`` (first entry in the lowest bits), unused high bits are 0;
* bits 16: ``R D`` bf16 bit patterns; bits 32: ``R D`` float32.

Randomness: ``u`` is drawn with ``torch.rand(generator=...)`` on the input's device and handed
to the kernels, so the torch, CuPy and Numba paths give the same bytes for the same ``u``.

>>> x = torch.tensor([[0.0, 1.0, 2.0, 3.0], [5.0, 5.0, 5.0, 5.0]])
>>> p = encode(x, 2, generator=torch.Generator().manual_seed(0))
>>> p.nbytes == payload_bytes(2, 4, 2) == 32
True
>>> decode(p)
tensor([[0., 1., 2., 3.],
        [5., 5., 5., 5.]])
"""

from __future__ import annotations

import dataclasses
import numbers
import struct
from typing import Optional, Sequence

import torch

from ..base import _deps
from .quant_ref import HUGE, QUANT_BITS, RESERVED, TORCH_KERNELS, CodecKernels
from .quant_ref import row_ranges as _row_ranges

__all__ = [
    "BITS",
    "QUANT_BITS",
    "BACKENDS",
    "HUGE",
    "RESERVED",
    "HEADER_BYTES",
    "ALIGN",
    "Layout",
    "Packed",
    "encode",
    "encode_groups",
    "decode",
    "payload_bytes",
    "row_ranges",
    "group_order",
    "resolve_backend",
    "check_bits",
    "CodecKernels",
]

BITS = (2, 4, 8, 16, 32)
BACKENDS = ("auto", "torch", "cupy", "numba")
HEADER_BYTES = 16
ALIGN = 16
_MAGIC, _VERSION = b"QZ", 1
_HEADER = struct.Struct("<2sBBIIHH")
_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


# -- sizes and layout ---------------------------------------------------------------------------
def check_bits(bits, name: str = "bits") -> int:
    """``bits`` as an int, or a ``ValueError`` naming ``name`` and the allowed widths."""
    if isinstance(bits, bool) or not isinstance(bits, numbers.Integral) or bits not in BITS:
        raise ValueError(
            f"{name} must be one of {BITS} (2/4/8 quantized, 16 bf16, 32 raw); got {bits!r}."
        )
    return int(bits)


def payload_bytes(rows: int, dim: int, bits: int) -> int:
    """Exact size in bytes of one encoded group of ``rows x dim`` at ``bits`` (header and
    padding included), without encoding anything. A message of several groups is the sum.

    >>> [payload_bytes(1000, 256, b) for b in BITS]
    [68016, 132016, 260016, 512016, 1024016]
    """
    check_bits(bits)
    if rows < 0 or dim < 0 or rows >= 2**32 or dim >= 2**32:
        raise ValueError(f"rows and dim must be in [0, 2^32); got rows={rows}, dim={dim}.")
    if bits in QUANT_BITS:
        body = rows * (4 + -(-dim * bits // 8))
    else:
        body = rows * dim * (bits // 8)
    return -(-(HEADER_BYTES + body) // ALIGN) * ALIGN


@dataclasses.dataclass(frozen=True)
class Layout:
    """Which rows of a message are sent at which bit width: consecutive groups of
    ``rows[g]`` rows at ``bits[g]`` bits, ``dim`` features each. Sender and receiver can
    build it from the same plan (no header read needed) or read it with :meth:`from_payload`.
    """

    dim: int
    rows: tuple
    bits: tuple

    def __post_init__(self):
        rows, bits = tuple(int(r) for r in self.rows), tuple(self.bits)
        if len(rows) != len(bits):
            raise ValueError(
                f"group_rows has {len(rows)} entries but group_bits has "
                f"{len(bits)}; give one bit width per group."
            )
        if len(rows) >= 2**16:
            raise ValueError(f"at most 65535 groups per message; got {len(rows)}.")
        if any(r < 0 for r in rows):
            raise ValueError(f"group_rows must be non-negative; got {rows}.")
        object.__setattr__(self, "rows", rows)
        object.__setattr__(
            self, "bits", tuple(check_bits(b, f"group_bits[{g}]") for g, b in enumerate(bits))
        )
        object.__setattr__(self, "dim", int(self.dim))

    @property
    def num_rows(self) -> int:
        return sum(self.rows)

    @property
    def nbytes(self) -> int:
        return sum(payload_bytes(r, self.dim, b) for r, b in zip(self.rows, self.bits))

    def sections(self):
        """Yield ``(group, first_row, rows, bits, byte_start)`` per group."""
        row = start = 0
        for g, (r, b) in enumerate(zip(self.rows, self.bits)):
            yield g, row, r, b, start
            row, start = row + r, start + payload_bytes(r, self.dim, b)

    def header(self, group: int) -> bytes:
        r, b = self.rows[group], self.bits[group]
        return _HEADER.pack(_MAGIC, _VERSION, b, r, self.dim, group, len(self.rows))

    @classmethod
    def from_payload(cls, payload: torch.Tensor) -> Layout:
        """Read the layout from the section headers (one small device-to-host copy per group)."""
        dim, rows, bits, start, count = None, [], [], 0, 1
        while len(rows) < count:
            raw = bytes(payload[start : start + HEADER_BYTES].cpu().tolist())
            if len(raw) < HEADER_BYTES or raw[:2] != _MAGIC:
                raise ValueError(
                    f"no quant message header at byte {start}: the payload is "
                    "truncated or was not made by encode()."
                )
            _, ver, b, r, d, g, count = _HEADER.unpack(raw)
            if ver != _VERSION or g != len(rows) or (dim is not None and d != dim):
                raise ValueError(
                    f"inconsistent header at byte {start} (version {ver}, group {g}, dim {d})."
                )
            dim = d
            rows.append(r)
            bits.append(b)
            start += payload_bytes(r, d, b)
        return cls(dim, tuple(rows), tuple(bits))


@dataclasses.dataclass(frozen=True, eq=False)
class Packed:
    """An encoded message: ``payload (nbytes,)`` uint8, its layout, the dtype to decode to."""

    payload: torch.Tensor
    layout: Layout
    dtype: torch.dtype = torch.float32

    @property
    def nbytes(self) -> int:
        return self.layout.nbytes


def group_order(group_id: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, tuple]:
    """Rows sorted by group (stable) and the row count per group, for :func:`encode_groups`.

    ``x[order]`` is encoded; ``decoded[inverse]`` with ``inverse = argsort(order)`` restores
    the original row order. One host synchronization (the counts).

    >>> group_order(torch.tensor([1, 0, 1, 2]), 3)
    (tensor([1, 0, 2, 3]), (1, 2, 1))
    """
    counts = torch.bincount(group_id.long(), minlength=num_groups)
    if counts.numel() != num_groups:
        raise ValueError(f"group_id holds ids >= num_groups ({num_groups}).")
    order = torch.sort(group_id.long(), stable=True).indices
    return order, tuple(int(c) for c in counts.tolist())


# -- dispatch -----------------------------------------------------------------------------------
def _load_cupy(device):
    if device.type != "cuda":
        raise ValueError(
            f"backend='cupy' needs CUDA tensors, got tensors on {device}; use "
            "backend='torch' or 'auto'."
        )
    _deps.require_cupy()
    from . import quant_cupy

    return quant_cupy


def _load_numba(device):
    _deps.require_numba_cuda()
    from . import quant_numba

    return quant_numba


def _auto(device):
    if device.type == "cuda" and _deps.cupy_available():
        return _load_cupy(device)
    if device.type == "cuda" and _deps.numba_cuda_available():
        return _load_numba(device)
    return TORCH_KERNELS


_LOADERS = {
    "auto": _auto,
    "torch": lambda device: TORCH_KERNELS,
    "cupy": _load_cupy,
    "numba": _load_numba,
}


def resolve_backend(name: str, device) -> CodecKernels:
    """The kernels for ``name`` on ``device``. ``"auto"``: torch for CPU tensors; for CUDA
    tensors CuPy if it works, else Numba-CUDA, else torch. A named backend that cannot run
    raises an ``ImportError``/``ValueError`` that says what is missing."""
    if name not in _LOADERS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}.")
    return _LOADERS[name](torch.device(device))


# -- encode / decode ----------------------------------------------------------------------------
def _check_x(x) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}.")
    if x.dim() != 2:
        raise ValueError(
            f"x must be 2-D (rows, features); got shape {tuple(x.shape)}. "
            "Reshape it, e.g. x.reshape(len(x), -1)."
        )
    if x.dtype not in _FLOATS:
        raise TypeError(f"x must be float32, float64, float16 or bfloat16; got {x.dtype}.")
    return x.detach().contiguous()


def _rand(shape, generator, device) -> torch.Tensor:
    if generator is not None and generator.device.type != device.type:
        raise ValueError(
            f"generator is on {generator.device} but x is on {device}; pass "
            f"torch.Generator(device={str(device)!r})."
        )
    return torch.rand(shape, generator=generator, device=device, dtype=torch.float32)


def _encode_group(kernels, x, bits, body, generator) -> int:
    """Encode ``x (R, D)`` into ``body``; returns the bytes written."""
    (r, d), device = x.shape, x.device
    if bits == 32:
        body[: r * d * 4].view(torch.float32).view(r, d).copy_(x)
        return r * d * 4
    u = _rand((r, d), generator, device)
    if bits == 16:
        if r * d:
            kernels.encode_bf16(x, u, body[: r * d * 2].view(torch.int16).view(r, d))
        return r * d * 2
    rb = -(-d * bits // 8)
    if r:
        meta = body[: 4 * r].view(torch.int16).view(r, 2)
        kernels.encode_quant(x, u, bits, meta, body[4 * r : r * (4 + rb)].view(r, rb))
    return r * (4 + rb)


def encode_groups(
    x,
    group_rows: Sequence[int],
    group_bits: Sequence[int],
    *,
    generator: Optional[torch.Generator] = None,
    backend: str = "auto",
) -> Packed:
    """Encode consecutive row groups of ``x (R, D)``, group ``g`` (``group_rows[g]`` rows) at
    ``group_bits[g]`` bits, into one payload. Sort rows by group first with
    :func:`group_order` when groups are not contiguous. ``u`` is drawn group by group."""
    x = _check_x(x)
    layout = Layout(x.shape[1], tuple(group_rows), tuple(group_bits))
    if layout.num_rows != x.shape[0]:
        raise ValueError(f"group_rows sum to {layout.num_rows} but x has {x.shape[0]} rows.")
    kernels = resolve_backend(backend, x.device)
    payload = torch.empty(layout.nbytes, dtype=torch.uint8, device=x.device)
    with torch.no_grad():
        for g, row, rows, bits, start in layout.sections():
            section = payload[start : start + payload_bytes(rows, layout.dim, bits)]
            header = torch.tensor(list(layout.header(g)), dtype=torch.uint8)
            section[:HEADER_BYTES].copy_(header, non_blocking=True)
            used = _encode_group(
                kernels, x[row : row + rows], bits, section[HEADER_BYTES:], generator
            )
            section[HEADER_BYTES + used :].zero_()
    return Packed(payload, layout, x.dtype)


def encode(
    x, bits: int, *, generator: Optional[torch.Generator] = None, backend: str = "auto"
) -> Packed:
    """Encode every row of ``x (R, D)`` at ``bits`` (2, 4, 8, 16 or 32); see the module doc."""
    return encode_groups(
        x, (_check_x(x).shape[0],), (check_bits(bits),), generator=generator, backend=backend
    )


def _narrow(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 -> ``dtype``; finite values beyond a 16-bit dtype's range saturate (never inf)."""
    if dtype in (torch.float16, torch.bfloat16):
        lim = torch.finfo(dtype).max
        y = torch.where(torch.isinf(y), y, y.clamp(-lim, lim))
    return y.to(dtype)


def decode(packed: Packed, dtype: Optional[torch.dtype] = None, *, backend: str = "auto"):
    """``(R, D)`` rows of ``packed`` in ``dtype`` (default: the encoded input's dtype).

    No host synchronization: the layout comes from ``packed``, not from the headers.
    """
    layout, payload = packed.layout, packed.payload
    if payload.dtype != torch.uint8 or payload.dim() != 1 or payload.numel() != layout.nbytes:
        raise ValueError(
            f"payload must be a 1-D uint8 tensor of {layout.nbytes} bytes for "
            f"this layout; got {payload.dtype} of shape {tuple(payload.shape)}."
        )
    dtype = packed.dtype if dtype is None else dtype
    if dtype not in _FLOATS:
        raise TypeError(f"dtype must be float32, float64, float16 or bfloat16; got {dtype}.")
    kernels = resolve_backend(backend, payload.device)
    d = layout.dim
    out = torch.empty((layout.num_rows, d), dtype=torch.float32, device=payload.device)
    for _, row, r, bits, start in layout.sections():
        body, y = payload[start + HEADER_BYTES :], out[row : row + r]
        if r * d == 0:
            continue
        if bits == 32:
            y.copy_(body[: r * d * 4].view(torch.float32).view(r, d))
        elif bits == 16:
            kernels.decode_bf16(body[: r * d * 2].view(torch.int16).view(r, d), y)
        else:
            rb = -(-d * bits // 8)
            meta = body[: 4 * r].view(torch.int16).view(r, 2)
            kernels.decode_quant(meta, body[4 * r : r * (4 + rb)].view(r, rb), bits, y)
    return _narrow(out, dtype)


def row_ranges(x: torch.Tensor) -> torch.Tensor:
    """``(R,)`` range of each row's ordinary entries above its bf16-rounded offset (entries
    with ``|x| <= HUGE`` only), for the variance model of :mod:`.bitwidth`."""
    return _row_ranges(_check_x(x).float())
