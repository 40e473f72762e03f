"""Exact sparse-dense products on torch's sparse CSR engine (MKL on CPU, cuSPARSE on CUDA).

These are the fastest exact engines measured on the project's machines (see
``docs/benchmarks.md``); both the forward product and the exact backward use them.
"""

from __future__ import annotations

import warnings

import torch

from .csr import CSR

__all__ = ["csr_mm", "csr_t_mm", "sddmm"]

warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")

# CPU kernels of torch.sparse (MKL) have no fp16/bf16 path: compute those in fp32.
_CPU_UPCAST = (torch.float16, torch.bfloat16)


def _mm(indptr, indices, values, shape, X: torch.Tensor) -> torch.Tensor:
    out_dtype = X.dtype
    if X.device.type == "cpu" and out_dtype in _CPU_UPCAST:
        X = X.float()
    if shape[0] == 0 or shape[1] == 0 or indices.numel() == 0:
        return X.new_zeros((shape[0], X.shape[1])).to(out_dtype)
    A = torch.sparse_csr_tensor(indptr, indices, values.to(X.dtype), size=shape)
    return torch.sparse.mm(A, X.contiguous()).to(out_dtype)


def csr_mm(A: CSR, X: torch.Tensor) -> torch.Tensor:
    """``A @ X``: ``A (M, N)``, ``X (N, D)`` -> ``(M, D)`` in ``X``'s dtype. No autograd."""
    return _mm(A.indptr, A.indices, A.values_or_ones(X.dtype), A.shape, X)


def csr_t_mm(A: CSR, Y: torch.Tensor) -> torch.Tensor:
    """``A^T @ Y``: ``Y (M, D)`` -> ``(N, D)``, through the cached transposed structure."""
    t_indptr, t_rows, perm = A.transposed()
    vals = A.values_or_ones(Y.dtype)
    if A.values is not None:
        vals = vals[perm]
    return _mm(t_indptr, t_rows, vals, (A.shape[1], A.shape[0]), Y)


def sddmm(A: CSR, dY: torch.Tensor, X: torch.Tensor, chunk: int = 1 << 20) -> torch.Tensor:
    """``(nnz,)`` ``<dY[i], X[j]>`` for every stored entry ``(i, j)``: the gradient of ``A``'s
    values in ``Y = A @ X``. Processed in chunks of edges to bound memory at ``chunk * D``."""
    rows = A.row_ids()
    cols = A.indices.long()
    out = torch.empty(A.nnz, dtype=torch.float32, device=A.device)
    for start in range(0, A.nnz, chunk):
        r = rows[start : start + chunk]
        c = cols[start : start + chunk]
        out[start : start + chunk] = (dY[r].float() * X[c].float()).sum(1)
    return out
