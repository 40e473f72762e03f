"""Choices made by measurement: which engine runs a kind of work, per shape.

Several pieces of the package can compute the same product in more than one way, and which
is faster depends on the machine, not on what it claims: DGL's or Numba's kernel for an exact
CPU product, ``torch._int_mm`` (fast only where the CPU has int8 dot products), an fp32 GEMM
or the package's exact int8 engines for a weight product, the INT8 or the fp32 sparse product.
So each is decided once per run and per shape by timing the candidates, and the fastest is
kept; CPU flags alone never decide (a VNNI Xeon and an AVX2 EPYC give opposite answers, and
a torch build may or may not use the instructions).

:data:`PICKS` is the one registry. A *kind* (``"exact_cpu"``, ``"int8_dense"``, ...) names the
work, a *key* its shape (a tuple of ints and strings the caller builds: see
:func:`fingerprint`). Two ways to measure:

* :meth:`Registry.run`: the first :data:`TRIALS` calls of a key run every candidate on the
  real operands and time each (the first round warms up: kernels compile, indexes build);
  the fastest of the last round is kept and later calls run only that one. For candidates of
  similar cost (the sparse products).
* :meth:`Registry.decide`: times cheap *probes* (the same work on a slice of the operands)
  :data:`TRIALS` times on the first call and keeps the fastest; for candidates of which one
  may be many times slower than the rest (``torch._int_mm`` on a CPU without int8 dot
  products: 19x an fp32 GEMM on an AVX2 EPYC), which must not run at full size even once.

``Registry.timer`` measures a candidate: ``timer(name, fn) -> (fn's result, seconds)``; a test
injects a fake one (no timed assertions). ``Registry.forced[kind] = name`` skips the
measurement for a kind. Decisions are logged once each and listed by :meth:`Registry.summary`.

>>> reg = Registry(timer=lambda name, fn: (fn(), {"slow": 2.0, "fast": 1.0}[name]))
>>> [reg.run("demo", (4,), {"slow": lambda: "s", "fast": lambda: "f"}, keep="slow")
...  for _ in range(3)]
['s', 's', 'f']
>>> reg.chosen("demo", (4,)), reg.trials("demo", (4,))
('fast', 2)
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Mapping, Optional

__all__ = ["TRIALS", "Registry", "PICKS", "fingerprint", "perf_timer"]

log = logging.getLogger(__name__)

#: measured rounds before a choice is kept (the first is a warm-up)
TRIALS = 2
#: keys kept per registry before the oldest are forgotten (shapes of a minibatch run vary)
CAPACITY = 4096


def perf_timer(name: str, fn: Callable[[], Any]) -> tuple[Any, float]:
    """``(fn(), seconds)`` by ``time.perf_counter`` (the default timer)."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _bucket(v: int) -> int:
    """``v`` itself up to 4096, else the next power of two (shapes that vary from batch to
    batch share a choice)."""
    v = int(v)
    return v if v <= 4096 else 1 << (v - 1).bit_length()


def fingerprint(*dims, exact: bool = True) -> tuple:
    """A key from sizes and labels: ints as given (``exact``) or bucketed to powers of two
    above 4096; anything else (a dtype, a device type) by its string."""
    out = []
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int):
            out.append(str(d))
        else:
            out.append(d if exact else _bucket(d))
    return tuple(out)


class _Entry:
    __slots__ = ("rounds", "chosen")

    def __init__(self):
        self.rounds: list = []  # one {name: seconds} per measured round
        self.chosen: Optional[str] = None


