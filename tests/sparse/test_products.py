"""The product dispatch: scales, their transpose, and the SDDMM over several chunks."""

import pytest
import torch

from dgl_rsc.sparse.csr import CSR
from dgl_rsc.sparse.products import Scales, coo_mm, csr_mm, csr_mm_sum, csr_t_mm, sddmm

from ..conftest import DEVICES, RTOL, power_law_csr, requires_dgl


def test_scales_transpose_and_row_factor():
    r, c = torch.tensor([2.0, 4.0]), torch.tensor([3.0, 5.0, 7.0])
    s = Scales(row=r, col=c, row_divide=True)
    torch.testing.assert_close(s.row_factor(), 1 / r)
    t = s.transposed()
    assert t.row is c and not t.row_divide
    torch.testing.assert_close(t.col, 1 / r)
    assert Scales(hint_col=c).score_col() is c and Scales(col=r, hint_col=c).score_col() is r
    assert Scales().is_identity and not s.is_identity


def test_sddmm_over_several_chunks_with_scales():
    A = power_law_csr(150, 6.0, weighted=True, seed=4)
    dY, X = torch.randn(150, 5), torch.randn(150, 5)
    r, c = torch.rand(150) + 0.5, torch.rand(150) + 0.5
    sc = Scales(row=r, col=c)
    got = sddmm(A, dY, X, sc, chunk=97)  # several chunks, the last one partial
    rows, cols = A.row_ids(), A.indices.long()
    expect = (dY[rows] * X[cols]).sum(1) * r[rows] * c[cols]
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-6)


def test_transposed_product_is_the_transpose_of_the_scaled_matrix():
    A = power_law_csr(120, 5.0, weighted=True, seed=5)
    Y = torch.randn(120, 3, dtype=torch.float64)
    r, c = torch.rand(120, dtype=torch.float64) + 0.5, torch.rand(120, dtype=torch.float64) + 0.5
    sc = Scales(row=r, col=c, row_divide=True)
    D = A.to_dense(torch.float64) / r[:, None] * c[None, :]
    torch.testing.assert_close(csr_mm(A, Y, sc), D @ Y)
    torch.testing.assert_close(csr_t_mm(A, Y, sc), D.t() @ Y)


@requires_dgl
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dgl_kernel_and_numba_kernel_agree_bit_for_bit(monkeypatch, dtype):
    """Where DGL imports the exact CPU products run on its kernel; without it, on the Numba
    kernels. Both give the same bits for every combination of values and scales (and the
    Numba engine is what the DGL-free machine runs)."""
    from dgl_rsc.dgl import kernels as dgl_kernels
    from dgl_rsc.sparse import products

    A = power_law_csr(3000, 15.0, seed=6)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(3000, 96, generator=g, dtype=dtype)
    w = torch.rand(A.nnz, generator=g, dtype=dtype) + 0.1
    r = torch.rand(3000, generator=g, dtype=dtype) + 0.5
    c = torch.rand(3000, generator=g, dtype=dtype) + 0.5
    W = A.with_values(w)
    cases = [(A, Scales()), (W, Scales()), (A, Scales(row=r, col=c)),
             (W, Scales(row=r, col=c)), (A, Scales(row=r, row_divide=True))]  # fmt: skip
    assert products.cpu_engine() == "dgl"
    with_dgl = [(csr_mm(M, X, sc).clone(), csr_t_mm(M, X, sc).clone()) for M, sc in cases]
    monkeypatch.setattr(dgl_kernels, "usable", lambda X: False)
    for (M, sc), (fwd, bwd) in zip(cases, with_dgl):
        assert torch.equal(csr_mm(M, X, sc), fwd)
        assert torch.equal(csr_t_mm(M, X, sc), bwd)


