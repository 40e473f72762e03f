"""Fidelity of the sampled product: rows scored as rows of the normalized matrix, the
least-squares scale, the exactly applied diagonal."""

import pytest
import torch

from dgl_rsc import RSCController, spmm_matrix
from dgl_rsc.backends import torch_ref
from dgl_rsc.sampling import (
    apply_scale,
    cross_terms,
    draw_sample,
    estimate_ls_scale,
    sample_product,
    sampled_cross_terms,
)
from dgl_rsc.sparse.csr import CSR
from dgl_rsc.sparse.products import Scales, csr_t_mm

from ..conftest import power_law_csr


def gcn_matrix(n=1500, degree=10.0, seed=3):
    A0 = power_law_csr(n, degree, seed=seed)
    r, c = A0.row_ids(), A0.indices.long()
    keep = r != c
    loops = torch.arange(n)
    A = CSR.from_coo(torch.cat([r[keep], loops]), torch.cat([c[keep], loops]), None, (n, n))
    din = A.row_nnz().float().clamp(min=1)
    dout = torch.bincount(A.indices.long(), minlength=n).float().clamp(min=1)
    return A, Scales(row=din.pow(-0.5), col=dout.pow(-0.5))


def grad(n, d, coherent, seed):
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(n, d, generator=g)
    if coherent:
        rows = torch.randn(1, d, generator=g) + 0.5 * rows
    return torch.randn(n, 1, generator=g).exp() * rows


def rel(a, b):
    return float((a - b).norm() / b.norm())


def test_row_order_is_that_of_the_dense_normalized_matrix():
    A, sc = gcn_matrix(400, 8.0)
    dY = grad(400, 16, False, 0)
    dense = sc.row[:, None] * A.to_dense() * sc.col[None, :]
    scores = dense.norm(dim=1) * dY.norm(dim=1)
    order = torch.sort(scores, descending=True, stable=True).indices
    for k in (5, 40, 200):  # the budget of the top-k rows' non-zeros keeps exactly them
        budget = int(A.row_nnz()[order[:k]].sum())
        s = draw_sample(A, dY, budget, "topk", 0, torch_ref, "none", sc)
        assert int(s.k) == k
        assert torch.equal(torch.nonzero(s.mask).squeeze(1), order[:k].sort().values)
    # the same through a score hint (column scale applied by the caller)
    hint = Scales(row=sc.row, hint_col=sc.col)
    s = draw_sample(A, dY, budget, "topk", 0, torch_ref, "none", hint)
    assert torch.equal(torch.nonzero(s.mask).squeeze(1), order[:200].sort().values)


@pytest.mark.parametrize("coherent", [False, True], ids=["random", "coherent"])
@pytest.mark.parametrize("budget", [0.05, 0.1, 0.3])
def test_ls_scale_is_near_the_oracle_and_never_worse_than_unscaled(coherent, budget):
    A, sc = gcn_matrix()
    dY = grad(A.shape[0], 32, coherent, 1)
    G = csr_t_mm(A, dY, sc)
    s = draw_sample(A, dY, int(budget * A.nnz), "cost", 0, torch_ref, "ls", sc)
    GS = sample_product(A, s, dY, sc)
    oracle = float((GS * G).sum() / GS.square().sum())
    gen = torch.Generator().manual_seed(0)
    c = float(estimate_ls_scale(A, dY, sc, GS, s.scores, s.mask, 256, gen))
    assert 1.0 <= c <= max(oracle, 1.0) * 1.01  # a lower bound of the optimum ...
    assert c > 0.9 * max(oracle, 1.0)  # ... and a close one
    assert rel(c * GS, G) <= rel(GS, G) + 1e-6  # never above the unscaled estimator
    if coherent:
        assert oracle > 1.1 and rel(c * GS, G) < rel(GS, G) - 0.02  # and it helps here


