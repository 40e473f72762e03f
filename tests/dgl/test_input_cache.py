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


# -- a stock dgl.nn.GraphConv inside dgl_rsc.patch() ---------------------------------------------


def _stock_steps(conv, g, x, n, patched, input_dropout=0.0):
    import dgl_rsc

    drop = torch.nn.Dropout(input_dropout)
    out = []
    with dgl_rsc.patch(budget=1.0, total_steps=n) if patched else _nothing() as rsc:
        for _ in range(n):
            conv.zero_grad()
            y = conv(g, drop(x))
            (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
            out.append((y.detach(), conv.weight.grad.clone()))
            if rsc is not None:
                rsc.step()
    return out, (rsc.stats()["cached_input_aggregation"] if rsc is not None else None)


def _nothing():
    import contextlib

    return contextlib.nullcontext()


@pytest.mark.dgl
@pytest.mark.parametrize("dims", [(12, 20), (20, 12)], ids=["aggregates-first", "weight-first"])
def test_patched_stock_graphconv_reuses_its_input_aggregation_bit_for_bit(dims):
    pytest.importorskip("dgl")
    import dgl
    import dgl.nn as dglnn

    gen = torch.Generator().manual_seed(0)
    src, dst = (
        torch.randint(0, 80, (500,), generator=gen),
        torch.randint(0, 80, (500,), generator=gen),
    )
    g = dgl.add_self_loop(dgl.graph((src, dst), num_nodes=80))
    x = torch.randn(80, dims[0])
    torch.manual_seed(0)
    conv = dglnn.GraphConv(*dims)
    stock, _ = _stock_steps(conv, g, x, 3, patched=False)
    patched, counts = _stock_steps(conv, g, x, 3, patched=True)
    for (y, gw), (y0, gw0) in zip(patched, stock):
        assert torch.equal(y, y0)  # the forward: DGL's own kernel, in DGL's order
        if dims[0] < dims[1]:  # no sparse backward: the weight's gradient is DGL's too
            assert torch.equal(gw, gw0)
        else:  # the patch's engine computes A^T dY: the same to rounding
            torch.testing.assert_close(gw, gw0, rtol=1e-5, atol=1e-6)
    # DGL transforms first when in > out: that order is kept, nothing is reused
    assert counts == ({"hits": 1, "builds": 1} if dims[0] < dims[1] else {"hits": 0, "builds": 0})
    _, counts = _stock_steps(conv, g, x, 3, patched=True, input_dropout=0.5)
    assert counts == {"hits": 0, "builds": 0}  # fresh features each step: never reused


def test_a_returned_product_changed_in_place_is_built_again():
    g, x = graph(), torch.randn(80, 12)
    layer = rnn.exact(rnn.GraphConv(12, 12, weight=False, bias=False))  # returns A X itself
    ref = layer(g, x).clone()
    layer(g, x).mul_(0.0)  # the caller changes the product it was handed
    torch.testing.assert_close(layer(g, x), ref)
    assert input_cache_counts(layer)["builds"] == 2


def test_a_layer_with_a_built_cache_pickles_without_it():
    import pickle

    g, x = graph(), torch.randn(80, 12)
    layer = rnn.exact(rnn.GraphConv(12, 5))
    for _ in range(2):
        want = layer(g, x)
    copy = pickle.loads(pickle.dumps(layer))
    assert input_cache_counts(copy)["bytes"] == 0 and input_cache_counts(layer)["bytes"] > 0
    torch.testing.assert_close(copy(g, x), want)


def test_an_int8_layer_reuses_an_fp32_aggregation():
    """INT8 layers use the cache too; the cached product is fp32 (no rounding error kept for
    the run), so the layer's output equals the fp32 layer's where its transform is fp32."""
    from dgl_rsc.int8 import Int8Spec, Int8State

    g, x = graph(), torch.randn(80, 12)
    torch.manual_seed(0)
    layer = rnn.exact(rnn.GraphConv(12, 20))
    fp32 = rnn.exact(rnn.GraphConv(12, 20))
    fp32.load_state_dict(layer.state_dict())
    state = Int8State(Int8Spec(rounding="stochastic", dense="fp32", sparse="int8"))
    layer.rsc_set_int8(state)
    got, want = steps(layer, g, x), steps(fp32, g, x)
    counts = input_cache_counts(layer)
    assert (counts["builds"], counts["hits"]) == (1, 1) and layer.rsc_int8() is state
    # the first call (before the same features came back) aggregated in INT8; then none
    assert state.calls == 1
    assert not torch.allclose(got[0][0], want[0][0], rtol=1e-5, atol=1e-5)
    for (y, grads), (y0, grads0) in zip(got[1:], want[1:]):
        torch.testing.assert_close(y, y0, rtol=1e-5, atol=1e-5)
        for k in grads0:
            torch.testing.assert_close(grads[k], grads0[k], rtol=1e-5, atol=1e-5)
