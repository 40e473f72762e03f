"""INT8 training (``dgl_rsc.int8``): quantization rules, bit-exact integer products across the
reference and the kernels, error bounds against fp32, stochastic rounding's unbiasedness, RSC's
sampled backward on INT8 operands, the model API and the launcher's ``train.precision``."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

from dgl_rsc.backends import int8_ref as ref
from dgl_rsc.backends import resolve_int8
from dgl_rsc.base import _deps
from dgl_rsc.core.spmm import spmm_matrix
from dgl_rsc.int8 import (
    Int8Spec,
    Int8State,
    dequantize_model,
    int8_csr_mm,
    int8_layers,
    int8_matmul,
    int_mm,
    quantize,
    quantize_model,
)
from dgl_rsc.int8.gemm import F32_EXACT_K, MAX_K, int_mm_any_k
from dgl_rsc.int8.quantize import torch_codes
from dgl_rsc.models import build_model
from dgl_rsc.nn import attach
from dgl_rsc.quant.rounding import hash_uniform, lowbias32
from dgl_rsc.sparse.csr import CSR
from dgl_rsc.sparse.graph import Graph

from ..proc import run as run_cmd

ROOT = Path(__file__).resolve().parents[2]
ROUNDINGS = [pytest.param("nearest", id="nearest"), pytest.param("stochastic", id="stochastic")]
needs_numba = pytest.mark.skipif(not _deps.numba_available(), reason="numba is not installed")


def random_csr(m, n, density, gen, values=False, index=torch.int64):
    dense = (torch.rand(m, n, generator=gen) < density).float()
    if values:
        dense = dense * torch.randn(m, n, generator=gen)
    rows, cols = torch.nonzero(dense, as_tuple=True)  # row-major order
    indptr = torch.zeros(m + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(rows, minlength=m), 0, out=indptr[1:])
    vals = dense[rows, cols] if values else None
    return CSR(indptr.to(index), cols.to(index), vals, (m, n))


def dense_of(A: CSR) -> torch.Tensor:
    out = torch.zeros(A.shape)
    rows = torch.repeat_interleave(torch.arange(A.shape[0]), A.row_nnz().long())
    vals = torch.ones(A.nnz) if A.values is None else A.values.float()
    out[rows, A.indices.long()] = vals
    return out


def rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


# -- hashing and quantization -------------------------------------------------------------------
def _lowbias32_plain(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_hash_is_the_32bit_lowbias32():
    gen = torch.Generator().manual_seed(0)
    xs = torch.randint(0, 2**32, (2000,), dtype=torch.int64, generator=gen)
    xs[:3] = torch.tensor([0, 1, 2**32 - 1])
    got = lowbias32(xs)
    assert got.tolist() == [_lowbias32_plain(int(x)) for x in xs]
    u = hash_uniform(7, 100_000)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.005  # 100k uniforms: std of the mean 0.0009
    assert not torch.equal(u, hash_uniform(8, 100_000))


@pytest.mark.parametrize("dim", [0, 1, None], ids=["col", "row", "tensor"])
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_quantize_error_bound(dim, rounding):
    x = torch.randn(64, 48, generator=torch.Generator().manual_seed(1)) * 3
    x[5] = 0.0
    q, s = quantize(x, dim, rounding, seed=3)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= 127
    err = (q.float() * s - x).abs()
    bound = s.expand_as(x) * (0.5 if rounding == "nearest" else 1.0)
    assert bool((err <= bound * (1 + 1e-6)).all())
    if dim == 1:
        assert float(s[5]) == 0.0 and int(q[5].abs().max()) == 0


def test_quantize_nonfinite_gives_nonfinite_scale():
    x = torch.ones(4, 3)
    x[1, 2] = float("nan")
    q, s = quantize(x, 0, "nearest")
    assert torch.isnan(s[0, 2]) and bool(torch.isfinite(s[0, :2]).all())
    assert int(q.abs().max()) <= 127


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_stochastic_rounding_is_unbiased_nearest_is_not(rounding):
    """Entries at 0.3 of a quantization step: nearest always rounds them down (bias -0.3
    steps); stochastic rounding's mean over 400 seeds is within 5 standard errors of x."""
    s_step = 1.0 / 127
    x = torch.full((1, 2000), 0.3 * s_step)
    x[0, 0] = 1.0  # fixes the scale at about 1/127
    runs = torch.stack([(lambda q, s: q.float() * s)(*quantize(x, None, rounding, seed))
                        for seed in range(400)])  # fmt: skip
    mean_err = (runs.mean(0) - x)[0, 1:] / s_step  # in steps
    if rounding == "nearest":
        assert float(mean_err.mean()) < -0.25
    else:
        # per entry: Bernoulli(0.3) steps, std sqrt(0.21 / 400); pooled over 1999 entries
        se = (0.21 / 400 / 1999) ** 0.5
        assert abs(float(mean_err.mean())) < 5 * se
        assert float(mean_err.abs().max()) < 5 * (0.21 / 400) ** 0.5


