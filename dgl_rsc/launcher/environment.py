"""The machine and versions a run records (``results.json``'s ``environment``): read from
``/proc``, sysfs and the installed packages' metadata, importing nothing."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform

import torch

from .. import __version__

__all__ = ["PACKAGES", "environment", "cpu_name", "cpu_caches"]

PACKAGES = (
    "torch",
    "dgl",
    "numpy",
    "pyyaml",
    "tqdm",
    "matplotlib",
    "cupy-cuda12x",
    "cupy-cuda13x",  # the GPU images' CuPy (CUDA 13)
    "numba",
    "numba-cuda",  # Numba's CUDA target on CUDA 13
    "torch-geometric",
)


def _version(package: str):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_name() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (else what ``platform`` knows)."""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_caches(root: str = "/sys/devices/system/cpu/cpu0/cache") -> dict:
    """CPU 0's cache sizes as sysfs lists them, e.g. ``{"L1d": "48K", "L2": "2048K", "L3":
    "491520K"}`` (``{}`` where it does not). Two 2-core VMs that both call themselves "Intel(R)
    Xeon(R) Processor" ran quickstart's exact epoch at 44 and 72 ms, and RSC's at 1.00x and
    1.12x of it (``docs/benchmarks.md``): the model name alone does not tell them apart."""
    out = {}
    if not os.path.isdir(root):
        return out
    for entry in sorted(os.listdir(root)):
        try:
            with open(os.path.join(root, entry, "level"), encoding="utf-8") as f:
                level = f.read().strip()
            with open(os.path.join(root, entry, "type"), encoding="utf-8") as f:
                kind = f.read().strip()
            with open(os.path.join(root, entry, "size"), encoding="utf-8") as f:
                size = f.read().strip()
        except OSError:
            continue
        suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
        out[f"L{level}{suffix}"] = size
    return out


def environment(device: torch.device) -> dict:
    """Versions, device and machine of this run (no package is imported to read them)."""
    cuda = device.type == "cuda"
    cpu = cpu_name()
    return {
        "dgl_rsc": __version__,
        "python": platform.python_version(),
        "packages": {p: _version(p) for p in PACKAGES},
        "torch": torch.__version__,
        "dgl": _version("dgl"),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if cuda else cpu,
        "cpu": cpu,
        "cpu_caches": cpu_caches(),
        "cuda_version": torch.version.cuda,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
