"""Greedy allocation of the backward budget across layers.

Problem (RSC.md, challenge 1). Layer ``l`` ranks its rows by a key and keeps a prefix of
``k_l`` rows of that order. Keeping a prefix costs ``d_l * (non-zeros of the prefix)`` and
leaves out the error ``e_l(k_l) = 1 - mass_l(prefix) / mass_l(all)``. Minimize
``sum_l e_l(k_l)`` subject to ``sum_l cost_l(k_l) <= budget``.

Method. Start from all rows with a positive key and remove rows from the tails, always the
removal with the smallest error increase per unit of cost saved (the reference
implementation's greedy, but one row at a time instead of 2% of the rows at a time). A
multi-way greedy over per-layer sequences that must be consumed in order takes element ``j``
of a sequence once the threshold passes the running maximum of that sequence's ratios up
to ``j``; so sorting all rows of all layers by that running maximum gives the greedy's whole
removal order in one vectorized pass. The cut is the shortest removal prefix that meets the
budget. Finally, rows are added back (next row of a layer's kept prefix) while slack allows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = ["LayerProblem", "Allocation", "allocate", "objective"]


@dataclass
class LayerProblem:
    """One layer's input to :func:`allocate`.

    Attributes:
        key: ``(M,)`` ranking key; rows are kept in descending key order (ties: lower id).
        mass: ``(M,)`` non-negative error mass of each row (``s`` or ``s^2``).
        nnz: ``(M,)`` non-zeros of each row.
        width: the layer's feature width ``d_l`` (cost of a row is ``nnz * width``).
        min_k: rows always kept (capped by the number of rows with a positive key).
    """

    key: torch.Tensor
    mass: torch.Tensor
    nnz: torch.Tensor
    width: int
    min_k: int = 0


@dataclass
class Allocation:
    """Solver output, one entry per layer: ``k`` rows kept and their ``nnz`` non-zeros."""

    k: list[int]
    nnz: list[int]
    objective: float
    cost: float


def _prefix_tables(p: LayerProblem):
    order = torch.sort(p.key.float(), descending=True, stable=True).indices
    n_useful = int((p.key > 0).sum())
    order = order[:n_useful]
    mass = p.mass.double()[order]
    total = float(mass.sum())
    cost = p.nnz.double()[order] * p.width
    return order, mass, cost, max(total, 0.0)


def objective(problems: Sequence[LayerProblem], ks: Sequence[int]) -> tuple[float, float]:
    """``(error, cost)`` of keeping the first ``ks[l]`` rows of each layer's order."""
    err, cost = 0.0, 0.0
    for p, k in zip(problems, ks):
        _, mass, c, total = _prefix_tables(p)
        if total > 0:
            err += float(mass[k:].sum()) / total
        cost += float(c[:k].sum())
    return err, cost


def allocate(problems: Sequence[LayerProblem], budget: float) -> Allocation:
    """Choose ``k_l`` per layer with ``sum_l cost_l <= budget`` and small summed error.

    ``budget`` is in cost units (non-zeros times width). Runs on the device of the keys;
    one sort over all rows of all layers plus a few passes. The ``min_k`` floors may push
    the cost over ``budget``; nothing else does.
    """
    tables = [_prefix_tables(p) for p in problems]
    device = problems[0].key.device if problems else torch.device("cpu")
    seq_ratio, seq_cost, seq_layer, ks = [], [], [], []
    for li, (p, (_, mass, cost, total)) in enumerate(zip(problems, tables)):
        n = mass.numel()
        floor = min(p.min_k, n)
        ks.append(n)
        # removal order: from the tail of the kept prefix back to the floor
        rm_mass = mass[floor:].flip(0)
        rm_cost = cost[floor:].flip(0)
        ratio = (rm_mass / total if total > 0 else torch.zeros_like(rm_mass)) / rm_cost.clamp(
            min=1e-30
        )
        if ratio.numel():
            ratio = torch.cummax(ratio, 0).values
        seq_ratio.append(ratio)
        seq_cost.append(rm_cost)
        seq_layer.append(torch.full((ratio.numel(),), li, dtype=torch.long, device=device))
    total_cost = float(sum(float(t[2].sum()) for t in tables))
    if seq_ratio and total_cost > budget:
        ratio = torch.cat(seq_ratio)
        cost = torch.cat(seq_cost)
        layer = torch.cat(seq_layer)
        order = torch.sort(ratio, stable=True).indices
        saved = torch.cumsum(cost[order], 0)
        need = total_cost - budget
        n_remove = int(
            torch.searchsorted(saved, torch.tensor([need], dtype=saved.dtype, device=saved.device))
        )
        n_remove = min(n_remove + 1, order.numel())
        removed = torch.bincount(layer[order[:n_remove]], minlength=len(problems))
        ks = [k - int(r) for k, r in zip(ks, removed.tolist())]
        ks = _add_back(tables, ks, budget)
    err, cost = 0.0, 0.0
    nnz = []
    for p, (order, mass, c, total), k in zip(problems, tables, ks):
        if total > 0:
            err += float(mass[k:].sum()) / total
        cost += float(c[:k].sum())
        nnz.append(int(p.nnz[order[:k]].sum()))
    return Allocation(k=ks, nnz=nnz, objective=err, cost=cost)


def _add_back(tables, ks, budget, max_rounds: int = 256):
    """Re-add the next row of some layer's prefix while it fits; best error gain first."""
    ks = list(ks)
    used = sum(float(c[:k].sum()) for (_, _, c, _), k in zip(tables, ks))
    for _ in range(max_rounds):
        best, best_gain = None, 0.0
        for li, ((_, mass, c, total), k) in enumerate(zip(tables, ks)):
            if k < mass.numel() and used + float(c[k]) <= budget and total > 0:
                gain = float(mass[k]) / total
                if gain > best_gain:
                    best, best_gain = li, gain
        if best is None:
            break
        used += float(tables[best][2][ks[best]])
        ks[best] += 1
    return ks