@needs_numba
@pytest.mark.parametrize("dim", [0, 1, None], ids=["col", "row", "tensor"])
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_codes_numba_cpu_bit_exact(dim, rounding):
    x = torch.randn(130, 33, generator=torch.Generator().manual_seed(2)) * 5
    x[3, 4] = float("nan")
    x[:, 7] = 0.0
    x[9, :] = torch.arange(33) / 2.0  # exact halves: round half to even
    cpu = resolve_int8("numba-cpu", "cpu")
    q0, _ = quantize(x, dim, rounding, seed=11, codes=torch_codes)
    q1, _ = quantize(x, dim, rounding, seed=11, codes=cpu.quantize_codes)
    assert torch.equal(q0, q1)


@needs_numba
@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("scaled", [True, False], ids=["col", "nocol"])
def test_quantize_columns_fused_equals_scaled_copy(rounding, scaled):
    """The CPU kernels' fused ``quantize_columns`` (no scaled copy) gives the codes and scales
    of quantizing ``x * col[:, None]`` per column, bit for bit (NaN, a zero column, Inf)."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(3000, 37, generator=gen) * 3
    x[5, 2], x[:, 7], x[9, 9] = float("nan"), 0.0, float("inf")
    col = torch.rand(3000, generator=gen) + 0.1 if scaled else None
    want_q, want_s = quantize(x if col is None else x * col.reshape(-1, 1), 0, rounding, seed=21)
    got_q, got_s = resolve_int8("numba-cpu", "cpu").quantize_columns(x, col, rounding, 21)
    assert torch.equal(got_q, want_q)
    assert torch.equal(got_s.isnan(), want_s.isnan())
    assert torch.equal(got_s.nan_to_num(), want_s.nan_to_num()) and got_s.shape == (1, 37)


# -- dense products -----------------------------------------------------------------------------
def test_int_mm_engines_bit_exact_and_limit():
    gen = torch.Generator().manual_seed(3)
    a = torch.randint(-127, 128, (40, 3000), dtype=torch.int8, generator=gen)
    b = torch.randint(-127, 128, (3000, 24), dtype=torch.int8, generator=gen)
    a[0], b[:, 0] = 127, 127  # the largest sum: 3000 * 127^2 (needs more than fp32's 24 bits)
    want = int_mm(a, b, "int64")
    got = int_mm(a, b, "float64")
    assert got.dtype == torch.int32 and torch.equal(got, want)
    for k in (F32_EXACT_K - 1, F32_EXACT_K, F32_EXACT_K + 1, 3000):  # fp32 over exact slices
        sliced = int_mm(a[:, :k].contiguous(), b[:k], "float32")
        assert sliced.dtype == torch.int32
        assert torch.equal(sliced, int_mm(a[:, :k].contiguous(), b[:k], "int64"))
    assert int(int_mm(a, b, "float32")[0, 0]) == 3000 * 127 * 127
    assert torch.equal(int_mm(a, b), want)  # the default engine of this torch
    if _deps.int_mm_on_cpu():  # torch >= 2.3-ish: the native kernel, padded to its shapes
        assert torch.equal(int_mm(a[:5, :3000], b[:, :3], "int_mm"), want[:5, :3])
        assert torch.equal(int_mm(a, b, "int_mm"), want)
    assert int(got[0, 0]) == 3000 * 127 * 127
    with pytest.raises(ValueError, match="MAX_K"):
        int_mm(torch.zeros(1, MAX_K + 1, dtype=torch.int8),
               torch.zeros(MAX_K + 1, 1, dtype=torch.int8))  # fmt: skip
    with pytest.raises(TypeError, match="int8"):
        int_mm(a.float(), b)


def test_int_mm_any_k_splits_a_contraction_past_max_k():
    """A weight gradient contracts over every node: past MAX_K the int32 products of slices
    are summed in int64, exactly (the largest sum here overflows int32)."""
    k = MAX_K + MAX_K // 2
    a = torch.full((2, k), 127, dtype=torch.int8)
    b = torch.full((k, 3), 127, dtype=torch.int8)
    a[1, ::3], b[::5, 2] = -127, -3
    got = int_mm_any_k(a, b)
    want = (a.double() @ b.double()).long()
    assert got.dtype == torch.int64 and torch.equal(got, want)
    assert int(got[0, 0]) == k * 127 * 127 > 2**31
    small = int_mm_any_k(a[:, :100], b[:100])
    assert small.dtype == torch.int32 and torch.equal(small.long(), want.new_tensor(
        a[:, :100].long() @ b[:100].long()))  # fmt: skip


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_int8_matmul_forward_and_gradients_close_to_fp32(rounding):
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(200, 64, generator=gen, requires_grad=True)
    w = torch.randn(64, 16, generator=gen, requires_grad=True)
    g = torch.randn(200, 16, generator=gen)
    state = Int8State(Int8Spec(rounding=rounding, backend="torch", dense="int8"))
    y = int8_matmul(x, w, state)
    (y * g).sum().backward()
    dx, dw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    y32 = x @ w
    (y32 * g).sum().backward()
    # two 8-bit operands: relative error about 2 * (1/127) / sqrt(3) per product, below 3%
    assert rel(y.detach(), y32.detach()) < 0.03
    assert rel(dx, x.grad) < 0.03 and rel(dw, w.grad) < 0.03
    assert rel(y.detach(), y32.detach()) > 0  # it did run in INT8
    if rounding == "stochastic":
        # forward x and w; dx: g (w's codes again); dw: the forward's codes of x (kept for
        # the backward) times s * g
        assert state.calls == 4


# -- sparse products ----------------------------------------------------------------------------
@needs_numba
@pytest.mark.parametrize("index", [torch.int32, torch.int64], ids=["i32", "i64"])
@pytest.mark.parametrize("values", [False, True], ids=["binary", "valued"])
def test_int8_spmm_kernels_bit_exact(index, values):
    gen = torch.Generator().manual_seed(5)
    A = random_csr(70, 50, 0.2, gen, values=values, index=index)
    qx = torch.randint(-127, 128, (50, 20), dtype=torch.int8, generator=gen)
    qx[:, 0] = 127
    qv = None
    if values:
        qv = torch.randint(-127, 128, (A.nnz,), dtype=torch.int8, generator=gen)
    cs, rf = torch.rand(20, generator=gen), torch.rand(70, generator=gen)
    cpu = resolve_int8("numba-cpu", "cpu")
    want = ref.int8_spmm_acc(A.indptr, A.indices, qv, qx)
    dense = dense_of(A.with_values(None)).long()
    expect = dense @ qx.long() if qv is None else None
    if expect is not None:
        assert torch.equal(want.long(), expect)
    assert torch.equal(cpu.int8_spmm_acc(A.indptr, A.indices, qv, qx), want)
    for row in (None, rf):
        assert torch.equal(cpu.int8_spmm(A.indptr, A.indices, qv, qx, row, cs),
                           ref.int8_spmm(A.indptr, A.indices, qv, qx, row, cs))  # fmt: skip


@needs_numba
@pytest.mark.parametrize("values", [False, True], ids=["binary", "valued"])
def test_int8_spmm_cpu_long_rows_at_the_code_limits(values):
    """Rows longer than the kernel's int16 span (and around it), every term at +-127: the
    span sums must not overflow, so the integers equal the int32 reference's."""
    from dgl_rsc.backends.int8_cpu import INT16_SPAN

    gen = torch.Generator().manual_seed(9)
    lengths = [0, 1, 3, INT16_SPAN - 1, INT16_SPAN, INT16_SPAN + 1, 2 * INT16_SPAN + 3, 1500]
    indptr = torch.tensor([0] + lengths).cumsum(0)
    indices = torch.randint(0, 40, (int(indptr[-1]),), generator=gen)
    qx = torch.randint(-127, 128, (40, 33), dtype=torch.int8, generator=gen)
    qx[:, 0], qx[:, 1] = 127, -127
    qv = torch.full((indices.numel(),), -127, dtype=torch.int8) if values else None
    want = ref.int8_spmm_acc(indptr, indices, qv, qx)
    got = resolve_int8("numba-cpu", "cpu").int8_spmm_acc(indptr, indices, qv, qx)
    assert torch.equal(got, want)
    sign = -127 if values else 1
    assert got[-1, 0].item() == sign * 127 * 1500 and got[-1, 1].item() == -sign * 127 * 1500


