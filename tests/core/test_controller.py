"""Controller: warm-up, cache keyed by period and graph, switching, solver, stats, state."""

import pytest
import torch

from dgl_rsc import CSR, RSCController, spmm_csr, spmm_matrix
from dgl_rsc.backends import resolve
from dgl_rsc.core.controller import MAX_PRODUCTS_PER_STEP

from ..conftest import power_law_csr


def run_step(rsc, mats, X, G):
    X.grad = None
    out = sum(spmm_matrix(A, X, rsc).mul(G).sum() for A in mats)
    out.backward()
    rsc.step()
    return X.grad.clone()


@pytest.fixture
def A():
    return power_law_csr(600, 8.0, seed=11)


def test_warmup_is_exact_and_records_scores(A):
    rsc = RSCController(min_width=0, budget=0.1, warmup_steps=2)
    X = torch.randn(600, 8, requires_grad=True)
    G = torch.randn(600, 8)
    exact = A.to_dense().t() @ G
    for _ in range(2):
        torch.testing.assert_close(run_step(rsc, [A], X, G), exact, rtol=1e-5, atol=1e-5)
    st = rsc.layers[0]
    assert st.ema is not None and st.ema.shape == (600,)
    approx = run_step(rsc, [A], X, G)
    assert not torch.allclose(approx, exact)
    assert rsc.stats()["layers"][0]["approx_calls"] == 1


def test_cache_reused_within_period_and_refreshed_after(A):
    rsc = RSCController(
        min_width=0, budget=0.2, warmup_steps=0, cache_interval=4, tune_interval=100
    )
    X = torch.randn(600, 8, requires_grad=True)
    for _ in range(8):
        G = torch.randn(600, 8)
        run_step(rsc, [A], X, G)
    st = rsc.stats()
    assert st["cache_misses"] == 2 and st["cache_hits"] == 6
    assert st["cache_bytes"] > 0


@pytest.mark.parametrize("groups", [0, 10])
def test_cached_sample_is_applied_to_the_new_gradient(A, groups):
    rsc = RSCController(
        min_width=0, budget=0.3, warmup_steps=0, cache_interval=10, remainder_groups=groups
    )
    X = torch.randn(600, 8, requires_grad=True)
    run_step(rsc, [A], X, torch.randn(600, 8))
    sample = rsc.layers[0]._sample
    G2 = torch.randn(600, 8)
    got = run_step(rsc, [A], X, G2)
    factor = 1.0 if sample.factor is None else float(sample.factor)
    expect = factor * (sample.t_slice.to_dense() @ G2)
    if groups:  # the second step adds its group of the partition, without S, times K
        assert sample.factor is None and len(sample.rest) == 10
        in_group = sample.rest.partition.labels == sample.rest.group(1)
        w = (in_group & ~sample.mask).to(G2.dtype).unsqueeze(1) * groups
        expect = expect + A.to_dense().t() @ (w * G2)
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("keep", [32, 0], ids=["subgraph-cache", "no-cache"])
def test_never_reuses_a_slice_across_graphs(A, keep):
    """Alternating matrices (mini-batch subgraphs): each sample is only ever used for the
    matrix it was cut from; with the subgraph cache a matrix that comes back finds its own."""
    B = power_law_csr(600, 8.0, seed=12)
    rsc = RSCController(
        min_width=0, budget=0.3, warmup_steps=0, cache_interval=100, subgraph_cache=keep
    )
    X = torch.randn(600, 8, requires_grad=True)
    for i in range(6):
        G = torch.randn(600, 8)
        M = A if i % 2 == 0 else B
        rsc_layer = rsc.slot(0)
        X.grad = None
        spmm_matrix(M, X, rsc_layer).backward(G)
        sample = rsc.layers[0].sample
        assert sample.token == M.token
        # the slice applied is a slice of M itself: its entries are a subset of M's
        dense_slice = sample.t_slice.to_dense().t()
        assert bool(((dense_slice != 0) <= (M.to_dense() != 0)).all())
    st = rsc.stats()
    if keep:
        assert st["cache_hits"] == 4 and st["cache_misses"] == 2 and st["subgraph_hits"] == 4
    else:
        assert st["cache_hits"] == 0 and st["subgraph_hits"] == 0


