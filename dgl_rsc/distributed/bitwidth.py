"""Adaptive bit-widths for halo messages (AdaQP): per group of rows, the width that trades
transfer time against quantization variance.

The model, per group ``g`` (``n_g`` rows of ``D`` features, sent to destination ``p(g)``):

* variance, an upper bound on the summed variance of the group's decoded entries:
  ``V_g(b) = D / 4 * sum_r (range_r / (2^b - 1))^2`` for ``b`` in 2/4/8 (``range_r`` is what
  the codec quantizes over, :func:`quant.row_ranges`; the codec's bf16 scale can be up to
  ~1.6% larger than ``range / (2^b - 1)``), ``V_g(16) = 2^-16 * sum_r ||x_r||^2`` (stochastic
  rounding to bf16: ``ulp(x) <= 2^-7 |x|`` for normal ``x``, variance ``<= ulp^2 / 4``) and
  ``V_g(32) = 0``;
* time, alpha-beta per destination: ``t_p = alpha + beta * sum_{g -> p} bytes_g(b_g)`` with the
  exact :func:`quant.payload_bytes`; the exchange lasts ``T = max_p t_p`` (sends to different
  peers run concurrently, so the slowest one bounds the step, as in AdaQP).

:func:`solve` minimizes ``T + lam * sum_g V_g`` over the allowed widths, optionally subject to
``sum_g V_g <= max_variance``. Method: dominated widths are dropped per group; per destination
a greedy path upgrades groups by variance saved per byte (the Lagrangian / LP-relaxation
order of the multiple-choice knapsack); a common byte cap for all destinations is swept over
the path points; the best caps are polished by steepest descent over one- and two-group
changes. ``max_variance`` is met by raising ``lam`` (bisection on the multiplier), then
polishing among feasible assignments. Its test compares it with brute force.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Optional, Sequence

import numpy as np
import torch

from . import quant

__all__ = [
    "CostModel",
    "GroupStats",
    "Assignment",
    "group_stats",
    "tables",
    "evaluate",
    "solve",
    "bit_histogram",
]

_BF16_VAR = 2.0**-16  # variance per x^2 of stochastic rounding to bf16


@dataclasses.dataclass(frozen=True)
class CostModel:
    """``t(bytes) = alpha + beta * bytes`` per message: ``alpha`` seconds, ``beta`` s/byte."""

    alpha: float
    beta: float

    def __post_init__(self):
        for name in ("alpha", "beta"):
            v = getattr(self, name)
            if not (isinstance(v, numbers.Real) and math.isfinite(v) and v >= 0):
                raise ValueError(f"CostModel.{name} must be a finite number >= 0; got {v!r}.")

    def time(self, nbytes: float) -> float:
        return self.alpha + self.beta * nbytes


@dataclasses.dataclass(frozen=True)
class GroupStats:
    """What the model needs of each group: rows, destination, ``sum range^2``, ``sum ||x||^2``."""

    dim: int
    rows: tuple
    dest: tuple
    range_sq: tuple
    sq_norm: tuple

    def __post_init__(self):
        n = len(self.rows)
        if not (len(self.dest) == len(self.range_sq) == len(self.sq_norm) == n):
            raise ValueError("GroupStats fields must have one entry per group.")
        if any(d < 0 for d in self.dest):
            raise ValueError(f"dest must hold destination ranks >= 0; got {self.dest}.")


@dataclasses.dataclass(frozen=True)
class Assignment:
    """A width per group, with its modelled time (s), variance and objective."""

    bits: tuple
    time: float
    variance: float
    objective: float


def group_stats(x: torch.Tensor, group_rows: Sequence[int], dest: Sequence[int]) -> GroupStats:
    """Statistics of ``x (R, D)`` split into consecutive groups of ``group_rows[g]`` rows sent
    to ``dest[g]``. Non-finite and ``|x| > quant.HUGE`` entries are left out (the codec sends
    them as reserved codes). One device-to-host copy."""
    layout = quant.Layout(
        x.shape[1] if x.dim() == 2 else 0, tuple(group_rows), (32,) * len(group_rows)
    )
    if x.dim() != 2 or layout.num_rows != x.shape[0]:
        raise ValueError(
            f"x must be (sum(group_rows), D) = ({layout.num_rows}, D); got {tuple(x.shape)}."
        )
    ranges = quant.row_ranges(x).double()
    xf = x.detach().float()
    sq = torch.where(xf.abs() <= quant.HUGE, xf, 0.0).double().square().sum(1)
    gid = torch.repeat_interleave(
        torch.arange(len(layout.rows), device=x.device), torch.tensor(layout.rows, device=x.device)
    )
    acc = torch.zeros(2, len(layout.rows), dtype=torch.float64, device=x.device)
    acc.index_add_(1, gid, torch.stack([ranges.square(), sq]))
    r2, s2 = acc.cpu().tolist()
    return GroupStats(layout.dim, layout.rows, tuple(int(d) for d in dest), tuple(r2), tuple(s2))


def _variance(stats: GroupStats, bits: int) -> np.ndarray:
    """``(G,)`` modelled variance of every group at ``bits``."""
    if bits in quant.QUANT_BITS:
        return stats.dim / 4 * np.asarray(stats.range_sq, float) / float((1 << bits) - 1) ** 2
    if bits == 16:
        return _BF16_VAR * np.asarray(stats.sq_norm, float)
    return np.zeros(len(stats.rows))


def tables(stats: GroupStats, allowed_bits: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """``(bytes (G, K), variance (G, K))`` of every group at every allowed width."""
    bits = [quant.check_bits(b, "allowed_bits") for b in allowed_bits]
    shape = (len(stats.rows), len(bits))
    nb = np.array(
        [[quant.payload_bytes(r, stats.dim, b) for b in bits] for r in stats.rows], dtype=np.float64
    ).reshape(shape)
    var = np.stack([_variance(stats, b) for b in bits], 1) if bits else np.zeros(shape)
    return nb, var


def evaluate(stats: GroupStats, bits: Sequence[int], cost: CostModel, lam: float) -> Assignment:
    """The modelled time, variance and objective of the widths ``bits`` (one per group)."""
    if len(bits) != len(stats.rows):
        raise ValueError(f"bits has {len(bits)} entries for {len(stats.rows)} groups.")
    bits = tuple(quant.check_bits(b) for b in bits)
    nb = [quant.payload_bytes(r, stats.dim, b) for r, b in zip(stats.rows, bits)]
    t = cost.time(float(np.bincount(stats.dest, weights=nb).max())) if bits else 0.0
    arr, var = np.array(bits), np.zeros(len(bits))
    for b in set(bits):
        var[arr == b] = _variance(stats, b)[arr == b]
    v = float(var.sum())
    return Assignment(bits, t, v, t + lam * v)


# -- solver -------------------------------------------------------------------------------------
def _pareto(nb: np.ndarray, var: np.ndarray) -> list:
    """Choices not dominated by another (fewer or equal bytes and lower or equal variance),
    bytes ascending, variance strictly descending."""
    best, keep = math.inf, []
    for k in np.lexsort((var, nb)):
        if var[k] < best:
            keep.append(int(k))
            best = var[k]
    return keep


def _hull(nb: np.ndarray, var: np.ndarray, front: list) -> list:
    """The lower convex hull of the front's (bytes, variance) points."""
    hull = []
    for k in front:
        while len(hull) >= 2:
            a, b = hull[-2:]
            if (nb[b] - nb[a]) * (var[k] - var[a]) > (var[b] - var[a]) * (nb[k] - nb[a]):
                break
            hull.pop()
        hull.append(k)
    return hull


