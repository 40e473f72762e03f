"""Symmetric INT8 quantization with one fp32 scale per slice.

``quantize(x, dim)`` returns codes ``q`` (int8, in ``[-127, 127]``) and scales ``s`` (fp32,
``x``'s shape with ``dim`` reduced to 1, or ``(1, 1)`` for ``dim=None``) with ``x ~ q * s``:

* ``s = amax(|x|) / 127`` rounded up to the bfloat16 grid (:func:`dgl_rsc.quant.bf16_scale_up`,
  the rule of the halo codec), so ``|x / s| <= 127`` (the largest entry maps to 126 or 127:
  the bf16 step costs at most 2^-8 of the range);
* nearest: ``q = round_half_even(x / s)``; stochastic: ``q = floor(x / s + u)`` with ``u`` in
  ``[0, 1)`` from :func:`dgl_rsc.quant.hash_uniform` (element ``i`` of ``x`` in row-major
  order, the seed given), unbiased: ``E[q s] = x`` up to ``2^-24`` of a step;
* a zero slice has ``s = 0`` and ``q = 0``; a slice holding NaN or Inf gets a non-finite
  scale, so every product it enters is non-finite too (never a silent finite number).

``dim`` is the *reduced* axis: for a product ``a @ b`` quantize ``a`` with ``dim=1`` (a scale
per row) and ``b`` with ``dim=0`` (a scale per column), so that the scales factor out of the
integer sum and the product is dequantized once: ``(qa @ qb) * sa * sb``.

>>> q, s = quantize(torch.tensor([[1.0, -0.5], [0.25, 0.0]]), dim=1, rounding="nearest")
>>> q.tolist(), s.flatten().tolist()
([[126, -63], [126, 0]], [0.0079345703125, 0.001983642578125])
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..quant.rounding import QMAX, bf16_scale_up, torch_codes

__all__ = ["QMAX", "quantize", "dequantize", "torch_codes"]


def quantize(
    x: torch.Tensor,
    dim: Optional[int],
    rounding: str = "nearest",
    seed: int = 0,
    codes: Callable = torch_codes,
    row_amax: Optional[Callable] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, s)``: int8 codes of ``x (R, C)`` and fp32 scales, one per slice along ``dim``
    (``0``: per column, ``1``: per row, ``None``: per tensor); see the module doc.
    ``codes``: a kernel module's ``quantize_codes`` (bit-identical to :func:`torch_codes`);
    ``row_amax``: its row maxima (``dim=1``; bit-identical to ``|x|.amax(1)``)."""
    if x.dim() != 2:
        raise ValueError(f"quantize takes a 2-D tensor, got shape {tuple(x.shape)}.")
    if rounding not in ("nearest", "stochastic"):
        raise ValueError(f"rounding={rounding!r} is not 'nearest' or 'stochastic'.")
    x = x.detach().float()
    if x.numel() == 0:
        shape = [1, 1] if dim is None else list(x.shape)
        if dim is not None:
            shape[dim] = 1
        return torch.zeros(x.shape, dtype=torch.int8, device=x.device), x.new_zeros(shape)
    if dim is None:
        amax = x.abs().amax().reshape(1, 1)
    elif dim == 1 and row_amax is not None:
        amax = row_amax(x)
    else:
        amax = x.abs().amax(dim=dim, keepdim=True)
    s = bf16_scale_up(amax, float(QMAX))
    return codes(x.contiguous(), s, rounding, seed), s


def dequantize(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``q * s`` in fp32 (exact: ``|q| < 256`` and ``s`` has 8 significant bits)."""
    return q.float() * s
