"""A hidden layer's epilogue in one pass: ``dropout(act(x + other + bias))``, forward and backward.

Op by op, a hidden GCN/GraphSAGE layer's bias, ReLU and dropout are five or more passes over
its ``(N, D)`` output forward and four backward, and they save two ``(N, D)`` tensors and a
mask. :func:`bias_act_dropout` makes one pass each way and saves only its output ``y`` (which
the next layer's weight gradient keeps anyway): an element's gradient flows iff ``y > 0``.
Dropout's mask is a hash of ``(seed, row, column)`` (:mod:`dgl_rsc.backends.cpu_fused`), the
seed drawn from torch's default generator, so ``torch.manual_seed`` makes a run repeatable and
the mask is regenerated, never stored. It is a different draw than ``torch.nn.Dropout``'s with
the same distribution (each element kept independently with probability ``1 - p``); with
``p = 0`` or in evaluation the result equals the op-by-op one bit for bit.

Engines (:data:`ENGINES`, chosen by :func:`engine_for`): ``numba`` for contiguous float32 CPU
tensors where Numba imports, rows split over torch's thread count; ``torch`` (the reference:
the same hash in int64 tensor arithmetic, any device and dtype) elsewhere. While
``torch.compile`` traces (torch >= 2.4) the pass is the custom operator
``dgl_rsc::bias_act_dropout`` (see the end of this module).

Example:
    >>> import torch
    >>> x = torch.randn(4, 3, requires_grad=True)
    >>> y = bias_act_dropout(x, bias=torch.zeros(3), p=0.0)
    >>> torch.equal(y, torch.relu(x))
    True
"""

from __future__ import annotations

from typing import Optional

import torch

from ..base import _deps
from ..base.tracing import HAS_OPS, compiling

__all__ = ["bias_act_dropout", "engine_for", "keep_mask", "ENGINES"]

_M32 = 0xFFFFFFFF
#: rows per range below which a product of the numba engine runs in the calling thread
_MIN_PARALLEL_ELEMS = 1 << 16


