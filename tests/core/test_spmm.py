"""The operator: exact forward, exact gradient at full budget, approximation quality, edges."""

import pytest
import torch

from dgl_rsc import CSR, RSCController, spmm_csr, spmm_matrix
from dgl_rsc.backends import torch_ref
from dgl_rsc.core.spmm import Sampler
from dgl_rsc.sampling import selection_key

from ..conftest import RTOL, power_law_csr


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30))


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_forward_and_full_budget_gradient(device, dtype, index_dtype, weighted):
    A = power_law_csr(300, 6.0, weighted=weighted, index_dtype=index_dtype, device=device)
    dense = A.to_dense(torch.float64)
    X = torch.randn(300, 8, dtype=torch.float64, device=device)
    G = torch.randn(300, 8, dtype=torch.float64, device=device)
    Xd = X.to(dtype).requires_grad_()
    Y = spmm_matrix(A, Xd, rsc=1.0)
    assert Y.dtype == dtype and Y.shape == (300, 8)
    assert rel(Y, dense @ X) < RTOL[dtype]
    Y.backward(G.to(dtype))
    assert Xd.grad.dtype == dtype
    assert rel(Xd.grad, dense.t() @ G) < RTOL[dtype]


def test_gradcheck_exact_path_float64():
    A = power_law_csr(40, 3.0, weighted=True)
    vals = A.values.double().requires_grad_()
    X = torch.randn(40, 3, dtype=torch.float64, requires_grad=True)

    def f(v, x):
        return spmm_csr(A.indptr, A.indices, v, A.shape, x)

    assert torch.autograd.gradcheck(f, (vals, X))


def test_value_gradient_is_exact_under_sampling(small_graph):
    A = small_graph
    vals = A.values.clone().requires_grad_()
    X = torch.randn(A.shape[1], 5, dtype=torch.float32, requires_grad=True)
    G = torch.randn(A.shape[0], 5)
    spmm_csr(A.indptr, A.indices, vals, A.shape, X, rsc=0.1).backward(G)
    # dL/dA_ij = <G_i, X_j> on the stored entries: the SDDMM, not approximated
    expect = (G[A.row_ids()] * X.detach()[A.indices.long()]).sum(1)
    torch.testing.assert_close(vals.grad, expect, rtol=1e-5, atol=1e-5)


def test_vector_operand_and_equal_to_dgl_semantics(small_graph):
    x = torch.randn(small_graph.shape[1], requires_grad=True)
    y = spmm_matrix(small_graph, x)
    assert y.shape == (small_graph.shape[0],)
    torch.testing.assert_close(y, small_graph.to_dense() @ x.detach(), rtol=1e-5, atol=1e-5)


def test_error_falls_as_budget_rises():
    A = power_law_csr(2000, 10.0, seed=3)
    X = torch.randn(2000, 16, requires_grad=True)
    G = torch.randn(2000, 16) * torch.rand(2000, 1).pow(3)  # uneven row norms, as in training
    exact = A.to_dense().t() @ G
    errs = []
    for b in (0.05, 0.1, 0.2, 0.4, 0.8, 1.0):
        X.grad = None
        spmm_matrix(A, X, rsc=b).backward(G)
        errs.append(rel(X.grad, exact))
    assert all(e1 >= e2 - 1e-9 for e1, e2 in zip(errs, errs[1:])), errs
    assert errs[-1] < 1e-6 and errs[0] > errs[-2]


@pytest.mark.parametrize("rule", ["topk", "cost"])
def test_top_rows_beat_uniform_sampling_at_equal_cost(rule):
    A = power_law_csr(3000, 12.0, exponent=2.1, seed=5)
    G = torch.randn(3000, 16) * torch.rand(3000, 1).pow(2)
    exact = A.to_dense().t() @ G
    budget = int(0.2 * A.nnz)
    key = selection_key(torch_ref.row_scores(A.row_norms(), G), A.row_nnz(), rule)
    mask, _ = torch_ref.select_rows(key, A.row_nnz(), budget, 0)
    approx = A.to_dense().t() @ (G * mask[:, None])
    top_err = rel(approx, exact)
    # uniform random rows with 1/p rescaling, drawn until the same non-zeros are spent
    gen = torch.Generator().manual_seed(0)
    errs = []
    for _ in range(5):
        perm = torch.randperm(3000, generator=gen)
        csum = torch.cumsum(A.row_nnz()[perm], 0)
        take = perm[csum <= budget]
        scale = 3000 / max(take.numel(), 1)
        m = torch.zeros(3000)
        m[take] = scale
        errs.append(rel(A.to_dense().t() @ (G * m[:, None]), exact))
    assert top_err < min(errs), (top_err, errs)


