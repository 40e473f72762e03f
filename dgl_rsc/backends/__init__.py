"""The one dispatch point between the torch reference and the CUDA kernels.

A backend is a module exposing ``row_scores``, ``select_rows`` and ``slice_transposed`` with
the signatures of :mod:`dgl_rsc.backends.torch_ref`. :func:`resolve` picks one for a device.
"""

from __future__ import annotations

from types import ModuleType

import torch

from .. import _deps
from ..config import BACKENDS
from . import torch_ref

__all__ = ["resolve", "torch_ref"]


def resolve(name: str, device: torch.device) -> ModuleType:
    """Return the backend module for ``name`` on ``device``.

    ``"auto"`` is CuPy for CUDA tensors when CuPy works, torch otherwise. Asking for a
    backend that cannot run raises an ``ImportError``/``ValueError`` naming what is missing.
    """
    device = torch.device(device)
    if name == "auto":
        name = "cupy" if device.type == "cuda" and _deps.cupy_available() else "torch"
    if name == "torch":
        return torch_ref
    if name == "cupy":
        if device.type != "cuda":
            raise ValueError(
                f"backend='cupy' needs CUDA tensors, got tensors on {device}; move the graph "
                "and features to a GPU or use backend='torch'."
            )
        _deps.require_cupy()
        from . import cupy_backend

        return cupy_backend
    if name == "numba":
        _deps.require_numba_cuda()
        from . import numba_backend

        return numba_backend
    raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}.")