class _Problem:
    """``min beta * max_p B_p + lam * sum_g V_g`` over one choice per group; ``nb``/``var``
    are ``(G, K)`` tables, ``dest (G,)`` the destination of each group."""

    def __init__(self, nb, var, dest, beta):
        self.nb, self.var, self.dest, self.beta = nb, var, dest, beta
        self.num_dest, self.g = int(dest.max()) + 1, np.arange(len(dest))
        self.front = [_pareto(nb[g], var[g]) for g in self.g]
        self.moves = np.array([(g, k) for g in self.g for k in self.front[g]], dtype=np.int64)
        self.base = np.array([f[0] for f in self.front])
        # per destination, the upgrade steps along the groups' hulls, most variance saved per
        # byte first (the LP relaxation's order), and the bytes/variance along that path
        steps = [[] for _ in range(self.num_dest)]
        for g in self.g:
            hull = _hull(nb[g], var[g], self.front[g])
            for i, (a, c) in enumerate(zip(hull, hull[1:])):
                eff = (var[g, a] - var[g, c]) / (nb[g, c] - nb[g, a])
                steps[dest[g]].append(
                    (-eff, i, int(g), c, nb[g, c] - nb[g, a], var[g, c] - var[g, a])
                )
        b0 = self.parts(self.base)[0]
        self.paths = []
        for p, st in enumerate(steps):
            st.sort()
            db, dv = np.array([s[4:] for s in st]).reshape(-1, 2).T
            self.paths.append(
                ([s[2:4] for s in st], b0[p] + np.cumsum([0.0, *db]), np.cumsum([0.0, *dv]))
            )

    def parts(self, c):
        return (
            np.bincount(self.dest, self.nb[self.g, c], minlength=self.num_dest),
            float(self.var[self.g, c].sum()),
        )

    def score(self, c, lam):
        b, v = self.parts(c)
        return self.beta * b.max() + lam * v

    def sweep(self, lam, keep=4):
        """Assignments at the ``keep`` best byte caps common to all destinations (each takes
        the longest prefix of its path that fits the cap)."""
        caps = np.unique(np.concatenate([b for _, b, _ in self.paths]))
        caps = caps[caps >= max(b[0] for _, b, _ in self.paths)]
        idx = [np.searchsorted(b, caps, side="right") - 1 for _, b, _ in self.paths]
        bmax = np.max([b[i] for (_, b, _), i in zip(self.paths, idx)], axis=0)
        dv = np.sum([v[i] for (_, _, v), i in zip(self.paths, idx)], axis=0)
        out = []
        for c in np.argsort(self.beta * bmax + lam * dv, kind="stable")[:keep]:
            choice = self.base.copy()
            for (steps, _, _), i in zip(self.paths, idx):
                for g, k in steps[: i[c]]:
                    choice[g] = k
            out.append(choice)
        return out

    def one_moves(self, c, lam):
        """Objective and variance after each single change in ``moves``."""
        g, k = self.moves.T
        b, v = self.parts(c)
        new_b = np.repeat(b[None, :], len(g), 0)
        new_b[np.arange(len(g)), self.dest[g]] += self.nb[g, k] - self.nb[g, c[g]]
        new_v = v + (self.var[g, k] - self.var[g, c[g]])
        return self.beta * new_b.max(1) + lam * new_v, new_v

    def descend(self, c, lam, vmax=math.inf):
        """Steepest descent over changes of one group, or of two groups of one destination,
        among assignments with ``sum V <= vmax``."""
        g, k = self.moves.T
        by_dest = [np.nonzero(self.dest[g] == p)[0] for p in range(self.num_dest)]
        while True:
            b, v = self.parts(c)
            top = np.argsort(b)[::-1]
            other = np.full(self.num_dest, b[top[0]])  # the largest B of the other destinations
            other[top[0]] = b[top[1]] if len(top) > 1 else 0.0
            db, dv = self.nb[g, k] - self.nb[g, c[g]], self.var[g, k] - self.var[g, c[g]]
            cands = [(other[self.dest[g]], b[self.dest[g]] + db, v + dv, np.arange(len(g)), None)]
            for p, m in enumerate(by_dest):
                i1, i2 = (m[i] for i in np.triu_indices(len(m), 1))
                i1, i2 = i1[g[i1] != g[i2]], i2[g[i1] != g[i2]]
                cands.append((other[p], b[p] + db[i1] + db[i2], v + dv[i1] + dv[i2], i1, i2))
            best, move = (self.beta * b.max() + lam * v) * (1 - 1e-12), None
            for other_b, new_b, new_v, i1, i2 in cands:
                f = np.where(
                    new_v <= vmax, self.beta * np.maximum(other_b, new_b) + lam * new_v, math.inf
                )
                j = int(np.argmin(f)) if f.size else -1
                if j >= 0 and f[j] < best:
                    best, move = f[j], [i1[j]] + ([] if i2 is None else [i2[j]])
            if move is None:
                return c
            c = c.copy()
            c[g[move]] = k[move]

    def repair(self, c, lam, vmax, frozen=-1):
        """Lower ``sum V`` to ``vmax`` by single changes (group ``frozen`` excepted), each
        the one costing the least objective per unit of variance removed; None if stuck."""
        g, k = self.moves.T
        while self.parts(c)[1] > vmax:
            f, new_v = self.one_moves(c, lam)
            dv = self.parts(c)[1] - new_v
            ok = (dv > 0) & (g != frozen) & (k != c[g])
            if not ok.any():
                return None
            j = int(
                np.argmin(np.where(ok, (f - self.score(c, lam)) / np.where(ok, dv, 1), math.inf))
            )
            c = c.copy()
            c[g[j]] = k[j]
        return c

    def polish(self, c, lam, vmax, kicks=16):
        """:meth:`descend`, then try the ``kicks`` best single changes that break
        ``sum V <= vmax``, each repaired without undoing it; repeat while that improves."""
        g, k = self.moves.T
        while True:
            c = self.descend(c, lam, vmax)
            cur = self.score(c, lam)
            f, new_v = self.one_moves(c, lam)
            best, best_f = None, cur * (1 - 1e-12)
            for j in np.argsort(np.where(new_v > vmax, f, math.inf))[:kicks]:
                if f[j] >= cur:
                    break
                t = c.copy()
                t[g[j]] = k[j]
                t = self.repair(t, lam, vmax, frozen=g[j])
                if t is not None and self.score(t, lam) < best_f:
                    best, best_f = t, self.score(t, lam)
            if best is None:
                return c
            c = best

    def solve(self, lam):
        return min(
            (self.descend(c, lam) for c in self.sweep(lam)), key=lambda c: self.score(c, lam)
        )


