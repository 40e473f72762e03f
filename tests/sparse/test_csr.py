"""CSR: validation messages, the cached transpose and diagonal, row norms, immutability."""

import pytest
import torch

from dgl_rsc.sparse.csr import CSR, StaleStructureError, check_csr_data

from ..conftest import power_law_csr


def t(*v):
    return torch.tensor(v, dtype=torch.long)


@pytest.mark.parametrize(
    "indptr, indices, shape, match",
    [
        (t(1, 2, 3), t(0, 1, 1), (2, 2), "indptr must start at 0"),
        (t(0, 2, 2), t(0, 1, 1), (2, 2), r"indptr must end at the number of stored entries \(3\)"),
        (t(0, 3, 2, 3), t(0, 1, 1), (3, 2), r"indptr must be non-decreasing, but indptr\[2\]=2"),
        (t(0, 2, 3), t(0, -1, 1), (2, 2), "column index -1 is out of range"),
        (t(0, 2, 3), t(0, 5, 1), (2, 2), r"column index 5 is out of range .* \[0, 2\)"),
        (t(0, 2), t(0, 1), (2, 2), "a 2-row matrix needs 3"),
    ],
    ids=["start", "end", "decreasing", "negative", "too-large", "length"],
)
def test_bad_contents_are_named(indptr, indices, shape, match):
    with pytest.raises(ValueError, match=match):
        CSR(indptr, indices, None, shape)
    with pytest.raises(ValueError, match=match):
        check_csr_data(indptr, indices, shape)


def test_types_are_checked():
    with pytest.raises(TypeError, match="int32 or int64"):
        CSR(torch.tensor([0.0, 1.0]), t(0), None, (1, 1))
    with pytest.raises(TypeError, match="share one index dtype"):
        CSR(t(0, 1), torch.tensor([0], dtype=torch.int32), None, (1, 1))
    with pytest.raises(ValueError, match="values must have shape"):
        CSR(t(0, 1), t(0), torch.ones(2), (1, 1))


def test_transpose_is_cached_and_correct():
    A = power_law_csr(200, 5.0, weighted=True, seed=1)
    T = A.transpose()
    torch.testing.assert_close(T.to_dense(), A.to_dense().t())
    assert A.transpose().token == T.token  # one transposed structure per structure
    B = A.with_values(A.values * 2)
    assert B.transpose().token == T.token
    torch.testing.assert_close(B.transpose().to_dense(), 2 * A.to_dense().t())


def test_diagonal_masks_in_both_orders():
    A = CSR.from_coo(t(0, 0, 1, 2, 2), t(0, 2, 0, 1, 2), None, (3, 3))
    mask, per_row, t_mask = A.diagonal()
    assert mask.tolist() == [True, False, False, False, True]
    assert per_row.tolist() == [1, 0, 1]
    _, t_rows, perm = A.transposed()
    assert torch.equal(t_mask, mask[perm])
    assert CSR.from_coo(t(0, 1), t(1, 0), None, (2, 2)).diagonal() is None


def test_row_norms_and_dense():
    A = power_law_csr(100, 4.0, weighted=True, seed=2)
    torch.testing.assert_close(A.row_norms(), A.to_dense().norm(dim=1))
    U = A.with_values(None)
    torch.testing.assert_close(U.row_norms(), U.row_nnz().float().sqrt())


def test_in_place_edit_of_the_structure_is_detected():
    A = power_law_csr(100, 4.0, seed=3)
    A.transpose()
    A.indices[0] = (A.indices[0] + 1) % 100
    with pytest.raises(StaleStructureError, match="immutable"):
        A.transpose()


def test_from_coo_keeps_duplicates_and_nbytes():
    A = CSR.from_coo(t(1, 0, 1), t(0, 1, 0), torch.tensor([1.0, 2.0, 3.0]), (2, 2))
    assert A.nnz == 3 and A.to_dense().tolist() == [[0.0, 2.0], [4.0, 0.0]]
    assert A.nbytes() == 3 * 8 + 3 * 8 + 3 * 4
    assert "nnz=3" in repr(A)


def test_transpose_gathers_the_values_once_while_they_stay_the_same():
    """Values kept across steps (PyG's normalized adjacency) are transposed once per
    structure; an in-place change gathers them again; values that need a gradient never."""
    A = CSR.from_coo(torch.tensor([0, 0, 1, 2]), torch.tensor([1, 2, 0, 1]),
                     torch.tensor([1.0, 2.0, 3.0, 4.0]), (3, 3))  # fmt: skip
    t1, t2 = A.transpose(), A.with_values(A.values).transpose()  # a new CSR, same values
    assert t1.values is t2.values
    torch.testing.assert_close(t1.to_dense(), A.to_dense().t())
    A.values.mul_(2.0)
    t3 = A.transpose()
    assert t3.values is not t1.values
    torch.testing.assert_close(t3.to_dense(), A.to_dense().t())
    w = torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    B = A.with_values(w)
    (B.transpose().values * torch.arange(4.0)).sum().backward()
    assert w.grad is not None and B.transpose().values is not B.transpose().values
