"""The CPU engine of INT8 dense products: ``torch._int_mm`` only where the CPU has int8
dot-product instructions (elsewhere its CPU kernel is 30-60x slower than fp32); float64
BLAS otherwise, with the same integers."""

import pytest
import torch

from dgl_rsc.base import _deps
from dgl_rsc.int8 import gemm


@pytest.fixture
def flags(monkeypatch):
    def set_flags(names):
        monkeypatch.setattr(_deps, "_cpu_flags", lambda: frozenset(names))
        _deps.int_mm_fast_on_cpu.cache_clear()

    yield set_flags
    _deps.int_mm_fast_on_cpu.cache_clear()


def _engine_used(monkeypatch) -> list:
    used = []
    for name, fn in list(gemm.INT_MM.items()):
        monkeypatch.setitem(gemm.INT_MM, name,
                            lambda a, b, _f=fn, _n=name: used.append(_n) or _f(a, b))  # fmt: skip
    return used


def test_default_cpu_engine_follows_the_instruction_set(flags, monkeypatch):
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(-127, 128, (30, 40), dtype=torch.int8, generator=gen)
    b = torch.randint(-127, 128, (40, 16), dtype=torch.int8, generator=gen)
    want = gemm.int_mm(a, b, "int64")
    used = _engine_used(monkeypatch)
    flags({"avx", "avx2"})
    assert not _deps.int_mm_fast_on_cpu()
    assert torch.equal(gemm.int_mm(a, b), want) and used[-1] == "float64"
    flags({"avx2", "avx512f", "avx512_vnni"})
    assert _deps.int_mm_fast_on_cpu() == _deps.int_mm_on_cpu()
    assert torch.equal(gemm.int_mm(a, b), want)
    assert used[-1] == ("int_mm" if _deps.int_mm_on_cpu() else "float64")
