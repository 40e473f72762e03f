"""One byte budget for the halo exchange: what each message costs and loses, and the allocator.

``distributed.comm_budget: F`` allows each rank, every training step, ``F`` times the bytes of
its exact fp32 1D exchange: per message *group* (a direction, a layer's exchange, a peer) the
plan's boundary rows times ``4 D`` bytes forward, and backward ``4 D + 4`` (the gradient rows
travel with an int32 index) times the rows the exact exchange sends back (the halo rows to
which the exact product of this step's output gradient gives a non-zero gradient,
:func:`~.local_graph.halo_reach`): what the plain :class:`~.exchange.HaloExchange` sends for
the same inputs. Below a backward that was sampled, rows whose gradient the sample left out
upstream are zero and do not count: there the reference is at most the exact run's. A
group can travel at a *width* (32, 16, 8, 4 or 2 bits,
:mod:`.codecs`) and with a *row count*: backward, the halo sample of :mod:`.halo_sample`;
forward, opt-in, the boundary sample of :mod:`.boundary`. Each choice has

- bytes: the codec's exact size for the rows sent, plus 4 bytes per row for the index (every
  backward message; a forward message when it is sampled): an upper bound of what is sent,
  since a row count is a cap;
- variance: the summed variance of the decoded message's entries against the exact message,
  from the rows measured at the last re-allocation: the sample's (``sum ||G_u||^2 (1/p_u - 1)``,
  uniform ``p`` forward), plus the codec's (:func:`row_quant_variance`: at 2/4/8 bits its
  exact expected variance for the rows measured, at most :mod:`.bitwidth`'s bound
  ``D/4 (range/(2^b - 1))^2``; ``2^-16 ||x||^2`` at 16, 0 at 32), divided by ``p_u`` for a
  sampled row.

The error of a layer's exchange in one direction is its relative variance: the groups'
variance over the exact message's energy ``sum ||x||^2``. :func:`allocate` minimizes the sum of
those relative errors over layers and directions subject to the summed bytes fitting the
budget, greedily like RSC's budget solver: from every group at its least-error choice, it
repeatedly takes the step with the smallest error increase per byte saved (along each
group's lower convex hull of (bytes, error) points, so a group's steps come in order), until
the bytes fit; then it spends the bytes left over on the upgrades that remove the most error.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np
import torch

from ..quant.rounding import bf16_scale_up
from . import quant
from .bitwidth import _hull, _pareto
from .boundary import boundary_count
from .codecs import codec_for
from .halo_sample import threshold_table
from .quant_ref import RESERVED, _row_frame

__all__ = [
    "FRACTIONS",
    "INDEX_BYTES",
    "Choice",
    "GroupTable",
    "reference_bytes",
    "message_bytes",
    "row_quant_variance",
    "forward_table",
    "backward_table",
    "allocate",
]

#: the row fractions a sampled group may take (of its non-zero rows backward, of the plan's
#: rows forward)
FRACTIONS = (1.0, 0.7, 0.5, 0.35, 0.25, 0.18, 0.12, 0.08, 0.05, 0.03, 0.02, 0.01)
INDEX_BYTES = 4  # an int32 row index
_BF16_VAR = 2.0**-16  # variance per x^2 of stochastic rounding to bf16 (bitwidth's model)


@dataclasses.dataclass(frozen=True)
class Choice:
    """How one group travels: ``bits`` per value and at most ``rows`` rows."""

    bits: int
    rows: int


@dataclasses.dataclass
class GroupTable:
    """One group's choices with their bytes and variance.

    Attributes:
        key: ``(direction, layer, peer)``.
        choices: the :class:`Choice` list.
        nbytes, variance: ``(C,)`` float64, per choice.
        energy: ``sum ||x||^2`` of the exact message (the relative error's denominator).
    """

    key: tuple
    choices: list
    nbytes: np.ndarray
    variance: np.ndarray
    energy: float


def reference_bytes(direction: str, rows: int, width: int) -> int:
    """Bytes of the exact fp32 1D exchange of ``rows`` plan rows of ``width`` values."""
    return rows * (4 * width + (INDEX_BYTES if direction == "backward" else 0))


def message_bytes(direction: str, rows: int, plan_rows: int, width: int, bits: int) -> int:
    """Bytes of ``rows`` rows sent at ``bits`` (index included where one travels)."""
    if rows <= 0:
        return 0
    indexed = direction == "backward" or rows < plan_rows
    return codec_for(bits).nbytes(rows, width) + (INDEX_BYTES * rows if indexed else 0)


def row_quant_variance(rows: torch.Tensor, widths: Sequence[int]) -> torch.Tensor:
    """``(B, R)`` float64 variance of each row of ``rows (R, D)`` decoded after each width.

    At 2, 4 and 8 bits it is the codec's exact expected variance for these rows: with the
    row's offset ``o`` and step ``s`` (:mod:`.quant`'s, bf16), an entry at ``t = (x - o) / s``
    rounds stochastically between ``floor(t)`` and ``floor(t) + 1``, variance
    ``s^2 f (1 - f)`` with ``f = t - floor(t)`` (0 for an entry on the grid, such as a ReLU's
    zeros at ``o = 0``; at most ``s^2 / 4``, :mod:`.bitwidth`'s bound). At 16 bits, the bound
    ``2^-16 ||x||^2``; at 32, 0."""
    out = torch.zeros(len(widths), rows.shape[0], dtype=torch.float64)
    if rows.shape[0] == 0 or rows.shape[1] == 0:
        return out
    x = rows.detach().float()
    frame = None
    for i, b in enumerate(widths):
        if b in quant.QUANT_BITS:
            frame = _row_frame(x) if frame is None else frame
            _, special, off, span = frame
            levels = torch.where(special, (1 << b) - 1 - RESERVED[b], (1 << b) - 1).float()
            step = bf16_scale_up(span, levels)
            t = (x - off[:, None]) / torch.where(step > 0, step, 1.0)[:, None]
            f = torch.nan_to_num(t - torch.floor(t), nan=0.0, posinf=0.0, neginf=0.0)
            per_row = (f * (1 - f)).double().sum(1) * step.double().square()
            out[i] = per_row.cpu()
        elif b == 16:
            out[i] = (_BF16_VAR * x.double().square().sum(1)).cpu()
    return out


def _table(key, direction, widths, counts, plan_rows, width, var_fn, energy) -> GroupTable:
    choices, nb, var = [], [], []
    for b in widths:
        for k in counts:
            choices.append(Choice(int(b), int(k)))
            nb.append(message_bytes(direction, int(k), plan_rows, width, int(b)))
            var.append(var_fn(b, k))
    return GroupTable(key, choices, np.array(nb, float), np.array(var, float), float(energy))


def forward_table(key, rows: torch.Tensor, widths: Sequence[int],
                  rates: Sequence[float]) -> GroupTable:  # fmt: skip
    """The choices of a forward group of ``rows (n, D)`` (the boundary rows a peer needs):
    every width times every boundary rate (``k`` rows of ``n`` uniformly, times ``n / k``)."""
    n, d = rows.shape
    energy = float(rows.detach().double().square().sum())
    qv = row_quant_variance(rows, widths).sum(1).tolist()
    counts = sorted({boundary_count(n, r) for r in rates}, reverse=True)
    index = {b: i for i, b in enumerate(widths)}

    def var(b, k):
        return (n / k - 1.0) * energy + (n / k) * qv[index[b]] if k else 0.0

    return _table(key, "forward", widths, counts, n, d, var, energy)


def backward_table(key, rows: torch.Tensor, widths: Sequence[int],
                   fractions: Sequence[float] = FRACTIONS) -> GroupTable:  # fmt: skip
    """The choices of a backward group whose non-zero gradient rows are ``rows (m, D)``:
    every width times a cap of ``max(1, round(f m))`` rows for every ``f`` of
    ``fractions`` (the threshold sample of :mod:`.halo_sample`)."""
    m, d = rows.shape
    norms = rows.detach().float().norm(dim=1)
    counts = sorted({max(1, int(round(f * m))) for f in fractions}, reverse=True)
    sample, q = threshold_table(norms, counts, row_quant_variance(rows, widths))
    at = {k: i for i, k in enumerate(counts)}
    index = {b: i for i, b in enumerate(widths)}

    def var(b, k):
        return float(sample[at[k]] + q[index[b], at[k]]) if m else 0.0

    return _table(key, "backward", widths, counts, m, d, var, float(norms.double().square().sum()))


def allocate(tables: Sequence[GroupTable], budget: float) -> tuple[list, bool]:
    """One choice index per table whose bytes sum to at most ``budget`` (``fits``), with a
    small summed relative error (module docstring); ``([cheapest...], False)`` when even the
    cheapest choices do not fit.

    Example:
        >>> t = GroupTable(("backward", 0, 1), [Choice(32, 10), Choice(8, 10), Choice(32, 5)],
        ...                np.array([400.0, 140.0, 200.0]), np.array([0.0, 1.0, 5.0]), 100.0)
        >>> allocate([t], 300.0)
        ([1], True)
    """
    slot_energy: dict = {}
    for t in tables:
        slot = t.key[:2]
        slot_energy[slot] = slot_energy.get(slot, 0.0) + t.energy
    err = [t.variance / max(slot_energy[t.key[:2]], 1e-300) for t in tables]
    fronts = [_pareto(t.nbytes, e) for t, e in zip(tables, err)]
    pick = [f[-1] for f in fronts]  # the least error (most bytes) of each front
    total = sum(t.nbytes[c] for t, c in zip(tables, pick))
    if total > budget:
        steps = []  # (ratio, group, position along the hull), hull walked down in bytes
        for g, (t, e, f) in enumerate(zip(tables, err, fronts)):
            hull = _hull(t.nbytes, e, f)
            pick[g] = hull[-1]
            worst = 0.0
            for i in range(len(hull) - 1, 0, -1):
                a, b = hull[i], hull[i - 1]
                worst = max(worst, (e[b] - e[a]) / max(t.nbytes[a] - t.nbytes[b], 1e-30))
                steps.append((worst, g, b))
        total = sum(t.nbytes[c] for t, c in zip(tables, pick))
        for _, g, b in sorted(steps, key=lambda s: s[0]):
            if total <= budget:
                break
            total += tables[g].nbytes[b] - tables[g].nbytes[pick[g]]
            pick[g] = b
        if total > budget:
            return [f[0] for f in fronts], False
    return _fill(tables, err, fronts, pick, budget - total), True


def _fill(tables, err, fronts, pick, slack: float) -> list:
    """Spend ``slack`` bytes: repeatedly the upgrade (to another point of a group's front)
    that fits and removes the most error per byte added."""
    pick = list(pick)
    while True:
        best: Optional[tuple] = None
        for g, (t, e, f) in enumerate(zip(tables, err, fronts)):
            c = pick[g]
            for o in f:
                extra = t.nbytes[o] - t.nbytes[c]
                gain = e[c] - e[o]
                if extra <= slack and gain > 0:
                    rate = gain / max(extra, 1e-30)
                    if best is None or rate > best[0]:
                        best = (rate, g, o, extra)
        if best is None:
            return pick
        _, g, o, extra = best
        pick[g] = o
        slack -= extra
