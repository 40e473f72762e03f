"""Which engine runs an exact CPU product where both can: DGL's kernel or the Numba kernels.

Both compute the same bits (the Numba kernels add in DGL's order, :mod:`.cpu_spmm`); which is
faster depends on the CPU and the product. A 200000-row, 20M-entry product 256 wide took 2319
ms in DGL 2.1's kernel and 1558 ms in the Numba kernels on the 2-core AMD EPYC VM (AVX2,
2026-11-28); on an AVX-512 Xeon the two were within 0-25% of each other. So the choice is
measured (:data:`dgl_rsc.base.pick.PICKS`, kind ``"exact_cpu"``): the first two products of
each structure and width run both engines, timed (the first is a warm-up: DGL builds its
graph index, Numba loads its kernels), and the faster on the second is kept.

A structure is known by its fingerprint (rows, columns, non-zeros, index dtype), not by the
Python object holding it: an entry point that builds a new structure object for the same
graph at every call (``dgl_rsc.spmm_csr`` on raw CSR tensors, a ``SparseMatrix`` rebuilt per
call) still settles after two products. Two graphs of the same sizes share a choice; that
only decides speed, never the result. :data:`CPU_ENGINE` forces one engine.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..base.pick import PICKS, fingerprint

__all__ = ["CPU_ENGINE", "KIND", "run", "key", "chosen"]

#: ``"auto"`` (measured per structure and width), ``"dgl"`` or ``"numba"``: the one switch
CPU_ENGINE = "auto"
#: the kind of work in :data:`~dgl_rsc.base.pick.PICKS`
KIND = "exact_cpu"


def key(structure, width: int, *labels) -> tuple:
    """The choice's key: ``structure``'s sizes and index dtype, the width, ``labels`` (the
    operand's dtype, whether the matrix has values)."""
    return fingerprint(*structure.shape, structure.nnz, structure.indices.dtype, width, *labels)


def chosen(structure, width: int, *labels):
    """``"dgl"``, ``"numba"``, or ``None`` while the engines are still being timed."""
    return PICKS.chosen(KIND, key(structure, width, *labels))


def run(structure, width: int, dgl: Callable[[], torch.Tensor],
        numba: Callable[[], torch.Tensor], *labels) -> torch.Tensor:  # fmt: skip
    """The product by the engine picked for ``(structure, width, *labels)``; while still
    measuring, by both (``dgl()`` first, then ``numba()``, whose output is returned: the
    same bits)."""
    if CPU_ENGINE not in ("auto", "dgl", "numba"):
        raise ValueError(f"CPU_ENGINE must be 'auto', 'dgl' or 'numba', got {CPU_ENGINE!r}.")
    if CPU_ENGINE != "auto":
        return (dgl if CPU_ENGINE == "dgl" else numba)()
    return PICKS.run(KIND, key(structure, width, *labels), {"dgl": dgl, "numba": numba},
                     keep="numba")  # fmt: skip
