"""Products of slices that read few of the operand's rows: renumbered columns, gathered rows."""

import pytest
import torch

from dgl_rsc.backends import resolve
from dgl_rsc.dgl import kernels as dgl_kernels
from dgl_rsc.sampling.draw import cut_rows
from dgl_rsc.sparse import compact
from dgl_rsc.sparse.csr import CSR, StaleStructureError
from dgl_rsc.sparse.products import Scales, csr_mm_sum

from ..conftest import power_law_csr, requires_dgl


def _slices(n: int = 2000, seed: int = 0):
    """``A (n, n)`` weighted, and two transposed slices of it as RSC's step multiplies them:
    ``A[S]^T`` for 10% of the rows and ``A[P]^T`` for another 10%, ``(n, n)`` each."""
    A = power_law_csr(n, 10.0, weighted=True, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    label = torch.randint(0, 10, (n,), generator=gen)
    be = resolve("torch", torch.device("cpu"))
    return A, cut_rows(A, label == 0, be), cut_rows(A, label == 1, be)


def test_compacted_renumbers_the_used_columns_in_order():
    """The renumbered structure is the slice's used columns, ascending, entry for entry in
    the same order; kept with the structure, counted in the slice's bytes, and a slice whose
    indices were edited in place is refused."""
    _, S, _ = _slices()
    s, cols = compact.compacted(S._s)
    assert compact.compacted(S._s)[0] is s  # computed once
    assert torch.equal(cols, torch.unique(S.indices.long()))
    assert s.shape == (S.shape[0], cols.numel()) and cols.numel() < 0.2 * S.shape[1]
    assert torch.equal(cols[s.indices.long()], S.indices.long())
    assert torch.equal(s.indptr, S.indptr)
    Sc = CSR(s.indptr, s.indices, S.values, s.shape)
    torch.testing.assert_close(Sc.to_dense(torch.float64), S.to_dense(torch.float64)[:, cols])
    copy = s.indices.numel() * s.indices.element_size() + cols.numel() * 8
    assert S.nbytes() == CSR(S.indptr, S.indices, S.values, S.shape).nbytes() + copy > copy
    _, T, _ = _slices(seed=1)
    T.indices[0] = T.indices[1]
    with pytest.raises(StaleStructureError):
        compact.compacted(T._s)


def test_pays_only_for_a_scaled_operand_of_few_rows():
    A, S, _ = _slices()
    f = torch.rand(A.shape[0])
    assert compact.pays(S._s, f) and not compact.pays(S._s, None)
    assert not compact.pays(A.transpose()._s, f)  # reads every row
    empty = CSR(torch.zeros(5, dtype=torch.long), torch.zeros(0, dtype=torch.long), None, (4, 9))
    assert not compact.pays(empty._s, torch.ones(9))
    assert compact.compacted(A.transpose()._s) is None  # decided once, no copy made


def _step_inputs(dtype):
    A, S, P = _slices()
    gen = torch.Generator().manual_seed(7)
    n = A.shape[0]
    dY = torch.randn(n, 48, generator=gen, dtype=dtype)
    r, c = (torch.rand(n, generator=gen, dtype=dtype).add(0.5) for _ in range(2))
    w = torch.where(torch.rand(n, generator=gen) < 0.1, 0.0, 10.0).to(dtype)
    return S, P, dY, Scales(row=c, col=r), w, torch.rand(n, 1, generator=gen, dtype=dtype)


@requires_dgl
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_step_on_dgl_gives_the_bits_of_the_whole_operand_scaled(dtype):
    """A step's two products with gathered rows give, bit for bit, what scaling the whole of
    ``dY`` per product gave before (the same kernel on the same entries in the same order)."""
    S, P, dY, sc, w, add = _step_inputs(dtype)
    got = csr_mm_sum([S, P], dY, sc, col_weight=[None, w], row_add=add).clone()
    assert S._s._compact is not None and S._s._compact[0] is not None  # the gathered path ran
    want = torch.zeros(S.shape[0], dY.shape[1], dtype=dtype)
    for M, f in ((S, sc.col), (P, sc.col * w)):
        dgl_kernels.spmm_add(M._s, M.values.to(dtype), dY * f.unsqueeze(1), want)
    want = torch.addcmul(add, want, sc.row.unsqueeze(1))
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_step_on_torch_sparse_matches_the_whole_operand_scaled(monkeypatch, dtype):
    """The engine without DGL (torch.sparse on the CPU): gathered rows against the whole
    operand scaled (the gather turned off), and against dense algebra."""
    S, P, dY, sc, w, add = _step_inputs(dtype)
    monkeypatch.setattr(dgl_kernels, "usable", lambda X: False)
    monkeypatch.setattr("dgl_rsc.sparse.products._folds", lambda nnz, X: False)
    got = csr_mm_sum([S, P], dY, sc, col_weight=[None, w], row_add=add).clone()
    assert P._s._compact is not None and P._s._compact[0] is not None
    monkeypatch.setattr(compact, "pays", lambda structure, factor: False)
    S2, P2 = (CSR(M.indptr, M.indices, M.values, M.shape) for M in (S, P))
    whole = csr_mm_sum([S2, P2], dY, sc, col_weight=[None, w], row_add=add)
    assert P2._s._compact is None  # never decided: no copy made
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got, whole, rtol=tol, atol=tol)
    dense = S.to_dense(torch.float64) * sc.col.double() + \
        P.to_dense(torch.float64) * (sc.col * w).double()  # fmt: skip
    want = sc.row.double().unsqueeze(1) * (dense @ dY.double()) + add.double()
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
