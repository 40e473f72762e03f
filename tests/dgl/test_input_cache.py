"""The first layer's aggregation computed once per run (dgl_rsc/dgl/nn/input_cache.py): equal
outputs and gradients to the plain path, used only when nothing it reads changes."""

import pytest
import torch

import dgl_rsc.nn as rnn
from dgl_rsc.dgl.nn.input_cache import cache_input_aggregation, input_cache_counts
from dgl_rsc.models.paper import GCN, SAGE
from dgl_rsc.sparse.graph import Graph

pytestmark = pytest.mark.usefixtures("one_thread")

LAYERS = {  # in > out: DGL's order transforms first; in < out: it aggregates first
    "gcn-both-narrowing": lambda: rnn.GraphConv(12, 5),
    "gcn-both-widening": lambda: rnn.GraphConv(12, 20, activation=torch.relu),
    "gcn-right": lambda: rnn.GraphConv(12, 5, norm="right", bias=False),
    "gcn-none": lambda: rnn.GraphConv(12, 5, norm="none"),
    "sage-mean-narrowing": lambda: rnn.SAGEConv(12, 5, "mean"),
    "sage-mean-widening": lambda: rnn.SAGEConv(12, 20, "mean"),
    "sage-gcn": lambda: rnn.SAGEConv(12, 5, "gcn"),
}


def graph(n=80, e=500, seed=0):
    g = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)
    return Graph(src, dst, n).add_self_loop()


def steps(layer, g, x, n=3, **kw):
    """Output and parameter gradients of ``n`` calls on the same inputs."""
    out = []
    for _ in range(n):
        layer.zero_grad()
        y = layer(g, x, **kw)
        (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
        out.append((y.detach(), {k: p.grad.clone() for k, p in layer.named_parameters()}))
    return out


@pytest.mark.parametrize("name", list(LAYERS))
def test_cached_steps_equal_the_plain_path(name):
    g, x = graph(), torch.randn(80, 12)
    torch.manual_seed(0)
    cached = rnn.exact(LAYERS[name]())
    plain = cache_input_aggregation(rnn.exact(LAYERS[name]()), enabled=False)
    plain.load_state_dict(cached.state_dict())
    got, want = steps(cached, g, x), steps(plain, g, x)
    counts = input_cache_counts(cached)
    assert counts == {"layers": 1, "hits": 1, "builds": 1, "bytes": 80 * 12 * 4}
    assert input_cache_counts(plain)["builds"] == 0
    for (y, grads), (y0, grads0) in zip(got, want):
        torch.testing.assert_close(y, y0, rtol=1e-5, atol=1e-5)
        for k in grads0:
            torch.testing.assert_close(grads[k], grads0[k], rtol=1e-5, atol=1e-5)


def test_edge_weights_are_part_of_the_key():
    g, x = graph(), torch.randn(80, 12)
    w = torch.rand(g.num_edges())
    layer = rnn.exact(rnn.GraphConv(12, 5))
    ref = cache_input_aggregation(rnn.exact(rnn.GraphConv(12, 5)), enabled=False)
    ref.load_state_dict(layer.state_dict())
    for _ in range(3):
        layer(g, x, edge_weight=w)
    assert input_cache_counts(layer)["hits"] == 1
    w.mul_(2.0)  # in place: the version counter moves, the cached product is stale
    torch.testing.assert_close(layer(g, x, edge_weight=w), ref(g, x, edge_weight=w))
    assert input_cache_counts(layer)["hits"] == 1
    wg = torch.rand(g.num_edges(), requires_grad=True)  # learned weights: never cached
    for _ in range(3):
        layer(g, x, edge_weight=wg)
    assert input_cache_counts(layer)["hits"] == 1


def test_features_changed_in_place_or_swapped_are_recomputed():
    g, x = graph(), torch.randn(80, 12)
    layer = rnn.exact(rnn.GraphConv(12, 5))
    ref = cache_input_aggregation(rnn.exact(rnn.GraphConv(12, 5)), enabled=False)
    ref.load_state_dict(layer.state_dict())
    for _ in range(3):
        layer(g, x)
    x[3] += 1.0
    torch.testing.assert_close(layer(g, x), ref(g, x))
    g2 = graph(seed=1)  # another graph, same features
    torch.testing.assert_close(layer(g2, x), ref(g2, x))
    assert input_cache_counts(layer)["hits"] == 1


def test_features_that_require_grad_do_not_use_it():
    g = graph()
    x = torch.randn(80, 12, requires_grad=True)
    layer = rnn.exact(rnn.GraphConv(12, 5))
    for _ in range(3):
        layer(g, x).sum().backward()
    assert input_cache_counts(layer) == {"layers": 0, "hits": 0, "builds": 0, "bytes": 0}
    assert x.grad is not None


@pytest.mark.parametrize("model", [GCN, SAGE])
def test_input_dropout_does_not_use_it(model):
    g, x = graph(), torch.randn(80, 12)
    net = rnn.exact(model(12, 3, hidden=8, layers=2, input_dropout=0.5))
    net.train()
    for _ in range(3):
        net(g, x).sum().backward()
    assert input_cache_counts(net)["builds"] == 0
    net.eval()  # evaluation draws no dropout: the same features come back, and are cached
    with torch.no_grad():
        for _ in range(3):
            net(g, x)
    assert input_cache_counts(net)["hits"] == 1


def test_model_training_matches_and_the_controller_reports_it():
    g, x = graph(), torch.randn(80, 12)
    y = torch.randint(0, 3, (80,))
    losses = {}
    for on in (True, False):
        torch.manual_seed(0)
        net = GCN(12, 3, hidden=8, layers=2, dropout=0.0)
        rsc = rnn.attach(net, budget=1.0, total_steps=10)
        cache_input_aggregation(net, enabled=on)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        losses[on] = []
        for _ in range(5):
            loss = torch.nn.functional.cross_entropy(net(g, x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rsc.step()
            losses[on].append(loss.item())
        stats = rsc.stats()["cached_input_aggregation"]
        assert stats == ({"hits": 3, "builds": 1} if on else {"hits": 0, "builds": 0})
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)