@pytest.mark.parametrize("rule", ["topk", "cost"])
def test_visited_nonzeros_stay_within_budget(rule):
    A = power_law_csr(1500, 10.0, seed=2)
    # the budget bounds the sampled rows; remainder groups (tested on their own) come on top
    rsc = RSCController(budget=0.1, warmup_steps=0, min_k=10, rule=rule, remainder_groups=0)
    X = torch.randn(1500, 8, requires_grad=True)
    spmm_matrix(A, X, rsc).sum().backward()
    st = rsc.stats()["layers"][0]
    max_row = int(A.row_nnz().max())
    assert st["nnz_visited"] <= 0.1 * A.nnz + 10 * max_row
    assert st["nnz_visited"] <= 0.1 * A.nnz or st["k"] <= 10
    assert st["nnz_visited"] > 0.05 * A.nnz  # and it does use the budget


def test_rows_without_entries_and_empty_matrices():
    # rows 1 and 3 hold nothing
    A = CSR(torch.tensor([0, 2, 2, 3, 3]), torch.tensor([0, 2, 1]), None, (4, 3))
    X = torch.randn(3, 2, requires_grad=True)
    spmm_matrix(A, X, rsc=0.5).sum().backward()
    assert torch.isfinite(X.grad).all()
    for shape in [(0, 5), (5, 0), (3, 3)]:
        E = CSR(
            torch.zeros(shape[0] + 1, dtype=torch.long),
            torch.zeros(0, dtype=torch.long),
            None,
            shape,
        )
        X = torch.randn(shape[1], 4, requires_grad=True)
        Y = spmm_matrix(E, X, rsc=0.3)
        assert Y.shape == (shape[0], 4) and (Y == 0).all()
        Y.sum().backward()
        if shape[1]:
            assert (X.grad == 0).all()


