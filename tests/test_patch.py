"""The global DGL patch: what it replaces, restores, and how stock models train inside it."""

import pytest
import torch
import torch.nn.functional as F

import dgl_rsc

from .conftest import labelled_graph, requires_dgl

pytestmark = [requires_dgl, pytest.mark.dgl]


@pytest.fixture(scope="module")
def dgl():
    import dgl as _dgl
    import dgl.sparse

    return _dgl


def originals():
    from dgl_rsc.patch import patched_symbols

    return {(id(o), n): o.__dict__[n] for o, n in patched_symbols()}


def test_restores_every_symbol_on_exit_and_on_exception(dgl):
    before = originals()
    with dgl_rsc.patch(budget=0.2) as rsc:
        assert isinstance(rsc, dgl_rsc.RSCController)
        assert dgl_rsc.is_patched()
        during = originals()
        assert all(during[k] is not v for k, v in before.items())
    assert originals() == before and not dgl_rsc.is_patched()
    with pytest.raises(KeyError):
        with dgl_rsc.patch(budget=0.2):
            raise KeyError("boom")
    after = originals()
    assert all(after[k] is v for k, v in before.items())


def test_patches_do_not_nest(dgl):
    with dgl_rsc.patch(budget=0.2):
        with pytest.raises(RuntimeError, match="do not nest"):
            with dgl_rsc.patch(budget=0.3):
                pass
        assert dgl_rsc.is_patched()
    assert not dgl_rsc.is_patched()


def test_sparse_api_forward_identical_and_layered(dgl):
    import dgl.sparse as dglsp

    torch.manual_seed(0)
    idx = torch.randint(0, 50, (2, 400))
    A = dglsp.spmatrix(idx, torch.rand(400), shape=(50, 50)).coalesce()
    X = torch.randn(50, 6, requires_grad=True)
    ref = [dglsp.spmm(A, X), dglsp.matmul(A, X), A @ X]
    with dgl_rsc.patch(budget=1.0, warmup_steps=0) as rsc:
        got = [dglsp.spmm(A, X), dglsp.matmul(A, X), A @ X]
        assert len(rsc.layers) == 3  # three approximated products: layers 0, 1, 2
        sum(g.sum() for g in got).backward()
        grad = X.grad.clone()
        S = dglsp.spmatrix(idx[:, :5], shape=(50, 50))
        assert isinstance(A @ S, dglsp.SparseMatrix)  # sparse @ sparse passes through
    for r, g in zip(ref, got):
        torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-6)
    X.grad = None
    sum(r.sum() for r in ref).backward()
    torch.testing.assert_close(grad, X.grad, rtol=1e-5, atol=1e-5)


def test_sparse_value_gradient_exact(dgl):
    import dgl.sparse as dglsp

    idx = torch.randint(0, 30, (2, 200))
    val = torch.rand(200, requires_grad=True)
    A = dglsp.spmatrix(idx, val, shape=(30, 30))
    X = torch.randn(30, 4, requires_grad=True)
    G = torch.randn(30, 4)
    dglsp.spmm(A, X).backward(G)
    ref = val.grad.clone()
    val.grad = None
    with dgl_rsc.patch(budget=0.1, warmup_steps=0):
        dglsp.spmm(A, X).backward(G)
    torch.testing.assert_close(val.grad, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["gcn", "sage-mean", "sage-gcn", "weighted-gcn", "gcn2"])
def test_message_passing_forward_identical_and_full_budget_exact(dgl, kind):
    import dgl.nn as dglnn

    torch.manual_seed(0)
    g = dgl.add_self_loop(dgl.to_bidirected(dgl.rand_graph(200, 1500)))
    x = torch.randn(200, 12, requires_grad=True)
    w = torch.rand(g.num_edges()) + 0.1 if kind == "weighted-gcn" else None
    conv = {
        "gcn": lambda: dglnn.GraphConv(12, 8),
        "weighted-gcn": lambda: dglnn.GraphConv(12, 8),
        "sage-mean": lambda: dglnn.SAGEConv(12, 8, "mean"),
        "sage-gcn": lambda: dglnn.SAGEConv(12, 8, "gcn"),
        "gcn2": lambda: dglnn.GCN2Conv(12, 1),
    }[kind]()

    def run():
        if kind == "gcn2":
            return conv(g, x, x)
        return conv(g, x, edge_weight=w) if w is not None else conv(g, x)

    ref = run()
    ref.square().sum().backward()
    ref_grad = x.grad.clone()
    x.grad = None
    with dgl_rsc.patch(budget=1.0, warmup_steps=0) as rsc:
        out = run()
        out.square().sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x.grad, ref_grad, rtol=1e-5, atol=1e-5)
    assert rsc.stats()["layers"][0]["approx_calls"] == 1


def test_eval_under_no_grad_does_no_sampling(dgl):
    import dgl.nn as dglnn

    g = dgl.add_self_loop(dgl.rand_graph(100, 500))
    conv = dglnn.GraphConv(4, 4)
    with dgl_rsc.patch(budget=0.1) as rsc:
        with torch.no_grad():
            conv(g, torch.randn(100, 4))
    assert rsc.layers == []


def test_stock_graphconv_trains_within_one_point_of_exact(dgl):
    import dgl.nn as dglnn

    src, dst, feat, label, train, test = labelled_graph(n=2000, seed=3)
    g = dgl.add_self_loop(dgl.graph((src, dst), num_nodes=2000))

    class GCN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = dglnn.GraphConv(16, 32, activation=F.relu)
            self.c2 = dglnn.GraphConv(32, 4)

        def forward(self, g, x):
            return self.c2(g, self.c1(g, x))

    def train_and_test(use_rsc):
        torch.manual_seed(0)
        model = GCN()
        opt = torch.optim.Adam(model.parameters(), lr=0.02)
        epochs = 60
        ctx = dgl_rsc.patch(budget=0.3, total_steps=epochs) if use_rsc else None
        rsc = ctx.__enter__() if ctx else None
        try:
            for _ in range(epochs):
                loss = F.cross_entropy(model(g, feat)[train], label[train])
                opt.zero_grad()
                loss.backward()
                opt.step()
                if rsc:
                    rsc.step()
        finally:
            if ctx:
                ctx.__exit__(None, None, None)
        with torch.no_grad():
            pred = model(g, feat).argmax(1)
        return float((pred[test] == label[test]).float().mean()), rsc

    exact, _ = train_and_test(False)
    approx, rsc = train_and_test(True)
    assert exact > 0.5  # the task is learnable
    assert abs(approx - exact) <= 0.01, (exact, approx)
    st = rsc.stats()
    # the first conv aggregates the raw features (no grad): only the second is sampled
    assert len(st["layers"]) == 1 and st["visited_fraction"] < 0.7
    assert st["cache_hits"] > st["cache_misses"] > 0
