"""The RSC sparse-dense product: exact forward, approximated backward for the dense operand.

``spmm_csr`` is the DGL-free entry point; ``spmm`` takes a ``dgl.sparse.SparseMatrix``.
Both end in :class:`RSCSpMM`, the one ``torch.autograd.Function`` of the package, or, while
``torch.compile`` traces, in the custom operator ``dgl_rsc::spmm`` (:mod:`dgl_rsc.core.ops`).
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from ..sparse.csr import CSR, check_shape
from ..sparse.products import Scales, csr_mm, sddmm
from ..sparse.structure_cache import TensorStructures
from .backward import BackwardSampler, SamplerSource, feature_grad
from .fixed import Sampler
from .ops import SlotRef, compiled_spmm, compiling
from .ops_memo import memo_spmm

__all__ = ["RSCSpMM", "spmm_csr", "spmm", "check_dense", "Sampler"]

RSCArg = Union[None, float, SamplerSource, BackwardSampler]

#: structures of raw CSR tensors given to :func:`spmm_csr` without a controller
_RAW = TensorStructures()


class RSCSpMM(torch.autograd.Function):
    """``Y = diag(r) A diag(c) X`` with ``A (M, N)`` sparse, ``X (N, D)`` dense, optional
    row/column scales (``r``, ``c``; ``scales.row_divide`` divides by ``r``).

    ``backward`` computes ``dX`` through ``sampler.backward_product(A, dY, scales)`` (the exact
    transposed product when ``sampler`` is ``None``) and, when ``A``'s values require grad,
    ``dA = r_i c_j <dY_i, X_j>`` exactly (SDDMM). ``A``'s values, ``X`` (only when ``dA`` is
    needed) and the scales are saved with ``save_for_backward``, so that modifying one of them
    in place before the backward raises autograd's version-counter error instead of giving a
    wrong gradient; ``A``'s index arrays are checked the same way by the structure itself.
    """

    @staticmethod
    def forward(ctx, values, X, A: CSR, sampler, scales: Scales):
        ctx.structure = A.with_values(None)
        ctx.sampler = sampler
        ctx.row_divide = scales.row_divide
        ctx.quant = scales.quant
        need_dA = values is not None and ctx.needs_input_grad[0]
        ctx.save_for_backward(
            values, X if need_dA else None, scales.row, scales.col, scales.hint_col
        )
        return csr_mm(A, X, scales)

    @staticmethod
    def backward(ctx, dY):
        values, X, row, col, hint_col = ctx.saved_tensors
        A = ctx.structure.with_values(values)
        A.check_unchanged()
        scales = Scales(row, col, ctx.row_divide, hint_col, ctx.quant)
        dvalues = dX = None
        if ctx.needs_input_grad[0]:
            dvalues = sddmm(A, dY, X, scales).to(values.dtype)
        if ctx.needs_input_grad[1]:
            dX = feature_grad(ctx.sampler, A, dY, scales)
        return dvalues, dX, None, None, None


def check_dense(X, n_rows: int, device: torch.device, name: str = "X") -> None:
    """Raise a ``TypeError``/``ValueError`` naming ``name`` if ``X`` cannot be multiplied."""
    if not isinstance(X, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(X).__name__}.")
    if not X.is_floating_point():
        raise TypeError(
            f"{name} must be floating point (fp16/bf16/fp32/fp64), got {X.dtype}; cast it "
            f"with {name}.float()."
        )
    if X.dim() not in (1, 2):
        raise ValueError(
            f"{name} must be 1-D (N,) or 2-D (N, D), got shape {tuple(X.shape)}; reshape it "
            f"with {name}.reshape({name}.shape[0], -1)."
        )
    if X.shape[0] != n_rows:
        raise ValueError(
            f"shape mismatch: A has {n_rows} columns but {name} has {X.shape[0]} rows; "
            f"{name} must be ({n_rows}, D)."
        )
    if X.device != device:
        raise ValueError(
            f"device mismatch: A is on {device} but {name} is on {X.device}; move one of "
            f"them with .to(...)."
        )


def _resolve_sampler(rsc: RSCArg, X: torch.Tensor):
    if rsc is None:
        return None
    if not (torch.is_grad_enabled() and X.requires_grad):
        return None  # no backward for X: no sampling work, no product slot used
    if isinstance(rsc, SamplerSource):
        return rsc.next_layer()
    if isinstance(rsc, BackwardSampler):
        return rsc
    if isinstance(rsc, SlotRef):
        return rsc.ctl.slot(rsc.index)
    if isinstance(getattr(rsc, "index", None), int):  # a controller's LayerState
        raise TypeError(
            f"rsc is a {type(rsc).__name__}, which holds a product's state but not the step "
            f"it runs in; pass controller.slot({rsc.index}) (or the controller itself) instead."
        )
    if isinstance(rsc, (float, int)) and not isinstance(rsc, bool):
        return Sampler(float(rsc))
    raise TypeError(
        "rsc must be None (exact backward), a budget fraction in (0, 1], an RSCController "
        f"or one of its slots (controller.slot(i)), got {type(rsc).__name__}."
    )


def spmm_csr(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    values: Optional[torch.Tensor],
    shape,
    X: torch.Tensor,
    rsc: RSCArg = None,
    *,
    row_scale: Optional[torch.Tensor] = None,
    col_scale: Optional[torch.Tensor] = None,
    row_divide: bool = False,
) -> torch.Tensor:
    """``diag(row_scale) A diag(col_scale) X`` for ``A`` given as CSR tensors; backward
    approximated per ``rsc``.

    Args:
        indptr: ``(M+1,)`` int32/int64.
        indices: ``(nnz,)`` column ids.
        values: ``(nnz,)`` floating values or ``None`` (all ones). Gradients flow to it.
            Any floating dtype (fp16/bf16 included): the product runs in ``X``'s dtype
            (values are cast to it), and the gradient of ``values`` comes back in theirs.
        shape: ``(M, N)``, two non-negative integers (a float, string or bool is refused).
        X: ``(N,)`` or ``(N, D)`` floating.
        rsc: ``None`` for the exact backward; a float budget fraction for stateless top
            rows; an :class:`RSCController` (this call is its next product) or one of its
            slots (``controller.slot(i)``: product ``i`` in the current step).
        row_scale: ``(M,)`` scale of the output rows (``None``: 1); with ``row_divide`` the
            rows are divided by it (mean aggregation by in-degree), and a row whose scale is
            0 (an empty row's in-degree) gives 0, as DGL's mean does. No gradient flows to it.
        col_scale: ``(N,)`` scale of ``X``'s rows before the product (``None``: 1).

    The scales are part of the matrix RSC samples from: rows are scored as rows of the
    normalized matrix ``diag(r) A diag(c)``, as in the paper (``||Â_i|| * ||dY_i||``).

    Returns:
        ``(M,)`` or ``(M, D)`` in ``X``'s dtype.

    Example:
        >>> import torch
        >>> indptr, indices = torch.tensor([0, 2, 3]), torch.tensor([0, 1, 1])
        >>> X = torch.ones(2, 4, requires_grad=True)
        >>> Y = spmm_csr(indptr, indices, None, (2, 2), X, rsc=0.5)
        >>> Y[:, 0].tolist()
        [2.0, 1.0]
        >>> spmm_csr(indptr, indices, None, (2, 2), X, row_scale=torch.tensor([2.0, 1.0]),
        ...          row_divide=True)[:, 0].tolist()
        [1.0, 1.0]
    """

    shape = check_shape(shape)

    def build():
        return CSR(indptr, indices, None, shape)

    # reuse the structure (checked once; its transpose, the engine's choice) while the same
    # index tensors come in: a controller's cache, else one that lives as long as they do
    if isinstance(rsc, SamplerSource):
        base = rsc.structures.get(indptr, build)
        if base.indices is not indices or base.shape != shape:
            rsc.structures.drop(indptr)
            base = rsc.structures.get(indptr, build)
    elif isinstance(indptr, torch.Tensor) and isinstance(indices, torch.Tensor):
        base = _RAW.get(indptr, indices, shape, lambda p, i: CSR(p, i, None, shape))
    else:
        base = build()
    return spmm_matrix(
        base.with_values(values), X, rsc,
        row_scale=row_scale, col_scale=col_scale, row_divide=row_divide,
    )  # fmt: skip


def _check_scale(name: str, t, n: int, X: torch.Tensor):
    if t is None:
        return None
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor or None, got {t!r:.60}.")
    if t.numel() != n:
        raise ValueError(f"{name} must have {n} entries (one per row), got shape {tuple(t.shape)}.")
    if t.device != X.device:
        raise ValueError(f"{name} is on {t.device} but X on {X.device}; move it with .to().")
    return t.detach().reshape(n)


def spmm_matrix(
    A: CSR,
    X: torch.Tensor,
    rsc: RSCArg = None,
    *,
    row_scale: Optional[torch.Tensor] = None,
    col_scale: Optional[torch.Tensor] = None,
    row_divide: bool = False,
    score_col_scale: Optional[torch.Tensor] = None,
    quant=None,
    memo: int = 0,
) -> torch.Tensor:
    """``diag(row_scale) A diag(col_scale) X`` for a :class:`~dgl_rsc.CSR` (see
    :func:`spmm_csr`). ``score_col_scale (N,)``: a column scale the caller already applied to
    ``X`` (or before a dense product that produced ``X``); not applied again, only used to
    score rows as rows of the normalized matrix. ``quant``: an
    :class:`~dgl_rsc.int8.spec.Int8State` to run the forward and backward products (exact
    or sampled) on INT8 operands, or ``None``. ``memo``: while torch.compile traces, a handle
    of :mod:`dgl_rsc.core.ops_memo` under which a product whose ``X`` needs no gradient is
    reused across steps (0: none; eager code ignores it)."""
    check_dense(X, A.shape[1], A.device)
    row = _check_scale("row_scale", row_scale, A.shape[0], X)
    if row is not None and row_divide:  # x / inf = 0: a row divided by 0 gives 0, not NaN
        row = torch.where(row == 0, torch.full_like(row, float("inf")), row)
    scales = Scales(
        row,
        _check_scale("col_scale", col_scale, A.shape[1], X),
        bool(row_divide) and row_scale is not None,
        _check_scale("score_col_scale", score_col_scale, A.shape[1], X),
        quant,
    )
    vec = X.dim() == 1
    X2 = X.unsqueeze(1) if vec else X
    if compiling():  # one custom operator node; the sampler is bound when it runs
        grad = torch.is_grad_enabled() and X.requires_grad
        if memo and quant is None and not grad:
            Y = memo_spmm(A, X2, scales, memo)
        else:
            Y = compiled_spmm(A, X2, rsc if rsc is not None and grad else None, scales)
    else:
        Y = RSCSpMM.apply(A.values, X2, A, _resolve_sampler(rsc, X), scales)
    return Y.squeeze(1) if vec else Y


def spmm(A, X: torch.Tensor, rsc: RSCArg = None, *, row_scale: Optional[torch.Tensor] = None,
         col_scale: Optional[torch.Tensor] = None,
         row_divide: bool = False) -> torch.Tensor:  # fmt: skip
    """``A @ X`` for a ``dgl.sparse.SparseMatrix`` ``A (M, N)`` with scalar values.

    Same forward as ``dgl.sparse.spmm``; the backward for ``X`` is approximated per ``rsc``
    (see :func:`spmm_csr`, also for the optional scales); the gradient of ``A.val`` is exact.
    """
    from ..dgl.interop import csr_from_sparse_matrix

    kw = dict(row_scale=row_scale, col_scale=col_scale, row_divide=row_divide)
    if isinstance(A, CSR):
        return spmm_matrix(A, X, rsc, **kw)
    cache = rsc.structures if isinstance(rsc, SamplerSource) else None
    return spmm_matrix(csr_from_sparse_matrix(A, cache), X, rsc, **kw)
