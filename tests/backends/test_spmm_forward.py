"""The CUDA forward product (``cuda/spmm_forward.cu``, :mod:`dgl_rsc.backends.spmm_cupy`).

On any machine: the work plan covers every entry once, long rows are cut, items run longest
first, and the plan's item-by-item arithmetic (:func:`plan_reference`) equals the plain product.
``gpu``: the kernel against the float64 reference on fresh random inputs (fp32 and bf16, every
optional factor, long rows through the reduce kernel), every output element written, the same
bits on every run. nvcc builds the source in tests/backends/test_cuda_compile.py.
"""

from __future__ import annotations

import pytest
import torch

from dgl_rsc.backends import spmm_cupy as sc
from dgl_rsc.base import _deps


def power_law_csr(m, n, gen, index=torch.int64, max_deg=300):
    deg = (torch.rand(m, generator=gen).pow(-1.2)).clamp(max=max_deg).long() - 1
    deg[::7] = 0  # empty rows
    deg[1] = max_deg  # one row as long as allowed
    indptr = torch.zeros(m + 1, dtype=torch.long)
    torch.cumsum(deg, 0, out=indptr[1:])
    indices = torch.randint(0, n, (int(indptr[-1]),), generator=gen)
    return indptr.to(index), indices.to(index)


@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000])
def test_plan_covers_every_entry_once(chunk):
    gen = torch.Generator().manual_seed(chunk)
    indptr, _ = power_law_csr(200, 50, gen)
    p = sc.plan(indptr, chunk)
    deg = indptr[1:] - indptr[:-1]
    assert p.rows == 200 and int(p.len.max()) <= chunk
    assert bool((p.len.long()[:-1] >= p.len.long()[1:]).all()), "items run longest first"
    covered = torch.zeros(int(indptr[-1]), dtype=torch.long)
    for s, n in zip(p.start.tolist(), p.len.tolist()):
        covered[s : s + n] += 1
    assert bool((covered == 1).all())
    assert set(p.row[p.slot < 0].tolist()) | set(p.long_row.tolist()) == set(range(200))
    assert set(p.long_row.tolist()) == set(torch.nonzero(deg > chunk).flatten().tolist())
    assert p.slots == int((p.slot >= 0).sum()) == int(p.first_slot[-1])
    parts = p.slot >= 0
    by_slot = p.row[parts][torch.argsort(p.slot[parts])]  # each long row's slots in a block
    spans = (p.first_slot[1:] - p.first_slot[:-1]).long()
    assert torch.equal(by_slot, torch.repeat_interleave(p.long_row, spans))
    starts = p.start[parts][torch.argsort(p.slot[parts])]
    assert bool((starts[1:] > starts[:-1]).all()), "a long row's slots follow its entries"


