"""Quantize once, fused: a hidden layer's epilogue writes the next INT8 product's operand codes.

Op by op, INT8 training quantizes the operand ``y`` of the next sparse product in two passes
of its own after the epilogue has written ``y`` (one for the column maxima of ``diag(c) y``,
one for the codes, :func:`dgl_rsc.backends.int8_cpu.quantize_columns`). Here the epilogue
(:func:`dgl_rsc.sparse.epilogue_bits.bias_act_dropout_bits`) measures the maxima row by row
while it writes ``y``, the scales follow (``amax / 127`` rounded up to the bfloat16 grid), and
one pass writes the codes, with stochastic rounding's ``u`` hashed from the element's index
and the call's seed by the same 32-bit mixer as dropout's mask (``lowbias32`` =
:func:`dgl_rsc.backends.cpu_fused.mix32`): nothing random is stored. The codes wait in the
next layer's :class:`~dgl_rsc.int8.spec.Int8State` (``prepared``) and the product takes them
instead of quantizing ``y`` itself (:func:`dgl_rsc.int8.spmm.int8_csr_mm`).

The codes, scales and the seed drawn are those the product would have made: the fused path
equals the op-by-op one bit for bit (tests). The model's fused forward
(:mod:`dgl_rsc.models.fused`) asks for them only where the next product's choice is settled
on INT8 (:func:`dgl_rsc.int8.choose.sparse_kept`): while it is measured, the INT8 candidate
is timed with its own quantization.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..backends import resolve_int8
from ..quant.rounding import QMAX, bf16_scale_up
from ..sparse.epilogue_bits import bias_act_dropout_bits
from .spec import Int8State

__all__ = ["Prepared", "epilogue_codes", "operand_codes"]


class Prepared:
    """Codes ``(q (N, D) int8, s (1, D))`` of ``diag(col) y``, for the product that reads
    ``y`` unchanged next."""

    __slots__ = ("ptr", "version", "shape", "col", "codes")

    def __init__(self, y: torch.Tensor, col: Optional[torch.Tensor], codes: tuple):
        self.ptr, self.version, self.shape = y.data_ptr(), y._version, tuple(y.shape)
        self.col, self.codes = col, codes

    def take(self, x: torch.Tensor, col: Optional[torch.Tensor]) -> Optional[tuple]:
        """The codes when ``x`` is ``y`` (same memory, shape, not modified since) and
        ``col`` the same scale, else ``None``."""
        same = (x.data_ptr(), x._version, tuple(x.shape)) == (self.ptr, self.version, self.shape)
        if not same or (col is None) != (self.col is None):
            return None
        if col is not None and not torch.equal(col.float(), self.col):
            return None
        return self.codes


def operand_codes(state: Int8State, y: torch.Tensor, col: Optional[torch.Tensor],
                  amax: torch.Tensor) -> tuple:  # fmt: skip
    """``(q, s)`` of ``diag(col) y`` given its column maxima ``amax (1, D)``: the scales, a
    seed drawn from ``state`` (stochastic rounding in training), one pass for the codes."""
    s = bf16_scale_up(amax, float(QMAX))
    stochastic = state.stochastic
    seed = state.next_seed() if stochastic else 0
    rounding = "stochastic" if stochastic else "nearest"
    kernels = resolve_int8(state.spec.backend, y.device)
    scaled = getattr(kernels, "scaled_codes", None)
    if scaled is not None:
        return scaled(y, col, s, rounding, seed), s
    x = y if col is None else y * col.reshape(-1, 1)
    return kernels.quantize_codes(x.contiguous(), s, rounding, seed), s


def epilogue_codes(x: torch.Tensor, other: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                   p: float, training: bool, ahead: Optional[tuple] = None,
                   inplace: bool = False) -> torch.Tensor:  # fmt: skip
    """``y = dropout(relu(x + other + bias), p)`` (one bit saved per element; ``inplace``:
    written over ``x``); with ``ahead = (state, col)`` (the next layer's INT8 state and its
    column scale ``(N,)`` or ``None``) the codes of ``diag(col) y`` are written into
    ``state.prepared``."""
    if ahead is None:
        return bias_act_dropout_bits(x, other, bias, p, training, inplace=inplace)[0]
    state, col = ahead
    col = None if col is None else col.detach().float().contiguous()
    y, amax = bias_act_dropout_bits(x, other, bias, p, training, col, measure=True,
                                    inplace=inplace)  # fmt: skip
    state.training = training
    state.prepared = Prepared(y, col, operand_codes(state, y.detach(), col, amax))
    return y