def _check_solve_args(stats, lam, allowed_bits, max_variance):
    if not isinstance(stats, GroupStats):
        raise TypeError(f"stats must be a GroupStats (see group_stats()); got {type(stats)}.")
    if not (isinstance(lam, numbers.Real) and math.isfinite(lam) and lam >= 0):
        raise ValueError(f"lam must be a finite number >= 0; got {lam!r}.")
    bits = [quant.check_bits(b, "allowed_bits") for b in allowed_bits]
    if not bits or len(set(bits)) != len(bits):
        raise ValueError(f"allowed_bits must be a non-empty set of widths; got {allowed_bits}.")
    if max_variance is not None and not (max_variance >= 0):
        raise ValueError(f"max_variance must be >= 0 or None; got {max_variance!r}.")
    return bits


def solve(
    stats: GroupStats,
    cost: CostModel,
    lam: float,
    allowed_bits: Sequence[int] = (2, 4, 8),
    max_variance: Optional[float] = None,
) -> Assignment:
    """Widths per group minimizing ``max_p t_p + lam * sum_g V_g`` (module doc), each from
    ``allowed_bits``, with ``sum_g V_g <= max_variance`` when given.

    >>> stats = GroupStats(256, rows=(1000, 10), dest=(0, 1), range_sq=(4e3, 40.0),
    ...                    sq_norm=(2e5, 2e3))
    >>> solve(stats, CostModel(alpha=1e-5, beta=1e-9), lam=1e-9).bits
    (2, 8)
    """
    bits = _check_solve_args(stats, lam, allowed_bits, max_variance)
    if not stats.rows:
        return Assignment((), 0.0, 0.0, 0.0)
    nb, var = tables(stats, bits)
    prob = _Problem(nb, var, np.asarray(stats.dest, np.int64), cost.beta)
    choice = prob.solve(lam)
    if max_variance is not None and prob.parts(choice)[1] > max_variance:
        vmin = float(var.min(1).sum())
        if vmin > max_variance:
            raise ValueError(
                f"max_variance={max_variance:g} is below the least variance the "
                f"allowed widths {tuple(bits)} reach ({vmin:g}); raise it or allow "
                "wider bit widths."
            )
        choice = _lagrangian(prob, lam, max_variance, var.argmin(1))
    return evaluate(stats, [bits[k] for k in choice], cost, lam)