@pytest.mark.parametrize("backend", ["torch", pytest.param("numba-cpu", marks=needs_numba)])
@pytest.mark.parametrize("values", [False, True], ids=["binary", "valued"])
def test_int8_csr_mm_close_to_fp32(backend, values):
    gen = torch.Generator().manual_seed(6)
    A = random_csr(300, 200, 0.05, gen, values=values)
    X = torch.randn(200, 32, generator=gen)
    r, c = torch.rand(300, generator=gen) + 0.5, torch.rand(200, generator=gen) + 0.5
    state = Int8State(Int8Spec(rounding="nearest", backend=backend))
    got = int8_csr_mm(A, X, r, c, state)
    want = r[:, None] * (dense_of(A) @ (c[:, None] * X))
    assert rel(got, want) < 0.02


def test_int8_csr_mm_refuses_an_overflowing_row():
    n = 2**31 // (127 * 127) + 1  # a row this long could overflow with int8 values
    A = CSR(torch.tensor([0, n]), torch.zeros(n, dtype=torch.int64), torch.ones(n), (1, 1))
    state = Int8State(Int8Spec(rounding="nearest", backend="torch"))
    with pytest.raises(ValueError, match="int32 accumulator"):
        int8_csr_mm(A, torch.ones(1, 2), None, None, state)