def _mul32(x: torch.Tensor, m: int) -> torch.Tensor:
    """``x * m mod 2^32`` of int64 tensors holding uint32 values (no int64 overflow)."""
    lo = x * (m & 0xFFFF)
    hi = ((x * (m >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    from ..backends.cpu_fused import M1, M2

    x = x ^ (x >> 16)
    x = _mul32(x, M1)
    x = x ^ (x >> 15)
    x = _mul32(x, M2)
    return x ^ (x >> 16)


def keep_mask(shape, seed: tuple, p: float, device=None) -> torch.Tensor:
    """``(N, D)`` bool: the elements dropout keeps for ``seed = (lo, hi)`` (uint32 values) and
    drop probability ``p``, as every engine computes them."""
    from ..backends.cpu_fused import GOLDEN

    n, d = shape
    rows = torch.arange(n, dtype=torch.int64, device=device)
    key = _mix32(_mix32(rows ^ seed[1]) ^ seed[0])
    cols = (torch.arange(d, dtype=torch.int64, device=device) * GOLDEN) & _M32
    return _mix32(key[:, None] ^ cols[None, :]) >= _threshold(p)


def _threshold(p: float) -> int:
    return min(int(round(p * 2.0**32)), _M32)


def _draw_seed() -> tuple:
    """Two uint32 values from torch's default generator (``torch.manual_seed`` repeats them)."""
    lo, hi = torch.randint(0, 2**32, (2,), dtype=torch.int64).tolist()
    return int(lo), int(hi)


# -- engines ------------------------------------------------------------------------------
def _torch_forward(x, other, bias, seed, p, relu):
    v = x if other is None else x + other
    if bias is not None:
        v = v + bias
    if relu:
        v = torch.where(v <= 0, torch.zeros((), dtype=v.dtype, device=v.device), v)
    if p > 0:
        scale = torch.tensor(1.0 / (1.0 - p), dtype=v.dtype, device=v.device)
        keep = keep_mask(v.shape, seed, p, v.device)
        v = torch.where(keep, v * scale, torch.zeros((), dtype=v.dtype, device=v.device))
    return v


def _torch_backward(dy, y, seed, p, relu, want_bias):
    scale = torch.tensor(1.0 / (1.0 - p), dtype=dy.dtype, device=dy.device)
    zero = torch.zeros((), dtype=dy.dtype, device=dy.device)
    if relu:
        dx = torch.where(y > 0, dy * scale, zero) if p > 0 else torch.where(y > 0, dy, zero)
    elif p > 0:
        dx = torch.where(keep_mask(dy.shape, seed, p, dy.device), dy * scale, zero)
    else:
        dx = dy.clone()
    return dx, (dx.sum(0) if want_bias else None)


def _row_ranges(n: int, d: int, threads: int) -> list:
    parts = 1 if threads <= 1 or n * d < _MIN_PARALLEL_ELEMS else threads * 4
    step = -(-n // parts) if n else 1
    return [(a, min(n, a + step), k) for k, a in enumerate(range(0, n, step))] or [(0, 0, 0)]


def _run(ranges, work) -> None:
    from .cpu_spmm import run_ranges

    threads = torch.get_num_threads()
    if len(ranges) == 1:
        work(*ranges[0])
    else:
        run_ranges(ranges, work, threads)


def _numba_forward(x, other, bias, seed, p, relu):
    import numpy as np

    from ..backends.cpu_fused import forward_rows

    y = torch.empty_like(x)
    xn, yn = x.detach().numpy(), y.numpy()
    on = other.detach().numpy() if other is not None else np.zeros((x.shape[0], 0), np.float32)
    bn = (bias.detach().contiguous().numpy() if bias is not None
          else np.zeros(x.shape[1], np.float32))  # fmt: skip
    thr, scale = (_threshold(p), np.float32(1.0 / (1.0 - p))) if p > 0 else (0, np.float32(1))
    lo, hi = np.uint32(seed[0]), np.uint32(seed[1])

    def work(a, b, _k):
        forward_rows(xn, on, bn, yn, a, b, lo, hi, thr, scale, relu)

    _run(_row_ranges(x.shape[0], x.shape[1], torch.get_num_threads()), work)
    return y


def _numba_backward(dy, y, seed, p, relu, want_bias):
    import numpy as np

    from ..backends.cpu_fused import backward_rows

    dx = torch.empty_like(dy)
    dyn, yn, dxn = dy.detach().numpy(), y.detach().numpy(), dx.numpy()
    thr, scale = (_threshold(p), np.float32(1.0 / (1.0 - p))) if p > 0 else (0, np.float32(1))
    lo, hi = np.uint32(seed[0]), np.uint32(seed[1])

    def work(a, b, _k):
        backward_rows(dyn, yn, dxn, a, b, lo, hi, thr, scale, relu)

    _run(_row_ranges(dy.shape[0], dy.shape[1], torch.get_num_threads()), work)
    return dx, (dx.sum(0) if want_bias else None)


#: ``name -> (forward(x, other, bias, seed, p, relu) -> y,
#: backward(dy, y, seed, p, relu, want_bias) -> (dx, db))``
ENGINES = {"numba": (_numba_forward, _numba_backward), "torch": (_torch_forward, _torch_backward)}


#: dynamo runs a function so marked instead of tracing it (its cache wrapper warns when traced)
_constant = getattr(getattr(torch, "compiler", None), "assume_constant_result", lambda f: f)


@_constant
def _numba_imports() -> bool:
    return _deps.numba_available()


def engine_for(x: torch.Tensor) -> str:
    """``"numba"`` for a float32 CPU tensor where Numba imports, else ``"torch"``."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and _numba_imports():
        return "numba"
    return "torch"


class _BiasActDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, other, bias, p, relu, engine):
        seed = _draw_seed() if p > 0 else (0, 0)
        fwd, _ = ENGINES[engine]
        x = x.contiguous()
        other = None if other is None else other.contiguous()
        y = fwd(x, other, bias, seed, p, relu)
        ctx.save_for_backward(y)
        ctx.conf = (seed, p, relu, engine, other is not None, bias is not None)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        seed, p, relu, engine, has_other, has_bias = ctx.conf
        _, bwd = ENGINES[engine]
        want_bias = has_bias and ctx.needs_input_grad[2]
        dx, db = bwd(dy.contiguous(), y, seed, p, relu, want_bias)
        return dx, (dx if has_other else None), db, None, None, None


def bias_act_dropout(
    x: torch.Tensor,
    other: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    p: float = 0.0,
    relu: bool = True,
    training: bool = True,
    engine: Optional[str] = None,
) -> torch.Tensor:
    """``dropout(act(x + other + bias), p)`` in one pass each way.

    Args:
        x: ``(N, D)``.
        other: ``(N, D)`` added to ``x`` (the self term of a SAGE layer), or ``None``.
        bias: ``(D,)`` or ``None``.
        p: drop probability in ``[0, 1)``; only applied when ``training``.
        relu: ReLU (``True``) or identity.
        engine: a key of :data:`ENGINES`; ``None`` chooses by :func:`engine_for`.

    Returns:
        ``y (N, D)``: sums in the order ``(x + other) + bias``, as the op-by-op layer adds.
    """
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p!r}.")
    if x.dim() != 2 or (other is not None and other.shape != x.shape):
        raise ValueError(
            f"x must be (N, D) and other the same shape; got {tuple(x.shape)} and "
            f"{None if other is None else tuple(other.shape)}."
        )
    if bias is not None and bias.shape != (x.shape[1],):
        raise ValueError(f"bias must be ({x.shape[1]},), got {tuple(bias.shape)}.")
    p = float(p) if training else 0.0
    engine = engine or engine_for(x)
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}.")
    if compiling():  # one opaque operator, not inductor's kernels and random draws
        return _bias_act_dropout_op(x, other, bias, p, bool(relu), engine)
    return _BiasActDropout.apply(x, other, bias, p, bool(relu), engine)


# -- under torch.compile (torch >= 2.4) ----------------------------------------------------
# Traced op by op, dropout's random draws on the CPU cost more than the rest of the layer
# (quickstart's 30000 x 64 layer: about 30 ms a call, eager ``bernoulli_`` or inductor's own
# generator). While dynamo traces, :func:`bias_act_dropout` calls ``dgl_rsc::bias_act_dropout``
# instead: one opaque node with a fake implementation, running the same engines and the same
# hashed mask as eager code. The seed enters as a tensor drawn in the traced graph, so every
# step draws a new mask without a recompile; the backward operator regenerates the mask.
if HAS_OPS:
    from torch.library import custom_op, register_autograd

    def _seed(seed: torch.Tensor) -> tuple:
        lo, hi = seed.tolist()
        return int(lo), int(hi)

    @custom_op("dgl_rsc::bias_act_dropout", mutates_args=())
    def _forward_op(x: torch.Tensor, other: Optional[torch.Tensor],
                    bias: Optional[torch.Tensor], seed: torch.Tensor, p: float, relu: bool,
                    engine: str) -> torch.Tensor:  # fmt: skip
        fwd, _ = ENGINES[engine]
        other = None if other is None else other.contiguous()
        return fwd(x.contiguous(), other, bias, _seed(seed), p, relu)

    @_forward_op.register_fake
    def _(x, other, bias, seed, p, relu, engine):
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @custom_op("dgl_rsc::bias_act_dropout_backward", mutates_args=())
    def _backward_op(dy: torch.Tensor, y: torch.Tensor, seed: torch.Tensor, p: float,
                     relu: bool, engine: str,
                     want_bias: bool) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        _, bwd = ENGINES[engine]
        dx, db = bwd(dy.contiguous(), y, _seed(seed), p, relu, want_bias)
        return dx, (db if want_bias else dy.new_zeros(0))

    @_backward_op.register_fake
    def _(dy, y, seed, p, relu, engine, want_bias):
        dx = torch.empty_like(dy, memory_format=torch.contiguous_format)
        return dx, dy.new_empty((dy.shape[1] if want_bias else 0,))

    def _setup(ctx, inputs, output):
        _, other, bias, seed, p, relu, engine = inputs
        ctx.conf = (p, relu, engine, other is not None, bias is not None)
        ctx.save_for_backward(output, seed)

    def _backward(ctx, dy):
        y, seed = ctx.saved_tensors
        p, relu, engine, has_other, has_bias = ctx.conf
        want_bias = has_bias and ctx.needs_input_grad[2]
        dx, db = _backward_op(dy, y, seed, p, relu, engine, want_bias)
        db = db if want_bias else None
        return dx, (dx if has_other else None), db, None, None, None, None

    register_autograd("dgl_rsc::bias_act_dropout", _backward, setup_context=_setup)

    def _bias_act_dropout_op(x: torch.Tensor, other: Optional[torch.Tensor],
                             bias: Optional[torch.Tensor], p: float, relu: bool,
                             engine: str) -> torch.Tensor:  # fmt: skip
        """``(N, D)`` ``dropout(act(x + other + bias), p)`` through ``dgl_rsc::bias_act_dropout``
        (arguments as :func:`bias_act_dropout`'s, already checked; ``p`` 0 outside
        training)."""
        if p > 0:
            seed = torch.randint(0, 2**32, (2,), dtype=torch.int64)
        else:
            seed = torch.zeros(2, dtype=torch.int64)
        return _forward_op(x, other, bias, seed, p, relu, engine)
