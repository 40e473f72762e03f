"""The backward halo sample and the forward boundary sample, ranks simulated in one process:
unbiased (the mean over many draws equals the exact gradient, within a tolerance from the
predicted variance), the predicted variance is the measured one, the rows sent follow the
budget, and a budget of every row is exact."""

import itertools

import pytest
import torch

from dgl_rsc.distributed.boundary import ForwardSample, boundary_count, boundary_rows
from dgl_rsc.distributed.halo import all_local
from dgl_rsc.distributed.halo_sample import (
    inclusion_probabilities,
    sample_halo_rows,
    systematic_sample,
    threshold_table,
)
from dgl_rsc.sparse.csr import CSR


def skewed_block(rows=400, width=6, seed=0):
    """A gradient block whose row norms span four orders of magnitude, some rows zero."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.rand(rows, generator=g) ** 4
    block = torch.randn(rows, width, generator=g) * scale[:, None]
    block[::9] = 0
    return block


def draws(block, k, n, seed=1):
    """Mean, summed empirical variance and row counts of ``n`` sampled blocks."""
    g = torch.Generator().manual_seed(seed)
    acc = torch.zeros(block.shape, dtype=torch.float64)
    acc2 = torch.zeros_like(acc)
    counts = set()
    for _ in range(n):
        h = sample_halo_rows(block, k, g)
        d = torch.zeros_like(acc)
        d[h.rows] = h.values.double()
        acc += d
        acc2 += d * d
        counts.add(h.rows.numel())
    mean = acc / n
    return mean, float((acc2 / n - mean.square()).sum()), counts, h.variance


def test_inclusion_probabilities_sum_to_the_row_count_and_follow_the_norms():
    norms = skewed_block().norm(dim=1)
    for k in (1, 7, 50, 200):
        p = inclusion_probabilities(norms, k)
        assert float(p.sum()) == pytest.approx(k, rel=1e-9)
        assert float(p.min()) >= 0 and float(p.max()) <= 1
        assert bool((p[norms == 0] == 0).all())
        below = (p > 0) & (p < 1)  # proportional to the norm below the cap
        ratio = p[below].double() / norms[below].double()
        assert float(ratio.max() - ratio.min()) < 1e-9 * float(ratio.max())
        if bool((p == 1).any()):
            assert float(norms[p == 1].min()) >= float(norms[below].max())


def test_systematic_draw_has_the_inclusion_probabilities_and_a_fixed_count():
    p = torch.tensor([1.0, 0.5, 0.25, 0.25, 0.7, 0.3, 0.0], dtype=torch.float64)
    g = torch.Generator().manual_seed(3)
    hits = torch.zeros(7)
    for _ in range(8000):
        idx = systematic_sample(p, g)
        assert idx.numel() == 3  # sum p = 3 exactly: always 3 rows
        hits[idx] += 1
    torch.testing.assert_close(hits / 8000, p.float(), atol=0.02, rtol=0)


@pytest.mark.parametrize("k", [10, 60, 200])
def test_the_halo_sample_is_unbiased_and_its_variance_is_predicted(k):
    block = skewed_block()
    n = 1500
    mean, var, counts, predicted = draws(block, k, n)
    assert counts == {k}  # the rows sent follow the budget, exactly
    assert var == pytest.approx(predicted, rel=0.2)
    s, _ = threshold_table(block.norm(dim=1), [k])
    assert float(s[0]) == pytest.approx(predicted, rel=1e-9)
    # E||mean - G||^2 = V / n; four times that fails with vanishing probability
    err = float((mean - block.double()).square().sum())
    assert err < 4 * predicted / n
    # the same draws without the 1/p scale are far off: the check can fail
    g = torch.Generator().manual_seed(1)
    acc = torch.zeros(block.shape, dtype=torch.float64)
    for _ in range(n):
        h = sample_halo_rows(block, k, g)
        p = inclusion_probabilities(block.norm(dim=1), k)[h.rows]
        acc[h.rows] += h.values.double() * p.unsqueeze(1)
    assert float((acc / n - block.double()).square().sum()) > 4 * predicted / n


def test_a_budget_of_every_row_sends_the_block_exactly():
    block = skewed_block()
    for k in (None, 10_000, int((block != 0).any(1).sum())):
        h = sample_halo_rows(block, k)
        assert h.variance == 0.0
        d = torch.zeros_like(block)
        d[h.rows] = h.values
        assert torch.equal(d, block)
        assert h.rows.numel() == int((block != 0).any(1).sum())  # zero rows stay home


def test_a_nonfinite_row_always_travels():
    block = skewed_block()
    block[5, 2] = float("nan")
    for seed in range(20):
        h = sample_halo_rows(block, 5, torch.Generator().manual_seed(seed))
        assert 5 in h.rows.tolist() and h.rows.numel() <= 5


def test_the_quantized_sample_variance_is_the_codec_variance_over_p():
    block = skewed_block()
    qv = torch.rand(2, block.shape[0], dtype=torch.float64) * (block.norm(dim=1) > 0)
    ks = [5, 40, 400]
    _, quant = threshold_table(block.norm(dim=1), ks, qv)
    for j, k in enumerate(ks):
        p = inclusion_probabilities(block.norm(dim=1), k)
        on = p > 0
        want = (qv[:, on] / p[on]).sum(1)
        torch.testing.assert_close(quant[:, j], want, rtol=1e-9, atol=1e-12)


def random_graph(n=240, e=2000, seed=0):
    g = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)
    part = torch.randint(0, 3, (n,), generator=g)
    return src, dst, n, part


def local_matrix(lp):
    counts = torch.bincount(lp.local_dst, minlength=lp.n_own)
    indptr = torch.zeros(lp.n_own + 1, dtype=torch.long)
    torch.cumsum(counts, 0, out=indptr[1:])
    return CSR(indptr, lp.local_src, None, (lp.n_own, lp.n_local)).to_dense()


def local_products(plans, dY):
    """Each rank's exact ``A_local^T dY_own`` (``(n_own + n_halo, D)``, float64)."""
    return [local_matrix(lp).double().t() @ dY[lp.owned].double() for lp in plans]


