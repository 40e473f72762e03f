"""INT8 sparse-dense products ``diag(r) A diag(c) X`` for the convolutions.

The rule (one place): the column scale ``c`` (degree normalization) is applied to ``X`` in
fp32, then ``c X`` is quantized with one scale per feature column (a column scale factors out
of every row's sum); ``A``'s values, when it has any, get one per-tensor scale; the integer
product accumulates in int32 and is dequantized once, with the row scale ``r`` (the other
degree normalization) fused into that step. The normalization values themselves are never
quantized. Used by :func:`dgl_rsc.sparse.products.csr_mm` when its scales carry an
:class:`~dgl_rsc.int8.spec.Int8State`, for the forward, the exact backward and RSC's sampled
backward (the cached slice ``A[S, :]^T`` times the int8 rows of ``dY``) alike.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..backends import resolve_int8
from ..sparse.buffers import OutputPool
from ..sparse.csr import CSR
from ..sparse.products import csr_mm
from ..sparse.scales import Scales
from .choose import sparse_choice, sparse_measuring
from .quantize import QMAX
from .spec import Int8State

__all__ = ["ACC_LIMIT", "int8_csr_mm", "check_accumulator", "quantized_product"]

ACC_LIMIT = 2**31 - 1


def check_accumulator(A: CSR, has_values: bool) -> None:
    """Raise a ``ValueError`` when a row of ``A`` could overflow the int32 accumulator."""
    if A.nnz == 0:
        return
    longest = int(A.row_nnz().max())
    bound = longest * QMAX * (QMAX if has_values else 1)
    if bound > ACC_LIMIT:
        raise ValueError(
            f"INT8 product: a row of A has {longest} entries, and {longest} x 127"
            f"{' x 127' if has_values else ''} can overflow the int32 accumulator; "
            "train this layer in fp32 (precision='fp32') or split the row."
        )


def _quantize_scaled(state: Int8State, x: torch.Tensor, col: Optional[torch.Tensor]):
    """Codes and per-column scales of ``diag(col) x``: the kernel module's fused
    ``quantize_columns`` where it has one (one pass for the maxima, one for the codes, no
    scaled copy: the CPU kernels), else the scaled copy quantized by the state."""
    prepared = state.prepared
    if prepared is not None:
        state.prepared = None
        codes = prepared.take(x, col)
        if codes is not None:  # written by the fused epilogue (.codes), the same bits
            return codes
    kernels = resolve_int8(state.spec.backend, x.device)
    fused = getattr(kernels, "quantize_columns", None)
    col = None if col is None else col.detach().float()
    if fused is None:
        return state.quantize(x if col is None else x * col.reshape(-1, 1), 0)
    rounding = "stochastic" if state.stochastic else "nearest"
    return fused(x, col, rounding, state.next_seed() if state.stochastic else 0)


def int8_csr_mm(
    A: CSR,
    X: torch.Tensor,
    row_factor: Optional[torch.Tensor],
    col: Optional[torch.Tensor],
    state: Int8State,
) -> torch.Tensor:
    """``(M, D)`` ``diag(row_factor) A diag(col) X`` on INT8 operands, in ``X``'s dtype.

    ``A (M, N)``, ``X (N, D)``, ``row_factor (M,)`` multiplicative, ``col (N,)``; no
    autograd (the caller's function owns it)."""
    m, d = A.shape[0], X.shape[1]
    if m == 0 or d == 0 or A.nnz == 0:
        return X.new_zeros((m, d))
    has_values = A.values is not None
    check_accumulator(A, has_values)
    qX, sX = _quantize_scaled(state, X.detach().float(), col)
    col_scale = sX.reshape(d)
    qv = None
    if has_values:
        qv, sv = state.quantize(A.values.detach().float().reshape(-1, 1), None)
        qv, col_scale = qv.reshape(-1), col_scale * sv.reshape(())
    rf = None if row_factor is None else row_factor.detach().float().contiguous()
    kernels = resolve_int8(state.spec.backend, X.device)
    out = kernels.int8_spmm(A.indptr, A.indices, qv, qX.contiguous(), rf, col_scale.contiguous())
    return out.to(X.dtype)


def quantized_product(A: CSR, X: torch.Tensor, scales: Scales) -> torch.Tensor:
    """``(M, D)`` ``diag(r) A diag(c) X`` of scales carrying an INT8 state: in INT8
    (:func:`int8_csr_mm`) or by the exact fp32 engine, per the state's ``spec.sparse``
    (``"auto"``: whichever measured faster for this shape, :mod:`.choose`)."""
    state = scales.quant

    def int8():
        return int8_csr_mm(A, X, scales.row_factor(), scales.col, state)

    def fp32():  # while timed against INT8, its output is not kept in A's buffer pool
        trial = sparse_measuring(A, X.shape[1], state.spec.sparse, X.device)
        return csr_mm(A, X, scales._replace(quant=None), pool=OutputPool() if trial else None)

    return sparse_choice(A, X, state.spec.sparse, int8, fp32)