def test_raw_csr_tensors_keep_their_cache(A):
    rsc = RSCController(min_width=0, budget=0.3, warmup_steps=0, cache_interval=5)
    X = torch.randn(600, 8, requires_grad=True)
    for _ in range(5):
        X.grad = None
        spmm_csr(A.indptr, A.indices, None, A.shape, X, rsc).sum().backward()
        rsc.step()
    assert rsc.stats()["cache_hits"] == 4


def test_switch_makes_backward_exact_and_free(A):
    rsc = RSCController(budget=0.1, warmup_steps=0, total_steps=10, switch_at=0.5)
    X = torch.randn(600, 8, requires_grad=True)
    G = torch.randn(600, 8)
    exact = A.to_dense().t() @ G
    for _ in range(5):
        run_step(rsc, [A], X, G)
    assert rsc.phase() == "exact"
    before = rsc.stats()
    for _ in range(5):
        torch.testing.assert_close(run_step(rsc, [A], X, G), exact, rtol=1e-5, atol=1e-5)
    after = rsc.stats()
    assert after["cache_misses"] == before["cache_misses"]  # no selection after the switch
    assert after["select_seconds"] == before["select_seconds"]


@pytest.mark.parametrize("groups", [0, 10])
def test_switch_releases_the_cached_samples(A, groups):
    """The samples and remainder slices are dropped at the switch (nothing reads them
    again); the scores and counters stay."""
    rsc = RSCController(min_width=0, budget=0.2, warmup_steps=0, total_steps=10, switch_at=0.5,
                        cache_interval=10, remainder_groups=groups)  # fmt: skip
    X = torch.randn(600, 8, requires_grad=True)
    G = torch.randn(600, 8)
    for _ in range(4):
        run_step(rsc, [A], X, G)
    assert rsc.phase() == "approx" and rsc.stats()["cache_bytes"] > 0
    run_step(rsc, [A], X, G)  # the fifth step() is the switch
    assert rsc.phase() == "exact" and rsc.stats()["cache_bytes"] == 0
    assert rsc.layers[0].ema is not None and rsc.stats()["layers"][0]["approx_calls"] == 5
    torch.testing.assert_close(run_step(rsc, [A], X, G), A.to_dense().t() @ G, rtol=1e-5,
                               atol=1e-5)  # fmt: skip


def test_layers_by_call_order_and_solver_allocation():
    A = power_law_csr(800, 10.0, seed=1)
    B = power_law_csr(800, 3.0, seed=2)
    rsc = RSCController(min_width=0, budget=0.2, warmup_steps=1, tune_interval=2, cache_interval=2)
    X = torch.randn(800, 8, requires_grad=True)
    G = torch.randn(800, 8) * torch.rand(800, 1).pow(4)
    for _ in range(5):
        run_step(rsc, [A, B], X, G)
    assert len(rsc.layers) == 2
    alloc = rsc.last_allocation
    assert alloc is not None and rsc.alloc_version >= 2
    budget = 0.2 * (A.nnz + B.nnz) * 8
    assert alloc.cost <= budget + 1e-6
    assert [rsc.allocation[i][0] for i in range(2)] == alloc.nnz
    assert [x["nnz_budget"] for x in rsc.stats()["layers"]] == alloc.nnz


def test_products_without_backward_or_step_warn_once_and_stay_bounded(A):
    """Forwards with gradients but no backward and no step(): a warning naming rsc.step(),
    never an exception, and no more than MAX_PRODUCTS_PER_STEP product states."""
    rsc = RSCController(warmup_steps=0)
    X = torch.randn(600, 2, requires_grad=True)
    with pytest.warns(UserWarning, match=r"rsc\.step\(\)") as caught:
        for _ in range(MAX_PRODUCTS_PER_STEP + 5):
            spmm_matrix(A, X, rsc)
    assert len([w for w in caught if "rsc.step()" in str(w.message)]) == 1
    assert len(rsc.layers) == MAX_PRODUCTS_PER_STEP


