"""The backward halo sample: which gradient rows of a halo block travel, unbiased.

In the backward of ``Y_own = A_local [X_own; X_halo]`` rank ``r`` computes the gradient of
every local column, ``G = A_local^T dY`` (exactly, or RSC's sampled product), and sends the
halo block's rows ``G[u]`` (``u`` a halo column, i.e. a source node owned by another rank)
back to their owners. Sampling *halo columns* makes the rows sent follow a budget on any graph
(sampling destination rows, as RSC's local product does, leaves almost every halo column
touched where nodes have many neighbours).

Of the block's ``m`` non-zero rows, ``k`` are sent in expectation: row ``u`` with probability

    p_u = min(1, ||G[u]|| / tau),      sum_u p_u = k,

scaled by ``1 / p_u``. The rows with ``p_u = 1`` (the largest) always travel; the others form an
unbiased remainder. Among all inclusion probabilities with ``sum p_u = k`` these minimize the
variance ``sum_u ||G[u]||^2 (1 / p_u - 1)`` (the same argument that makes RSC's scores
``||A[i,:]|| ||dY[i,:]||`` the variance-optimal column-row sampling, here with the product's
own rows as scores). The draw is systematic: one uniform offset on the line of intervals of
lengths ``p_u``, so each row is included with probability exactly ``p_u`` and the count is
``floor(k)`` or ``ceil(k)``, never more: the bytes are bounded, not only expected.

:func:`threshold_table` gives the variance (and the variance of a quantized message on top)
at many ``k`` at once from the sorted row norms, for the byte budget's allocator
(:mod:`.comm_budget`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch

__all__ = [
    "inclusion_probabilities",
    "systematic_sample",
    "HaloRows",
    "sample_halo_rows",
    "sample_variance",
    "threshold_table",
]


def inclusion_probabilities(norms: torch.Tensor, k: float) -> torch.Tensor:
    """``(R,)`` float64 ``p_u = min(1, norms_u / tau)`` with ``sum p = min(k, m)`` (``m``: rows
    with a positive norm; rows of norm 0 get 0).

    Example:
        >>> inclusion_probabilities(torch.tensor([8.0, 1.0, 1.0, 0.0]), 2).tolist()
        [1.0, 0.5, 0.5, 0.0]
    """
    a = norms.detach().double().reshape(-1)
    nz = a > 0
    m = int(nz.sum())
    if k >= m:
        return nz.double()
    if k <= 0:
        return torch.zeros_like(a)
    s = torch.sort(a, descending=True).values[:m]
    tail = torch.flip(torch.cumsum(torch.flip(s, [0]), 0), [0])  # tail[t] = sum_{i >= t} s_i
    # the fewest rows t kept with p = 1: the first t with s_t * (k - t) <= tail_t
    h = torch.arange(m, dtype=a.dtype, device=a.device) + tail / s
    t = int(torch.searchsorted(h, torch.tensor([float(k)], dtype=a.dtype, device=a.device)))
    t = min(t, m - 1)
    tau = float(tail[t]) / (k - t)
    return (a / tau).clamp_(max=1.0)


def systematic_sample(p: torch.Tensor, generator: Optional[torch.Generator] = None):
    """Indices drawn with inclusion probabilities ``p (R,)`` in ``[0, 1]``: every ``p = 1``
    row, plus a systematic draw over the others (one uniform offset ``U``; row ``u`` is taken
    when a point ``U + j`` falls in its interval of length ``p_u``), so ``P(u) = p_u`` exactly
    and the count is ``floor(sum p)`` or ``ceil(sum p)``. Ascending ``int64`` indices."""
    sure = p >= 1.0
    part = torch.where(sure, torch.zeros_like(p), p.double())
    c = torch.cumsum(part, 0)
    u = torch.rand(1, generator=generator, dtype=torch.float64, device=p.device)
    hit = (torch.floor(c - u) > torch.floor(c - part - u)) & (part > 0)
    return torch.nonzero(sure | hit).squeeze(1)


@dataclasses.dataclass
class HaloRows:
    """What one halo block sends back: ``rows (K,)`` positions in the block (int64,
    ascending), ``values (K, D)`` the rows already scaled by ``1 / p``, the block's non-zero
    rows ``m`` and the sample's predicted variance ``sum ||G_u||^2 (1 / p_u - 1)``."""

    rows: torch.Tensor
    values: torch.Tensor
    nonzero: int
    variance: float


