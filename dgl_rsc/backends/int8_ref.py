"""The torch reference of the INT8 sparse-dense product: the specification the Numba and
CUDA kernels (:mod:`dgl_rsc.backends.int8_cpu`, :mod:`~dgl_rsc.backends.int8_numba`,
``cuda/int8_spmm.cu``) are tested against.

``acc[i, f] = sum_{e in row i} v_e * qX[indices[e], f]`` in int32 (``v_e`` the int8 value
codes, 1 without values), then one fused dequantize per entry, two fp32 roundings in this
order: ``out[i, f] = (float(acc[i, f]) * col_scale[f]) * row_factor[i]``. The caller keeps
``|acc|`` below ``2^31`` (:func:`dgl_rsc.int8.spmm.int8_csr_mm` checks it). Every kernel
module also provides ``quantize_codes(x, s, rounding, seed)`` (the int8 codes of
:func:`dgl_rsc.int8.quantize`), here :func:`~dgl_rsc.quant.rounding.torch_codes` itself.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..quant.rounding import torch_codes as quantize_codes

__all__ = ["int8_spmm_acc", "int8_spmm", "dequantize_acc", "quantize_codes"]

_CHUNK = 1 << 22  # entries of the (edges, D) gather per chunk


def int8_spmm_acc(indptr, indices, qvals: Optional[torch.Tensor], qX) -> torch.Tensor:
    """``(M, D)`` int32 accumulation of the CSR ``(indptr, indices, qvals)`` times the int8
    rows of ``qX (N, D)``."""
    m, d = indptr.numel() - 1, qX.shape[1]
    acc = torch.zeros((m, d), dtype=torch.int32, device=qX.device)
    nnz = int(indices.numel())
    if nnz == 0 or d == 0:
        return acc
    counts = (indptr[1:] - indptr[:-1]).long()
    rows = torch.repeat_interleave(torch.arange(m, device=qX.device), counts)
    step = max(1, _CHUNK // max(d, 1))
    for start in range(0, nnz, step):
        idx = indices[start : start + step].long()
        part = qX[idx].to(torch.int32)
        if qvals is not None:
            part.mul_(qvals[start : start + step].to(torch.int32).unsqueeze(1))
        acc.index_add_(0, rows[start : start + step], part)
    return acc


def dequantize_acc(acc, row_factor: Optional[torch.Tensor], col_scale) -> torch.Tensor:
    """``(float(acc) * col_scale[None, :]) * row_factor[:, None]`` in fp32."""
    out = acc.float().mul_(col_scale.reshape(1, -1))
    if row_factor is not None:
        out.mul_(row_factor.reshape(-1, 1))
    return out


def int8_spmm(indptr, indices, qvals, qX, row_factor, col_scale) -> torch.Tensor:
    """``(M, D)`` fp32: :func:`int8_spmm_acc` then :func:`dequantize_acc`."""
    return dequantize_acc(int8_spmm_acc(indptr, indices, qvals, qX), row_factor, col_scale)