def test_state_dict_roundtrip_resumes_identically(A, tmp_path):
    def make():
        return RSCController(budget=0.2, warmup_steps=1, cache_interval=3, tune_interval=3)

    X = torch.randn(600, 8, requires_grad=True)
    Gs = [torch.randn(600, 8) for _ in range(8)]
    ref = make()
    grads = [run_step(ref, [A], X, G) for G in Gs]
    first = make()
    for G in Gs[:4]:
        run_step(first, [A], X, G)
    path = tmp_path / "rsc.pt"
    torch.save(first.state_dict(), path)
    resumed = make()
    resumed.load_state_dict(torch.load(path, weights_only=True))
    A2 = CSR(A.indptr.clone(), A.indices.clone(), None, A.shape)  # a re-loaded graph
    for G, want in zip(Gs[4:], grads[4:]):
        torch.testing.assert_close(run_step(resumed, [A2], X, G), want)


def test_private_layer_controller_uses_config_budget(A):
    rsc = RSCController(budget=0.05, warmup_steps=0, min_k=0, remainder_groups=0)
    X = torch.randn(600, 4, requires_grad=True)
    spmm_matrix(A, X, rsc).sum().backward()
    assert rsc.stats()["visited_fraction"] <= 0.05 + 1e-9


def test_step_counters_fold_so_memory_stays_bounded(A, monkeypatch):
    from dgl_rsc.core import stats

    monkeypatch.setattr(stats, "FOLD_EVERY", 4)
    rsc = RSCController(
        min_width=0, budget=0.2, warmup_steps=0, cache_interval=3, tune_interval=100
    )
    X = torch.randn(600, 8, requires_grad=True)
    visited = 0
    for _ in range(11):
        run_step(rsc, [A], X, torch.randn(600, 8))
        st = rsc.layers[0]
        s = st._sample  # what this step's product visited: the sample and one group
        part = s.rest.slice(s.rest.group(s.uses - 1), A, resolve("torch", "cpu"))
        visited += int(s.nnz) + part.nnz
        assert len(st.stats._pending) < 4 and len(st.stats._timers) < 4
    stats = rsc.stats()["layers"][0]
    # 11 approximated steps in periods of 3: 4 refreshes; every step's non-zeros counted
    assert stats["approx_calls"] == 11 and stats["cache_misses"] == 4
    assert stats["nnz_visited"] == visited


def test_a_layer_state_alone_with_a_step_record(A):
    """The state needs no controller: a step record says what to do."""
    from dgl_rsc import RSCConfig
    from dgl_rsc.core.layer_state import LayerState
    from dgl_rsc.core.slot import LayerSlot, StepInfo

    cfg = RSCConfig(budget=0.2, remainder_groups=0)
    state = LayerState(0)
    X = torch.randn(600, 4, requires_grad=True)
    G = torch.randn(600, 4)
    warm = LayerSlot(state, StepInfo("warmup", 0, None, cfg))
    spmm_matrix(A, X, warm).backward(G)
    torch.testing.assert_close(X.grad, A.to_dense().t() @ G, rtol=1e-5, atol=1e-5)
    assert state.ema is not None and state.sample is None  # scores recorded, nothing drawn
    X.grad = None
    approx = LayerSlot(state, StepInfo("approx", 0, None, cfg))
    spmm_matrix(A, X, approx).backward(G)
    assert state.sample is not None and state.stats.misses == 1
    assert state.stats.nnz_visited == A.nnz  # the warm-up product, exact
    assert state.stats.as_dict()["nnz_visited"] <= A.nnz + 0.2 * A.nnz + 1  # ... plus the sample


def test_a_layer_state_is_not_an_rsc_argument(A):
    rsc = RSCController()
    X = torch.randn(600, 4, requires_grad=True)
    with pytest.raises(TypeError, match=r"controller.slot\(0\)"):
        spmm_matrix(A, X, rsc.layer(0))


def test_steps_outnumbering_products_warn_once(A):
    rsc = RSCController(budget=0.2, warmup_steps=0, total_steps=100)
    X = torch.randn(600, 4, requires_grad=True)
    run_step(rsc, [A], X, torch.randn(600, 4))
    with pytest.warns(UserWarning, match="without a training forward"):
        for _ in range(3):
            rsc.step()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rsc.step()  # once only


