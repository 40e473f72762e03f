"""``CommBudget``: one rank's byte budget over a run, step by step.

The exchange asks it, for every training message group (direction, layer, peer), how to send
it (:meth:`CommBudget.plan`: a width and a row cap) and tells it what was sent
(:meth:`CommBudget.sent`). Every ``interval`` steps the groups' rows are measured as they pass
(:func:`~.comm_budget.forward_table`, :func:`~.comm_budget.backward_table`), and at the start
of the next step the allocation is solved again over all of them (:func:`~.comm_budget.allocate`)
with ``fraction`` times the groups' reference bytes. Before the first solve, each group takes
on its own the widest width that fits ``fraction`` of its reference bytes (the narrowest,
sampled to fit, when none does): every step keeps to the budget, the first one included.

Each rank allocates its own sends: the ranks' budgets add up to ``fraction`` of the whole
exchange, and the receivers learn each message's width and row count from a header round
(forward: only on the steps that may re-plan, :meth:`CommBudget.replans`).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from typing import Optional

import numpy as np
import torch

from .boundary import boundary_count
from .comm_budget import (
    FRACTIONS,
    Choice,
    allocate,
    backward_table,
    forward_table,
    message_bytes,
    reference_bytes,
)

__all__ = ["CommBudget", "combine_reports"]

log = logging.getLogger(__name__)
#: re-allocations kept for the report (the most recent)
MAX_LOG = 200


class CommBudget:
    """The byte budget of one rank (see the module docstring).

    Args:
        fraction: ``F`` in (0, 1]: bytes allowed per step over the exact fp32 1D exchange's.
        forward_bits, backward_bits: the widths each direction may take.
        boundary: the forward boundary rates to choose from (``(1.0,)``: no forward sample).
        fractions: the backward halo sample's row fractions to choose from.
        interval: steps between re-allocations (measured the step before).
        seed: seeds the samples' generator (with the rank).
        rank: this rank.
    """

    def __init__(self, fraction: float, forward_bits=(32, 8, 4, 2), backward_bits=(32, 8, 4, 2),
                 boundary=(1.0,), fractions=FRACTIONS, interval: int = 10, seed: int = 0,
                 rank: int = 0):  # fmt: skip
        if not 0.0 < float(fraction) <= 1.0:
            raise ValueError(f"fraction must lie in (0, 1], got {fraction!r}.")
        self.fraction = float(fraction)
        self.widths = {"forward": tuple(forward_bits), "backward": tuple(backward_bits)}
        self.boundary, self.fractions = tuple(boundary), tuple(fractions)
        self.interval, self.seed, self.rank = int(interval), int(seed), int(rank)
        self.reset()

    def reset(self, by_peer: Optional[dict] = None) -> None:
        """A new run: no measurements, no allocation, counters at zero; ``by_peer``: the
        byte counter's per-peer bytes so far (:meth:`report` counts from there)."""
        self._peer0 = dict(by_peer or {})
        self.tables: dict = {}
        self.refs: dict = {}  # key -> reference bytes per step
        self.alloc: dict = {}  # key -> Choice
        self.offset: dict = {}  # key -> its allocated bytes over its share at the solve
        self.step, self.measuring = -1, False
        self.solves: list = []
        self.step_sent: list = []  # halo bytes this rank sent, per finished step
        self.step_ref: list = []  # and the reference bytes of the groups it planned
        self._sent = self._ref = 0
        self._balance = 0.0
        self.realized: dict = defaultdict(list)  # (direction, layer) -> measured rel. errors
        self.over_budget = False

    # -- the step -------------------------------------------------------------------------
    def begin_step(self) -> None:
        """The first training exchange of a step: close the last one, solve when measured."""
        if self.step >= 0:
            self.step_sent.append(self._sent)
            self.step_ref.append(self._ref)
        self._sent = self._ref = 0
        self._balance = 0.0  # bytes the groups of this step spent over their allowances
        if self.measuring and self.tables:
            self.solve()
        self.step += 1
        self.measuring = self.step % self.interval == 0

    def replans(self) -> bool:
        """Whether this step's forward plans may differ from the last step's: its first
        step (the prior choices) and the step after each measuring one (the re-allocation).
        A pure function of the step, so every rank answers alike; between these steps a
        forward group keeps its choice (only backward groups are fitted step by step)."""
        return self.step <= 0 or (self.step - 1) % self.interval == 0

    def plan(
        self, direction: str, layer: int, peer: int, plan_rows: int, rows: torch.Tensor
    ) -> Choice:
        """How the group ``(direction, layer, peer)`` travels this step. ``plan_rows``: the
        rows the plan exchanges (forward: sent; backward: the halo block's); ``rows
        (R, D)``: the rows that would travel exactly (backward: the non-zero ones)."""
        key = (direction, int(layer), int(peer))
        width = int(rows.shape[1])
        self.refs[key] = reference_bytes(direction, plan_rows, width)
        self._ref += self.refs[key]
        if self.measuring:
            self.tables[key] = self._measure(direction, key, rows)
        choice = self.alloc.get(key)
        if choice is None:
            return self._prior(direction, plan_rows, rows.shape[0], width)
        # the group's allowance: its share of this step's reference plus what the solve gave
        # it over its share then (a backward group's reference moves with the rows the exact
        # product reaches), less what earlier groups of the step spent over theirs
        allowed = self.fraction * self.refs[key] + self.offset[key]
        if direction == "backward":
            choice = self._fit(choice, plan_rows, width, rows.shape[0], allowed - self._balance)
        n = min(choice.rows, rows.shape[0])
        self._balance += message_bytes(direction, n, plan_rows, width, choice.bits) - allowed
        return choice

    @staticmethod
    def _fit(choice: Choice, plan_rows: int, width: int, m: int, allowed: float) -> Choice:
        """``choice`` with the most rows (up to its own, at least 1) whose backward message
        fits ``allowed`` bytes."""
        hi = max(min(choice.rows, m), 1)

        def size(k):
            return message_bytes("backward", k, plan_rows, width, choice.bits)

        if size(hi) <= allowed:
            return choice
        lo = 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if size(mid) <= allowed else (lo, mid - 1)
        return Choice(choice.bits, lo)

    def _measure(self, direction, key, rows):
        if direction == "forward":
            return forward_table(key, rows, self.widths["forward"], self.boundary)
        return backward_table(key, rows, self.widths["backward"], self.fractions)

    def _prior(self, direction, plan_rows, n, width) -> Choice:
        """A group before any allocation: the widest width whose bytes fit its share
        (``fraction`` of its reference, less what earlier groups of the step spent over
        theirs) at full rows, else the narrowest at the largest row count that fits."""
        share = self.fraction * reference_bytes(direction, plan_rows, width)
        allowed = share - self._balance
        widths = sorted(self.widths[direction], reverse=True)
        rates = self.boundary if direction == "forward" else self.fractions
        counts = sorted({boundary_count(n, r) if direction == "forward" else
                         max(1, int(round(r * n))) for r in rates}, reverse=True)  # fmt: skip
        pick = next((Choice(b, counts[0]) for b in widths
                     if message_bytes(direction, counts[0], plan_rows, width, b) <= allowed),
                    None)  # fmt: skip
        if pick is None:
            b = widths[-1]
            pick = next((Choice(b, k) for k in counts
                         if message_bytes(direction, k, plan_rows, width, b) <= allowed),
                        Choice(b, counts[-1]))  # fmt: skip
        self._balance += message_bytes(direction, pick.rows, plan_rows, width, pick.bits) - share
        return pick

    def sent(self, nbytes: int) -> None:
        """Halo bytes sent this step (payload and index; the exchange counts them per group
        in the context's :class:`~.runtime.ByteCounter`)."""
        self._sent += int(nbytes)

    def realized_error(self, direction: str, layer: int, err_sq: float, energy: float,
                       predicted_sq: float) -> None:  # fmt: skip
        """One exchange (all peers) at a measuring step: its realized squared error, the
        exact message's energy and the model's squared error for what was sent."""
        if energy > 0:
            self.realized[(direction, int(layer))].append((err_sq / energy, predicted_sq / energy))

    # -- the allocation -------------------------------------------------------------------
    def solve(self) -> None:
        keys = sorted(self.tables)
        tables = [self.tables[k] for k in keys]
        reference = sum(self.refs[k] for k in keys)
        budget = self.fraction * reference
        picks, fits = allocate(tables, budget)
        if not fits and not self.over_budget:
            self.over_budget = True
            least = sum(float(t.nbytes.min()) for t in tables)
            log.warning(
                "rank %d: distributed.comm_budget=%g allows %.0f bytes a step, but the "
                "narrowest widths and fewest rows allowed (forward %s bits, backward %s bits, "
                "forward boundary rates %s) need %.0f: those are sent. Let the budget pick the "
                "widths (forward_bits/backward_bits: adaptive) or sample the forward "
                "(boundary_sample: true), or raise comm_budget.", self.rank, self.fraction,
                budget, self.widths["forward"], self.widths["backward"], self.boundary, least,
            )  # fmt: skip
        self.alloc = {k: t.choices[c] for k, t, c in zip(keys, tables, picks)}
        self.offset = {k: float(t.nbytes[c]) - self.fraction * self.refs[k]
                       for k, t, c in zip(keys, tables, picks)}  # fmt: skip
        self.solves.append(self._summary(keys, tables, picks, budget, reference))
        del self.solves[:-MAX_LOG]

    def _summary(self, keys, tables, picks, budget, reference) -> dict:
        """One re-allocation: per (direction, layer), the planned bytes against the
        reference, the estimated relative error and the choice per peer."""
        slots: dict = {}
        for k, t, c in zip(keys, tables, picks):
            s = slots.setdefault(f"{k[0]}/{k[1]}", {"bytes": 0.0, "reference": 0, "var": 0.0,
                                                    "energy": 0.0, "peers": {}})  # fmt: skip
            s["bytes"] += float(t.nbytes[c])
            s["reference"] += self.refs[k]
            s["var"] += float(t.variance[c])
            s["energy"] += t.energy
            ch = t.choices[c]
            rows = max(max(ch.rows for ch in t.choices), 1)
            s["peers"][str(k[2])] = {"bits": ch.bits, "rows": ch.rows,
                                     "row_fraction": round(ch.rows / rows, 4)}  # fmt: skip
        for s in slots.values():
            s["error"] = round(math.sqrt(s.pop("var") / s["energy"]), 5) if s["energy"] else 0.0
            s.pop("energy")
        planned = float(np.sum([t.nbytes[c] for t, c in zip(tables, picks)]))
        return {"step": self.step + 1, "budget_bytes": budget, "planned_bytes": planned,
                "reference_bytes": reference, "slots": slots}  # fmt: skip

    # -- the report -----------------------------------------------------------------------
    def report(self, by_peer: dict) -> dict:
        """This rank's run: the budget, per step the sent and reference bytes, per group
        (``by_peer``: ``{(kind, layer, peer): (sent, received)}`` bytes of the run, from the
        :class:`~.runtime.ByteCounter`) the mean bytes per step against its reference, and
        the re-allocations (the last one in full)."""
        sent = self.step_sent + ([self._sent] if self.step >= 0 else [])
        ref = self.step_ref + ([self._ref] if self.step >= 0 else [])
        steps = max(len(sent), 1)
        kinds = {"forward_halo": "forward", "backward_halo": "backward"}
        groups = {}
        for (kind, layer, p), (b, _) in sorted(by_peer.items(), key=str):
            b -= self._peer0.get((kind, layer, p), (0, 0))[0]
            if kind in kinds and layer is not None:
                key = (kinds[kind], layer, p)
                groups[f"{key[0]}/{layer}/{p}"] = {
                    "bytes_per_step": b / steps,
                    "reference_per_step": self.refs.get(key, 0),
                }
        realized = {f"{d}/{layer}": [round(math.sqrt(float(np.mean(x))), 5) for x in zip(*v)]
                    for (d, layer), v in sorted(self.realized.items())}  # fmt: skip
        return {"fraction": self.fraction, "steps": len(sent), "sent_per_step": sent,
                "reference_per_step": ref, "groups": groups, "solves": len(self.solves),
                "last_solve": self.solves[-1] if self.solves else None,
                "measured_error": realized, "over_budget": self.over_budget}  # fmt: skip

    def stats(self) -> list:
        """Like ``rsc.stats()["budgets"]``: one entry per re-allocation (step, planned and
        budget bytes, per layer and direction the estimated relative error)."""
        return [{"step": s["step"], "budget_bytes": s["budget_bytes"],
                 "planned_bytes": s["planned_bytes"],
                 "errors": {k: v["error"] for k, v in s["slots"].items()}}
                for s in self.solves]  # fmt: skip