@pytest.mark.cudasim
def test_int8_numba_cuda_kernels_under_simulator():
    if importlib.util.find_spec("numba") is None:
        pytest.skip("numba is not installed")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": str(ROOT)}
    script = str(ROOT / "tests" / "int8_cudasim_check.py")
    proc = run_cmd([sys.executable, script], env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, f"checker failed:\n{proc.stdout}\n{proc.stderr}"
    assert "match the torch reference" in proc.stdout


# -- autograd and RSC ---------------------------------------------------------------------------
def _backward(A, X, rsc, quant, scales):
    X = X.clone().requires_grad_(True)
    Y = spmm_matrix(A, X, rsc, quant=quant, **scales)
    g = torch.randn(Y.shape, generator=torch.Generator().manual_seed(9))
    (Y * g).sum().backward()
    return Y.detach(), X.grad


@pytest.mark.parametrize("budget", [None, 0.4], ids=["exact", "rsc"])
def test_spmm_int8_forward_and_backward_exact_and_sampled(budget):
    gen = torch.Generator().manual_seed(7)
    A = random_csr(400, 400, 0.03, gen)
    X = torch.randn(400, 24, generator=gen)
    deg = A.row_nnz().float().clamp(min=1)
    scales = dict(row_scale=deg.rsqrt(), col_scale=deg.rsqrt())
    state = Int8State(Int8Spec(rounding="stochastic", backend="torch", sparse="int8"))
    y8, dx8 = _backward(A, X, budget, state, scales)
    y32, dx32 = _backward(A, X, budget, None, scales)
    assert rel(y8, y32) < 0.02
    # the backward ran on INT8 operands (X quantized forward, dY backward)...
    assert state.calls == 2
    # ...and is close to the fp32 product of the same rows (RSC: the same top rows)
    assert rel(dx8, dx32) < 0.03
    if budget is not None:
        _, exact = _backward(A, X, None, None, scales)
        assert rel(dx32, exact) > 0.01  # the sampled product differs from the exact one


# -- the model API and training -----------------------------------------------------------------
def planted_graph(n=600, classes=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    label = torch.randint(0, classes, (n,), generator=gen)
    src = torch.randint(0, n, (8 * n,), generator=gen)
    dst = torch.randint(0, n, (8 * n,), generator=gen)
    keep = (label[src] == label[dst]) | (torch.rand(8 * n, generator=gen) < 0.1)
    src, dst = src[keep], dst[keep]
    loops = torch.arange(n)
    g = Graph(torch.cat([src, dst, loops]), torch.cat([dst, src, loops]), n)
    feat = torch.nn.functional.one_hot(label, classes).float() + 1.5 * torch.randn(
        n, classes, generator=gen
    )
    feat = torch.cat([feat, torch.randn(n, 13, generator=gen)], 1)
    return g, feat, label


def test_quantize_model_layers_and_errors():
    model = build_model("gcn", in_feats=4, num_classes=3, hidden=8, layers=3)
    assert quantize_model(model, "nearest") == ["convs.0", "convs.1"]
    assert int8_layers(model) == ["convs.0", "convs.1"]
    assert quantize_model(model, keep_last=False) == ["convs.0", "convs.1", "convs.2"]
    dequantize_model(model)
    assert int8_layers(model) == []
    with pytest.raises(ValueError, match="no dgl_rsc convolution"):
        quantize_model(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="rounding"):
        quantize_model(model, "upward")


@pytest.mark.heavy
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_int8_training_with_rsc_converges(rounding):
    g, feat, label = planted_graph()
    torch.manual_seed(0)
    model = build_model("gcn", in_feats=feat.shape[1], num_classes=3, hidden=32, layers=3,
                        dropout=0.0)  # fmt: skip
    quantize_model(model, rounding, seed=1, keep_last=False)
    ctl = attach(model, budget=0.3, total_steps=60, cache_interval=5, tune_interval=5)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    losses = []
    for _ in range(60):
        loss = torch.nn.functional.cross_entropy(model(g, feat), label)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctl.step()
        losses.append(float(loss))
    model.eval()
    with torch.no_grad():
        acc = float((model(g, feat).argmax(1) == label).float().mean())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.5 * losses[0]
    assert acc > 0.9


# -- GPU (deselected by default: pytest -m gpu) -------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cupy", "numba", "torch"])
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_gpu_kernels_match_the_cpu_reference(backend, rounding):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    dev = torch.device("cuda", torch.cuda.current_device())
    kernels = resolve_int8(backend, dev)
    gen = torch.Generator().manual_seed(8)
    A = random_csr(500, 300, 0.05, gen, values=True, index=torch.int32)
    qx = torch.randint(-127, 128, (300, 70), dtype=torch.int8, generator=gen)
    qv = torch.randint(-127, 128, (A.nnz,), dtype=torch.int8, generator=gen)
    cs, rf = torch.rand(70, generator=gen), torch.rand(500, generator=gen)
    for vals in (None, qv):
        want = ref.int8_spmm(A.indptr, A.indices, vals, qx, rf, cs)
        got = kernels.int8_spmm(A.indptr.to(dev), A.indices.to(dev),
                                None if vals is None else vals.to(dev), qx.to(dev), rf.to(dev),
                                cs.to(dev))  # fmt: skip
        assert torch.equal(got.cpu(), want)
    x = torch.randn(257, 33, generator=gen) * 3
    for dim in (0, 1, None):
        q0, _ = quantize(x, dim, rounding, 5)
        q1, _ = quantize(x.to(dev), dim, rounding, 5, codes=kernels.quantize_codes)
        assert torch.equal(q1.cpu(), q0)
    a = torch.randint(-127, 128, (37, 300), dtype=torch.int8, generator=gen)
    assert torch.equal(int_mm(a.to(dev), qx.to(dev)).cpu(), int_mm(a, qx, "int64"))