def test_step_takes_a_loss_that_requires_grad_without_a_warning(A):
    """``rsc.step(loss)`` reads the loss for the guard without the warning torch >= 2.3 gives
    when a tensor that requires grad is turned into a float."""
    import warnings

    rsc = RSCController(budget=0.2, warmup_steps=0, total_steps=100)
    X = torch.randn(600, 4, requires_grad=True)
    run_step(rsc, [A], X, torch.randn(600, 4))
    assert rsc.phase() == "approx" and rsc.guard is not None
    loss = (X * 2).sum()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rsc.step(loss)
    assert rsc.guard.losses[-1] == pytest.approx(float(loss.detach()))


def test_narrow_products_keep_the_exact_backward_and_the_budget_goes_to_the_rest():
    """``min_width``: a product whose gradient is narrower keeps the exact backward in the
    approximate phase (no sample, no probe, every non-zero visited), and the fixed budget is
    shared by the wide products alone; ``min_width=0`` approximates both."""
    torch.manual_seed(0)
    A = power_law_csr(800, 10.0, seed=1)
    B = power_law_csr(800, 6.0, seed=2)
    Xw, Xn = torch.randn(800, 32, requires_grad=True), torch.randn(800, 4, requires_grad=True)
    Gw, Gn = torch.randn(800, 32), torch.randn(800, 4)
    exact_n = B.to_dense().t() @ Gn

    def step(rsc):
        Xw.grad = Xn.grad = None
        loss = (spmm_matrix(A, Xw, rsc) * Gw).sum() + (spmm_matrix(B, Xn, rsc) * Gn).sum()
        loss.backward()
        rsc.step()
        return Xn.grad.clone()

    rsc = RSCController(budget=0.2, warmup_steps=1, tune_interval=2, cache_interval=2,
                        min_width=16)  # fmt: skip
    for i in range(6):
        grad_n = step(rsc)
        if i >= 1:  # the approximate phase: the narrow product is still exact
            torch.testing.assert_close(grad_n, exact_n, rtol=1e-5, atol=1e-5)
    wide, narrow = rsc.stats()["layers"]
    assert (wide["narrow"], narrow["narrow"]) == (False, True)
    assert narrow["nnz_visited"] == narrow["nnz_exact"] and narrow["approx_calls"] == 0
    assert wide["nnz_visited"] < wide["nnz_exact"] and wide["approx_calls"] > 0
    assert [s.index for s in rsc.ready()] == [0] and set(rsc.allocation) == {0}
    assert rsc.last_allocation.cost <= 0.2 * A.nnz * 32 + 1e-6  # the wide product's work only

    every = RSCController(budget=0.2, warmup_steps=1, tune_interval=2, cache_interval=2,
                          min_width=0)  # fmt: skip
    for _ in range(4):
        grad_n = step(every)
    assert not torch.allclose(grad_n, exact_n)
    assert [x["narrow"] for x in every.stats()["layers"]] == [False, False]


def test_a_product_that_stopped_running_takes_no_share_of_the_budget():
    """A slot whose backward ran early and then never again (a first layer whose input
    aggregation is reused from step 2 on) leaves the solve once a tune has passed: the
    budget goes to the products still running, as if the stopped one had never run."""
    A = power_law_csr(800, 10.0, seed=1)
    B = power_law_csr(800, 3.0, seed=2)
    X = torch.randn(800, 8, requires_grad=True)
    G = torch.randn(800, 8)
    cfg = dict(min_width=0, budget=0.2, warmup_steps=1, tune_interval=2, cache_interval=2,
               guard=False)  # fmt: skip
    rsc = RSCController(**cfg)
    for _ in range(3):
        run_step(rsc, [A, B], X, G)
    assert set(rsc.allocation) == {0, 1}
    for _ in range(4):  # only product 0 from now on (slot 1 stops)
        run_step(rsc, [A], X, G)
    assert set(rsc.allocation) == {0}
    alone = RSCController(**cfg)
    for _ in range(7):
        run_step(alone, [A], X, G)
    assert rsc.allocation[0][0] == alone.allocation[0][0]
