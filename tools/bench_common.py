"""Helpers shared by the benchmark scripts: power-law matrices, timers, result files."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import time

import torch
import yaml

from dgl_rsc.launcher.report import cpu_caches, cpu_name
from dgl_rsc.sparse.csr import CSR


def parse_variant(text: str) -> tuple[str, dict]:
    """A sweep's ``--variant name:key=value,key=value`` -> ``(name, {key: value})`` (values
    read as YAML; keys without a section are ``rsc`` keys)."""
    name, _, rest = text.partition(":")
    sets = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        key = key if "." in key else f"rsc.{key}"
        sets[key] = yaml.safe_load(value)
    return name, sets


def power_law_csr(n, nnz, exponent=2.1, seed=0, device="cpu", index_dtype=torch.int64):
    """Chung-Lu random ``(n, n)`` CSR with power-law degrees and about ``nnz`` entries."""
    gen = torch.Generator(device=device).manual_seed(seed)
    theta = torch.rand(n, generator=gen, device=device).clamp(min=1e-6)
    theta = theta.pow(-1.0 / (exponent - 1.0)).clamp(max=n / 4)
    p = theta / theta.sum()
    key = torch.empty(0, dtype=torch.long, device=device)
    chunk = 1 << 24  # torch.multinomial draws at most 2^24 samples per call
    while key.numel() < nnz:  # duplicates are dropped: draw until the target is reached
        need = int((nnz - key.numel()) * 1.3) + 1024
        parts = [key]
        for start in range(0, need, chunk):
            m = min(chunk, need - start)
            r = torch.multinomial(p, m, replacement=True, generator=gen)
            c = torch.multinomial(p, m, replacement=True, generator=gen)
            parts.append(r * n + c)
        key = torch.unique(torch.cat(parts))
    keep = torch.randperm(key.numel(), generator=gen, device=device)[:nnz]
    key = torch.sort(key[keep]).values  # row-major CSR order
    rows, cols = key // n, key % n
    counts = torch.bincount(rows, minlength=n)
    indptr = torch.zeros(n + 1, dtype=torch.long, device=device)
    torch.cumsum(counts, 0, out=indptr[1:])
    return CSR(indptr.to(index_dtype), cols.to(index_dtype), None, (n, n))


def grad_like(n, d, seed=1, device="cpu", dtype=torch.float32):
    """``(n, d)`` output gradient with uneven row norms (log-normal), as in training."""
    gen = torch.Generator(device=device).manual_seed(seed)
    scale = torch.randn(n, 1, generator=gen, device=device).mul(1.0).exp()
    return (torch.randn(n, d, generator=gen, device=device) * scale).to(dtype)


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timeit(fn, device, reps=5, warmup=1):
    """Median seconds of ``fn()`` over ``reps`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def machine(device) -> dict:
    info = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "host_cpu": platform.processor() or platform.machine(),
        "cpu": cpu_name(),
        "cpu_caches": cpu_caches(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "load_average": list(os.getloadavg()),  # 1, 5 and 15 minutes, when the record is made
    }
    if torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    from dgl_rsc.base import _deps

    dots = getattr(_deps, "int8_dot_instructions", None)  # VNNI/AMX: INT8 GEMMs can pay
    if dots is not None:
        info["int8_dot_instructions"] = list(dots())
    alloc = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_") or k == "LD_PRELOAD"}
    if alloc:
        info["allocator_env"] = alloc
    return info


def write_json(path, data):
    """Atomic write (the launcher's: a temp file beside ``path``, then a rename); the file's
    permissions follow the umask."""
    from dgl_rsc.base.atomic import atomic_write_text

    atomic_write_text(path, json.dumps(data, indent=2) + "\n")
