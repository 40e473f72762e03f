"""``GroupedSlices``: the transposed entries grouped by row class, and the step's product read
straight from them, against dense algebra."""

import pytest
import torch

from dgl_rsc import CSR
from dgl_rsc.sparse.cpu_grouped import GroupedSlices

from ..conftest import power_law_csr


def _dense_step(A, keep, rows, g, X, row, col):
    sel = torch.zeros(A.shape[0], dtype=torch.float64)
    sel[keep] = 1.0
    sel[rows[g]] = 1.0
    dense = A.to_dense().double() * sel.unsqueeze(1)  # only the rows of S and R_g
    out = dense.T @ (col.double().unsqueeze(1) * X.double())
    return out if row is None else row.double().unsqueeze(1) * out


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("index", [torch.int32, torch.int64])
@pytest.mark.parametrize("weighted", [False, True])
def test_the_grouped_product_is_the_sample_plus_one_group(threads, index, weighted):
    B = power_law_csr(2000, 40.0, seed=7)
    gen = torch.Generator().manual_seed(3)
    vals = torch.rand(B.nnz, generator=gen) if weighted else None
    A = CSR(B.indptr.to(index), B.indices.to(index), vals, B.shape, check=False)
    label = torch.randint(0, 5, (2000,), generator=gen)
    keep = label == 0
    rows = [torch.nonzero(label == 1 + g).squeeze(1) for g in range(3)]
    rows.append(torch.zeros(0, dtype=torch.long))  # an empty group
    X = torch.randn(2000, 70, generator=gen)
    row, col = torch.rand(2000, generator=gen) + 0.5, torch.rand(2000, generator=gen) + 0.5
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        grouped = GroupedSlices(A, keep, rows)
        for g in range(4):
            for r in (row, None):
                out = torch.full((2000, 70), float("nan"))  # every row is written
                grouped.product(g, X, r, col, out)
                want = _dense_step(A, keep, rows, g, X, r, col)
                torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4)
    finally:
        torch.set_num_threads(old)
    kept = int(A.row_nnz()[keep].sum()) + sum(int(A.row_nnz()[r].sum()) for r in rows)
    assert grouped.cols.shape[0] == kept  # one copy of the kept entries, nothing else


def test_a_matrix_with_empty_rows_and_columns_groups_cleanly():
    A = CSR.from_coo(torch.tensor([0, 0, 3]), torch.tensor([1, 4, 1]), None, (5, 6))
    grouped = GroupedSlices(A, torch.tensor([True, False, False, False, False]),
                            [torch.tensor([3])])  # fmt: skip
    X = torch.randn(5, 3, dtype=torch.float64)
    out = grouped.product(0, X, None, torch.ones(5, dtype=torch.float64),
                          torch.empty(6, 3, dtype=torch.float64))  # fmt: skip
    torch.testing.assert_close(out, A.to_dense().double().T @ X)