def _split(A: CSR, parts: int, seed: int) -> list:
    """``A`` as ``parts`` CSRs of its shape, each holding a random share of its rows."""
    label = torch.randint(0, parts, (A.shape[0],), generator=torch.Generator().manual_seed(seed))
    out = []
    for p in range(parts):
        keep = (label == p).to(A.device)
        counts = torch.where(keep, A.row_nnz(), torch.zeros_like(A.row_nnz()))
        indptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(A.indptr.dtype)
        entry = keep.repeat_interleave(A.row_nnz())
        vals = None if A.values is None else A.values[entry]
        out.append(CSR(indptr, A.indices[entry], vals, A.shape))
    return out


def _split_entries(A: CSR, seed: int) -> list:
    """``A`` as two CSRs of its shape, each holding a random half of every row's entries (the
    rows shared between them, as a sample's and a remainder group's are)."""
    side = torch.rand(A.nnz, generator=torch.Generator().manual_seed(seed)) < 0.5
    parts = []
    for keep in (side, ~side):
        counts = torch.zeros(A.shape[0], dtype=torch.long).index_add_(
            0, A.row_ids()[keep], torch.ones(int(keep.sum()), dtype=torch.long)
        )
        indptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(A.indptr.dtype)
        parts.append(CSR(indptr, A.indices[keep], A.values[keep], A.shape))
    return parts


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16],
                         ids=["fp32", "fp64", "bf16"])  # fmt: skip
