"""DGL's own CPU SpMM kernel for the exact products, where DGL imports.

On the CPU, DGL's message-passing kernel (libxsmm, JIT-compiled for the machine) is 10-25%
faster than the package's Numba kernel on graphs of tens of thousands of nodes, at the same
result bit for bit (both sum each row's entries in stored order; ``docs/benchmarks.md``).
Where DGL is installed, the exact products of every engine run on it, so that exact training
is at least as fast as stock DGL; the Numba kernels remain the engine without DGL and the
engine of the sampled products (whose cached slices write only the rows they reach).

A matrix ``A (M, N)`` is handed to DGL as a bipartite graph whose in-edge CSR is ``A``'s CSR
(sources: the ``N`` columns, destinations: the ``M`` rows, edge ``p`` = entry ``p``), built once
per structure. The scales are applied around the kernel in DGL's own order (the column scale
on the source features, the edge weight in the kernel, the row scale on the result), which is
the arithmetic of :mod:`dgl_rsc.sparse.cpu_spmm`. The output is a buffer of the structure's
:class:`~dgl_rsc.sparse.buffers.OutputPool`, zeroed and passed to DGL's kernel (``dgl.ops`` would
allocate, and fault in, a fresh one per call).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import private as dgl_private

__all__ = ["usable", "spmm", "spmm_add"]

#: dtypes DGL's CPU kernel computes as the Numba kernels do
DTYPES = (torch.float32, torch.float64)


def usable(X: torch.Tensor) -> bool:
    """Whether DGL's kernel takes this product: DGL imports, ``X`` is an fp32/fp64 CPU
    tensor."""
    return X.device.type == "cpu" and X.dtype in DTYPES and dgl_private.available()


def _graph_index(structure):
    """The structure's DGL ``HeteroGraphIndex`` (built on first use and kept with it)."""
    gidx = getattr(structure, "_dgl_gidx", None)
    if gidx is None:
        m, n = structure.shape
        gidx = dgl_private.build_index(structure.indptr.long(), structure.indices.long(), n, m)
        structure._dgl_gidx = gidx
    return gidx


def spmm(structure, values: Optional[torch.Tensor], X: torch.Tensor, scales,
         out: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """``diag(r) A diag(c) X`` into ``out (M, D)`` (overwritten) on DGL's kernel.

    Args:
        structure: ``A``'s structure (``indptr``, ``indices``, ``shape``).
        values: ``(nnz,)`` in ``X``'s dtype, or ``None`` (all ones).
        X: ``(N, D)`` contiguous fp32/fp64 CPU tensor.
        scales: :class:`~dgl_rsc.sparse.products.Scales` (row, col, row_divide).
        out: ``(M, D)`` contiguous tensor of ``X``'s dtype, not a view.
    """
    if scales.col is not None:
        X = X * scales.col.to(X.dtype).unsqueeze(1)
    spmm_add(structure, values, X, out.zero_())
    if scales.row is not None:
        r = scales.row.to(out.dtype).unsqueeze(1)
        out.div_(r) if scales.row_divide else out.mul_(r)
    return out


def spmm_add(structure, values: Optional[torch.Tensor], X: torch.Tensor,
             out: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """``out (M, D) += A X`` on DGL's kernel, unscaled (``values``, ``X`` and ``out`` as in
    :func:`spmm`): each entry's term is added to ``out``'s row in stored order (DGL 2's CPU
    kernels, libxsmm's and the plain one, add into what ``out`` holds; a test checks both),
    so the products of several matrices into one zeroed ``out`` are the product of their
    sum, one output written."""
    e = None if values is None else values.reshape(-1, 1)
    dgl_private.spmm_into(_graph_index(structure), X, e, out)
    return out