def simulated_backward(plans, products, k, generator, forward=None):
    """The whole graph's ``A^T dY`` as the ranks compute it from their local ``products``:
    the owned rows kept, the halo blocks sampled (``k`` rows each; ``None``: exact) and
    added at their owners. ``forward[r]``: rank r's :class:`ForwardSample` (the backward
    follows it)."""
    grad = torch.zeros((sum(lp.n_own for lp in plans), products[0].shape[1]), dtype=torch.float64)
    for lp, g_local in zip(plans, products):
        grad[lp.owned] += g_local[: lp.n_own]
        halo = g_local[lp.n_own :]
        for q in range(len(plans)):
            lo, hi = int(lp.halo_offsets[q]), int(lp.halo_offsets[q + 1])
            if hi == lo:
                continue
            block = halo[lo:hi]
            cut = None if forward is None else forward[lp.rank].restrict(q, block)
            base, cand = (None, block) if cut is None else cut
            h = sample_halo_rows(cand, k, generator)
            pos = h.rows if base is None else base[h.rows]
            owner = plans[q]
            grad[owner.owned[owner.send_idx[lp.rank][pos]]] += h.values
    return grad


def test_simulated_ranks_estimate_the_whole_graph_gradient_without_bias():
    src, dst, n, part = random_graph()
    plans = all_local(src, dst, n, part, 3)
    A = torch.zeros(n, n, dtype=torch.float64)
    A.index_put_((dst, src), torch.ones(src.numel(), dtype=torch.float64), accumulate=True)
    dY = torch.randn(n, 4, generator=torch.Generator().manual_seed(5)).double()
    exact = A.t() @ dY
    g = torch.Generator().manual_seed(0)
    products = local_products(plans, dY)
    torch.testing.assert_close(simulated_backward(plans, products, None, g), exact)  # all rows
    runs = [simulated_backward(plans, products, 8, g) for _ in range(600)]
    stack = torch.stack(runs)
    var = float(stack.var(0).sum())
    assert float((runs[0] - exact).abs().max()) > 1e-3  # the sample is at work
    err = float((stack.mean(0) - exact).square().sum())
    assert err < 4 * var / len(runs)


def test_the_backward_of_a_boundary_sample_is_the_gradient_of_the_sampled_forward():
    """Forward: each rank's halo holds k of a peer's n rows times n / k (unbiased over
    draws); backward through ForwardSample.restrict: autograd's gradient of that forward."""
    src, dst, n, part = random_graph(seed=1)
    plans = all_local(src, dst, n, part, 3)
    X = torch.randn(n, 3, generator=torch.Generator().manual_seed(2)).double()
    dY = torch.randn(n, 3, generator=torch.Generator().manual_seed(3)).double()
    g = torch.Generator().manual_seed(4)
    ys, mats = [], [local_matrix(lp).double() for lp in plans]
    for draw in range(200):
        grad_on = draw < 3  # the restricted backward is autograd's gradient of this draw
        Xr = X.clone().requires_grad_(grad_on)
        y_all, samples = torch.zeros(n, 3, dtype=torch.float64), []
        for lp in plans:
            halo, picked = [], {}
            for q in range(3):
                lo, hi = int(lp.halo_offsets[q]), int(lp.halo_offsets[q + 1])
                rows = Xr[lp.halo[lo:hi]]
                k = boundary_count(hi - lo, 0.4)
                if hi > lo and k < hi - lo:
                    pick = boundary_rows(hi - lo, k, g)
                    block = torch.zeros_like(rows).index_copy(0, pick, rows[pick] * ((hi - lo) / k))
                    picked[q] = (pick, (hi - lo) / k)
                    rows = block
                halo.append(rows)
            x_local = torch.cat([Xr[lp.owned]] + halo)
            y_all = y_all.index_add(0, lp.owned, mats[lp.rank] @ x_local)
            samples.append(ForwardSample(0, picked))
        ys.append(y_all.detach())
        if grad_on:
            (y_all * dY).sum().backward()
            products = [m.t() @ dY[lp.owned] for m, lp in zip(mats, plans)]
            got = simulated_backward(plans, products, None, g, forward=samples)
            torch.testing.assert_close(got, Xr.grad)
    A = torch.zeros(n, n, dtype=torch.float64)
    A.index_put_((dst, src), torch.ones(src.numel(), dtype=torch.float64), accumulate=True)
    stack = torch.stack(ys)
    err = float((stack.mean(0) - A @ X).square().sum())
    assert err < 4 * float(stack.var(0).sum()) / len(ys)


def test_boundary_rows_are_uniform_without_replacement():
    g = torch.Generator().manual_seed(0)
    hits = torch.zeros(10)
    for _ in range(5000):
        r = boundary_rows(10, 3, g)
        assert r.numel() == 3 and len(set(r.tolist())) == 3
        hits[r] += 1
    torch.testing.assert_close(hits / 5000, torch.full((10,), 0.3), atol=0.03, rtol=0)
    assert [boundary_count(n, r) for n, r in itertools.product((1, 40), (0.01, 0.5, 1.0))] == [
        1, 1, 1, 1, 20, 40]  # fmt: skip
