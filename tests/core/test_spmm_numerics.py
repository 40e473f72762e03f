"""Numerics of ``dgl_rsc.spmm_csr`` at its edges (issue 23, item 7): a NaN in ``dY`` poisons
the rows exact would poison and no more (every rescale mode), a tiny budget still keeps a
row, an empty row divided by its zero degree gives 0 like DGL's mean, fp16/bf16 values work
under the documented cast rule, and ``shape`` must be a pair of non-negative integers."""

from __future__ import annotations

import pytest
import torch

from dgl_rsc import RSCController, spmm_csr
from dgl_rsc.core.spmm import Sampler
from dgl_rsc.sparse.csr import CSR

from ..conftest import power_law_csr, requires_dgl

M = 200


@pytest.fixture(scope="module")
def A():
    return power_law_csr(M, 2.0, weighted=True, seed=3)


def _grad(A, rsc, dY, **kw):
    torch.manual_seed(0)
    X = torch.randn(A.shape[1], dY.shape[1], requires_grad=True)
    spmm_csr(A.indptr, A.indices, A.values, A.shape, X, rsc, **kw).backward(dY)
    return X.grad


def _poisoned(grad) -> set:
    return set(torch.nonzero(~torch.isfinite(grad).all(1)).flatten().tolist())


@pytest.mark.parametrize("rescale", ["ls", "mass", "none"])
@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "row_scale"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_a_non_finite_dy_poisons_exactly_the_rows_exact_poisons(A, rescale, scaled, bad):
    row = int(torch.argmax(A.row_nnz()))  # the busiest row: several columns reached
    dY = torch.randn(M, 8, generator=torch.Generator().manual_seed(1))
    dY[row, 3] = bad
    kw = {"row_scale": torch.rand(M) + 0.5} if scaled else {}
    exact = _poisoned(_grad(A, None, dY, **kw))
    assert len(exact) == int(A.row_nnz()[row]) > 1
    for budget in (0.1, 0.3, 0.9):
        rsc = Sampler(budget, rescale=rescale)
        assert _poisoned(_grad(A, rsc, dY, **kw)) == exact, (budget, rescale)


def test_a_non_finite_dy_through_a_controller_keeps_the_factor_finite(A):
    ctl = RSCController(budget=0.3, warmup_steps=0, rescale="ls")
    row = int(torch.argmax(A.row_nnz()))
    dY = torch.randn(M, 4)
    dY[row, 0] = float("nan")
    exact = _poisoned(_grad(A, None, dY))
    assert _poisoned(_grad(A, ctl, dY)) == exact
    ctl.step()  # the next step reuses the sample and its factor: finite again
    assert _poisoned(_grad(A, ctl, torch.randn(M, 4))) == set()


@pytest.mark.parametrize("budget", [1e-9, 0.001, 0.01])
def test_a_budget_too_small_for_any_row_still_keeps_one(budget):
    A = power_law_csr(M, 2.0, seed=5)  # about 400 non-zeros: 0.01 is 4, less than top rows
    dY = torch.randn(M, 8)
    grad = _grad(A, budget, dY)
    assert float(grad.abs().sum()) > 0
    ctl = RSCController(budget=budget, warmup_steps=0, min_k=0)
    assert float(_grad(A, ctl, dY).abs().sum()) > 0
    assert ctl.stats()["nnz_visited"] > 0


def test_an_all_zero_dy_keeps_no_row_and_gives_zero(A):
    grad = _grad(A, 0.01, torch.zeros(M, 4))
    assert torch.equal(grad, torch.zeros_like(grad))


