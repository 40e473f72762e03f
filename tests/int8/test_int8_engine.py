"""The CPU engine of INT8 dense products: ``torch._int_mm`` only where the CPU has int8
dot-product instructions (elsewhere its CPU kernel is 30-60x slower than fp32); fp32 BLAS
over exact slices otherwise (float64 where the user lets fp32 products round lower), with the
same integers."""

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
    assert torch.equal(gemm.int_mm(a, b), want) and used[-1] == "float32"
    flags({"avx2", "avx512f", "avx512_vnni"})
    assert _deps.int_mm_fast_on_cpu() == _deps.int_mm_on_cpu()
    assert torch.equal(gemm.int_mm(a, b), want)
    assert used[-1] == ("int_mm" if _deps.int_mm_on_cpu() else "float32")


@pytest.mark.parametrize("precision", ["high", "medium"])
def test_fp32_products_allowed_to_round_lower_get_the_float64_engine(flags, monkeypatch,
                                                                      precision):  # fmt: skip
    """With ``torch.set_float32_matmul_precision("high"/"medium")`` an fp32 GEMM may run in
    TF32 or bf16, which would not hold the codes' sums exactly: float64 is used instead."""
    gen = torch.Generator().manual_seed(1)
    a = torch.randint(-127, 128, (20, 300), dtype=torch.int8, generator=gen)
    b = torch.randint(-127, 128, (300, 9), dtype=torch.int8, generator=gen)
    want = gemm.int_mm(a, b, "int64")
    used = _engine_used(monkeypatch)
    flags({"avx2"})
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision(precision)
        assert torch.equal(gemm.int_mm(a, b), want) and used[-1] == "float64"
    finally:
        torch.set_float32_matmul_precision(before)
    assert torch.equal(gemm.int_mm(a, b), want) and used[-1] == "float32"


@pytest.mark.parametrize(
    "dense, cpu_flags, expect_int8",
    [("auto", {"avx2"}, False), ("auto", {"avx512_vnni"}, True), ("int8", {"avx2"}, True),
     ("fp32", {"avx512_vnni"}, False)],
)  # fmt: skip
def test_weight_products_run_in_int8_only_where_dense_says(flags, monkeypatch, dense, cpu_flags,
                                                           expect_int8):  # fmt: skip
    """``dense="auto"``: a GraphConv's weight products are INT8 where the CPU has int8
    dot-product instructions (and torch a CPU ``_int_mm``), fp32 elsewhere; its sparse
    products are INT8 either way."""
    from dgl_rsc.dgl.nn import _base
    from dgl_rsc.int8 import quantize_model
    from dgl_rsc.models import build_model
    from dgl_rsc.sparse import products
    from dgl_rsc.sparse.graph import Graph

    flags(cpu_flags)
    calls = {"gemm": 0, "spmm": 0}
    real_mm, real_sp = _base.int8_matmul, products.ENGINES["quantized"]

    def count(key, fn):
        return lambda *a, **k: calls.__setitem__(key, calls[key] + 1) or fn(*a, **k)

    monkeypatch.setattr(_base, "int8_matmul", count("gemm", real_mm))
    monkeypatch.setitem(products.ENGINES, "quantized", count("spmm", real_sp))
    gen = torch.Generator().manual_seed(0)
    src, dst = (
        torch.randint(0, 40, (200,), generator=gen),
        torch.randint(0, 40, (200,), generator=gen),
    )
    g = Graph(torch.cat([src, dst]), torch.cat([dst, src]), 40)
    model = build_model("gcn", in_feats=6, num_classes=3, hidden=8, layers=2, dropout=0.0)
    quantize_model(model, "nearest", dense=dense)
    model(g, torch.randn(40, 6)).sum().backward()
    native = _deps.int_mm_fast_on_cpu() or dense == "int8"
    assert (calls["gemm"] > 0) == (expect_int8 and native)
    assert calls["spmm"] > 0


def test_dense_choice_is_validated():
    from dgl_rsc.int8 import Int8Spec

    with pytest.raises(ValueError, match="dense='gpu'.*'auto'"):
        Int8Spec(dense="gpu")
