"""Products that read few rows of a scaled operand: the rows gathered, the columns renumbered.

RSC's step multiplies slices ``A[S]^T`` and ``A[P_g]^T`` (``(N, M)``, cut from ``A (M, N)``)
with ``dY (M, D)`` scaled by a column factor (the normalization's ``r`` times the rows' weights:
``K`` for the group's rows outside the sample, 0 on the sample's). A slice has entries in the
columns ``S`` or ``P_g`` alone, a few of ``dY``'s ``M`` rows, so scaling the whole of ``dY``
(a pass over ``M * D`` elements and an allocation, per slice and step) mostly scales rows that
no entry reads. Here a structure's columns are renumbered once to the ``C`` it uses
(:func:`compacted`, ascending, so every row keeps its entries' order and the product its
bits), and the operand is the ``(C, D)`` gather of those rows, scaled (:func:`gathered`).
Used on the CPU by :func:`~dgl_rsc.sparse.products.csr_mm_sum` (DGL's kernel, and torch.sparse
where the factor is not folded into the values). Inside training on the 2-core VM the step
product got 1.16-1.36x faster (quickstart at a 20% budget: 4.20 to 3.62 ms), bit for bit the
same, for a renumbered copy of each cached slice's indices (``docs/benchmarks.md``, *Gathered
operand rows*).
"""

from __future__ import annotations

from typing import Optional

import torch

from .csr import _Structure

__all__ = ["compacted", "gathered", "pays"]

#: a product gathers its operand's rows when it reads at most this share of them
MAX_SHARE = 0.5


def compacted(structure) -> Optional[tuple]:
    """``(structure_c, cols)``: ``structure`` ``(M, N)`` with its columns renumbered to the
    ``C`` it uses, ``(M, C)``, and ``cols (C,)`` int64, ascending, the original column of
    each new one; ``None`` where it uses more than :data:`MAX_SHARE` of its columns (or has
    no entries). Decided, and the copy made, once per structure and kept with it
    (``structure._compact``)."""
    if structure._compact is None:
        structure.check_unchanged()
        idx = structure.indices.long()
        used = torch.zeros(structure.shape[1], dtype=torch.bool, device=idx.device)
        used[idx] = True
        cols = used.nonzero().squeeze(1)
        structure._compact = (None,)
        if 0 < cols.numel() <= MAX_SHARE * structure.shape[1]:
            new_id = torch.cumsum(used, 0) - 1  # new id of each used column
            renum = new_id.index_select(0, idx).to(structure.indices.dtype)
            shape = (structure.shape[0], cols.numel())
            structure._compact = (_Structure(structure.indptr, renum, shape), cols)
    return None if structure._compact[0] is None else structure._compact


def pays(structure, factor: Optional[torch.Tensor]) -> bool:
    """Whether a product of ``structure`` with an operand scaled by ``factor`` gathers the
    operand's rows: there is a factor (an unscaled operand is read in place) and the matrix
    reads at most :data:`MAX_SHARE` of the rows (:func:`compacted` is not ``None``)."""
    return factor is not None and compacted(structure) is not None


def gathered(X: torch.Tensor, cols: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``(C, D)`` ``diag(factor) X`` at the rows ``cols (C,)`` of ``X (N, D)``, ``factor
    (N,)``: element for element the rows of ``X * factor`` (the factor cast to ``X``'s
    dtype first, as the full scaling does)."""
    f = factor.to(X.dtype).index_select(0, cols).unsqueeze(1)
    return X.index_select(0, cols).mul_(f)
