"""An unbiased estimate of the rows a sample drops: random groups, one per step, in turn.

A cached sample keeps the rows ``S`` with the largest scores and drops the rest ``R``; the
sampled product ``Â[S]^T dY[S]`` leaves out ``Â[R]^T dY[R]`` at every step that reuses it,
the same rows each time. With ``remainder_groups = K`` the refresh also splits the dropped
rows that can contribute (non-zero score) uniformly at random into ``K`` groups ``R_1..R_K``
and cuts each group's slice once; step ``u`` of the sample's life adds

    K * Â[R_g]^T dY[R_g],        g = u mod K,

whose expectation over the random split is ``Â[R]^T dY[R]``: the step's product is then an
unbiased estimate of the exact one (top rows exactly, the rest by a uniform group), and over
``K`` consecutive steps every dropped row enters once. Each step visits about ``nnz(R) / K``
more non-zeros than the sample alone; no cut happens between refreshes.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..sparse.csr import CSR
from ..sparse.products import Scales, csr_mm
from .draw import Sample, cut_rows, scaled_transpose

__all__ = ["cut_groups", "rest_product"]


def cut_groups(
    A: CSR,
    sample: Sample,
    groups: int,
    backend,
    generator: Optional[torch.Generator] = None,
    uses: Optional[int] = None,
) -> list:
    """Split the rows of ``A (M, N)`` that ``sample`` drops and that can contribute (score not
    zero, at least one non-zero) into ``groups`` uniform random groups; return the slices
    ``A[R_g, :]^T`` (``(N, M)`` CSRs, cut with ``backend``) of the first ``min(groups,
    uses)`` of them: a sample used ``uses`` times never reaches the others, and each group
    alone is a uniform draw of the dropped rows.

    ``sample.mask`` and ``sample.scores`` must be set (a fresh sample)."""
    if groups < 1:
        raise ValueError(f"groups must be >= 1, got {groups}.")
    count = groups if uses is None else max(1, min(groups, int(uses)))
    dropped = ~sample.mask & (sample.scores != 0) & (A.row_nnz() > 0)
    dev = A.device if generator is None else generator.device
    label = torch.randint(0, groups, (A.shape[0],), generator=generator, device=dev).to(A.device)
    return [cut_rows(A, dropped & (label == g), backend) for g in range(count)]


def rest_product(A: CSR, sample: Sample, dY: torch.Tensor, scales: Scales, use: int,
                 groups: int) -> tuple:  # fmt: skip
    """``(N, D)`` ``K * diag(c) A[R_g]^T diag(r) dY`` for the group ``g = use mod len(rest)``
    of ``sample.rest``, and the 0-dim number of non-zeros it visited (``K = groups``)."""
    group = sample.rest[use % len(sample.rest)]
    k = torch.tensor(float(groups), device=dY.device)
    out = csr_mm(group, dY, scaled_transpose(scales, k, A.shape[1], dY), pool=A.transpose_pool())
    return out, group.indptr[-1].long()