def combine_reports(reports: list) -> dict:
    """Every rank's :meth:`CommBudget.report` as one: per step the bytes all ranks sent over
    the reference, per layer and direction (``"forward/0"``) the bytes per step summed over
    ranks and peers against the reference, with the estimated (last allocation, mean over
    ranks) and measured relative errors; the ranks' own reports under ``"ranks"``."""
    steps = min(len(r["sent_per_step"]) for r in reports)
    sent = [sum(r["sent_per_step"][i] for r in reports) for i in range(steps)]
    ref = [sum(r["reference_per_step"][i] for r in reports) for i in range(steps)]
    frac = [s / f for s, f in zip(sent, ref) if f]
    slots: dict = {}
    for r in reports:
        for name, g in r["groups"].items():
            s = slots.setdefault(name.rsplit("/", 1)[0], {"bytes_per_step": 0.0,
                                                          "reference_per_step": 0.0})  # fmt: skip
            s["bytes_per_step"] += g["bytes_per_step"]
            s["reference_per_step"] += g["reference_per_step"]
    for name, s in slots.items():
        s["fraction"] = (
            s["bytes_per_step"] / s["reference_per_step"] if s["reference_per_step"] else None
        )
        est = [r["last_solve"]["slots"][name]["error"] for r in reports
               if r["last_solve"] and name in r["last_solve"]["slots"]]  # fmt: skip
        got = [r["measured_error"][name] for r in reports if name in r["measured_error"]]
        s["estimated_error"] = float(np.mean(est)) if est else None  # at the last allocation
        # over the measuring steps: the realized error of the messages sent, and the model's
        s["measured_error"] = float(np.mean([g[0] for g in got])) if got else None
        s["predicted_error"] = float(np.mean([g[1] for g in got])) if got else None
    return {
        "fraction": reports[0]["fraction"],
        "steps": steps,
        "sent_per_step": float(np.mean(sent)) if sent else 0.0,
        "reference_per_step": float(np.mean(ref)) if ref else 0.0,
        "sent_fraction_mean": float(np.mean(frac)) if frac else None,
        "sent_fraction_max": max(frac) if frac else None,
        "sent_fraction_per_step": [round(f, 5) for f in frac],
        "by_slot": slots,
        "over_budget": any(r["over_budget"] for r in reports),
        "ranks": [{k: r[k] for k in ("groups", "last_solve", "solves")} for r in reports],
    }
