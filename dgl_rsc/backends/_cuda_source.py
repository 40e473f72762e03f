"""Find and read the CUDA C++ kernel sources (``cuda/*.cu``).

The sources are package data of ``dgl_rsc.cuda`` (setup.cfg maps that package to the top-level
``cuda/`` folder). An installed package finds them through :mod:`importlib.resources`; a source
tree used through ``PYTHONPATH=.`` without installation has no ``dgl_rsc.cuda`` package, and
the sources are read from ``<repo>/cuda`` instead. No CuPy import here.
"""

from __future__ import annotations

import functools
import importlib.resources as resources
from pathlib import Path

__all__ = ["source_dir", "cu_files", "read_source"]

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