@pytest.mark.parametrize("rsc", [None, 0.5], ids=["exact", "rsc"])
def test_row_divide_by_a_zero_degree_gives_zero(rsc):
    indptr, indices = torch.tensor([0, 2, 2, 3]), torch.tensor([0, 1, 2])
    X = torch.arange(6.0).reshape(3, 2).requires_grad_()
    deg = torch.tensor([2.0, 0.0, 1.0])  # row 1 is empty: its mean is 0
    Y = spmm_csr(indptr, indices, None, (3, 3), X, rsc, row_scale=deg, row_divide=True)
    assert Y.tolist() == [[1.0, 2.0], [0.0, 0.0], [4.0, 5.0]]
    Y.sum().backward()
    assert torch.isfinite(X.grad).all()
    if rsc is None:
        assert X.grad.tolist() == [[0.5, 0.5], [0.5, 0.5], [1.0, 1.0]]


@requires_dgl
def test_row_divide_matches_dgls_mean_on_a_graph_with_isolated_nodes():
    import dgl
    import dgl.function as fn

    src, dst = torch.tensor([0, 1, 2, 0]), torch.tensor([1, 2, 1, 3])
    g = dgl.graph((src, dst), num_nodes=5)  # nodes 0 and 4 have no in-edges
    X = torch.randn(5, 3)
    g.ndata["h"] = X
    g.update_all(fn.copy_u("h", "m"), fn.mean("m", "out"))
    A = CSR.from_coo(dst, src, None, (5, 5))
    deg = g.in_degrees().float()
    Y = spmm_csr(A.indptr, A.indices, None, A.shape, X, row_scale=deg, row_divide=True)
    torch.testing.assert_close(Y, g.ndata["out"])


@pytest.mark.parametrize("vdtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("xdtype", [None, torch.float32], ids=["same", "fp32X"])
@pytest.mark.parametrize("rsc", [None, 1.0, 0.5], ids=["exact", "rsc1", "rsc0.5"])
def test_half_values_follow_the_cast_rule(A, vdtype, xdtype, rsc):
    xdtype = xdtype or vdtype
    values = A.values.to(vdtype).requires_grad_()
    X = torch.randn(M, 4).to(xdtype).requires_grad_()
    Y = spmm_csr(A.indptr, A.indices, values, A.shape, X, rsc)
    assert Y.dtype == xdtype  # the product runs in X's dtype
    dY = torch.randn(M, 4).to(xdtype)
    Y.backward(dY)
    assert values.grad.dtype == vdtype and X.grad.dtype == xdtype
    assert torch.isfinite(X.grad.float()).all()
    ref = A.with_values(values.detach().float()).to_dense().double()
    torch.testing.assert_close(Y.double(), ref @ X.detach().double(), rtol=3e-2, atol=3e-2)
    if rsc == 1.0 or rsc is None:  # every row kept: the exact gradient, up to rounding
        want = ref.t() @ dY.double()
        torch.testing.assert_close(X.grad.double(), want, rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize(
    "shape, error, fragment",
    [
        ((3.7, 3), TypeError, "must hold integers"),
        (("3", "a"), TypeError, "must hold integers"),
        ((3.0, 3.0), TypeError, "must hold integers"),
        ((True, 3), TypeError, "must hold integers"),
        ((-1, 3), ValueError, "non-negative"),
        ((3, 3, 1), ValueError, "a pair"),
        ("33", ValueError, "a pair"),
        (3, ValueError, "a pair"),
    ],
)
@pytest.mark.parametrize("with_controller", [False, True], ids=["plain", "controller"])
def test_shape_must_be_a_pair_of_non_negative_integers(shape, error, fragment, with_controller):
    indptr, indices = torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1, 2])
    X = torch.ones(3, 2, requires_grad=True)
    rsc = RSCController(budget=0.5) if with_controller else None
    with pytest.raises(error, match=fragment) as info:
        spmm_csr(indptr, indices, None, shape, X, rsc)
    assert "shape=(num_rows, num_cols)" in str(info.value)


def test_integer_like_shapes_are_accepted():
    import numpy as np

    indptr, indices = torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1, 2])
    X = torch.ones(3, 2)
    for shape in [(3, 3), [3, 3], torch.Size([3, 3]), (np.int64(3), 3), (torch.tensor(3), 3)]:
        assert spmm_csr(indptr, indices, None, shape, X).shape == (3, 2)
