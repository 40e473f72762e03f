"""Activations saved for a weight gradient, kept in INT8 (the idea of EXACT, ICLR'22, and of
Tango's quantized saved tensors).

A weight product ``y = x @ w`` saves ``x (N, K)`` for ``dw = x^T @ dy``: in fp32 that is one
``(N, K)`` tensor per layer, kept from the forward to the backward, the bulk of full-graph
training's memory above the graph itself. :class:`SavedRows` keeps it as int8 codes with one
scale per row (``amax / 127`` on the bfloat16 grid; stochastic rounding from the layer's
:class:`~dgl_rsc.int8.spec.Int8State` in training, so ``dw`` is unbiased), a quarter of the
bytes; ``x`` itself is freed once the forward is done with it. ``dw`` is computed from the
codes in chunks of rows (no full fp32 copy of ``x`` is made again), or, where the weight
gradient runs in INT8, from the codes directly (each row's scale folded into ``dy``).

The error is that of one 8-bit quantization of ``x`` per step: on Cora's GCN the weight
gradients' relative error is reported by ``tools/experiments/int8_errors.py``
(``docs/guide/int8.md``); tests bound it. :func:`saved_matmul` is ``x @ w`` with fp32
products and ``x`` saved so (the fp32 last layer of an INT8 model); :class:`~dgl_rsc.int8.
gemm.Int8Matmul` saves its input the same way.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..backends import resolve_int8
from .spec import Int8State

__all__ = ["SavedRows", "saved_matmul", "CHUNK_ROWS"]

#: rows of ``x`` dequantized at a time for ``x^T @ dy`` (16 MB at 256 wide)
CHUNK_ROWS = 16384


class SavedRows:
    """``x (N, K)`` as int8 codes ``q`` and per-row scales ``s (N, 1)``."""

    __slots__ = ("q", "s", "dtype", "kernels")

    def __init__(self, x: Optional[torch.Tensor], state: Optional[Int8State]):
        if x is None:  # filled by of_codes
            return
        self.q, self.s = state.quantize(x.detach(), 1)
        self.dtype = x.dtype
        self.kernels = resolve_int8(state.spec.backend, x.device)

    @classmethod
    def of_codes(cls, q: torch.Tensor, s: torch.Tensor, dtype, state: Int8State) -> SavedRows:
        """Rows already quantized per row (an INT8 product's own codes of ``x``)."""
        rows = cls(None, None)
        rows.q, rows.s, rows.dtype = q, s, dtype
        rows.kernels = resolve_int8(state.spec.backend, q.device)
        return rows

    def nbytes(self) -> int:
        return self.q.numel() + self.s.numel() * 4

    def dequantized(self, rows: Optional[int] = None) -> torch.Tensor:
        """``(N, K)`` fp32 ``q * s`` (exact: 8-bit codes times bf16-grid scales), or its
        first ``rows`` rows."""
        n = self.q.shape[0] if rows is None else min(rows, self.q.shape[0])
        return self.q[:n].float().mul_(self.s[:n])

    def t_times(self, dy: torch.Tensor, chunk: int = CHUNK_ROWS) -> torch.Tensor:
        """``(K, O)`` ``x^T @ dy`` (``dy (N, O)``) in fp32, from the codes in chunks of
        rows: ``sum_c (dy_c^T @ x_c)^T`` (the narrow operand first, as
        :mod:`dgl_rsc.backends.narrow_mm` orders a classifier's weight gradient)."""
        dy = dy.float()
        acc = None
        dequantize = getattr(self.kernels, "dequantize_rows", None)
        buf = None
        for r in range(0, self.q.shape[0], chunk):
            n = min(chunk, self.q.shape[0] - r)
            if dequantize is not None and self.q.device.type == "cpu":
                buf = torch.empty((n, self.q.shape[1])) if buf is None else buf[:n]
                xc = dequantize(self.q, self.s, r, buf)  # one pass into one reused buffer
            else:
                xc = self.q[r : r + n].float().mul_(self.s[r : r + n])
            part = torch.mm(dy[r : r + n].t(), xc)
            acc = part if acc is None else acc.add_(part)
        if acc is None:
            return dy.new_zeros((self.q.shape[1], dy.shape[1]))
        return acc.t().to(self.dtype)

    def t_times_int8(self, dy: torch.Tensor, state: Int8State, int_mm: Callable,
                     engine: str) -> torch.Tensor:  # fmt: skip
        """``(K, O)`` ``x^T @ dy`` on the codes: ``q^T @ (s * dy)`` with ``s * dy``
        quantized per column (every scale factors out of the integer sum)."""
        qg, sg = state.quantize(dy.float() * self.s, 0)
        return int_mm(self.q.t().contiguous(), qg, engine).float().mul_(sg).to(self.dtype)


class _SavedMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, state: Int8State, mm: Callable):
        ctx.rows = SavedRows(x, state) if ctx.needs_input_grad[1] else None
        ctx.save_for_backward(w if ctx.needs_input_grad[0] else None)
        return mm(x.detach(), w.detach())

    @staticmethod
    def backward(ctx, g):
        (w,) = ctx.saved_tensors
        dx = torch.mm(g, w.t()) if ctx.needs_input_grad[0] else None
        dw = ctx.rows.t_times(g) if ctx.needs_input_grad[1] else None
        ctx.rows = None
        return dx, dw, None, None


def saved_matmul(x: torch.Tensor, w: torch.Tensor, state: Int8State,
                 mm: Optional[Callable] = None) -> torch.Tensor:  # fmt: skip
    """``x (N, K) @ w (K, O)`` by ``mm`` (default ``torch.mm``; the forward only: no
    autograd), ``x`` saved as :class:`SavedRows` for ``dw``; ``dx = dy @ w^T`` in fp32."""
    return _SavedMatmul.apply(x, w, state, mm or torch.mm)
