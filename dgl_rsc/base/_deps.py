"""Optional dependencies, probed once, in one place.

Nothing else in the package wraps an import in ``try``/``except``: it asks one of the
functions below. The probes are lazy (importing DGL or CuPy costs seconds) and cached.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
from types import ModuleType

__all__ = [
    "dgl_available",
    "cupy_available",
    "matplotlib_available",
    "numba_available",
    "numba_cuda_available",
    "int_mm_on_cpu",
    "int8_dot_instructions",
    "require_dgl",
    "require_cupy",
    "require_numba",
    "require_numba_cuda",
    "torch_geometric_available",
    "torch_sparse_available",
    "require_torch_geometric",
    "sparse_tensor_class",
    "is_sparse_tensor",
    "TORCH_VERSION",
]


def _torch_version() -> tuple[int, int]:
    import torch

    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


TORCH_VERSION = _torch_version()


_PROBED: dict[str, tuple] = {}


def _probe(name: str) -> tuple[ModuleType | None, str]:
    """``(module or None, why not)``, imported once. A plain dict rather than
    ``functools.cache``, read before anything else: ``torch.compile`` traces a hit as one
    lookup (no ``DGLBACKEND`` context, no cache wrapper)."""
    hit = _PROBED.get(name)
    if hit is not None:
        return hit
    with _dgl_backend_for_import():
        try:
            hit = importlib.import_module(name), ""
        except Exception as exc:  # any failure to import means "not available"
            hit = None, f"{type(exc).__name__}: {exc}"
    _PROBED[name] = hit
    return hit


@contextlib.contextmanager
def _dgl_backend_for_import():
    """DGL reads ``DGLBACKEND`` once, at import; without it, it warns and writes
    ``~/.dgl/config.json``. Set it (to PyTorch, the only backend dgl_rsc uses) for the
    import only, and leave the environment as it was."""
    missing = "DGLBACKEND" not in os.environ
    if missing:
        os.environ["DGLBACKEND"] = "pytorch"
    try:
        yield
    finally:
        if missing:
            os.environ.pop("DGLBACKEND", None)


def dgl_available() -> bool:
    """``True`` when DGL imports with the installed torch."""
    return _probe("dgl")[0] is not None


@functools.cache
def cupy_available() -> bool:
    """``True`` when CuPy imports and sees at least one CUDA device."""
    cp = _probe("cupy")[0]
    if cp is None:
        return False
    try:
        return cp.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def matplotlib_available() -> bool:
    """``True`` when matplotlib imports (the launcher's summary.png)."""
    return _probe("matplotlib")[0] is not None


@functools.cache
def numba_available() -> bool:
    """``True`` when Numba imports (its CPU kernels are the CPU product engine)."""
    return _probe("numba")[0] is not None


@functools.cache
def numba_cuda_available() -> bool:
    """``True`` when Numba's CUDA target works (a real GPU or the simulator)."""
    cuda = _probe("numba.cuda")[0]
    if cuda is None:
        return False
    try:
        return bool(cuda.is_available())
    except Exception:
        return False


@functools.cache
def int_mm_on_cpu() -> bool:
    """``True`` when ``torch._int_mm`` (int8 x int8 -> int32) runs on CPU tensors (newer torch;
    2.2 has it for CUDA only)."""
    import torch

    try:
        a = torch.ones((24, 8), dtype=torch.int8)
        return int(torch._int_mm(a, a.t().contiguous())[0, 0]) == 8
    except Exception:  # not registered for the CPU backend, or absent
        return False


def _cpu_flags() -> frozenset:
    """The CPU's feature flags from ``/proc/cpuinfo`` (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def int8_dot_instructions() -> tuple:
    """The CPU's int8 dot-product instruction sets named in ``/proc/cpuinfo``
    (``avx512_vnni``, ``avx_vnni``, ``amx_int8``): recorded beside measurements, never used to
    decide (which INT8 products pay is measured, :mod:`dgl_rsc.int8.choose`). On a 2-core AMD
    EPYC with AVX2 only (torch 2.15) ``torch._int_mm`` was 19x slower than an fp32 GEMM, where
    an AVX512-VNNI Xeon ran it 1.6x faster."""
    return tuple(sorted(_cpu_flags() & {"avx512_vnni", "avx_vnni", "amx_int8"}))


def _require(name: str, ok: bool, hint: str) -> ModuleType:
    if not ok:
        reason = _probe(name)[1] or "no usable device"
        raise ImportError(f"{name} is required here but is not usable ({reason}). {hint}")
    return _probe(name)[0]


def require_dgl() -> ModuleType:
    """Return the ``dgl`` module or raise an ``ImportError`` that says how to get it."""
    return _require(
        "dgl",
        dgl_available(),
        "Install it with `pip install dgl==2.1.0` (needs torch<=2.2), or use the DGL-free "
        "entry points: dgl_rsc.spmm_csr and dgl_rsc.Graph.",
    )


def require_cupy() -> ModuleType:
    """Return the ``cupy`` module or raise an ``ImportError`` naming what is missing."""
    return _require(
        "cupy",
        cupy_available(),
        "The 'cupy' backend needs `pip install cupy-cuda12x` (or cupy-cuda13x) and a CUDA "
        "device; use backend='torch' or 'auto' otherwise.",
    )


def require_numba() -> ModuleType:
    """Return ``numba`` or raise an ``ImportError`` naming what is missing."""
    return _require(
        "numba",
        numba_available(),
        "Install it with `pip install numba` (the CPU kernels), or use backend='torch'.",
    )


def _numpy_alias_for_numba_cuda() -> None:
    """numba-cuda 0.68 still calls ``np.row_stack`` when it compiles kernels; NumPy 2.5
    removed it (an alias of ``np.vstack``). Restore the alias there, and only there (seen on
    the H100 and H200 images: numba-cuda 0.68, NumPy 2.5.2). It changes the ``numpy`` module,
    so it happens when a Numba-CUDA backend is asked for, not when dgl_rsc is imported."""
    import numpy as np

    version = tuple(int(p) for p in np.__version__.split(".")[:2] if p.isdigit())
    if version >= (2, 5) and not hasattr(np, "row_stack"):
        np.row_stack = np.vstack  # noqa: NPY201 (restoring the removed alias on purpose)


def require_numba_cuda() -> ModuleType:
    """Return ``numba.cuda`` or raise an ``ImportError`` naming what is missing. Every
    Numba-CUDA module (the sampling, codec and INT8 kernels) gets it here, so the NumPy alias
    its compiler needs is restored here, once for all of them."""
    cuda = _require(
        "numba.cuda",
        numba_cuda_available(),
        "The 'numba' backend needs numba (and numba-cuda on CUDA 13) with a CUDA device, or "
        "NUMBA_ENABLE_CUDASIM=1 for the simulator; use backend='torch' or 'auto' otherwise.",
    )
    _numpy_alias_for_numba_cuda()
    return cuda


def torch_geometric_available() -> bool:
    """``True`` when PyTorch Geometric imports (the :mod:`dgl_rsc.pyg` front end)."""
    return _probe("torch_geometric")[0] is not None


def torch_sparse_available() -> bool:
    """``True`` when ``torch_sparse`` imports (PyG's ``SparseTensor`` adjacency)."""
    return _probe("torch_sparse")[0] is not None


def require_torch_geometric() -> ModuleType:
    """Return ``torch_geometric`` or raise an ``ImportError`` that says how to get it."""
    return _require(
        "torch_geometric",
        torch_geometric_available(),
        "Install it with `pip install torch-geometric==2.8.1` for dgl_rsc.pyg, or use "
        "dgl_rsc.nn layers on a dgl_rsc.Graph.",
    )


def sparse_tensor_class():
    """``torch_sparse.SparseTensor``, or ``None`` when torch_sparse is not installed."""
    mod = _probe("torch_sparse")[0]
    return None if mod is None else mod.SparseTensor


def is_sparse_tensor(obj) -> bool:
    """``obj`` is a ``torch_sparse.SparseTensor`` (``False`` without torch_sparse)."""
    cls = sparse_tensor_class()
    return cls is not None and isinstance(obj, cls)
