"""``RSCConfig.restrict``: the row-restricted backward of the native GCN
(:mod:`dgl_rsc.core.restrict`, :mod:`dgl_rsc.models.restricted`).

Two models with the same weights, the same dropout draws and controllers of the same config
(but ``restrict``) run step by step; before each step the restricted model takes the
reference's weights back, so each step is compared from the same state."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import dgl_rsc.nn as rnn
from dgl_rsc.core import restrict as R
from dgl_rsc.core.config import ConfigError, RSCConfig
from dgl_rsc.core.slot import LayerSlot
from dgl_rsc.models import GCN, GCNII, ResGCN
from dgl_rsc.sparse.graph import Graph

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def same_allocation(monkeypatch):
    """The restricted run's solver priced as the reference's (no row cost), so that both
    draw the same samples and their gradients compare row for row; the row cost's effect on
    the allocation is ``tests/core/test_solver.py``'s subject."""
    monkeypatch.setattr(R, "segment_row_work", lambda *args: 0.0)


N, FEATS, CLASSES = 300, 20, 6
BASE = dict(min_width=0, cache_interval=3, tune_interval=6, warmup_steps=1, guard=False,
            total_steps=40, remainder_groups=4)  # fmt: skip


def graph(n=N, extra=6 * N, seed=0):
    g = torch.Generator().manual_seed(seed)
    hub = torch.rand(n, generator=g).pow(3)  # a skewed degree distribution
    src = torch.multinomial(hub + 0.01, extra, replacement=True, generator=g)
    dst = torch.randint(0, n, (extra,), generator=g)
    loops = torch.arange(n)
    return Graph(torch.cat([src, dst, loops]), torch.cat([dst, src, loops]), n)


def data(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, FEATS, generator=g), torch.randint(0, CLASSES, (N,), generator=g)


def pair(model_cls=GCN, budget=0.2, mode="weights", **kw):
    """Reference and restricted model (same weights), each attached to its controller."""
    torch.manual_seed(0)
    ref = model_cls(FEATS, CLASSES, hidden=16, layers=3, **kw)
    res = model_cls(FEATS, CLASSES, hidden=16, layers=3, **kw)
    res.load_state_dict(ref.state_dict())
    # the restricted forward aggregates every step, in DGL's order: so do both models
    rnn.cache_input_aggregation(ref, False), rnn.cache_input_aggregation(res, False)
    ref.fused_epilogue = res.fused_epilogue = (
        False  # the restricted forward draws dropout as torch does
    )
    return ref, res, rnn.attach(ref, budget=budget, **BASE), rnn.attach(
        res, budget=budget, restrict=mode, **BASE)  # fmt: skip


class Recorder:
    """The ``dY`` each product's backward gets (a wrapper of ``LayerSlot.backward_product``)
    and the row sets resolved, per step."""

    def __init__(self, monkeypatch):
        self.dy, self.rows = [], []
        orig_bp, orig_resolve = LayerSlot.backward_product, R.RowPlan.resolve

        def bp(slot, A, dY, *args):
            self.dy.append((slot.state.index, dY.detach().clone()))
            return orig_bp(slot, A, dY, *args)

        def resolve(plan, dtype):
            out = orig_resolve(plan, dtype)
            self.rows.append((plan.state.index, out))
            return out

        monkeypatch.setattr(LayerSlot, "backward_product", bp)
        monkeypatch.setattr(R.RowPlan, "resolve", resolve)

    def take(self):
        out = dict(self.dy), dict(self.rows)
        self.dy, self.rows = [], []
        return out


def run_step(model, ctl, g, x, y, seed):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = model(g, x)
    F.cross_entropy(out, y).backward()
    ctl.step()
    return out.detach()


