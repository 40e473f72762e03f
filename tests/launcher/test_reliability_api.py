"""Reliability of the Python API (issue cases 8-10, 12, 17): non-finite gradients between
refreshes, CSR validation, in-place edits of cached structures, misuse of rsc.step(), bad
arguments. Each case asserts the clear error (type and a phrase) or the correct behaviour."""

import pytest
import torch

from dgl_rsc import CSR, ConfigError, RSCController, spmm_csr, spmm_matrix
from dgl_rsc.sparse.csr import StaleStructureError
from dgl_rsc.sparse.graph import Graph

from ..conftest import power_law_csr


def test_case08_nan_between_refreshes_reaches_the_gradient():
    A = power_law_csr(300, 6.0, seed=8)
    rsc = RSCController(budget=0.05, warmup_steps=0, cache_interval=10)
    X = torch.randn(300, 3, requires_grad=True)
    spmm_matrix(A, X, rsc).backward(torch.randn(300, 3))
    rsc.step()
    dropped = torch.nonzero(~rsc.layers[0].sample.mask & (A.row_nnz() > 0)).squeeze(1)
    G = torch.randn(300, 3)
    G[dropped[:3], 0] = float("nan")
    X.grad = None
    spmm_matrix(A, X, rsc).backward(G)
    X2 = X.detach().clone().requires_grad_()
    spmm_matrix(A, X2).backward(G)
    exact_bad = ~torch.isfinite(X2.grad).all(1)
    assert exact_bad.any() and torch.equal(~torch.isfinite(X.grad).all(1), exact_bad)


@pytest.mark.parametrize(
    "indptr, indices, match",
    [
        ([0, 2, 3], [0, 9, 1], "column index 9 is out of range"),
        ([0, 2, 3], [0, -4, 1], "column index -4 is out of range"),
        ([0, 2, 3], [0, 1 << 40, 1], "out of range"),  # a huge index: an error, no segfault
        ([0, 4, 3], [0, 1, 1], "non-decreasing"),
        ([1, 2, 3], [0, 1, 1], "start at 0"),
        ([0, 2, 2], [0, 1, 1], "end at the number of stored entries"),
    ],
    ids=[
        "case09-range",
        "case17-negative",
        "case09-huge",
        "case17-unsorted",
        "case17-start",
        "case17-end",
    ],  # fmt: skip
)
def test_case09_17_bad_csr_arrays(indptr, indices, match):
    X = torch.randn(3, 2, requires_grad=True)
    with pytest.raises(ValueError, match=match):
        spmm_csr(torch.tensor(indptr), torch.tensor(indices), None, (2, 3), X)


def test_case10_in_place_edit_under_a_controller_is_an_error():
    A = power_law_csr(200, 5.0, seed=10)
    indptr, indices = A.indptr.clone(), A.indices.clone()
    rsc = RSCController(budget=0.3, warmup_steps=0, cache_interval=5)
    X = torch.randn(200, 4, requires_grad=True)
    spmm_csr(indptr, indices, None, A.shape, X, rsc).sum().backward()
    rsc.step()
    indices[:10] = indices[:10].flip(0)  # in place: the cached transpose is now stale
    with pytest.raises(StaleStructureError, match="modified in place"):
        spmm_csr(indptr, indices, None, A.shape, X, rsc).sum().backward()


def test_case10_values_edited_after_the_forward_are_caught_by_autograd():
    A = power_law_csr(100, 4.0, weighted=True, seed=11)
    vals = A.values.clone().requires_grad_()
    X = torch.randn(100, 2, requires_grad=True)
    Y = spmm_csr(A.indptr, A.indices, vals, A.shape, X)
    with torch.no_grad():
        vals.mul_(2)  # saved for backward: autograd's version counter notices
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        Y.sum().backward()


def test_case12_step_called_too_often_warns():
    A = power_law_csr(100, 4.0, seed=12)
    rsc = RSCController(budget=0.2, warmup_steps=0, total_steps=100)
    X = torch.randn(100, 2, requires_grad=True)
    spmm_matrix(A, X, rsc).sum().backward()
    with pytest.warns(UserWarning, match="switch to the exact backward"):
        for _ in range(4):
            rsc.step()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, 1.5, -0.1])
def test_case17_bad_budget_argument(bad):
    A = power_law_csr(50, 3.0, seed=13)
    X = torch.randn(50, 2, requires_grad=True)
    with pytest.raises(ConfigError, match="budget"):
        spmm_matrix(A, X, rsc=bad)


def test_case17_graph_with_an_edge_id_out_of_range():
    with pytest.raises(ValueError, match="node id 7 in src/dst is out of range for num_nodes=5"):
        Graph(torch.tensor([0, 7]), torch.tensor([1, 2]), num_nodes=5)


def test_case17_wrong_rsc_and_operand_types():
    A = CSR(torch.tensor([0, 1]), torch.tensor([0]), None, (1, 1))
    X = torch.ones(1, 2, requires_grad=True)
    with pytest.raises(TypeError, match="rsc must be None"):
        spmm_matrix(A, X, rsc="0.1")
    with pytest.raises(TypeError, match="floating point"):
        spmm_matrix(A, torch.ones(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="shape mismatch"):
        spmm_matrix(A, torch.ones(3, 2))
    with pytest.raises(ValueError, match="row_scale must have 1 entries"):
        spmm_matrix(A, X, row_scale=torch.ones(4))
