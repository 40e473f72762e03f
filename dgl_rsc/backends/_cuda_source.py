"""Find and read the CUDA C++ kernel sources (``cuda/*.cu``).

The sources are package data of ``dgl_rsc.cuda`` (setup.cfg maps that package to the top-level
``cuda/`` folder). An installed package finds them through :mod:`importlib.resources`; a source
tree used through ``PYTHONPATH=.`` without installation has no ``dgl_rsc.cuda`` package, and
the sources are read from ``<repo>/cuda`` instead.

:func:`cupy_module` and :func:`launch` are the one CuPy loader of every kernel family (the
sampling kernels, the INT8 product, the message codec): each source is compiled once per
device, and kernels run on torch's current stream. CuPy is imported only when a kernel is
compiled; the compile's seconds go to an entered :class:`~.compile_watch.CompileWatch`.
"""

from __future__ import annotations

import functools
import importlib.resources as resources
from pathlib import Path

import torch

from ..base import _deps
from .compile_watch import compiling

__all__ = ["source_dir", "cu_files", "read_source", "cupy_module", "launch"]

_REPO_CUDA = Path(__file__).resolve().parents[2] / "cuda"


def _package_dir():
    try:
        return resources.files("dgl_rsc.cuda")
    except ModuleNotFoundError:  # a source tree that is not installed
        return None


def source_dir():
    """The folder holding the ``.cu`` files (a ``Traversable`` or a :class:`~pathlib.Path`).

    Raises:
        FileNotFoundError: neither the installed package data nor ``<repo>/cuda`` has them.
    """
    pkg = _package_dir()
    if pkg is not None and any(p.name.endswith(".cu") for p in pkg.iterdir()):
        return pkg
    if _REPO_CUDA.is_dir() and any(_REPO_CUDA.glob("*.cu")):
        return _REPO_CUDA
    raise FileNotFoundError(
        "the CUDA kernel sources (cuda/*.cu) were not found: neither the package data of "
        f"dgl_rsc.cuda nor {_REPO_CUDA} has them. Reinstall dgl_rsc (`pip install .`) or run "
        "from the repository root."
    )


def cu_files() -> list[str]:
    """Sorted names of the ``.cu`` files, e.g. ``["rsc_kernels.cu"]``."""
    return sorted(p.name for p in source_dir().iterdir() if p.name.endswith(".cu"))


@functools.cache
def read_source(name: str) -> str:
    """Text of the kernel source ``name`` (e.g. ``"rsc_kernels.cu"``), read once."""
    path = source_dir() / name
    if not path.is_file():
        raise FileNotFoundError(f"no kernel source {name!r}; available: {cu_files()}.")
    return path.read_text(encoding="utf-8")


@functools.cache
def cupy_module(source: str, options: tuple, names: tuple, device_index: int):
    """``cupy.RawModule`` of the kernel source ``source`` with the compile ``options`` and the
    template instantiations ``names``, compiled once per device."""
    cp = _deps.require_cupy()
    with cp.cuda.Device(device_index), compiling("CUDA"):  # seconds to a launcher's watch
        module = cp.RawModule(code=read_source(source), options=tuple(options),
                              name_expressions=list(names))  # fmt: skip
        module.compile()  # now rather than at the first get_function (CuPy caches it on disk)
    return module


@functools.lru_cache(maxsize=64)
def _external_stream(device_index: int, ptr: int):
    return _deps.require_cupy().cuda.ExternalStream(ptr, device_index)


def launch(module: tuple, t: torch.Tensor, name: str, grid, block, *args) -> None:
    """Run kernel ``name`` of ``module`` (``(source, options, names)``, as for
    :func:`cupy_module`) on the device of ``t``, on torch's current stream."""
    cp = _deps.require_cupy()
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    stream = _external_stream(index, torch.cuda.current_stream(index).cuda_stream)
    kernel = cupy_module(*module, index).get_function(name)
    with cp.cuda.Device(index), stream:
        kernel(grid, block, args)
