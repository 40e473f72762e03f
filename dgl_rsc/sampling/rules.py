"""Selection rules: how rows are ranked for the sampled product, and what the solver weighs.

A rule is one :class:`Rule` entry of :data:`RULES`: its ``key`` ranks the rows (kept in
descending key order under the non-zero budget) and its ``mass`` is the error a dropped row
leaves, which the budget solver adds up per layer. Adding a rule is one entry here plus its
test; :class:`~dgl_rsc.RSCConfig` takes its names from this registry.

Every key goes through :func:`selection_key`, which gives the backends the contract they rely
on (the CuPy radix select orders the bits of non-negative float32 values): keys are float32,
``>= 0``, ``0`` for rows that cannot contribute (zero score or no non-zeros, never kept) and
``+inf`` for rows with a non-finite score (always kept, so NaN/Inf reach the gradient as on
the exact path).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

__all__ = ["Rule", "RULES", "get_rule", "selection_key", "kept_count"]

_TINY = float(torch.finfo(torch.float32).tiny)  # smallest normal float32
_HUGE = float(torch.finfo(torch.float32).max)


@dataclasses.dataclass(frozen=True)
class Rule:
    """One selection rule.

    Attributes:
        name: the config name.
        key: ``(scores (M,), row_nnz (M,)) -> (M,)`` ranking key for finite, positive scores.
        mass: ``scores (M,) -> (M,)`` non-negative error mass of each row (for the solver).
        summary: one line for docs and error messages.
    """

    name: str
    key: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    mass: Callable[[torch.Tensor], torch.Tensor]
    summary: str


RULES: dict[str, Rule] = {
    r.name: r
    for r in (
        Rule(
            "topk",
            key=lambda s, nnz: s.clone(),
            mass=lambda s: s,
            summary="keep rows by score s_i (the paper)",
        ),
        Rule(
            "cost",
            key=lambda s, nnz: s.double().square() / nnz.clamp(min=1).double(),
            mass=lambda s: s.square(),
            summary="keep rows by s_i^2 / nnz_i (the fractional-knapsack rule for the energy)",
        ),
    )
}


def get_rule(name: str) -> Rule:
    """The registered rule ``name``, or a ``ValueError`` listing the known ones."""
    if name not in RULES:
        raise ValueError(f"unknown selection rule {name!r}; known rules: {', '.join(RULES)}.")
    return RULES[name]


def selection_key(scores: torch.Tensor, row_nnz: torch.Tensor, rule: str) -> torch.Tensor:
    """``(M,)`` float32 ranking key of ``rule`` with the contract of the module docstring.

    Example:
        >>> s = torch.tensor([2.0, 0.0, float("nan"), 1.0])
        >>> selection_key(s, torch.tensor([4, 3, 1, 0]), "cost").tolist()
        [1.0, 0.0, inf, 0.0]
    """
    s = scores.float()
    finite = torch.isfinite(s)
    key = get_rule(rule).key(torch.where(finite, s, torch.zeros_like(s)), row_nnz).double()
    # a finite positive score keeps a finite positive float32 key (no over- or underflow)
    key = key.clamp(min=_TINY, max=_HUGE).float()
    key = torch.where(finite, key, torch.full_like(key, float("inf")))
    return torch.where((row_nnz > 0) & (s != 0), key, torch.zeros_like(key))


def kept_count(fit, useful, min_k: int, forced):
    """Rows kept: ``max(min(max(fit, min(useful, min_k)), useful), forced)``.

    ``fit`` rows fit the budget, ``useful`` have a positive key, ``forced`` an infinite key.
    Works on 0-dim tensors (no host synchronization) and on ints. The CUDA kernel
    ``rsc_select_k`` in ``cuda/rsc_kernels.cu`` computes the same; the GPU tests compare it
    with this definition.
    """
    if isinstance(fit, torch.Tensor):
        k = torch.minimum(torch.maximum(fit, torch.clamp(useful, max=min_k)), useful)
        return torch.maximum(k, forced)
    return max(min(max(fit, min(useful, min_k)), useful), forced)
