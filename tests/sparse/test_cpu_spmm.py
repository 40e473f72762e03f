"""The CPU product engine: Numba kernels against a dense fp64 reference and against DGL, the
torch.sparse fallback, row ranges, scales, dtypes, the transposed product and empty shapes."""

import pytest
import torch

from dgl_rsc import spmm_matrix
from dgl_rsc.base import _deps
from dgl_rsc.sparse.cpu_spmm import spmm_rows
from dgl_rsc.sparse.csr import CSR
from dgl_rsc.sparse.products import Scales, csr_mm, csr_t_mm, sddmm

from ..conftest import RTOL, power_law_csr, requires_dgl

SCALES = ["none", "row", "row_divide", "col", "both"]


def dense_ref(A: CSR, X, scales: Scales):
    D = A.to_dense(torch.float64)
    if scales.col is not None:
        D = D * scales.col.double()[None, :]
    if scales.row is not None:
        r = scales.row.double()[:, None]
        D = D / r if scales.row_divide else D * r
    return D @ X.double()


def make_scales(kind, m, n, dtype):
    g = torch.Generator().manual_seed(3)
    r = torch.rand(m, generator=g, dtype=torch.float64).add(0.5).to(dtype)
    c = torch.rand(n, generator=g, dtype=torch.float64).add(0.5).to(dtype)
    return {
        "none": Scales(),
        "row": Scales(row=r),
        "row_divide": Scales(row=r, row_divide=True),
        "col": Scales(col=c),
        "both": Scales(row=r, col=c),
    }[kind]


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_products_match_dense_reference(dtype, index_dtype, weighted, scale):
    A = power_law_csr(250, 7.0, weighted=weighted, index_dtype=index_dtype, seed=4)
    X = torch.randn(250, 13, dtype=torch.float64)
    s = make_scales(scale, 250, 250, dtype)
    Y = csr_mm(A, X.to(dtype), s)
    assert Y.dtype == dtype and Y.shape == (250, 13)
    ref = dense_ref(A, X.to(dtype), s)
    assert float((Y.double() - ref).norm() / ref.norm()) < RTOL[dtype]
    # the transposed product through the cached transpose
    Yt = csr_t_mm(A, X.to(dtype), s)
    D = A.to_dense(torch.float64)
    sd = make_scales(scale, 250, 250, torch.float64)
    Dn = D * (sd.col[None, :] if sd.col is not None else 1)
    if sd.row is not None:
        Dn = Dn / sd.row[:, None] if sd.row_divide else Dn * sd.row[:, None]
    ref_t = Dn.t() @ X.to(dtype).double()
    assert float((Yt.double() - ref_t).norm() / ref_t.norm()) < RTOL[dtype]


def test_rectangular_and_row_ranges():
    A = power_law_csr(300, 5.0, seed=5)
    keep = torch.arange(0, 300, 3)  # a (300, 100) matrix: columns 0, 3, 6, ...
    sub = A.to_dense()[:, keep]
    R = CSR.from_coo(*torch.nonzero(sub, as_tuple=True), None, (300, 100))
    X = torch.randn(100, 6)
    full = csr_mm(R, X)
    torch.testing.assert_close(full, sub @ X, rtol=1e-5, atol=1e-5)
    out = torch.full((50, 6), float("nan"))
    spmm_rows(R.indptr, R.indices, None, X, out, r0=120, r1=170)
    assert torch.equal(out, full[120:170])  # every row of the range written, nothing else


def test_empty_rows_are_zero_and_empty_shapes():
    A = CSR(torch.tensor([0, 0, 2, 2]), torch.tensor([0, 2]), None, (3, 3))
    Y = csr_mm(A, torch.ones(3, 4))
    assert Y[0].eq(0).all() and Y[2].eq(0).all() and Y[1].eq(2).all()
    E = CSR(torch.zeros(4, dtype=torch.long), torch.zeros(0, dtype=torch.long), None, (3, 5))
    assert csr_mm(E, torch.ones(5, 2)).eq(0).all()
    assert csr_mm(A, torch.ones(3, 0)).shape == (3, 0)


