"""How halo messages travel: a codec per bit width and the policy that picks the width.

``32`` sends float32 rows as they are (:class:`RawCodec`); ``16``, ``8``, ``4`` and ``2`` use
the stochastic, unbiased codec of :mod:`dgl_rsc.distributed.quant` (:class:`QuantCodec`);
``"adaptive"`` picks, per message to each destination, the width that minimizes

    T / T_32 + weight * V / ||X||^2

with ``T`` the exchange time of the alpha-beta cost model (the slowest destination bounds it,
as in AdaQP) relative to the same exchange in fp32, and ``V`` the variance bound of the
quantized message relative to its energy (:func:`dgl_rsc.distributed.bitwidth.solve`). The
choice is kept for ``interval`` training steps of the same message slot (the n-th exchange
of a step in its direction), then made again from the current rows.

A :class:`BitPolicy` also keeps what a run reports: the rows sent at each width (the bit-width
histogram) and the relative error of the decoded messages, measured when widths are chosen.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional, Protocol

import torch

from . import quant
from .bitwidth import CostModel, GroupStats, solve

__all__ = ["Codec", "RawCodec", "QuantCodec", "BitPolicy", "codec_for", "DEFAULT_COST"]

#: used when no measured model is given: 50 us per message, 1 GB/s (gloo over loopback)
DEFAULT_COST = CostModel(alpha=5e-5, beta=1e-9)


class Codec(Protocol):
    """Turns rows into bytes and back. ``encode(rows (R, D)) -> uint8 payload``;
    ``decode(payload, R, D, dtype) -> (R, D)``; ``nbytes(R, D)``: the payload's size."""

    def encode(self, rows: torch.Tensor) -> torch.Tensor: ...

    def decode(self, payload: torch.Tensor, n_rows: int, width: int, dtype) -> torch.Tensor: ...

    def nbytes(self, n_rows: int, width: int) -> int: ...


class RawCodec:
    """No compression: float32 rows as bytes (other dtypes travel in their own width)."""

    bits = 32

    def __init__(self, dtype: torch.dtype = torch.float32):
        self.dtype = dtype

    def encode(self, rows: torch.Tensor) -> torch.Tensor:
        return rows.to(self.dtype).contiguous().view(torch.uint8).reshape(-1)

    def decode(self, payload: torch.Tensor, n_rows: int, width: int, dtype) -> torch.Tensor:
        return payload.view(self.dtype).reshape(n_rows, width).to(dtype)

    def nbytes(self, n_rows: int, width: int) -> int:
        return n_rows * width * torch.empty((), dtype=self.dtype).element_size()


class QuantCodec:
    """Rows as ``bits``-bit codes with a bf16 offset and scale per row (unbiased)."""

    def __init__(self, bits: int, generator: Optional[torch.Generator] = None):
        self.bits, self.generator = quant.check_bits(bits), generator

    def encode(self, rows: torch.Tensor) -> torch.Tensor:
        return quant.encode(rows, self.bits, generator=self.generator).payload

    def decode(self, payload: torch.Tensor, n_rows: int, width: int, dtype) -> torch.Tensor:
        layout = quant.Layout(width, (n_rows,), (self.bits,))
        return quant.decode(quant.Packed(payload, layout, torch.float32), dtype)

    def nbytes(self, n_rows: int, width: int) -> int:
        return quant.payload_bytes(n_rows, width, self.bits)


def codec_for(bits: int, generator: Optional[torch.Generator] = None):
    """:class:`RawCodec` for 32 bits, :class:`QuantCodec` otherwise."""
    return RawCodec() if int(bits) == 32 else QuantCodec(int(bits), generator)


class BitPolicy:
    """The width of every message of one direction (forward or backward).

    Args:
        spec: 32, 16, 8, 4, 2 or ``"adaptive"``.
        interval: steps an adaptive choice is kept.
        weight: the weight of relative variance against relative time (adaptive).
        allowed: the widths the adaptive choice picks from.
        cost: the alpha-beta :class:`~dgl_rsc.distributed.bitwidth.CostModel`.
        generator: random numbers of the stochastic rounding.
    """

    def __init__(self, spec=32, interval: int = 10, weight: float = 1.0,
                 allowed=(2, 4, 8), cost: CostModel = DEFAULT_COST,
                 generator: Optional[torch.Generator] = None):  # fmt: skip
        self.adaptive = spec == "adaptive"
        self.spec = spec if self.adaptive else quant.check_bits(spec)
        self.interval, self.weight = int(interval), float(weight)
        self.allowed, self.cost, self.generator = tuple(allowed), cost, generator
        self._chosen: dict = {}  # slot -> bits per destination
        self._calls: dict = {}  # slot -> calls so far
        self.histogram = defaultdict(int)  # bits -> rows sent
        self._errors: list = []

    @property
    def fixed(self) -> bool:
        """Every width is known in advance (no adaptive choice to tell the receivers)."""
        return not self.adaptive

    def choose(self, slot, messages: dict) -> dict:
        """``{destination: bits}`` for ``messages`` (``{destination: rows (R, D)}``); every
        ``interval`` calls of a slot the adaptive widths are chosen again and the codec's
        error is measured."""
        count = self._calls.get(slot, 0)
        self._calls[slot] = count + 1
        due = count % self.interval == 0
        if not self.adaptive:
            bits = {q: self.spec for q in messages}
        else:
            kept = self._chosen.get(slot)
            if due or kept is None or set(kept) != set(messages):
                kept = self._solve(messages)
                self._chosen[slot] = kept
            bits = kept
        if due:
            self._measure(messages, bits)
        for q, rows in messages.items():
            self.histogram[int(bits[q])] += int(rows.shape[0])
        return bits

    def _solve(self, messages: dict) -> dict:
        dests = [q for q, rows in messages.items() if rows.shape[0]]
        if not dests:
            return {q: 32 for q in messages}
        x = torch.cat([messages[q] for q in dests])
        stats = _group_stats(x, [messages[q].shape[0] for q in dests], dests)
        energy = max(sum(stats.sq_norm), 1e-30)
        t32 = max(self.cost.time(quant.payload_bytes(r, stats.dim, 32)) for r in stats.rows)
        lam = self.weight * t32 / energy  # T / T32 + weight * V / energy, scaled by T32
        picked = solve(stats, self.cost, lam, self.allowed).bits
        out = {q: 32 for q in messages}
        out.update(dict(zip(dests, picked)))
        return out

    def _measure(self, messages: dict, bits: dict) -> None:
        for q, rows in messages.items():
            if rows.shape[0] and bits[q] != 32:
                codec = codec_for(bits[q], self.generator)
                back = codec.decode(codec.encode(rows), rows.shape[0], rows.shape[1], rows.dtype)
                err = float((back - rows).norm() / rows.norm().clamp(min=1e-30))
                self._errors.append(err)

    def reset(self) -> None:
        """Forget the choices, the histogram and the measured errors (a new run)."""
        self._chosen, self._calls = {}, {}
        self.histogram.clear()
        self._errors = []

    def report(self) -> dict:
        """``{"histogram": {bits: rows}, "error": mean relative error or None}``."""
        err = sum(self._errors) / len(self._errors) if self._errors else None
        return {"histogram": {str(b): n for b, n in sorted(self.histogram.items())},
                "error": err, "spec": self.spec}  # fmt: skip


def _group_stats(x: torch.Tensor, rows: list, dests: list) -> GroupStats:
    from .bitwidth import group_stats

    return group_stats(x, rows, dests)
