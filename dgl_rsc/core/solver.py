"""Greedy allocation of the backward budget across layers.

Problem (RSC.md, challenge 1). Layer ``l`` ranks its rows by a key and keeps a prefix of
``k_l`` rows of that order. Keeping a prefix costs ``d_l * (non-zeros of the prefix)``, plus
``r_l * k_l`` where the backward before the product is restricted to the rows it reads
(``row_cost``: the dense and elementwise work of one row there), and leaves out the error
``e_l(k_l) = 1 - mass_l(prefix) / mass_l(all)``. Minimize ``sum_l e_l(k_l)`` subject to
``sum_l cost_l(k_l) <= budget``.

Method. Start from all rows with a positive key and remove rows from the tails, always the
removal with the smallest error increase per unit of cost saved, one row at a time. (The
reference implementation's greedy differs: it shrinks one layer's ratio by 2% of its rows per
step and picks the step with the smallest increase of left-out score mass divided by the
layer's exact product norm, whatever budget the step saves; ``tests/core/test_solver.py`` keeps it
as a baseline.) A
multi-way greedy over per-layer sequences that must be consumed in order takes element ``j``
of a sequence once the threshold passes the running maximum of that sequence's ratios up
to ``j``; so sorting all rows of all layers by that running maximum gives the greedy's whole
removal order in one vectorized pass. The cut is the shortest removal prefix that meets the
budget. Then a local search exchanges rows between layers (extend one layer's prefix,
shrink another's just enough) while that lowers the error; each pair of layers is scored
for all extension lengths at once from prefix sums. The local search also polishes a second
start, 2%-of-rows moves picked per unit of cost saved, and the better result is returned: on
random instances the one-row greedy alone lost to the coarse one on about 1 in 40, by <0.3%.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..sampling.order import stable_order

__all__ = ["LayerProblem", "Allocation", "allocate", "objective", "full_cost"]


@dataclass
class LayerProblem:
    """One layer's input to :func:`allocate`.

    Attributes:
        key: ``(M,)`` ranking key; rows are kept in descending key order (ties: lower id).
        mass: ``(M,)`` non-negative error mass of each row (``s`` or ``s^2``).
        nnz: ``(M,)`` non-zeros of each row.
        width: the layer's feature width ``d_l`` (cost of a row is ``nnz * width``).
        min_k: rows always kept (capped by the number of rows with a positive key).
        row_cost: work of one kept row besides its non-zeros, in the same units
            (``nnz * width``): what a row-restricted backward computes per row of the
            gradient the product reads (:func:`dgl_rsc.core.restrict.segment_row_work`);
            ``0`` where the backward before the product computes every row anyway.
    """

    key: torch.Tensor
    mass: torch.Tensor
    nnz: torch.Tensor
    width: int
    min_k: int = 0
    row_cost: float = 0.0


@dataclass
class Allocation:
    """Solver output, one entry per layer: ``k`` rows kept and their ``nnz`` non-zeros."""

    k: list[int]
    nnz: list[int]
    objective: float
    cost: float


def _prefix_tables(p: LayerProblem):
    order = stable_order(p.key.float(), descending=True)
    n_useful = int((p.key > 0).sum())
    order = order[:n_useful]
    mass = p.mass.double()[order]
    total = float(mass.sum())
    cost = p.nnz.double()[order] * p.width + float(p.row_cost)
    return order, mass, cost, max(total, 0.0)


def full_cost(p: LayerProblem) -> float:
    """The cost of keeping every row of ``p`` (the exact backward's work in solver units)."""
    return float(p.nnz.sum()) * p.width + float(p.row_cost) * p.nnz.numel()


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

    ``budget`` is in cost units (non-zeros times width). Runs on the device of the keys
    (the local search on the host); one sort over all rows of all layers plus a few passes.
    The ``min_k`` floors may push the cost over ``budget``; nothing else does.
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
        order = stable_order(ratio)
        saved = torch.cumsum(cost[order], 0)
        need = total_cost - budget
        n_remove = int(
            torch.searchsorted(saved, torch.tensor([need], dtype=saved.dtype, device=saved.device))
        )
        n_remove = min(n_remove + 1, order.numel())
        removed = torch.bincount(layer[order[:n_remove]], minlength=len(problems))
        ks = [k - int(r) for k, r in zip(ks, removed.tolist())]
        floors = [min(p.min_k, t[1].numel()) for p, t in zip(problems, tables)]
        starts = [ks, _grid_start(tables, floors, budget)]
        polished = [_exchange(tables, floors, k0, budget) for k0 in starts if k0 is not None]
        ks = min(polished, key=lambda k: _table_objective(tables, k))
    err, cost = 0.0, 0.0
    nnz = []
    for p, (order, mass, c, total), k in zip(problems, tables, ks):
        if total > 0:
            err += float(mass[k:].sum()) / total
        cost += float(c[:k].sum())
        nnz.append(int(p.nnz[order[:k]].sum()))
    return Allocation(k=ks, nnz=nnz, objective=err, cost=cost)


def _table_objective(tables, ks) -> float:
    return sum(float(m[k:].sum()) / t for (_, m, _, t), k in zip(tables, ks) if t > 0)


def _grid_start(tables, floors, budget, step: float = 0.02):
    """A second start for the local search: shrink one layer at a time by ``step`` of its
    rows (the reference implementation's step size, chosen per unit of cost saved); ``None``
    if it cannot meet the budget.

    The prefix sums at the grid points are fetched in one transfer; the greedy itself runs
    on the host.
    """
    n_steps = int(round(1.0 / step))
    grid = []  # per layer: (ks, err, cost) at ratio 1 - j * step, j = 0..n_steps
    for (_, m, c, t), floor in zip(tables, floors):
        n = m.numel()
        ks = [max(int(round((n_steps - j) / n_steps * n)), floor) for j in range(n_steps + 1)]
        if n == 0 or t <= 0:
            grid.append((ks, [0.0] * len(ks), [0.0] * len(ks)))
            continue
        idx = torch.tensor([max(k - 1, 0) for k in ks], device=m.device)
        cm, cc = torch.cumsum(m, 0)[idx], torch.cumsum(c, 0)[idx]
        vals = torch.stack([cm, cc]).cpu().tolist()
        err = [(t - vm) / t if k else 1.0 for k, vm in zip(ks, vals[0])]
        cost = [vc if k else 0.0 for k, vc in zip(ks, vals[1])]
        grid.append((ks, err, cost))
    pos = [0] * len(grid)
    while sum(g[2][p] for g, p in zip(grid, pos)) > budget:
        best = None
        for li, (_, err, cost) in enumerate(grid):
            p = pos[li]
            if p >= n_steps:
                continue
            saved = cost[p] - cost[p + 1]
            if saved > 0 and (best is None or (err[p + 1] - err[p]) / saved < best[0]):
                best = ((err[p + 1] - err[p]) / saved, li)
        if best is None:
            return None
        pos[best[1]] += 1
    return [g[0][p] for g, p in zip(grid, pos)]


def _exchange(tables, floors, ks, budget, max_rounds: int = 32, window: int = 1024):
    """Local search over prefix lengths: extend layer ``a`` by ``t`` rows and shrink layer
    ``b`` by the fewest rows that keep the budget (or none, when slack allows). All ``t``
    and all pairs of a round are scored at once from prefix sums; the best move is applied
    if it lowers the error. Host-side control work: the tables' prefix sums are read into
    NumPy once (one transfer from a device), where a round's few dozen small operations cost
    microseconds each rather than a torch dispatch (or a kernel launch) each."""
    pre = []
    for _, mass, cost, total in tables:
        m = mass.detach().double().cpu().numpy()
        c = cost.detach().double().cpu().numpy()
        pre.append((np.concatenate(([0.0], np.cumsum(m))), np.concatenate(([0.0], np.cumsum(c))),
                    total))  # fmt: skip
    ks = list(ks)
    for _ in range(max_rounds):
        used = sum(pc[k] for (_, pc, _), k in zip(pre, ks))
        slack = budget - used
        best = None  # (gain, a, b, t, j): the first largest gain in move order
        for a, (pm_a, pc_a, tot_a) in enumerate(pre):
            n_a = pm_a.shape[0] - 1
            if ks[a] >= n_a or tot_a <= 0:
                continue
            hi = min(ks[a] + 1 + window, n_a + 1)  # moves near the boundary only
            ext_cost = pc_a[ks[a] + 1 : hi] - pc_a[ks[a]]  # (t,) for t = 1..
            ext_gain = (pm_a[ks[a] + 1 : hi] - pm_a[ks[a]]) / tot_a
            free = ext_cost <= slack
            g = np.where(free, ext_gain, -1.0)
            t = int(np.argmax(g))
            if best is None or g[t] > best[0]:
                best = (g[t], a, None, t, 0)
            for b, (pm_b, pc_b, tot_b) in enumerate(pre):
                if b == a or ks[b] <= floors[b] or tot_b <= 0:
                    continue
                target = pc_b[ks[b]] - (ext_cost - slack)  # shrink b's prefix cost to this
                j = np.searchsorted(pc_b[: ks[b] + 1], target, side="right") - 1
                ok = (j >= floors[b]) & ~free
                jc = np.maximum(j, 0)
                gain = np.where(ok, ext_gain - (pm_b[ks[b]] - pm_b[jc]) / tot_b, -1.0)
                t = int(np.argmax(gain))
                if gain[t] > best[0]:
                    best = (gain[t], a, b, t, int(jc[t]))
        if best is None or best[0] <= 1e-15:
            break
        _, a, b, t, jb = best
        ks[a] += t + 1
        if b is not None:
            ks[b] = jb
    return ks