@pytest.mark.parametrize("index", [torch.int32, torch.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("factors", ["none", "vals", "all"])
@pytest.mark.parametrize("chunk", [3, 512])
def test_plan_reference_is_the_product(index, factors, chunk):
    gen = torch.Generator().manual_seed(3)
    indptr, indices = power_law_csr(150, 90, gen, index)
    X = torch.randn(90, 24, generator=gen)
    vals = torch.rand(indices.numel(), generator=gen) if factors != "none" else None
    cf, rf, bias = (None,) * 3
    if factors == "all":
        cf, rf = torch.rand(90, generator=gen), torch.rand(150, generator=gen)
        bias = torch.randn(24, generator=gen)
    got = sc.plan_reference(sc.plan(indptr, chunk), indices, vals, X, cf, rf, bias)
    want = sc.reference(indptr, indices, vals, X, cf, rf, bias)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_plan_reference_bf16_rounds_once():
    gen = torch.Generator().manual_seed(4)
    indptr, indices = power_law_csr(60, 40, gen)
    X = torch.randn(40, 16, generator=gen).bfloat16()
    got = sc.plan_reference(sc.plan(indptr, 4), indices, None, X)
    assert got.dtype == torch.bfloat16
    want = sc.reference(indptr, indices, None, X)
    torch.testing.assert_close(got.double(), want.bfloat16().double(), rtol=1e-2, atol=1e-2)


def test_bad_input_is_refused_with_the_fix():
    indptr, indices = torch.tensor([0, 1]), torch.tensor([0])
    assert not sc.supported(torch.zeros(1, 8))  # not CUDA
    with pytest.raises(ValueError, match="torch.sparse.mm"):
        sc.spmm_forward(indptr, indices, None, torch.zeros(1, 8))
    with pytest.raises(ValueError, match="chunk"):
        sc.plan(indptr, 0)


def test_every_instantiation_is_in_the_source():
    from dgl_rsc.backends import _cuda_source

    text = _cuda_source.read_source("spmm_forward.cu")
    for expr in sc.NAME_EXPRESSIONS:
        assert expr.split("<")[0] in text


# -- GPU (deselected by default: pytest -m gpu) -------------------------------------------------
@pytest.fixture
def cuda():
    if not (torch.cuda.is_available() and _deps.cupy_available()):
        pytest.skip("needs a CUDA device and CuPy")
    return torch.device("cuda", torch.cuda.current_device())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("dim", [8, 64, 256, 520])
@pytest.mark.parametrize("index", [torch.int32, torch.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("chunk", [16, 512])
def test_kernel_matches_the_reference(cuda, dtype, dim, index, chunk):
    gen = torch.Generator().manual_seed(dim + chunk)
    indptr, indices = power_law_csr(700, 400, gen, index, max_deg=2000)
    X = torch.randn(400, dim, generator=gen).to(dtype)
    vals, cf = torch.rand(indices.numel(), generator=gen), torch.rand(400, generator=gen)
    rf, bias = torch.rand(700, generator=gen), torch.randn(dim, generator=gen)
    dev = [t.to(cuda) for t in (indptr, indices, vals, X, cf, rf, bias)]
    p = sc.plan(dev[0], chunk)
    assert p.slots > 0, "the graph has rows longer than a chunk"
    for args in ((None, None, None, None), (dev[2], dev[4], dev[5], dev[6])):
        poison = torch.full((700 * dim + 4096,), float("nan"), device=cuda, dtype=dtype)
        del poison  # the caching allocator hands this block to the output: unwritten stays NaN
        got = sc.spmm_forward(dev[0], dev[1], args[0], dev[3], *args[1:], p=p)
        again = sc.spmm_forward(dev[0], dev[1], args[0], dev[3], *args[1:], p=p)
        assert got.dtype == dtype and bool(torch.isfinite(got).all())
        assert torch.equal(got, again), "the same bits on every run"
        want = sc.reference(indptr, indices, *[None if a is None else a.cpu() for a in args[:1]],
                            X, *[None if a is None else a.cpu() for a in args[1:]])  # fmt: skip
        err = float((got.cpu().double() - want).norm() / want.norm())
        assert err < (1e-6 if dtype == torch.float32 else 8e-3), err


@pytest.mark.gpu
@pytest.mark.parametrize("divide", [False, True], ids=["scaled", "mean"])
def test_csr_mm_on_cuda_runs_the_kernel_and_equals_cusparse(cuda, divide, monkeypatch):
    """The package's CUDA products take the kernel (the plan made once per structure) and give
    cuSPARSE's result up to the order of the sums."""
    from dgl_rsc.sparse import products
    from dgl_rsc.sparse.csr import CSR

    gen = torch.Generator().manual_seed(11)
    indptr, indices = power_law_csr(500, 500, gen, max_deg=1200)
    A = CSR(indptr.to(cuda), indices.to(cuda), None, (500, 500))
    X = torch.randn(500, 64, generator=gen).to(cuda)
    row = torch.rand(500, generator=gen).to(cuda) + 0.5
    scales = products.Scales(
        row=row, col=torch.rand(500, generator=gen).to(cuda), row_divide=divide
    )
    calls = []
    real = sc.spmm_forward
    monkeypatch.setattr(sc, "spmm_forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    got = products.csr_mm(A, X, scales)
    assert calls and A._s.forward_plan() is A._s.forward_plan()
    monkeypatch.setattr(products, "CUDA_KERNEL", False)
    want = products.csr_mm(A, X, scales)
    assert len(calls) == 1
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)  # rows of up to 1200 terms
