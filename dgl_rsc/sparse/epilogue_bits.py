"""The one-pass epilogue of :mod:`.epilogue` for INT8 training: one bit saved per element, and
the column maxima of its output measured in the same pass.

``bias_act_dropout_bits(x, other, bias, p, training, col, measure)`` computes the same ``y =
dropout(relu(x + other + bias))`` as :func:`~dgl_rsc.sparse.epilogue.bias_act_dropout` (the
same dropout seed from torch's generator, the same hash, the same bits), but saves for the
backward a packed bit per element, ``y > 0`` (the elements whose gradient flows), instead of
``y`` itself: 1/32 of the bytes, so ``y`` is freed as soon as its consumer has read it (the
next layer's INT8 product reads its codes and keeps nothing). With ``measure`` it also
returns ``amax (1, D)``, the column maxima of ``|diag(col) y|`` that the next product's
per-column scales need (:mod:`dgl_rsc.int8.codes`), taken row by row while each row is in
cache: the quantization then needs one pass over ``y`` (the codes) instead of two.

Engines: ``numba`` (:func:`dgl_rsc.backends.cpu_fused.forward_rows_bits`, rows split over
torch's threads, partial maxima per range reduced by torch) and ``torch`` (the reference).
ReLU only (with the identity activation an element's gradient flows where ``y`` may be 0).

Example:
    >>> import torch
    >>> x = torch.randn(5, 3, requires_grad=True)
    >>> y, amax = bias_act_dropout_bits(x, measure=True)
    >>> torch.equal(y, torch.relu(x)), torch.equal(amax, y.detach().abs().amax(0, True))
    (True, True)
"""

from __future__ import annotations

from typing import Optional

import torch

from .epilogue import _draw_seed, _row_ranges, _run, _threshold, engine_for, keep_mask

__all__ = ["bias_act_dropout_bits", "pack_bits", "ENGINES"]


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """``(N, ceil(D / 8))`` uint8: bit ``j & 7`` of byte ``j >> 3`` is ``mask[:, j]``."""
    n, d = mask.shape
    pad = -d % 8
    m = torch.nn.functional.pad(mask.to(torch.uint8), (0, pad)).view(n, -1, 8)
    weights = (1 << torch.arange(8, dtype=torch.int32, device=mask.device)).to(torch.uint8)
    return (m * weights).sum(-1, dtype=torch.int32).to(torch.uint8)


def _unpack(bits: torch.Tensor, d: int) -> torch.Tensor:
    j = torch.arange(d, device=bits.device)
    return ((bits[:, j >> 3].to(torch.int32) >> (j & 7)) & 1).bool()


def _torch_forward(x, other, bias, seed, p, col, measure, out=None):
    v = x if other is None else x + other
    if bias is not None:
        v = v + bias
    y = torch.where(v <= 0, torch.zeros((), dtype=v.dtype), v)
    if p > 0:
        scale = torch.tensor(1.0 / (1.0 - p), dtype=v.dtype)
        y = torch.where(keep_mask(v.shape, seed, p, v.device), y * scale,
                        torch.zeros((), dtype=v.dtype))  # fmt: skip
    amax = None
    if measure:
        scaled = y if col is None else y * col.reshape(-1, 1)
        amax = scaled.abs().amax(0, keepdim=True)
    bits = pack_bits(y > 0)
    return (y if out is None else out.copy_(y)), bits, amax


def _torch_backward(dy, bits, p):
    scale = torch.tensor(1.0 / (1.0 - p) if p > 0 else 1.0, dtype=dy.dtype)
    return torch.where(_unpack(bits, dy.shape[1]), dy * scale, torch.zeros((), dtype=dy.dtype))


