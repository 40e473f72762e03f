"""INT8 dense products: int8 operands, int32 accumulation, one fused dequantize.

``int_mm(qa, qb)`` is the integer part, ``(M, K) int8 @ (K, N) int8 -> (M, N) int32``, by
engine (:data:`INT_MM`), all giving the same integers:

* ``"int_mm"``: ``torch._int_mm`` (CUDA, and the CPU where this torch has a kernel: not 2.2;
  operands padded to its shape rules with zeros). Fast where the CPU has int8 dot products
  (VNNI, AMX), 19x slower than an fp32 GEMM on an AVX2 EPYC (torch 2.15);
* ``"float32"``: the codes as float32 through BLAS, over slices of at most
  :data:`F32_EXACT_K` of the contraction. Every partial sum of a slice is an integer of
  magnitude ``<= 1040 * 127^2 < 2^24``, so each addition is exact whatever order BLAS adds
  in; the slices' integers are summed in int32, and the result equals the int32
  accumulation bit for bit, at fp32 GEMM speed. Used only while torch computes fp32
  products in fp32 (``torch.get_float32_matmul_precision() == "highest"``);
* ``"float64"``: the same with float64 (partial sums ``< 2^53``: no slicing);
* ``"int64"``: ``torch.matmul`` on int64 codes, the slow reference.

Which engine runs, and whether a weight product runs in INT8 at all, is measured per shape
(:mod:`.choose`), never read from CPU flags. Every engine refuses ``K > MAX_K`` (an int32 sum
of ``K`` products ``127 * 127`` could then overflow) with an error naming the limit.

:class:`Int8Matmul` is the autograd function of ``x @ w``: forward ``x`` per row and ``w`` per
tensor; backward ``dx = g @ w^T`` (``g`` per row, the same codes of ``w`` transposed: a
weight is quantized once per optimizer step, :meth:`Int8State.weight_codes`) and ``dw = x^T @
g`` (``x^T`` per row, ``g`` per column): every scale factors out of the integer sum. Each of
the three products runs in fp32 where that measured faster (``Int8Spec.dense="auto"``).
"""

from __future__ import annotations

from typing import Optional

import torch

from .choose import PROBE, dense_engine, int_mm_engine
from .quantize import QMAX, quantize
from .saved import SavedRows
from .spec import Int8State

__all__ = ["MAX_K", "F32_EXACT_K", "INT_MM", "int_mm", "int8_mm", "int8_matmul", "Int8Matmul"]

MAX_K = (2**31 - 1) // (QMAX * QMAX)  #: 133143: longest int32-safe contraction


F32_EXACT_K = 2**24 // (QMAX * QMAX)  #: 1040: longest contraction whose sums fp32 holds exactly


def _sum_over_slices(a, b, width: int, product):
    """``sum_s product(a[:, s], b[s])`` over slices ``s`` of at most ``width`` of the
    contraction (one call when it fits), summed in the dtype ``product`` returns."""
    acc = None
    for s in range(0, max(a.shape[1], 1), width):
        part = product(a[:, s : s + width], b[s : s + width])
        acc = part if acc is None else acc.add_(part)
    return acc


def _float32(qa, qb):
    return _sum_over_slices(qa.float(), qb.float(), F32_EXACT_K,
                            lambda x, y: torch.matmul(x, y).to(torch.int32))  # fmt: skip


def _fp32_is_exact() -> bool:
    """``True`` while torch runs fp32 matrix products in fp32 (no bf16/TF32 shortcut)."""
    return torch.get_float32_matmul_precision() == "highest"


def _float64(qa, qb):
    return torch.matmul(qa.double(), qb.double()).to(torch.int32)


def _int64(qa, qb):
    return torch.matmul(qa.long(), qb.long()).to(torch.int32)