class Registry:
    """Measured choices per ``(kind, key)``; see the module doc."""

    def __init__(self, timer: Callable = perf_timer, trials: int = TRIALS):
        self.timer = timer
        self.trials_needed = int(trials)
        self.forced: dict = {}
        self._table: dict = {}

    # -- reading ----------------------------------------------------------------------
    def chosen(self, kind: str, key: tuple) -> Optional[str]:
        """The kept candidate of ``(kind, key)``, or ``None`` while still measuring."""
        entry = self._table.get((kind, key))
        return None if entry is None else entry.chosen

    def trials(self, kind: str, key: tuple) -> int:
        """Measured rounds of ``(kind, key)`` so far."""
        entry = self._table.get((kind, key))
        return 0 if entry is None else len(entry.rounds)

    def summary(self, kind: Optional[str] = None) -> list:
        """``[{"kind", "key", "chosen", "ms"}]``: every decision (of ``kind``), with the
        last round's times in milliseconds."""
        out = []
        for (k, key), e in self._table.items():
            if (kind is None or k == kind) and e.chosen is not None:
                ms = {n: round(s * 1e3, 3) for n, s in e.rounds[-1].items()}
                out.append({"kind": k, "key": list(key), "chosen": e.chosen, "ms": ms})
        return out

    def clear(self, kind: Optional[str] = None) -> None:
        """Forget the choices (of ``kind``): the next calls measure again."""
        for k in [k for k in self._table if kind is None or k[0] == kind]:
            del self._table[k]

    # -- measuring ----------------------------------------------------------------------
    def _entry(self, kind: str, key: tuple) -> _Entry:
        entry = self._table.get((kind, key))
        if entry is None:
            if len(self._table) >= CAPACITY:
                self._table.pop(next(iter(self._table)))
            entry = self._table[(kind, key)] = _Entry()
        return entry

    def _keep(self, kind: str, key: tuple, entry: _Entry) -> None:
        last = entry.rounds[-1]
        entry.chosen = min(last, key=last.get)
        log.info("%s %s: %s (%s)", kind, key, entry.chosen,
                 ", ".join(f"{n} {s * 1e3:.2f} ms" for n, s in last.items()))  # fmt: skip

    def _forced(self, kind: str, names) -> Optional[str]:
        name = self.forced.get(kind)
        if name is not None and name not in names:
            raise ValueError(f"forced engine {name!r} for {kind} is not one of "
                             f"{', '.join(names)}.")  # fmt: skip
        return name

    def run(self, kind: str, key: tuple, candidates: Mapping[str, Callable[[], Any]],
            keep: Optional[str] = None, trials: Optional[int] = None) -> Any:  # fmt: skip
        """The result of the candidate kept for ``(kind, key)``. While measuring (``trials``
        rounds, default :attr:`trials_needed`), every candidate runs (in the mapping's
        order, ``keep`` last) and ``keep``'s result is returned (default: the first
        candidate's): those
        that claim to compute the same bits return the same result whichever is kept. A
        single candidate just runs."""
        if len(candidates) == 1:
            return next(iter(candidates.values()))()
        forced = self._forced(kind, candidates)
        if forced is not None:
            return candidates[forced]()
        entry = self._entry(kind, key)
        if entry.chosen is not None and entry.chosen in candidates:
            return candidates[entry.chosen]()
        keep = keep if keep is not None else next(iter(candidates))
        times, out = {}, None
        # the kept candidate last: the others' outputs are freed before it allocates its own
        for name in [n for n in candidates if n != keep] + [keep]:
            res, times[name] = self.timer(name, candidates[name])
            if name == keep:
                out = res
            res = None  # freed before the next candidate runs (its pooled output is reused)
        entry.rounds.append(times)
        if len(entry.rounds) >= (self.trials_needed if trials is None else trials):
            self._keep(kind, key, entry)
        return out

    def decide(self, kind: str, key: tuple, probes: Mapping[str, Callable[[], Any]]) -> str:
        """The candidate kept for ``(kind, key)``; on the first call, every probe is timed
        :data:`TRIALS` times now (in turns) and the fastest of the last round is kept."""
        if len(probes) == 1:
            return next(iter(probes))
        forced = self._forced(kind, probes)
        if forced is not None:
            return forced
        entry = self._entry(kind, key)
        if entry.chosen is None or entry.chosen not in probes:
            entry.rounds.clear()
            for _ in range(self.trials_needed):
                entry.rounds.append({n: self.timer(n, fn)[1] for n, fn in probes.items()})
            self._keep(kind, key, entry)
        return entry.chosen


#: the package's registry (one per process): every measured choice of the package
PICKS = Registry()