def test_k_larger_than_useful_rows_and_min_k():
    A = power_law_csr(200, 4.0, seed=7)
    G = torch.zeros(200, 3)
    G[:5] = torch.randn(5, 3)  # only 5 rows have a non-zero score
    X = torch.randn(200, 3, requires_grad=True)
    Sampler(0.01, min_k=50).backward_product(A, G)  # min_k over the useful count: no crash
    spmm_matrix(A, X, rsc=1.0).backward(G)
    torch.testing.assert_close(X.grad, A.to_dense().t() @ G)
    key = selection_key(torch_ref.row_scores(A.row_norms(), G), A.row_nnz(), "topk")
    mask, k = torch_ref.select_rows(key, A.row_nnz(), 0, min_k=50)
    assert int(k) == int((key > 0).sum()) <= 5 and int(mask.sum()) == int(k)
    mask, k = torch_ref.select_rows(key, A.row_nnz(), 0, min_k=0)
    assert int(k) == 0 and not mask.any()


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_gradients_propagate_like_exact(bad):
    A = power_law_csr(300, 5.0, seed=4)
    G = torch.randn(300, 4)
    row = int(torch.argmax(A.row_nnz()))
    G[row, 1] = bad
    X = torch.randn(300, 4, requires_grad=True)
    spmm_matrix(A, X, rsc=None).backward(G)
    exact_bad = ~torch.isfinite(X.grad)
    X.grad = None
    spmm_matrix(A, X, rsc=0.05).backward(G)
    approx_bad = ~torch.isfinite(X.grad)
    # every value the exact product makes non-finite is non-finite, in the same gradient
    # rows (a whole row: telling the features apart would cost an exact product)
    assert exact_bad.any() and bool((approx_bad | ~exact_bad).all())
    assert torch.equal(approx_bad.any(1), exact_bad.any(1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_rows_outside_a_cached_sample_still_propagate(bad, dtype):
    """Also through the summed step (bf16: the sample's and the group's products accumulate
    into one output and the non-finite term joins the row scale's pass)."""
    A = power_law_csr(400, 6.0, seed=5)
    rsc = RSCController(min_width=0, budget=0.05, warmup_steps=0, cache_interval=10)
    X = torch.randn(400, 4, dtype=dtype, requires_grad=True)
    G0 = torch.randn(400, 4, dtype=dtype)
    spmm_matrix(A, X, rsc).backward(G0)  # draws and caches the sample
    rsc.step()
    dropped = int(torch.nonzero(~rsc.layers[0].sample.mask & (A.row_nnz() > 0))[0])
    G = torch.randn(400, 4, dtype=dtype)
    G[dropped, 2] = bad
    X.grad = None
    spmm_matrix(A, X, rsc).backward(G)  # a cache hit: the row is not in the slice
    assert rsc.stats()["cache_hits"] == 1
    reached = A.indices[A.indptr[dropped] : A.indptr[dropped + 1]].long()
    assert bool((~torch.isfinite(X.grad[reached])).all())
    others = torch.ones(400, dtype=torch.bool)
    others[reached] = False
    assert bool(torch.isfinite(X.grad[others]).all())  # nothing else is touched
    off = RSCController(
        min_width=0, budget=0.05, warmup_steps=0, cache_interval=10, check_finite=False
    )
    X.grad = None
    spmm_matrix(A, X, off).backward(G0)  # the same sample: the row is left out again
    off.step()
    X.grad = None
    spmm_matrix(A, X, off).backward(G)
    assert bool(torch.isfinite(X.grad).all())  # what the check prevents: the NaN vanished


def test_no_grad_does_no_sampling(small_graph):
    rsc = RSCController(warmup_steps=0)
    X = torch.randn(small_graph.shape[1], 4, requires_grad=True)
    with torch.no_grad():
        spmm_matrix(small_graph, X, rsc)
    spmm_matrix(small_graph, X.detach(), rsc)
    assert rsc.layers == []


def test_bad_inputs_name_the_argument(small_graph):
    A = small_graph
    n = A.shape[1]
    with pytest.raises(ValueError, match="shape mismatch.*X must be"):
        spmm_matrix(A, torch.randn(n + 1, 3))
    with pytest.raises(ValueError, match="1-D .* or 2-D"):
        spmm_matrix(A, torch.randn(n, 3, 2))
    with pytest.raises(TypeError, match=r"floating point.*X.float\(\)"):
        spmm_matrix(A, torch.ones(n, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="torch.Tensor"):
        spmm_matrix(A, [[1.0]])
    with pytest.raises(ValueError, match="budget"):
        spmm_matrix(A, torch.randn(n, 3, requires_grad=True), rsc=1.5).sum().backward()
    with pytest.raises(ValueError, match="budget"):
        spmm_matrix(A, torch.randn(n, 3, requires_grad=True), rsc=0.0)
    with pytest.raises(TypeError, match="int32 or int64"):
        spmm_csr(A.indptr.float(), A.indices, None, A.shape, torch.randn(n, 2))
    with pytest.raises(ValueError, match="indptr has"):
        spmm_csr(A.indptr[:-1], A.indices, None, A.shape, torch.randn(n, 2))
    with pytest.raises(ValueError, match="values must have shape"):
        spmm_csr(A.indptr, A.indices, torch.ones(3), A.shape, torch.randn(n, 2))
    with pytest.raises(TypeError, match="rsc must be"):
        spmm_matrix(A, torch.randn(n, 3, requires_grad=True), rsc="fast")


def test_device_mismatch_is_explained(small_graph):
    meta = torch.randn(small_graph.shape[1], 3, device="meta")
    with pytest.raises(ValueError, match="device mismatch"):
        spmm_matrix(small_graph, meta)


def test_mass_scale_by_hand():
    from dgl_rsc.sampling import mass_scale

    s = torch.tensor([4.0, 3.0, 2.0, 1.0, float("nan"), float("inf")])
    keep = torch.tensor([True, True, False, False, True, True])
    assert float(mass_scale(s, keep)) == pytest.approx(10.0 / 7.0)  # non-finite ignored
    assert float(mass_scale(s, torch.zeros(6, dtype=torch.bool))) == 1.0  # nothing kept
    finite = torch.rand(50) + 0.1
    assert float(mass_scale(finite, torch.ones(50, dtype=torch.bool))) == 1.0  # exactly


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_rescale_matches_the_exact_scale_and_only_scales(weighted):
    """With coherent gradients (the common case in training) the kept rows' product is far
    smaller than the exact one; rescaling by the score mass brings it back, and it multiplies
    the same sampled product by one scalar."""
    A = power_law_csr(3000, 12.0, exponent=2.1, weighted=weighted, seed=7)
    G = torch.rand(3000, 16) + 0.5  # same-signed rows: contributions add up coherently
    exact = A.to_dense().t() @ G
    grads = {}
    for rescale in (False, True):
        X = torch.randn(3000, 16, requires_grad=True)
        spmm_matrix(A, X, rsc=Sampler(0.1, rule="cost", rescale=rescale)).backward(G)
        grads[rescale] = X.grad
    plain, scaled = grads[False], grads[True]
    ratio = scaled.norm() / plain.norm()
    assert float(ratio) > 2.0  # the plain sample lost most of the gradient's size ...
    torch.testing.assert_close(scaled, plain * ratio, rtol=1e-4, atol=1e-5)  # one scalar
    norm_gap = lambda g: abs(float(torch.log(g.norm() / exact.norm())))  # noqa: E731
    assert norm_gap(scaled) < 0.5 * norm_gap(plain)  # ... and rescaling restores it
    assert rel(scaled, exact) < rel(plain, exact)


def test_controller_rescale_is_a_factor_of_the_cached_slice():
    A = power_law_csr(800, 8.0, seed=2)
    G = torch.rand(800, 8) + 0.5
    out = {}
    for rescale in (False, True):
        rsc = RSCController(budget=0.1, warmup_steps=0, rescale=rescale, rule="topk",
                            remainder_groups=0)  # fmt: skip
        X = torch.randn(800, 8, requires_grad=True)
        spmm_matrix(A, X, rsc).backward(G)
        sample = rsc.layers[0]._sample
        factor = 1.0 if sample.factor is None else float(sample.factor)
        # the product is exactly the cached slice applied to dY, times one scalar
        expect = factor * (sample.t_slice.to_dense() @ G)
        torch.testing.assert_close(X.grad, expect, rtol=1e-5, atol=1e-5)
        out[rescale] = (sample.t_slice.values, sample.factor)
    assert out[False] == (None, None)  # unweighted and not rescaled: no values, no factor
    assert out[True][0] is None and float(out[True][1]) > 1.0  # the slice stays unweighted