def _numba_forward(x, other, bias, seed, p, col, measure, out=None):
    import numpy as np

    from ..backends.cpu_fused import forward_rows_bits

    n, d = x.shape
    y = torch.empty_like(x) if out is None else out  # the kernel reads x[i, j] before y[i, j]
    bits = torch.empty((n, (d + 7) // 8), dtype=torch.uint8)
    ranges = _row_ranges(n, d, torch.get_num_threads())
    parts = torch.zeros((len(ranges) if measure else 0, d), dtype=torch.float32)
    nans = torch.zeros(parts.shape, dtype=torch.bool)
    on = other.numpy() if other is not None else np.zeros((n, 0), np.float32)
    bn = bias.detach().contiguous().numpy() if bias is not None else np.zeros(d, np.float32)
    cn = col.contiguous().numpy() if col is not None else np.ones(1, np.float32)
    thr, scale = (_threshold(p), np.float32(1.0 / (1.0 - p))) if p > 0 else (0, np.float32(1))
    lo, hi = np.uint32(seed[0]), np.uint32(seed[1])
    xn, yn, bn_, pn, nn = x.numpy(), y.numpy(), bits.numpy(), parts.numpy(), nans.numpy()
    empty, no_nan = np.zeros(0, np.float32), np.zeros(0, np.bool_)

    def work(a, b, k):
        forward_rows_bits(xn, on, bn, yn, a, b, lo, hi, thr, scale, bn_, cn, col is not None,
                          pn[k] if measure else empty, nn[k] if measure else no_nan)  # fmt: skip

    _run(ranges, work)
    if not measure:
        return y, bits, None
    amax = parts.amax(0, keepdim=True)  # the non-NaN maxima; NaN where a column had one
    return y, bits, amax.masked_fill_(nans.any(0, keepdim=True), float("nan"))


def _numba_backward(dy, bits, p):
    import numpy as np

    from ..backends.cpu_fused import backward_rows_bits

    dx = torch.empty_like(dy)
    scale = np.float32(1.0 / (1.0 - p)) if p > 0 else np.float32(1.0)
    dyn, bn, dxn = dy.numpy(), bits.numpy(), dx.numpy()

    def work(a, b, _k):
        backward_rows_bits(dyn, bn, dxn, a, b, scale)

    _run(_row_ranges(dy.shape[0], dy.shape[1], torch.get_num_threads()), work)
    return dx


#: ``name -> (forward(x, other, bias, seed, p, col, measure, out) -> (y, bits, amax),
#: backward(dy, bits, p) -> dx)``
ENGINES = {"numba": (_numba_forward, _numba_backward), "torch": (_torch_forward, _torch_backward)}


class _BiasReluDropoutBits(torch.autograd.Function):
    """One output (``y``; autograd refuses more beside an input modified in place that is a
    view): the column maxima are handed back through ``sink``, a list."""

    @staticmethod
    def forward(ctx, x, other, bias, p, engine, col, sink, inplace):
        seed = _draw_seed() if p > 0 else (0, 0)
        fwd, _ = ENGINES[engine]
        src = x.detach().contiguous()
        other = None if other is None else other.detach().contiguous()
        out = src if inplace and src.data_ptr() == x.data_ptr() else None
        y, bits, amax = fwd(src, other, bias, seed, p, col, sink is not None, out)
        if sink is not None:
            sink.append(amax)
        ctx.save_for_backward(bits)
        ctx.conf = (p, engine, other is not None, bias is not None)
        if out is not None:  # y written over x: one (N, D) tensor less alive at once
            ctx.mark_dirty(x)
            return x
        return y

    @staticmethod
    def backward(ctx, dy):
        (bits,) = ctx.saved_tensors
        p, engine, has_other, has_bias = ctx.conf
        dx = ENGINES[engine][1](dy.contiguous(), bits, p)
        db = dx.sum(0) if has_bias and ctx.needs_input_grad[2] else None
        return dx, (dx if has_other else None), db, None, None, None, None, None


def bias_act_dropout_bits(
    x: torch.Tensor,
    other: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    p: float = 0.0,
    training: bool = True,
    col: Optional[torch.Tensor] = None,
    measure: bool = False,
    engine: Optional[str] = None,
    inplace: bool = False,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(y (N, D), amax (1, D) or None)``: ``y = dropout(relu(x + other + bias), p)`` as
    :func:`~dgl_rsc.sparse.epilogue.bias_act_dropout` computes it, one bit per element saved;
    with ``measure``, ``amax = max_i |col[i] * y[i, :]|`` (``col (N,)`` float32 or ``None``).
    Arguments as there; ``engine``: a key of :data:`ENGINES` (``None``: by ``engine_for``);
    ``inplace``: write ``y`` over a contiguous ``x`` (an intermediate nothing else reads;
    autograd refuses it where a node saved ``x``)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p!r}.")
    if x.dim() != 2 or (other is not None and other.shape != x.shape):
        raise ValueError(f"x must be (N, D) and other the same shape; got {tuple(x.shape)}.")
    if col is not None and col.shape != (x.shape[0],):
        raise ValueError(f"col must be ({x.shape[0]},), got {tuple(col.shape)}.")
    engine = engine or engine_for(x)
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}.")
    col = None if col is None else col.detach().float()
    sink = [] if measure else None
    y = _BiasReluDropoutBits.apply(x, other, bias, float(p) if training else 0.0, engine, col,
                                   sink, bool(inplace))  # fmt: skip
    return y, (sink[0] if measure else None)
