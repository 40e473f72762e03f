"""Which engine runs an exact CPU product where both can: DGL's kernel or the Numba kernels.

Both compute the same bits (the Numba kernels add in DGL's order, :mod:`.cpu_spmm`); which is
faster depends on the CPU and the product. A 200000-row, 20M-entry product 256 wide took 2319
ms in DGL 2.1's kernel and 1558 ms in the Numba kernels on the 2-core AMD EPYC VM (AVX2,
2026-11-28); on an AVX-512 Xeon the two were within 0-25% of each other. So the choice is
measured: the first two products of each structure and width run both engines, timed (the
first is a warm-up: DGL builds its graph index, Numba loads its kernels), and the faster on
the second is kept for that structure and width. :data:`CPU_ENGINE` forces one.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

__all__ = ["CPU_ENGINE", "run", "picks"]

#: ``"auto"`` (measured per structure and width), ``"dgl"`` or ``"numba"``: the one switch
CPU_ENGINE = "auto"
#: products of a (structure, width) that run both engines before the choice is kept
TRIALS = 2


def picks(structure) -> dict:
    """``{width: "dgl" | "numba" | [(dgl_s, numba_s), ...]}``: the choices (or the trials so
    far) made for ``structure``."""
    return structure.__dict__.setdefault("_cpu_engine_picks", {})


def run(structure, width: int, dgl: Callable[[], torch.Tensor],
        numba: Callable[[], torch.Tensor]) -> torch.Tensor:  # fmt: skip
    """The product by the engine picked for ``(structure, width)``; while still measuring,
    by both (``dgl()`` first, then ``numba()``, whose output is returned: the same bits)."""
    if CPU_ENGINE not in ("auto", "dgl", "numba"):
        raise ValueError(f"CPU_ENGINE must be 'auto', 'dgl' or 'numba', got {CPU_ENGINE!r}.")
    if CPU_ENGINE != "auto":
        return (dgl if CPU_ENGINE == "dgl" else numba)()
    table = picks(structure)
    state = table.get(width)
    if isinstance(state, str):
        return (dgl if state == "dgl" else numba)()
    trials = table.setdefault(width, [])
    t0 = time.perf_counter()
    dgl()
    t1 = time.perf_counter()
    out = numba()
    trials.append((t1 - t0, time.perf_counter() - t1))
    if len(trials) >= TRIALS:
        d, n = trials[-1]
        table[width] = "dgl" if d < n else "numba"
    return out
