"""The one dispatch point between the torch reference and the CUDA kernels.

A backend is a module implementing :class:`~dgl_rsc.backends.protocol.SamplingBackend`;
:data:`BACKENDS` registers each with the devices it runs on and how to check that it can
run. :func:`resolve` picks one for a device. A backend may also name the module of its INT8
sparse-dense product (:mod:`dgl_rsc.int8`); :func:`resolve_int8` picks that one, with the same
device rules.
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType
from typing import Callable

import torch

from ..base import _deps
from ..base.names import did_you_mean
from .protocol import SamplingBackend

__all__ = ["BACKENDS", "Backend", "SamplingBackend", "resolve", "resolve_int8"]


@dataclasses.dataclass(frozen=True)
class Backend:
    """A registered backend.

    Attributes:
        name: the config name.
        module: the module path (imported on first use).
        devices: device types it takes tensors on (``"any"``: every device torch supports).
        require: raises an ``ImportError`` naming what is missing when it cannot run.
        summary: one line for messages.
        int8: the module of its INT8 product (``int8_spmm``, ``int8_spmm_acc``), or ``""``.
    """

    name: str
    module: str
    devices: tuple
    require: Callable[[], object]
    summary: str
    int8: str = ""

    def load(self) -> SamplingBackend:
        return importlib.import_module(self.module)

    def load_int8(self) -> ModuleType:
        return importlib.import_module(self.int8)


def _nothing():
    return None


BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("torch", "dgl_rsc.backends.torch_ref", ("any",), _nothing,
                "vectorized torch, the reference (CPU and every device)",
                "dgl_rsc.backends.int8_ref"),
        Backend("cupy", "dgl_rsc.backends.cupy_backend", ("cuda",), _deps.require_cupy,
                "CuPy RawKernels (CUDA)", "dgl_rsc.backends.int8_cupy"),
        Backend("numba", "dgl_rsc.backends.numba_backend", ("cuda", "cpu-simulator"),
                _deps.require_numba_cuda, "Numba-CUDA kernels (CUDA, or Numba's simulator)",
                "dgl_rsc.backends.int8_numba"),
        Backend("numba-cpu", "dgl_rsc.backends.numba_cpu", ("cpu",), _deps.require_numba,
                "Numba CPU kernels (the CPU default where Numba imports)",
                "dgl_rsc.backends.int8_cpu"),
    )
}  # fmt: skip

#: ``"auto"``: the first backend of the device type's list that can run
AUTO = {"cuda": ("cupy", "torch"), "cpu": ("numba-cpu", "torch")}


def _pick(name: str, device) -> Backend:
    device = torch.device(device)
    if name == "auto":
        for cand in AUTO.get(device.type, ("torch",)):
            try:
                BACKENDS[cand].require()
            except ImportError:
                continue
            return BACKENDS[cand]
    if name not in BACKENDS:
        hint = did_you_mean(str(name), BACKENDS)
        known = ", ".join(["auto", *BACKENDS])
        raise ValueError(f"unknown backend {name!r}; choose one of {known}.{hint}")
    spec = BACKENDS[name]
    if "any" not in spec.devices and device.type not in spec.devices:
        if not (device.type == "cpu" and "cpu-simulator" in spec.devices):
            raise ValueError(
                f"backend={name!r} needs CUDA tensors, got tensors on {device}; move the graph "
                "and features to a GPU or use backend='torch' (or 'auto')."
            )
    spec.require()
    return spec


def resolve(name: str, device) -> ModuleType:
    """The backend module for ``name`` on ``device``.

    ``"auto"`` is CuPy for CUDA tensors when CuPy works, the Numba CPU kernels for CPU tensors
    when Numba imports, torch otherwise. A backend that
    cannot run raises an ``ImportError``/``ValueError`` naming what is missing and the fix.
    """
    return _pick(name, device).load()


def resolve_int8(name: str, device) -> ModuleType:
    """The INT8 sparse-product module of backend ``name`` on ``device`` (the same choice and
    errors as :func:`resolve`): ``int8_spmm`` and ``int8_spmm_acc`` as in
    :mod:`dgl_rsc.backends.int8_ref`."""
    return _pick(name, device).load_int8()