def test_cross_terms_match_a_dense_computation():
    A, sc = gcn_matrix(200, 6.0)
    dY = grad(200, 8, False, 2)
    G = torch.randn(200, 8)
    dense = sc.row[:, None] * A.to_dense() * sc.col[None, :]
    rows = torch.tensor([0, 5, 5, 199])
    expect = torch.stack([(torch.outer(dense[i], dY[i]) * G).sum() for i in rows.tolist()])
    got = cross_terms(A, dY, sc, G, rows)
    torch.testing.assert_close(got.float(), expect, rtol=1e-5, atol=1e-5)
    off = dense - torch.diag(torch.diag(dense))
    expect_off = torch.stack([(torch.outer(off[i], dY[i]) * G).sum() for i in rows.tolist()])
    got_off = cross_terms(A, dY, sc, G, rows, skip_diagonal=True)
    torch.testing.assert_close(got_off.float(), expect_off, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("skip_diagonal", [False, True])
def test_sampled_cross_terms_are_unbiased(skip_diagonal):
    """One uniformly drawn entry per row, times the row's length: the mean of many draws is
    the exact cross term (within 4 standard errors), for every row, empty rows included."""
    A, sc = gcn_matrix(300, 8.0)
    A = A.with_values(torch.rand(A.nnz, generator=torch.Generator().manual_seed(1)) + 0.5)
    dY = grad(300, 8, False, 6)
    G = torch.randn(300, 8, generator=torch.Generator().manual_seed(7))
    rows = torch.tensor([0, 3, 17, 150, 299])
    exact = cross_terms(A, dY, sc, G, rows, skip_diagonal)
    draws = 20000
    gen = torch.Generator().manual_seed(0)
    est = sampled_cross_terms(A, dY, sc, G, rows.repeat(draws), gen, skip_diagonal)
    est = est.reshape(draws, rows.numel())
    se = est.std(0) / draws**0.5
    assert ((est.mean(0) - exact).abs() <= 4 * se + 1e-9).all()
    empty = CSR.from_coo(torch.tensor([1]), torch.tensor([2]), None, (3, 3))
    got = sampled_cross_terms(empty, torch.ones(3, 2), Scales(), torch.ones(3, 2),
                              torch.tensor([0, 1, 2]), gen)  # fmt: skip
    assert got.tolist() == [0.0, 2.0, 0.0]


@pytest.mark.parametrize("coherent", [False, True])
def test_ls_scale_with_a_hint_is_the_scale_of_the_scaled_product(coherent):
    """A layer that scales X itself (``hint_col``) gets the factor it would get with the
    column scale applied in the product: ``G`` is measured as ``diag(c) G``, through its
    row norms and the probed rows, without a scaled copy of ``G``."""
    A, sc = gcn_matrix(800, 10.0)
    dY = grad(800, 16, coherent, 3)
    fused = draw_sample(A, dY, int(0.1 * A.nnz), "cost", 0, torch_ref, "ls", sc)
    G = sample_product(A, fused, dY, sc).clone()  # (N, D), includes diag(c)
    G_raw = G / sc.col[:, None]  # what the product gives when the caller applies c
    hint = Scales(row=sc.row, hint_col=sc.col)

    def factor(scales, g):
        gen = torch.Generator().manual_seed(5)
        return float(estimate_ls_scale(A, dY, scales, g, fused.scores, fused.mask, 512, gen))

    torch.testing.assert_close(factor(hint, G_raw), factor(sc, G), rtol=1e-5, atol=0)
    assert factor(sc, G) >= 1.0


def test_exact_diagonal_is_always_applied_and_counted():
    A, sc = gcn_matrix(600, 8.0)
    dY = grad(600, 8, False, 3)
    n_diag = 600
    budget = n_diag + 300
    # the budget counts the sampled rows' non-zeros; the diagonal comes on top
    s = draw_sample(A, dY, 300, "topk", 0, torch_ref, "none", sc, diagonal="exact")
    assert int(s.nnz) <= budget + int(A.row_nnz().max())  # off-diagonal rows fit the rest
    dense_slice = s.t_slice.to_dense().t()  # (M, N) entries kept
    assert bool(torch.diag(dense_slice).eq(1).all())  # every diagonal entry is there
    # with no rows kept the product is exactly the diagonal term
    s0 = draw_sample(A, dY, 0, "topk", 0, torch_ref, "none", sc, diagonal="exact")
    assert int(s0.k) == 0
    d = torch.diag(sc.row[:, None] * A.to_dense() * sc.col[None, :])
    torch.testing.assert_close(sample_product(A, s0, dY, sc), d[:, None] * dY)


def test_controller_ls_scale_is_stored_and_reused_and_checkpointed():
    A, sc = gcn_matrix(800, 8.0)
    G = grad(800, 8, True, 4)
    settings = dict(budget=0.1, warmup_steps=0, cache_interval=5, tune_interval=100,
                    remainder_groups=0, min_width=0)  # fmt: skip
    rsc = RSCController(**settings)
    X = torch.randn(800, 8, requires_grad=True)
    spmm_matrix(A, X, rsc, row_scale=sc.row, col_scale=sc.col).backward(G)
    first = X.grad.clone()
    sample = rsc.layers[0]._sample
    assert sample.factor is not None and float(sample.factor) > 1.0
    X.grad = None
    rsc.step()
    spmm_matrix(A, X, rsc, row_scale=sc.row, col_scale=sc.col).backward(G)
    torch.testing.assert_close(X.grad, first)  # a cache hit: same slice, same factor
    state = rsc.state_dict()
    assert state["layers"][0]["generator"] is not None
    again = RSCController(**settings)
    again.load_state_dict(state)
    assert torch.equal(again.layers[0].generator("cpu").get_state(),
                       rsc.layers[0].generator("cpu").get_state())  # fmt: skip


def test_apply_scale_modes():
    A, sc = gcn_matrix(300, 6.0)
    dY = grad(300, 4, True, 5)
    for mode in ("none", "mass"):
        s = draw_sample(A, dY, int(0.1 * A.nnz), "cost", 0, torch_ref, mode, sc)
        out = sample_product(A, s, dY, sc)
        before = out.clone()
        apply_scale(A, s, dY, sc, out, mode, 64, torch.Generator())
        assert torch.equal(out, before)  # nothing changes after the product
        assert (s.factor is None) == (mode == "none")
