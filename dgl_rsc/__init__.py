"""dgl_rsc: Randomized Sparse Computations (Liu et al., ICML 2023) for DGL.

The forward sparse product stays exact; the backward product ``A^T @ dY`` is approximated by
the top rows of ``A`` scored by ``||A[i, :]|| * ||dY[i, :]||`` under a per-layer budget.

Entry points: :func:`patch` (stock DGL models), :mod:`dgl_rsc.nn` (drop-in convs),
:func:`spmm` / :func:`spmm_csr` (the operator), and the ``dgl-rsc`` launcher;
:func:`keep_freed_memory` (glibc keeps freed large blocks: no page faults per step) is one
explicit call, never made at import.
"""

from .base.memory import keep_freed_memory
from .core.config import ConfigError, RSCConfig
from .core.controller import RSCController
from .core.spmm import spmm, spmm_csr, spmm_matrix
from .dgl import kernels as _dgl_kernels
from .dgl.patch import is_patched, patch
from .int8.spmm import quantized_product as _quantized_product
from .sparse import products as _products
from .sparse.csr import CSR
from .sparse.graph import Graph

# the engines the sparse layer runs without importing the layers above it
_products.register("exact_cpu", _dgl_kernels)
_products.register("quantized", _quantized_product)

__all__ = [
    "CSR",
    "ConfigError",
    "Graph",
    "RSCConfig",
    "RSCController",
    "is_patched",
    "keep_freed_memory",
    "patch",
    "spmm",
    "spmm_csr",
    "spmm_matrix",
]
__version__ = "0.1.0"


def __getattr__(name):
    # `dgl_rsc.nn` on first use, so `import dgl_rsc` stays light.
    if name == "nn":
        import importlib

        return importlib.import_module(".nn", __name__)
    raise AttributeError(f"module 'dgl_rsc' has no attribute {name!r}")