def test_torch_sparse_fallback_agrees(monkeypatch):
    A = power_law_csr(200, 6.0, weighted=True, seed=6)
    X = torch.randn(200, 9)
    s = make_scales("both", 200, 200, torch.float32)
    fast = csr_mm(A, X, s)
    monkeypatch.setattr(_deps, "numba_available", lambda: False)
    slow = csr_mm(A, X, s)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)


def test_sddmm_accumulates_fp64_in_fp64():
    A = power_law_csr(120, 5.0, weighted=True, seed=7)
    dY = torch.randn(120, 4, dtype=torch.float64)
    X = torch.randn(120, 4, dtype=torch.float64)
    got = sddmm(A, dY, X)
    expect = (dY[A.row_ids()] * X[A.indices.long()]).sum(1)
    assert got.dtype == torch.float64
    assert float((got - expect).abs().max()) < 1e-14  # fp64, not fp32 rounding


def test_pooled_outputs_are_fresh_tensors_and_reused_safely():
    A = power_law_csr(2000, 5.0, seed=8)
    X = torch.randn(2000, 256, requires_grad=True)  # 2 MB output: pooled
    Y1 = spmm_matrix(A, X)
    Y1.relu_()  # in place on an output is allowed (not an autograd view)
    keep = Y1.detach().clone()
    Y2 = spmm_matrix(A, X)  # Y1 alive: must not share its memory
    assert Y1.data_ptr() != Y2.data_ptr()
    torch.testing.assert_close(Y1, keep)
    ptr = Y2.data_ptr()
    del Y2
    Y3 = spmm_matrix(A, X)
    assert Y3.data_ptr() == ptr  # released: the buffer is reused, no new allocation


@requires_dgl
@pytest.mark.parametrize("weighted", [False, True], ids=["copy_u", "u_mul_e"])
@pytest.mark.parametrize("dt", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_bit_identical_to_dgl_message_passing(weighted, dt):
    import dgl
    import dgl.function as fn

    from dgl_rsc.dgl.interop import csr_from_graph

    g = dgl.rand_graph(500, 6000)
    x = torch.randn(500, 33, dtype=dt)
    w = torch.rand(6000, dtype=dt) + 0.1 if weighted else None
    with g.local_scope():
        g.srcdata["h"] = x
        msg = fn.copy_u("h", "m")
        if weighted:
            g.edata["w"] = w
            msg = fn.u_mul_e("h", "w", "m")
        g.update_all(msg, fn.sum("m", "o"))
        expect = g.dstdata["o"]
    got = csr_mm(csr_from_graph(g, w), x)
    assert torch.equal(got, expect)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_coo_rows_adds_the_same_bits_as_index_add(dtype):
    """The probe's COO product: entries in any order with repeated rows and columns, added in
    entry order; equal bit for bit to the gather-and-``index_add_`` it replaced (and to what
    ``coo_mm`` returns on the CPU)."""
    from dgl_rsc.sparse.cpu_spmm import coo_rows
    from dgl_rsc.sparse.products import coo_mm

    g = torch.Generator().manual_seed(11)
    rows = torch.randint(0, 70, (5000,), generator=g)
    cols = torch.randint(0, 400, (5000,), generator=g)
    vals = torch.randn(5000, generator=g).to(dtype)
    X = torch.randn(400, 13, generator=g).to(dtype)
    want = X.new_zeros(80, 13).index_add_(0, rows, X[cols] * vals.unsqueeze(1))
    got = coo_rows(rows, cols, vals, X, X.new_zeros(80, 13))
    assert torch.equal(got, want)
    assert torch.equal(coo_mm(rows, cols, vals, 80, X), want)
    assert not got[70:].any()
