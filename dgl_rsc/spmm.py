"""The RSC sparse-dense product: exact forward, approximated backward for the dense operand.

``spmm_csr`` is the DGL-free entry point; ``spmm`` takes a ``dgl.sparse.SparseMatrix``.
Both end in :class:`RSCSpMM`, the one ``torch.autograd.Function`` of the package.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from .controller import RSCController
from .csr import CSR
from .layer_state import LayerState, draw_sample
from .products import csr_mm, csr_t_mm, sddmm

__all__ = ["RSCSpMM", "spmm_csr", "spmm", "check_dense", "Sampler"]

RSCArg = Union[None, float, RSCController, LayerState]


class RSCSpMM(torch.autograd.Function):
    """``Y = A @ X`` with ``A (M, N)`` sparse and ``X (N, D)`` dense.

    ``backward`` computes ``dX = sampler.backward_product(A, dY)`` (exact when ``sampler`` is
    ``None``) and, when ``A``'s values require grad, ``dA = SDDMM(dY, X)`` exactly.
    """

    @staticmethod
    def forward(ctx, values, X, A: CSR, sampler):
        ctx.A = A
        ctx.sampler = sampler
        need_dA = values is not None and ctx.needs_input_grad[0]
        ctx.save_for_backward(X if need_dA else None)
        return csr_mm(A, X)

    @staticmethod
    def backward(ctx, dY):
        (X,) = ctx.saved_tensors
        A = ctx.A
        dvalues = dX = None
        if ctx.needs_input_grad[0]:
            dvalues = sddmm(A, dY, X).to(A.values.dtype)
        if ctx.needs_input_grad[1]:
            if ctx.sampler is None:
                dX = csr_t_mm(A, dY)
            else:
                dX = ctx.sampler.backward_product(A, dY)
        return dvalues, dX, None, None


class Sampler:
    """Stateless top rows at a fixed budget fraction (no cache, no schedule).

    Used when ``rsc`` is a float: each backward scores, selects and slices afresh.
    """

    def __init__(
        self, budget: float, rule: str = "cost", min_k: int = 0, backend="auto", rescale=True
    ):
        from .config import RSCConfig

        RSCConfig(budget=budget, rule=rule, min_k=min_k, backend=backend, rescale=rescale)
        self.budget, self.rule, self.min_k, self.backend = budget, rule, min_k, backend
        self.rescale = rescale

    def backward_product(self, A: CSR, dY: torch.Tensor) -> torch.Tensor:
        from .backends import resolve

        backend = resolve(self.backend, dY.device)
        t_slice, _, _, _ = draw_sample(
            A, dY, int(self.budget * A.nnz), self.rule, self.min_k, backend, self.rescale
        )
        return csr_mm(t_slice, dY)


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
        return None  # no backward for X: no sampling work, no layer slot used
    if isinstance(rsc, RSCController):
        return rsc.next_layer()
    if isinstance(rsc, (LayerState, Sampler)):
        return rsc
    if isinstance(rsc, (float, int)) and not isinstance(rsc, bool):
        return Sampler(float(rsc))
    raise TypeError(
        "rsc must be None (exact backward), a budget fraction in (0, 1], an RSCController "
        f"or a LayerState, got {type(rsc).__name__}."
    )


def spmm_csr(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    values: Optional[torch.Tensor],
    shape,
    X: torch.Tensor,
    rsc: RSCArg = None,
) -> torch.Tensor:
    """``A @ X`` for ``A`` given as CSR tensors; backward approximated per ``rsc``.

    Args:
        indptr: ``(M+1,)`` int32/int64.
        indices: ``(nnz,)`` column ids.
        values: ``(nnz,)`` floating values or ``None`` (all ones). Gradients flow to it.
        shape: ``(M, N)``.
        X: ``(N,)`` or ``(N, D)`` floating.
        rsc: ``None`` for the exact backward; a float budget fraction for stateless top
            rows; an :class:`RSCController` (this call is its next layer) or a
            :class:`LayerState`.

    Returns:
        ``(M,)`` or ``(M, D)`` in ``X``'s dtype.

    Example:
        >>> import torch
        >>> indptr, indices = torch.tensor([0, 2, 3]), torch.tensor([0, 1, 1])
        >>> X = torch.ones(2, 4, requires_grad=True)
        >>> Y = spmm_csr(indptr, indices, None, (2, 2), X, rsc=0.5)
        >>> Y[:, 0].tolist()
        [2.0, 1.0]
    """

    def build():
        return CSR(indptr, indices, None, shape)

    if isinstance(rsc, RSCController):
        # reuse the structure (and its cached transpose) while the same index tensors come in
        base = rsc.structures.get(indptr, build)
        if base.indices is not indices or base.shape != tuple(int(s) for s in shape):
            rsc.structures.drop(indptr)
            base = rsc.structures.get(indptr, build)
    else:
        base = build()
    return spmm_matrix(base.with_values(values), X, rsc)


def spmm_matrix(A: CSR, X: torch.Tensor, rsc: RSCArg = None) -> torch.Tensor:
    """``A @ X`` for a :class:`~dgl_rsc.CSR` (see :func:`spmm_csr`)."""
    check_dense(X, A.shape[1], A.device)
    vec = X.dim() == 1
    X2 = X.unsqueeze(1) if vec else X
    sampler = _resolve_sampler(rsc, X)
    Y = RSCSpMM.apply(A.values, X2, A, sampler)
    return Y.squeeze(1) if vec else Y


def spmm(A, X: torch.Tensor, rsc: RSCArg = None) -> torch.Tensor:
    """``A @ X`` for a ``dgl.sparse.SparseMatrix`` ``A (M, N)`` with scalar values.

    Same forward as ``dgl.sparse.spmm``; the backward for ``X`` is approximated per ``rsc``
    (see :func:`spmm_csr`); the gradient of ``A.val`` is exact.
    """
    from .dgl_interop import csr_from_sparse_matrix

    if isinstance(A, CSR):
        return spmm_matrix(A, X, rsc)
    cache = rsc.structures if isinstance(rsc, RSCController) else None
    return spmm_matrix(csr_from_sparse_matrix(A, cache), X, rsc)