@pytest.mark.parametrize("mode", ["rows", "weights"])
def test_the_rows_a_product_reads_get_todays_gradient(monkeypatch, mode):
    g, (x, y) = graph(), data()
    ref, res, c_ref, c_res = pair(mode=mode)
    rec = Recorder(monkeypatch)
    restricted_steps = 0
    for step in range(20):
        res.load_state_dict(ref.state_dict())
        misses = [s.stats.misses for s in c_ref.layers]
        out_ref = run_step(ref, c_ref, g, x, y, step)
        dy_ref, _ = rec.take()
        out_res = run_step(res, c_res, g, x, y, step)
        dy_res, rows = rec.take()
        assert torch.equal(out_ref, out_res)  # the same forward, bit for bit
        refreshed = [s.stats.misses > m for s, m in zip(c_ref.layers, misses)]
        for i, d in dy_ref.items():
            rs = rows.get(i)
            if rs is None:  # not restricted: the whole gradient as today
                torch.testing.assert_close(dy_res[i], d, rtol=1e-6, atol=1e-7)
                continue
            assert not refreshed[i], "a refresh step must compute every row"
            restricted_steps += 1
            torch.testing.assert_close(dy_res[i][rs.index], d[rs.index], rtol=1e-6, atol=1e-7)
            outside = torch.ones(N, dtype=torch.bool)
            outside[rs.index] = False
            assert outside.any() and (dy_res[i][outside] == 0).all()
        # layer 0's weight only sees what product 0 reads: exact in both modes
        torch.testing.assert_close(res.convs[0].weight.grad, ref.convs[0].weight.grad,
                                   rtol=1e-5, atol=1e-6)  # fmt: skip
        if mode == "rows":  # every parameter gradient exact
            for p, q in zip(res.parameters(), ref.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    assert restricted_steps >= 8
    frac = [d["backward_rows_fraction"] for d in c_res.stats()["layers"]]
    assert min(frac[:2]) < 0.9 and frac[2] == 1.0  # the last product has no segment
    assert all(d["backward_rows_fraction"] == 1.0 for d in c_ref.stats()["layers"])


def test_the_restricted_forward_reuses_the_first_layers_aggregation(monkeypatch):
    """With the input cache on (the default) the restricted forward takes the first layer's
    ``A X`` from it as the plain model does: the same outputs, under ``"rows"`` the same
    parameter gradients, no backward for the first product, one build for the run."""
    g, (x, y) = graph(), data()
    ref, res, c_ref, c_res = pair(mode="rows")
    rnn.cache_input_aggregation(ref, True), rnn.cache_input_aggregation(res, True)
    rec = Recorder(monkeypatch)
    for step in range(12):
        res.load_state_dict(ref.state_dict())
        out_ref = run_step(ref, c_ref, g, x, y, step)
        out_res = run_step(res, c_res, g, x, y, step)
        torch.testing.assert_close(out_res, out_ref, rtol=1e-6, atol=1e-6)
        for p, q in zip(res.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
        dy, _ = rec.take()
        assert 0 not in dy or step < 2  # the first product: no backward once cached
    assert rnn.input_cache_counts(res)["builds"] == 1
    assert rnn.input_cache_counts(res)["hits"] == rnn.input_cache_counts(ref)["hits"] >= 10
    assert c_res.stats()["layers"][1]["backward_rows_fraction"] < 0.9


@pytest.mark.parametrize("mode", ["rows", "weights"])
@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_budget_one_equals_the_exact_backward(mode, dropout):
    """Without dropout no row of a gradient is zero at a refresh, the sample keeps every row,
    and the restricted backward is the exact one. With dropout a row can score 0 at a refresh
    and be left to the groups: today's RSC is not exact then, and ``"rows"`` equals it (the
    parameter gradients of ``"weights"`` are estimates, whose mean the next test checks)."""
    g, (x, y) = graph(), data()
    ref, res, c_ref, c_res = pair(budget=1.0, mode=mode, dropout=dropout)
    exact = GCN(FEATS, CLASSES, hidden=16, layers=3, dropout=dropout)
    rnn.exact(exact)
    for step in range(8):
        for m in (res, exact):
            m.load_state_dict(ref.state_dict())
        run_step(ref, c_ref, g, x, y, step)
        run_step(res, c_res, g, x, y, step)
        exact.zero_grad()
        torch.manual_seed(step)
        F.cross_entropy(exact(g, x), y).backward()
        for p, q, e in zip(res.parameters(), ref.parameters(), exact.parameters()):
            if mode == "rows" or dropout == 0:
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
            if dropout == 0:
                torch.testing.assert_close(p.grad, e.grad, rtol=1e-5, atol=1e-6)
    assert c_res.stats()["phase"] == "approx"
    if dropout == 0:
        assert all(d["backward_rows_fraction"] == 1.0 for d in c_res.stats()["layers"])


@pytest.mark.parametrize("case", ["batch_norm", "hook", "gcn2", "resgcn", "off"])
def test_every_row_where_the_package_cannot_see_every_consumer(case):
    """Batch norm (its backward needs every row), a hook on a layer (a consumer the package
    cannot see) and models with residual consumers keep the plain backward."""
    g, (x, y) = graph(), data()
    cls, kw = {"gcn2": (GCNII, {}), "resgcn": (ResGCN, {})}.get(case, (GCN, {}))
    if case == "batch_norm":
        kw = {"batch_norm": True}
    ref, res, c_ref, c_res = pair(cls, mode="off" if case == "off" else "weights", **kw)
    if case == "hook":
        res.convs[1].register_forward_hook(lambda m, i, o: None)
    for step in range(10):
        res.load_state_dict(ref.state_dict())
        run_step(ref, c_ref, g, x, y, step)
        run_step(res, c_res, g, x, y, step)
        for p, q in zip(res.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7)
    assert all(d["backward_rows_fraction"] == 1.0 for d in c_res.stats()["layers"])
    assert c_res.stats()["phase"] == "approx"


def test_the_config_key_is_validated():
    assert RSCConfig().restrict == "off"
    with pytest.raises(ConfigError, match="restrict"):
        RSCConfig(restrict="weight")
    with pytest.raises(ValueError, match="mode"):
        R.RowPlan(None, None, None, "off")


K = 4


def _segment_grads(plan, seed=0):
    """``(dW, db)`` of one segment (aggregate-first ``W``, a transform-first next weight,
    dropout) for fixed inputs and a fixed ``dx``, its rows restricted by ``plan``."""
    g = torch.Generator().manual_seed(7)
    z = torch.randn(N, 16, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, 16, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(16, generator=g, dtype=torch.float64, requires_grad=True)
    wn = torch.randn(16, 6, generator=g, dtype=torch.float64, requires_grad=True)
    row = torch.rand(N, generator=g, dtype=torch.float64) + 0.5
    col = torch.rand(N, generator=g, dtype=torch.float64) + 0.5
    dx = torch.randn(N, 6, generator=g, dtype=torch.float64)
    torch.manual_seed(seed)
    x = R.RestrictedSegment.apply(z, w, b, wn, R.SegmentSpec(row, col, 0.5), plan)
    x.backward(dx)
    return torch.cat([w.grad.reshape(-1), b.grad]), z.grad


def _drawn_plan(seed, use=0):
    """A plan over a sample drawn (budget 0.2, ``K`` groups) by a controller seeded ``seed``,
    at its ``use``-th step."""
    from dgl_rsc.core.controller import RSCController

    A = graph().adj
    ctl = RSCController(min_width=0, budget=0.2, remainder_groups=K, cache_interval=K,
                        warmup_steps=0, guard=False, total_steps=100, seed=seed)  # fmt: skip
    dy = torch.randn(N, 16, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ctl.slot(0).backward_product(A, dy)  # the refresh draws the sample and its groups
    state = ctl.layers[0]
    state.sample.uses = use
    return R.RowPlan(state, ctl.step_info(0), A, "weights")


def test_the_weight_estimate_averages_to_the_exact_gradient_over_the_groups():
    """For one sample, the K uses see each group once: the mean of the K estimates of the
    weight and bias gradients is the exact one, and the rows the product reads are exact."""
    exact, dz = _segment_grads(None)
    plan = _drawn_plan(0)
    est = []
    for use in range(K):
        plan.state.sample.uses = use
        g, dz_r = _segment_grads(plan)
        rows = plan.resolve(torch.float64)
        assert rows is not None and rows.index.numel() < N
        torch.testing.assert_close(dz_r[rows.index], dz[rows.index])
        est.append(g)
    torch.testing.assert_close(torch.stack(est).mean(0), exact)
    assert all((e - exact).norm() > 1e-3 * exact.norm() for e in est)  # each is sampled


def test_the_weight_estimate_is_unbiased_over_many_draws():
    """Over 200 draws of the groups (a new partition and use each), the mean estimate lies
    within 5 standard errors of the exact gradient (in norm), and its relative error is what
    the per-draw spread predicts."""
    exact, _ = _segment_grads(None)
    gen = torch.Generator().manual_seed(11)
    draws = torch.stack([
        _segment_grads(_drawn_plan(s, int(torch.randint(0, K, (1,), generator=gen))))[0]
        for s in range(200)
    ])  # fmt: skip
    mean, sd = draws.mean(0), draws.std(0)
    se = (sd.square().sum() / len(draws)).sqrt()
    assert (mean - exact).norm() < 5 * se
    assert se > 0  # the draws differ
