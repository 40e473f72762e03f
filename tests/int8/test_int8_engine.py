"""INT8 where it pays, chosen by measurement (``dgl_rsc.int8.choose``): the integer engine of
a dense product, whether a weight product and a sparse product run in INT8 or fp32. A fake
timer decides (no timed assertions); whichever engine is kept, the integer engines give the
same integers and an fp32 choice gives the fp32 product's bits."""

import pytest
import torch

from dgl_rsc.base import _deps
from dgl_rsc.base.pick import Registry
from dgl_rsc.int8 import choose, gemm


@pytest.fixture
def timed(monkeypatch):
    """``timed({name: seconds})``: a fresh registry whose timer gives each candidate that
    time (``default`` for the others)."""

    def make(times, default=1.0):
        reg = Registry(timer=lambda name, fn: (fn(), times.get(name, default)))
        monkeypatch.setattr(choose, "PICKS", reg)
        return reg

    return make


def _engine_used(monkeypatch) -> list:
    used = []
    for name, fn in list(gemm.INT_MM.items()):
        monkeypatch.setitem(gemm.INT_MM, name,
                            lambda a, b, _f=fn, _n=name: used.append(_n) or _f(a, b))  # fmt: skip
    return used


def _codes(shape, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-127, 128, shape, dtype=torch.int8, generator=gen)


@pytest.mark.parametrize("int_mm_fast", [False, True])
def test_default_integer_engine_is_the_fastest_measured(timed, monkeypatch, int_mm_fast):
    a, b = _codes((30, 40), 0), _codes((40, 16), 1)
    want = gemm.int_mm(a, b, "int64")
    timed({"int_mm": 0.1 if int_mm_fast else 9.0, "float32": 1.0})
    used = _engine_used(monkeypatch)
    assert torch.equal(gemm.int_mm(a, b), want)
    has_int_mm = _deps.int_mm_on_cpu()  # torch 2.2 has no CPU kernel: never a candidate
    assert used[-1] == ("int_mm" if int_mm_fast and has_int_mm else "float32")
    assert torch.equal(gemm.int_mm(a, b), want) and used.count(used[-1]) >= 2


@pytest.mark.parametrize("precision", ["high", "medium"])
def test_fp32_products_allowed_to_round_lower_get_the_float64_engine(timed, monkeypatch,
                                                                      precision):  # fmt: skip
    """With ``torch.set_float32_matmul_precision("high"/"medium")`` an fp32 GEMM may run in
    TF32 or bf16, which would not hold the codes' sums exactly: float64 is the BLAS engine."""
    a, b = _codes((20, 300), 1), _codes((300, 9), 2)
    want = gemm.int_mm(a, b, "int64")
    timed({"int_mm": 9.0})
    used = _engine_used(monkeypatch)
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision(precision)
        assert torch.equal(gemm.int_mm(a, b), want) and used[-1] == "float64"
    finally:
        torch.set_float32_matmul_precision(before)
    assert torch.equal(gemm.int_mm(a, b), want) and used[-1] == "float32"


def _graph(n=40, seed=0):
    from dgl_rsc.sparse.graph import Graph

    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (5 * n,), generator=gen)
    dst = torch.randint(0, n, (5 * n,), generator=gen)
    return Graph(torch.cat([src, dst]), torch.cat([dst, src]), n)


def _counted_model(monkeypatch, dense, sparse="auto", layers=2):
    from dgl_rsc.int8 import quantize_model
    from dgl_rsc.int8 import spmm as int8_spmm
    from dgl_rsc.models import build_model
    from dgl_rsc.nn import exact

    calls = {"gemm": 0, "spmm": 0}  # real products (the probes' own are not counted)
    probing = []
    real_mm, real_probe, real_sp = gemm.int_mm_any_k, gemm._probe_int8, int8_spmm.int8_csr_mm

    def count(key, fn):
        def run(*a, **k):
            if not probing:
                calls[key] += 1
            return fn(*a, **k)

        return run

    def probe(*a, **k):
        probing.append(1)
        try:
            return real_probe(*a, **k)
        finally:
            probing.pop()

    monkeypatch.setattr(gemm, "int_mm_any_k", count("gemm", real_mm))
    monkeypatch.setattr(gemm, "_probe_int8", probe)
    monkeypatch.setattr(int8_spmm, "int8_csr_mm", count("spmm", real_sp))
    model = build_model("gcn", in_feats=6, num_classes=3, hidden=24, layers=layers, dropout=0.0)
    exact(model)
    quantize_model(model, "nearest", dense=dense, sparse=sparse)
    return model, calls


@pytest.mark.parametrize(
    "dense, times, expect_int8",
    [("auto", {"fp32": 1.0}, False), ("auto", {"fp32": 9.0}, True), ("int8", {"fp32": 0.1}, True),
     ("fp32", {"fp32": 9.0}, False)],
)  # fmt: skip
def test_weight_products_run_in_int8_only_where_it_measured_faster(timed, monkeypatch, dense,
                                                                   times, expect_int8):  # fmt: skip
    """``dense="auto"``: a GraphConv's weight products run in INT8 where that measured faster
    than fp32 (a VNNI CPU), in fp32 where it did not (AVX2); ``"int8"``/``"fp32"`` force."""
    reg = timed(times)
    model, calls = _counted_model(monkeypatch, dense)
    model(_graph(), torch.randn(40, 6, requires_grad=True)).sum().backward()
    assert (calls["gemm"] > 0) == expect_int8
    kept = {r["chosen"] for r in reg.summary("int8_dense")}
    if dense == "auto":  # fp32 and the integer engines measured: the faster kept
        assert kept == ({"fp32"} if not expect_int8 else kept - {"fp32"}) and kept
    else:  # "fp32": nothing measured; "int8": integer engines only (one on torch 2.2)
        assert "fp32" not in kept


@pytest.mark.parametrize("int8_slow", [True, False])
def test_sparse_auto_falls_back_to_fp32_where_int8_is_slower(timed, monkeypatch, int8_slow):
    """``sparse="auto"``: after its trials a product runs only the faster of INT8 and the
    fp32 engine; where fp32 is kept, the layer's outputs equal an fp32 model's bit for bit."""
    from dgl_rsc.int8 import dequantize_model

    timed({"int8": 5.0 if int8_slow else 0.5, "fp32": 1.0})
    torch.manual_seed(0)
    model, calls = _counted_model(monkeypatch, "fp32", layers=3)
    g, x = _graph(60, 1), torch.randn(60, 6)
    for _ in range(5):  # the trials (both run, INT8's result kept), then the choice alone
        model(g, x)
    trials = calls["spmm"]
    out = model(g, x)
    assert calls["spmm"] == trials + (0 if int8_slow else 1)
    dequantize_model(model)
    assert torch.equal(out, model(g, x)) == int8_slow


@pytest.mark.parametrize("key", ["dense", "sparse"])
def test_int8_choices_are_validated(key):
    from dgl_rsc.int8 import Int8Spec

    with pytest.raises(ValueError, match=f"{key}='gpu'.*'auto'"):
        Int8Spec(**{key: "gpu"})