@pytest.mark.parametrize("scaled", ["none", "both", "divide"])
def test_csr_mm_sum_is_the_product_of_the_sum(device, dtype, scaled):
    """``diag(r) (A_1 + A_2 + A_3) diag(c w) X + row_add`` against dense algebra in fp64,
    with a matrix of no entries among the parts; a NaN in ``row_add`` poisons its row."""
    A = power_law_csr(400, 6.0, weighted=True, seed=2, device=device)
    mats = _split(A, 3, seed=1)
    mats.append(CSR(torch.zeros(401, dtype=A.indptr.dtype, device=device),
                    A.indices[:0], A.values[:0], A.shape))  # fmt: skip
    gen = torch.Generator().manual_seed(3)
    X = torch.randn(400, 7, generator=gen).to(device, dtype)
    r, c, w = (torch.rand(400, generator=gen).add(0.5).to(device) for _ in range(3))
    sc = {"none": Scales(), "both": Scales(r, c), "divide": Scales(r, c, row_divide=True)}[scaled]
    add = torch.zeros(400, 1, device=device)
    add[5] = float("nan")
    got = csr_mm_sum(mats, X, sc, col_weight=w, row_add=add)
    assert got.dtype == dtype and got.shape == (400, 7) and got.device == X.device
    r, c, w = r.double(), c.double(), w.double()
    rf = {"none": torch.ones_like(r), "both": r, "divide": 1 / r}[scaled]
    cf = w if sc.col is None else c * w
    want = (rf.unsqueeze(1) * A.to_dense(torch.float64) * cf) @ X.double()
    assert bool(torch.isnan(got[5]).all()) and bool(
        torch.isfinite(got[torch.arange(400) != 5]).all()
    )
    want[5] = got[5].double()
    # bf16 (rounded at each step on CUDA) against the norm, as RTOL; others element-wise
    finite = torch.arange(400, device=device) != 5
    err = (got.double() - want)[finite].norm() / want[finite].norm()
    assert float(err) < RTOL[dtype], float(err)
    if dtype != torch.bfloat16:
        torch.testing.assert_close(got.double(), want, rtol=RTOL[dtype], atol=RTOL[dtype],
                                   equal_nan=True)  # fmt: skip
    tol = RTOL[dtype]
    plain = csr_mm_sum(mats[:1], X, sc)  # one matrix, no weight, nothing added
    torch.testing.assert_close(plain.double(), csr_mm(mats[0], X, sc).double(), rtol=tol,
                               atol=tol)  # fmt: skip
    with pytest.raises(ValueError, match="no INT8 operands"):
        csr_mm_sum(mats, X, Scales(quant=object()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_csr_mm_sum_weights_each_matrix_on_its_own(device, dtype):
    """A list of weights: ``diag(r) (A_1 diag(c w_1) + A_2 diag(c) + A_3 diag(c w_3)) X`` (a
    ``None`` weight: the column scale alone), as the remainder step weights the sample's and
    the group's products; a weight per matrix or the call is refused."""
    A = power_law_csr(400, 6.0, weighted=True, seed=2, device=device)
    mats = _split(A, 3, seed=1)
    gen = torch.Generator().manual_seed(3)
    X = torch.randn(400, 7, generator=gen).to(device, dtype)
    r, c, w1, w3 = (torch.rand(400, generator=gen).add(0.5).to(device) for _ in range(4))
    w3[::3] = 0.0  # rows another part takes: read as zeros here
    got = csr_mm_sum(mats, X, Scales(r, c), col_weight=[w1, None, w3])
    want = sum((M.to_dense(torch.float64) * (c.double() * w.double())) @ X.double()
               for M, w in zip(mats, (w1, torch.ones_like(c), w3)))  # fmt: skip
    want = r.double().unsqueeze(1) * want
    tol = RTOL[dtype]
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="2 weights for 3 matrices"):
        csr_mm_sum(mats, X, Scales(r, c), col_weight=[w1, w3])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_coo_mm_sums_duplicates_in_any_order(device, dtype):
    gen = torch.Generator().manual_seed(6)
    rows = torch.randint(0, 40, (500,), generator=gen)
    cols = torch.randint(0, 300, (500,), generator=gen)
    vals = torch.randn(500, generator=gen)
    X = torch.randn(300, 9, generator=gen, dtype=torch.float64)
    dense = torch.zeros(50, 300, dtype=torch.float64)
    dense.index_put_((rows, cols), vals.double(), accumulate=True)  # rows 40-49 stay empty
    got = coo_mm(rows.to(device), cols.to(device), vals.to(device), 50, X.to(device, dtype))
    assert got.dtype == dtype and got.shape == (50, 9) and got.device == torch.device(device)
    tol = RTOL[dtype]
    torch.testing.assert_close(got.double().cpu(), dense @ X, rtol=tol, atol=tol)
    assert not got[40:].any()


@requires_dgl
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_csr_mm_sum_on_dgl_adds_into_a_pooled_buffer_from_zero(dtype):
    """On the CPU with DGL the parts' products add into one buffer of the pool: with every
    row's entries split between the parts (as a sample's and a group's are), the sum matches
    the whole matrix's product to rounding, and a second call (the buffer holding the first's
    result) gives the same numbers, not their double. fp32 runs DGL's libxsmm kernel where
    the CPU has it, fp64 its plain one: both must add into the output."""
    A = power_law_csr(500, 8.0, weighted=True, seed=3)
    A = CSR(A.indptr, A.indices, A.values.to(dtype), A.shape)
    parts = _split_entries(A, seed=4)
    assert int(((parts[0].row_nnz() > 0) & (parts[1].row_nnz() > 0)).sum()) > 100  # shared rows
    X = torch.randn(500, 16, generator=torch.Generator().manual_seed(5)).to(dtype)
    pool = A.pool()
    first = csr_mm_sum(parts, X, pool=pool).clone()
    again = csr_mm_sum(parts, X, pool=pool)
    assert torch.equal(first, again)
    torch.testing.assert_close(again, csr_mm(A, X), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_csr_mm_sum_without_dgl_adds_on_the_numba_kernels(monkeypatch, dtype):
    """Without DGL's engine (the DGL-free machine of PyG users) the parts' products add into
    one pooled buffer on the Numba kernels, never through torch.sparse: the product of the
    sum, the same numbers on a second call (not their double), and where DGL imports the
    same bits as its kernel."""
    from dgl_rsc.base import _deps
    from dgl_rsc.sparse import products

    A = power_law_csr(500, 8.0, weighted=True, seed=3)
    A = CSR(A.indptr, A.indices, A.values.to(dtype), A.shape)
    parts = _split_entries(A, seed=4)  # every row shared, as a sample's and a group's
    gen = torch.Generator().manual_seed(5)
    X = torch.randn(500, 33, generator=gen).to(dtype)
    r, c, w = (torch.rand(500, generator=gen).add(0.5).to(dtype) for _ in range(3))
    sc = Scales(r, c)
    dgl = products.cpu_engine() == "dgl"
    with_dgl = csr_mm_sum(parts, X, sc, col_weight=[None, w]).clone() if dgl else None
    monkeypatch.setattr(products, "ENGINES", {**products.ENGINES, "exact_cpu": None})

    def no_torch_sparse(*args):
        raise AssertionError("csr_mm_sum went through torch.sparse")

    monkeypatch.setattr(products, "_torch_csr", no_torch_sparse)
    assert _deps.numba_available() and products.cpu_engine() == "numba"
    pool = A.pool()
    first = csr_mm_sum(parts, X, sc, col_weight=[None, w], pool=pool).clone()
    again = csr_mm_sum(parts, X, sc, col_weight=[None, w], pool=pool)
    assert torch.equal(first, again)
    d = [m.to_dense(torch.float64) for m in parts]
    want = r.double()[:, None] * (d[0] * c.double() + d[1] * (c * w).double()) @ X.double()
    torch.testing.assert_close(again.double(), want, rtol=RTOL[dtype], atol=RTOL[dtype])
    if dgl:
        assert torch.equal(again, with_dgl)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("width", [20, 1], ids=["values", "operand"])
@pytest.mark.parametrize("weighted", [False, True], ids=["ones", "weighted"])
def test_torch_sparse_engine_folds_the_column_factor_where_cheaper(monkeypatch, device,
                                                                   width, weighted):  # fmt: skip
    """On the torch.sparse engine (CUDA; the CPU without DGL or Numba) a column factor goes
    into the matrix's values where that costs less than scaling ``X`` (a gather per entry
    against three elements of ``X``: 20 columns here) and onto ``X`` otherwise (1 column):
    both give ``diag(r) A diag(c w) X``, and a NaN row of ``X`` under a zero weight still
    poisons exactly the rows that reach it."""
    from dgl_rsc.base import _deps
    from dgl_rsc.dgl import kernels as dgl_kernels
    from dgl_rsc.sparse import products

    monkeypatch.setattr(dgl_kernels, "usable", lambda X: False)
    monkeypatch.setattr(_deps, "numba_available", lambda: False)
    index = torch.int64 if weighted else torch.int32  # both index widths gather
    A = power_law_csr(300, 5.0, weighted=weighted, seed=7, device=device, index_dtype=index)
    mats = _split(A, 2, seed=2)
    gen = torch.Generator().manual_seed(8)
    X = torch.randn(300, width, generator=gen, dtype=torch.float64).to(device)
    r, c, w = (torch.rand(300, generator=gen, dtype=torch.float64).add(0.5).to(device)
               for _ in range(3))  # fmt: skip
    assert products._folds(A.nnz, X) == (width == 20)
    assert products._folds(mats[1].nnz, X) == (width == 20)
    dense = A.to_dense(torch.float64)
    sc = Scales(r, c)
    torch.testing.assert_close(csr_mm(A, X, sc), r[:, None] * dense * c @ X)
    torch.testing.assert_close(csr_t_mm(A, X, sc), (r[:, None] * dense * c).T @ X)
    got = csr_mm_sum(mats, X, sc, col_weight=[None, w])
    want = r[:, None] * (mats[0].to_dense(torch.float64) * c @ X
                         + mats[1].to_dense(torch.float64) * (c * w) @ X)  # fmt: skip
    torch.testing.assert_close(got, want)
    w[11], X[11] = 0.0, float("nan")  # a zero weight does not hide a non-finite row
    got = csr_mm_sum(mats, X, sc, col_weight=[None, w])
    reach = A.to_dense(torch.float64)[:, 11] != 0
    assert bool(reach.any()) and bool(torch.isnan(got[reach]).all())
    assert bool(torch.isfinite(got[~reach]).all())