def _lagrangian(prob, lam, vmax, fallback, iters=40):
    """Meet ``sum V <= vmax``: bisect (in log scale) the multiplier ``mu`` added to ``lam``
    between an infeasible and a feasible solution; then polish the feasible one, and the
    infeasible one repaired by the cheapest variance reductions, among feasible assignments."""
    infeasible, feasible, lo, hi = prob.solve(lam), None, 0.0, max(lam, 1e-300)
    for _ in range(2100):  # doubling from 1e-300 passes 1e300
        c = prob.solve(lam + hi)
        if prob.parts(c)[1] <= vmax:
            feasible = c
            break
        infeasible, lo, hi = c, hi, hi * 2
    if feasible is None:
        feasible, hi = fallback, lo
    for _ in range(iters):
        mid = math.sqrt(lo * hi) if lo > 0 else hi / 2
        c = prob.solve(lam + mid)
        if prob.parts(c)[1] <= vmax:
            feasible, hi = c, mid
        else:
            infeasible, lo = c, mid
    cands = [feasible, prob.repair(infeasible, lam, vmax), prob.repair(prob.solve(lam), lam, vmax)]
    return min((prob.polish(c, lam, vmax) for c in cands), key=lambda c: prob.score(c, lam))


def bit_histogram(bits: Sequence[int], rows: Sequence[int]) -> dict:
    """Rows sent at each width: ``{bits: rows}``, widths ascending.

    >>> bit_histogram((8, 2, 8), (10, 5, 1))
    {2: 5, 8: 11}
    """
    if len(bits) != len(rows):
        raise ValueError(f"bits has {len(bits)} entries but rows has {len(rows)}.")
    out = {}
    for b, r in zip(bits, rows):
        out[int(b)] = out.get(int(b), 0) + int(r)
    return dict(sorted(out.items()))


# -- calibration --------------------------------------------------------------------------------