def _pad(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    r, c = t.shape
    if r == rows and c == cols:
        return t.contiguous()
    out = t.new_zeros((rows, cols))
    out[:r, :c] = t
    return out


def _torch_int_mm(qa, qb):
    (m, k), n = qa.shape, qb.shape[1]
    up8 = lambda v: -(-v // 8) * 8  # noqa: E731 - torch._int_mm: K and N multiples of 8
    mp, kp, np_ = max(up8(m), 24), up8(k), up8(n)  # and M > 16
    out = torch._int_mm(_pad(qa, mp, kp), _pad(qb, kp, np_))
    return out[:m, :n]


INT_MM = {"int_mm": _torch_int_mm, "float32": _float32, "float64": _float64, "int64": _int64}


def int_mm(qa: torch.Tensor, qb: torch.Tensor, engine: Optional[str] = None) -> torch.Tensor:
    """``(M, N)`` int32 ``qa (M, K) @ qb (K, N)`` (both int8). ``engine``: a key of
    :data:`INT_MM`; ``None`` takes the fastest measured for this shape on this machine
    (:func:`dgl_rsc.int8.choose.int_mm_engine`); all give the same integers."""
    if qa.dtype != torch.int8 or qb.dtype != torch.int8:
        raise TypeError(f"int_mm takes int8 operands, got {qa.dtype} and {qb.dtype}.")
    if qa.dim() != 2 or qb.dim() != 2 or qa.shape[1] != qb.shape[0]:
        raise ValueError(f"int_mm: shapes {tuple(qa.shape)} @ {tuple(qb.shape)} do not chain.")
    k = qa.shape[1]
    if k > MAX_K:
        raise ValueError(
            f"int_mm: contraction length {k} exceeds MAX_K={MAX_K}, beyond which an int32 "
            "sum of int8 products can overflow; split the product or keep it in fp32."
        )
    if engine is not None and engine not in INT_MM:
        raise ValueError(f"engine={engine!r} is not one of {', '.join(INT_MM)}.")
    if qa.shape[0] == 0 or qb.shape[1] == 0 or k == 0:
        return torch.zeros((qa.shape[0], qb.shape[1]), dtype=torch.int32, device=qa.device)
    if engine is None:
        engine = int_mm_engine(qa, qb, lambda a, b, e: INT_MM[e](a, b))
    return INT_MM[engine](qa, qb)


def int_mm_any_k(qa: torch.Tensor, qb: torch.Tensor,
                 engine: Optional[str] = None) -> torch.Tensor:  # fmt: skip
    """``(M, N)`` exact ``qa (M, K) @ qb (K, N)`` for any ``K``: :func:`int_mm` (``engine``)
    itself up to :data:`MAX_K` (int32), else its int32 products over slices of at most
    ``MAX_K`` summed in int64 (a weight gradient contracts over every node of the graph)."""
    if qa.shape[1] <= MAX_K:
        return int_mm(qa, qb, engine)

    def product(x, y):
        return int_mm(x.contiguous(), y.contiguous(), engine).long()

    return _sum_over_slices(qa, qb, MAX_K, product)


def int8_mm(a: torch.Tensor, b: torch.Tensor, state: Int8State,
            engine: Optional[str] = None) -> torch.Tensor:  # fmt: skip
    """``(M, N)`` fp32 ``a (M, K) @ b (K, N)`` on INT8 operands: ``a`` per row, ``b`` per
    column, exact integer accumulation (``engine`` as :func:`int_mm`), dequantized once as
    ``(acc * s_a) * s_b``. No autograd."""
    qa, sa = state.quantize(a, 1)
    qb, sb = state.quantize(b, 0)
    return int_mm_any_k(qa, qb, engine).float().mul_(sa).mul_(sb)


def _probe_int8(a: torch.Tensor, b: torch.Tensor, engine: str) -> torch.Tensor:
    """The whole INT8 product of a probe (:func:`dgl_rsc.int8.choose.dense_engine`):
    quantization (nearest, no seed drawn), integer product, dequantize."""
    qa, sa = quantize(a, 1)
    qb, sb = quantize(b, 0)
    return int_mm_any_k(qa, qb, engine).float().mul_(sa).mul_(sb)


def _engine(a: torch.Tensor, b: torch.Tensor, state: Int8State, *labels) -> str:
    return dense_engine(a, b, state.spec.dense, _probe_int8, *labels)


def _times_weight(a: torch.Tensor, w: torch.Tensor, transposed: bool, state: Int8State,
                  keep_rows: bool = False):  # fmt: skip
    """``(a @ w (or a @ w^T), rows)`` by the engine measured for it: fp32, or ``a``'s codes
    per row times the step's codes of ``w`` (one scale: :meth:`Int8State.weight_codes`).
    With ``keep_rows``, ``rows`` is ``a`` as :class:`~dgl_rsc.int8.saved.SavedRows`: the
    INT8 product's own codes of ``a``, else quantized for it; else ``None``."""
    b = w.t() if transposed else w
    engine = _engine(a, b, state)
    if engine == "fp32":
        return torch.matmul(a, b), (SavedRows(a, state) if keep_rows else None)
    qw, sw = state.weight_codes(w)
    qa, sa = state.quantize(a, 1)
    qb = qw.t().contiguous() if transposed else qw
    out = int_mm_any_k(qa, qb, engine).float().mul_(sa).mul_(sw).to(a.dtype)
    return out, (SavedRows.of_codes(qa, sa, a.dtype, state) if keep_rows else None)


class Int8Matmul(torch.autograd.Function):
    """``x (N, K) @ w (K, O)`` with every product (forward and both gradients) in INT8 where
    that measured faster than fp32 (:mod:`.choose`).

    An input that is an activation (it needs a gradient) is kept for the weight gradient as
    int8 codes per row (``spec.saved == "int8"``, :mod:`.saved`); a constant input (a cached
    aggregation) and the weight are kept as they are. The optimizer and its state never see
    INT8 values."""

    @staticmethod
    def forward(ctx, x, w, state: Int8State):
        ctx.state = state
        compress = ctx.needs_input_grad[0] and ctx.needs_input_grad[1] and (
            state.spec.saved == "int8")  # fmt: skip
        out, ctx.rows = _times_weight(x, w, False, state, keep_rows=compress)
        keep_x = ctx.needs_input_grad[1] and not compress
        ctx.save_for_backward(x if keep_x else None, w if ctx.needs_input_grad[0] else None)
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = _times_weight(g, w, True, ctx.state)[0].to(w.dtype)
        if ctx.needs_input_grad[1] and ctx.rows is not None:
            rows, ctx.rows = ctx.rows, None
            probe = rows.dequantized(PROBE).t()
            engine = _engine(probe, g[:PROBE], ctx.state, "saved", g.shape[0])
            if engine == "fp32":
                dw = rows.t_times(g)
            else:
                dw = rows.t_times_int8(g, ctx.state, int_mm_any_k, engine)
        elif ctx.needs_input_grad[1]:
            xt = x.t()
            engine = _engine(xt, g, ctx.state)
            dw = torch.matmul(xt, g) if engine == "fp32" else int8_mm(xt, g, ctx.state, engine)
            dw = dw.to(x.dtype)
        return dx, dw, None


def int8_matmul(x: torch.Tensor, w: torch.Tensor, state: Int8State) -> torch.Tensor:
    """``x (..., K) @ w (K, O)`` in INT8 (leading dimensions of ``x`` are flattened)."""
    if x.dim() == 2:  # the output itself, not a view of it (an in-place epilogue may follow)
        return Int8Matmul.apply(x, w, state)
    lead = x.shape[:-1]
    out = Int8Matmul.apply(x.reshape(-1, x.shape[-1]), w, state)
    return out.reshape(*lead, w.shape[1])
