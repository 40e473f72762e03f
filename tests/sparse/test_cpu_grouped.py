"""``group_slices``: every group's slice ``A[R_g, :]^T`` from one pass over ``A^T``, the same
CSR, entry for entry, as cutting each group by its row mask."""

import pytest
import torch

from dgl_rsc import CSR
from dgl_rsc.backends import resolve
from dgl_rsc.sampling.draw import cut_rows
from dgl_rsc.sparse.cpu_grouped import group_slices

from ..conftest import power_law_csr


def _same_csr(got: CSR, want: CSR):
    assert got.shape == want.shape
    assert torch.equal(got.indptr.long(), want.indptr.long())
    assert torch.equal(got.indices.long(), want.indices.long())
    assert (got.values is None) == (want.values is None)
    if want.values is not None:
        assert got.values.dtype == want.values.dtype
        assert torch.equal(got.values, want.values)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("index", [torch.int32, torch.int64])
@pytest.mark.parametrize("values", [None, torch.float32, torch.float64, torch.bfloat16])
def test_every_group_slice_is_the_cut_of_its_rows(threads, index, values):
    B = power_law_csr(2000, 40.0, seed=7)
    gen = torch.Generator().manual_seed(3)
    vals = None if values is None else torch.rand(B.nnz, generator=gen).to(values)
    A = CSR(B.indptr.to(index), B.indices.to(index), vals, B.shape, check=False)
    label = torch.randint(0, 5, (2000,), generator=gen)  # label 0: in no group (the sample)
    rows = [torch.nonzero(label == 1 + g).squeeze(1) for g in range(4)]
    rows.append(torch.zeros(0, dtype=torch.long))  # an empty group
    be = resolve("numba-cpu", "cpu")
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        slices = group_slices(A, label - 1, 5)  # label 0 (-1): in none; group 4 empty
    finally:
        torch.set_num_threads(old)
    assert len(slices) == 5
    for g, r in enumerate(rows):
        mask = torch.zeros(2000, dtype=torch.bool)
        mask[r] = True
        _same_csr(slices[g], cut_rows(A, mask, be))
        assert slices[g].nnz == int(A.row_nnz()[r].sum())


def test_a_matrix_with_empty_rows_and_columns_slices_cleanly():
    A = CSR.from_coo(torch.tensor([0, 0, 3]), torch.tensor([1, 4, 1]), None, (5, 6))
    first, second = group_slices(A, torch.tensor([-1, 1, 1, 0, -1]), 2)
    assert first.shape == (6, 5) and first.nnz == 1 and second.nnz == 0
    X = torch.randn(5, 3, dtype=torch.float64)
    keep = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0], dtype=torch.float64).unsqueeze(1)
    torch.testing.assert_close(first.to_dense().double() @ X, A.to_dense().double().T @ (keep * X))