def sample_halo_rows(block: torch.Tensor, k: Optional[int],
                     generator: Optional[torch.Generator] = None) -> HaloRows:  # fmt: skip
    """Sample the rows of one halo block's gradient ``block (R, D)``: at most ``k`` of its
    non-zero rows, each scaled by ``1 / p_u`` (all of them, unscaled, when ``k`` is ``None``
    or at least the non-zero count). A row holding a NaN or Inf always travels (as the exact
    exchange sends it). Unbiased: ``E[scatter(rows, values)] = block``."""
    norms = block.detach().float().norm(dim=1)
    bad = ~torch.isfinite(norms)
    nonzero = (block != 0).any(dim=1) | bad
    m = int(nonzero.sum())
    if k is None or k >= m:
        rows = torch.nonzero(nonzero).squeeze(1)
        return HaloRows(rows, block[rows], m, 0.0)
    score = torch.where(bad, torch.zeros_like(norms), norms)
    p = inclusion_probabilities(score, max(int(k) - int(bad.sum()), 0))
    p = torch.where(bad, torch.ones_like(p), p)
    rows = systematic_sample(p, generator)
    keep = p[rows]
    values = block[rows] / keep.to(block.dtype).unsqueeze(1)
    return HaloRows(rows, values, m, sample_variance(score, p))


def sample_variance(norms: torch.Tensor, p: torch.Tensor) -> float:
    """``sum_u norms_u^2 (1 / p_u - 1)`` over rows with ``p_u > 0`` (the summed variance of
    the sampled block's entries)."""
    a, p = norms.double(), p.double()
    on = p > 0
    return float((a[on].square() * (1.0 / p[on] - 1.0)).sum())


def threshold_table(
    norms: torch.Tensor, ks: Sequence[int], quant_var: Optional[torch.Tensor] = None
):
    """The sample's variance at each row count of ``ks``, from one block's row ``norms (R,)``.

    Args:
        norms: ``(R,)`` row norms of the block's gradient (0 for rows that are not sent).
        ks: rows sent in expectation, one entry per column of the result.
        quant_var: ``(B, R)`` optional variance of each row when quantized at each of ``B``
            widths (unscaled rows); a sampled row scaled by ``1 / p_u`` has ``quant_var /
            p_u^2``, sent with probability ``p_u``: it adds ``quant_var / p_u``.

    Returns:
        ``(sample (K,), quant (B, K))`` float64: the summed sampling variance, and the summed
        quantization variance per width, at each ``k``.

    Example:
        >>> s, _ = threshold_table(torch.tensor([8.0, 1.0, 1.0, 0.0]), [1, 2, 3])
        >>> [round(v, 6) for v in s.tolist()]
        [34.0, 2.0, 0.0]
    """
    a = norms.detach().double().reshape(-1)
    order = torch.argsort(a, descending=True)
    s = a[order]
    m = int((s > 0).sum())
    s = s[:m]
    K = torch.tensor([float(k) for k in ks], dtype=torch.float64)
    B = 0 if quant_var is None else quant_var.shape[0]
    qv = None if quant_var is None else quant_var.double()[:, order[:m]].cpu()
    if m == 0:
        return torch.zeros(len(ks), dtype=torch.float64), torch.zeros(
            B, len(ks), dtype=torch.float64
        )
    s = s.cpu()

    def suffix(x):  # (..., m) -> (..., m + 1), suffix[..., t] = sum_{i >= t} x_i
        z = torch.zeros(x.shape[:-1] + (1,), dtype=x.dtype)
        return torch.cat([torch.flip(torch.cumsum(torch.flip(x, [-1]), -1), [-1]), z], -1)

    tail, tail2 = suffix(s), suffix(s.square())
    h = torch.arange(m, dtype=torch.float64) + tail[:m] / s
    t = torch.searchsorted(h, K).clamp(max=m - 1)
    full = K >= m
    tau = tail[t] / (K - t).clamp(min=1e-300)
    sample = torch.where(full, torch.zeros_like(K), (tau * tail[t] - tail2[t]).clamp(min=0))
    if qv is None:
        return sample, torch.zeros(0, len(ks), dtype=torch.float64)
    head = torch.cat([torch.zeros(B, 1, dtype=torch.float64), torch.cumsum(qv, 1)], 1)
    wtail = suffix(qv / s)
    quant = head[:, t] + tau * wtail[:, t]
    quant = torch.where(full, head[:, m : m + 1].expand(B, len(ks)), quant)
    return sample, quant
