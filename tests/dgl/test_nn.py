"""Drop-in convolutions: the DGL-free Graph path, slots, attach/exact/unattached, convert(),
errors. Parity with DGL over the grid of options is in test_conformance.py."""

import pickle
import sys
import warnings

import pytest
import torch

import dgl_rsc.nn as rnn
from dgl_rsc.dgl.nn.errors import layer_error
from dgl_rsc.sparse.graph import Graph

from ..conftest import BLOCK_DGL, requires_dgl
from ..proc import run as run_cmd

pytestmark = pytest.mark.usefixtures("one_thread")


def ring_graph(n=60, extra=240, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.cat([torch.arange(n), torch.randint(0, n, (extra,), generator=g)])
    dst = torch.cat([(torch.arange(n) + 1) % n, torch.randint(0, n, (extra,), generator=g)])
    return src, dst, n


LAYERS = {
    "gcn-both": lambda: rnn.GraphConv(10, 6),
    "gcn-right-wide": lambda: rnn.GraphConv(4, 6, norm="right"),
    "gcn-left": lambda: rnn.GraphConv(10, 6, norm="left", bias=False),
    "gcn-none": lambda: rnn.GraphConv(10, 6, norm="none"),
    "sage-mean": lambda: rnn.SAGEConv(10, 6, "mean"),
    "sage-gcn": lambda: rnn.SAGEConv(10, 6, "gcn"),
    "sage-mean-wide": lambda: rnn.SAGEConv(4, 6, "mean"),
    "gcn2": lambda: rnn.GCN2Conv(10, 2),
    "cheb": lambda: rnn.ChebConv(10, 6, 3),
}


def in_width(name):
    return 4 if "wide" in name else 10


def call(layer, g, x, w=None):
    kind = type(layer).__name__
    if kind == "GCN2Conv":
        return layer(g, x, x, edge_weight=w)
    if kind == "ChebConv":
        return layer(g, x, lambda_max=[2.0])
    return layer(g, x, edge_weight=w)


def holder(*layers):
    return torch.nn.ModuleList(layers)


def backward(layer, g, x, w=None):
    x = x.detach().clone().requires_grad_(True)
    out = call(layer, g, x, w)
    out.square().sum().backward()
    return out.detach(), x.grad


@pytest.mark.parametrize("name", list(LAYERS))
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "edge_weight"])
def test_full_budget_equals_exact_backward(name, weighted):
    src, dst, n = ring_graph()
    g = Graph(src, dst, n)
    torch.manual_seed(0)
    layer = LAYERS[name]()
    x = torch.randn(n, in_width(name))
    w = torch.rand(src.numel()) + 0.1 if weighted and name != "cheb" else None
    rsc = rnn.attach(holder(layer), budget=1.0, warmup_steps=0)
    out, grad = backward(layer, g, x, w)
    assert sum(s.stats.approx_calls for s in rsc.layers) == layer.rsc_products
    rnn.exact(holder(layer))
    out_exact, grad_exact = backward(layer, g, x, w)
    assert torch.equal(out, out_exact)  # the forward never depends on the sampler
    torch.testing.assert_close(grad, grad_exact, rtol=1e-5, atol=1e-6)


def dense_reference(name, layer, A, x, src, dst):
    """The layer's documented formula on a dense ``(N, N)`` adjacency ``A[dst, src]`` (edge
    weights, and parallel edges, summed into ``A``), in fp64: no DGL involved."""
    n = A.shape[0]
    deg = {k: torch.bincount(v, minlength=n).double() for k, v in (("out", src), ("in", dst))}
    out_deg, in_deg = deg["out"].clamp(min=1), deg["in"].clamp(min=1)
    if name.startswith("gcn-"):
        norm = layer._norm
        src_scale = {"both": out_deg.rsqrt(), "left": out_deg.reciprocal()}.get(norm)
        dst_scale = {"both": in_deg.rsqrt(), "right": in_deg.reciprocal()}.get(norm)
        h = x if src_scale is None else x * src_scale[:, None]
        h = A @ h @ layer.weight.double()
        if dst_scale is not None:
            h = h * dst_scale[:, None]
        return h if layer.bias is None else h + layer.bias.double()
    neigh = A @ x
    if name == "sage-gcn":
        h = (neigh + x) / (deg["in"] + 1)[:, None]
        return h @ layer.fc_neigh.weight.double().t() + layer.bias.double()
    h = neigh / in_deg[:, None]
    return (
        x @ layer.fc_self.weight.double().t()
        + layer.fc_self.bias.double()
        + h @ layer.fc_neigh.weight.double().t()
    )


@pytest.mark.parametrize("name", [n for n in LAYERS if n.startswith(("gcn-", "sage-"))])
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "edge_weight"])
def test_dgl_free_graph_matches_a_dense_reference(name, weighted):
    """Without DGL (the GPU machine has none), the native Graph path is checked against the
    layer's formula on a dense adjacency: outputs and input gradients."""
    src, dst, n = ring_graph()
    torch.manual_seed(0)
    layer = LAYERS[name]().double()
    x = torch.randn(n, in_width(name), dtype=torch.float64)
    w = torch.rand(src.numel(), dtype=torch.float64) + 0.1 if weighted else None
    A = torch.zeros(n, n, dtype=torch.float64)
    A.index_put_(
        (dst, src),
        torch.ones(src.numel(), dtype=torch.float64) if w is None else w,
        accumulate=True,
    )
    rnn.exact(holder(layer))
    out, grad = backward(layer, Graph(src, dst, n), x, w)
    x_ref = x.clone().requires_grad_(True)
    ref = dense_reference(name, layer, A, x_ref, src, dst)
    ref.square().sum().backward()
    torch.testing.assert_close(out, ref.detach(), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(grad, x_ref.grad, rtol=1e-10, atol=1e-10)


@requires_dgl
@pytest.mark.dgl
@pytest.mark.parametrize("name", list(LAYERS))
def test_dgl_free_graph_is_bit_identical_to_dglgraph(name):
    """``Graph`` lists in-edges in edge-id order like DGL: same sums, same order."""
    import dgl

    src, dst, n = ring_graph()
    torch.manual_seed(0)
    layer = LAYERS[name]()
    x = torch.randn(n, in_width(name))
    w = torch.rand(src.numel()) + 0.1 if name != "cheb" else None
    rnn.exact(holder(layer))
    out_g, grad_g = backward(layer, Graph(src, dst, n), x, w)
    out_d, grad_d = backward(layer, dgl.graph((src, dst), num_nodes=n), x, w)
    assert torch.equal(out_g, out_d)
    assert torch.equal(grad_g, grad_d)


def test_per_feature_edge_weights_are_exact_and_take_no_slot():
    src, dst, n = ring_graph(n=20, extra=60)
    g = Graph(src, dst, n)
    torch.manual_seed(0)
    conv = rnn.GraphConv(3, 5, norm="right", bias=False)  # aggregates 3 features, then W
    rsc = rnn.attach(holder(conv), budget=0.5, warmup_steps=0)
    x = torch.randn(n, 3, requires_grad=True)
    w = torch.rand(src.numel(), 3, requires_grad=True)
    out = conv(g, x, edge_weight=w)
    A = torch.zeros(n, n, 3).index_put_((dst, src), w.detach(), accumulate=True)
    deg = torch.bincount(dst, minlength=n).clamp(min=1).to(x.dtype)
    expect = torch.einsum("vuk,uk->vk", A, x.detach()) @ conv.weight.detach() / deg[:, None]
    torch.testing.assert_close(out, expect, rtol=1e-5, atol=1e-6)
    out.sum().backward()
    assert x.grad is not None and w.grad is not None and rsc.layers == []
    # (E, 1) is one weight per edge: the approximated product
    conv(g, x, edge_weight=w[:, :1]).sum().backward()
    assert len(rsc.layers) == 1 and rsc.layers[0].stats.approx_calls == 1


def test_layers_declare_products_and_get_consecutive_slots():
    src, dst, n = ring_graph(n=80, extra=400)
    g = Graph(src, dst, n).add_self_loop()
    model = holder(rnn.GraphConv(8, 8), rnn.ChebConv(8, 8, 4), rnn.SAGEConv(8, 4, "mean"))
    assert [m.rsc_products for m in model] == [1, 3, 1]
    rsc = rnn.attach(model, budget=0.3, warmup_steps=0)
    assert [list(m.rsc_slots()) for m in model] == [[0], [1, 2, 3], [4]]
    x = torch.randn(n, 8, requires_grad=True)
    model[2](g, model[1](g, model[0](g, x), lambda_max=[2.0])).sum().backward()
    stats = rsc.stats()["layers"]
    assert [s["approx_calls"] for s in stats] == [1] * 5
    assert stats[1]["visited_fraction"] < 1.0  # a ChebConv product was sampled
    with pytest.raises(IndexError, match="rsc_products=1"):
        model[0]._aggregate(g, x, slot=1)
    for i in model[1].rsc_slots():
        assert rsc.layers[i]._sample is not None
    model[1].reset_parameters()  # clears every slot of the layer, and only those
    assert all(rsc.layers[i]._sample is None for i in model[1].rsc_slots())
    assert rsc.layers[0]._sample is not None and rsc.layers[4]._sample is not None
    assert rnn.ChebConv(8, 8, 1).rsc_products == 0


def test_unattached_layer_is_exact_and_warns_once_per_layer():
    src, dst, n = ring_graph(n=100, extra=500)
    g = Graph(src, dst, n).add_self_loop()
    torch.manual_seed(0)
    conv = rnn.GraphConv(8, 8)
    x = torch.randn(n, 8)
    with pytest.warns(UserWarning, match=r"not attached.*dgl_rsc\.nn\.attach\(model, budget="):
        out, grad = backward(conv, g, x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second training forward does not warn again
        backward(conv, g, x)
        with torch.no_grad():  # nor does evaluation
            rnn.GraphConv(8, 8)(g, x)
    assert conv.rsc_controller() is None  # no private controller, no sampling
    rnn.exact(holder(conv))
    out_exact, grad_exact = backward(conv, g, x)
    assert torch.equal(out, out_exact) and torch.equal(grad, grad_exact)
    with pytest.warns(UserWarning, match="ChebConv is not attached"):
        backward(rnn.ChebConv(8, 8, 2), g, x)


def test_attach_and_exact_modes():
    src, dst, n = ring_graph(n=100, extra=800)
    g = Graph(src, dst, n).add_self_loop()
    model = holder(rnn.GraphConv(5, 5, bias=False))
    rnn.exact(model)
    x = torch.randn(n, 5, requires_grad=True)
    model[0](g, x).sum().backward()
    assert model[0].rsc_controller() is None
    A = g.adj.to_dense()
    P = A.sum(1).clamp(min=1).rsqrt()[:, None] * A * A.sum(0).clamp(min=1).rsqrt()[None, :]
    expect = P.t() @ torch.ones(n, 5) @ model[0].weight.detach().t()
    torch.testing.assert_close(x.grad, expect, rtol=1e-5, atol=1e-5)
    rsc = rnn.attach(model, budget=0.2)
    model[0](g, x).sum().backward()
    assert rsc.layers and model[0].rsc_controller() is rsc
    with pytest.raises(TypeError, match="not both"):
        rnn.attach(model, rsc, budget=0.5)  # as dgl_rsc.patch
    assert rnn.attach(model, rsc) is rsc
    with pytest.raises(ValueError, match="no dgl_rsc layers"):
        rnn.attach(torch.nn.Linear(2, 2))


def test_errors_say_how_to_fix_and_are_layer_errors():
    with pytest.raises(rnn.RSCLayerError, match="Invalid norm value"):
        rnn.GraphConv(3, 3, norm="sym")
    with pytest.raises(ValueError, match="pool"):
        rnn.SAGEConv(3, 3, "pool")
    with pytest.raises(rnn.RSCLayerError, match="at least 1"):
        rnn.ChebConv(3, 3, 0)
    g = Graph(torch.tensor([0, 1]), torch.tensor([1, 0]), 3)  # node 2 has no in-edge
    with pytest.raises(rnn.RSCLayerError, match="add_self_loop"):
        rnn.GraphConv(3, 3)(g, torch.randn(3, 3))
    rnn.GraphConv(3, 3, allow_zero_in_degree=True)(g, torch.randn(3, 3))
    conv = rnn.GraphConv(3, 3, allow_zero_in_degree=True)
    with pytest.raises(rnn.RSCLayerError, match="External weight"):
        conv(g, torch.randn(3, 3), weight=torch.randn(3, 3))
    with pytest.raises(rnn.RSCLayerError, match="edge_weight has 5 entries"):
        rnn.SAGEConv(3, 3, "mean")(g, torch.randn(3, 3), edge_weight=torch.ones(5))
    with pytest.raises(rnn.RSCLayerError, match=r"shape \(4, 3\).*3 source nodes"):
        conv(g, torch.randn(4, 3))
    with pytest.raises(rnn.RSCLayerError, match="float64"):
        conv(g, torch.randn(3, 3), edge_weight=torch.ones(2, dtype=torch.float64))
    err = pickle.loads(pickle.dumps(layer_error("boom")))
    assert isinstance(err, rnn.RSCLayerError) and str(err) == "boom"


@requires_dgl
@pytest.mark.dgl
def test_layer_errors_are_dgl_errors_when_dgl_is_installed():
    import dgl

    g = Graph(torch.tensor([0]), torch.tensor([1]), 2)
    with pytest.raises(dgl.DGLError) as exc:
        rnn.GraphConv(2, 2)(g, torch.randn(2, 2))
    assert isinstance(exc.value, (ValueError, rnn.RSCLayerError))
    assert isinstance(exc.value, rnn.RSCLayerError) and isinstance(exc.value, ValueError)


def test_layer_errors_need_no_dgl():
    code = BLOCK_DGL + (
        "import torch, dgl_rsc.nn as rnn\n"
        "from dgl_rsc.sparse.graph import Graph\n"
        "g = Graph(torch.tensor([0]), torch.tensor([1]), 2)\n"
        "try:\n"
        "    rnn.GraphConv(2, 2)(g, torch.ones(2, 2))\n"
        "except ValueError as exc:\n"
        "    assert type(exc) is rnn.RSCLayerError, type(exc).__mro__\n"
        "    print('ok', type(exc).__name__)\n"
    )
    out = run_cmd([sys.executable, "-c", code], timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok RSCLayerError", out.stderr


@requires_dgl
@pytest.mark.dgl
def test_convert_swaps_convs_keeps_parameters_and_attach_orders_slots():
    import dgl
    import dgl.nn as dglnn

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = torch.nn.ModuleList(
                [
                    dglnn.GraphConv(8, 16),
                    dglnn.ChebConv(16, 16, 3),
                    dglnn.SAGEConv(16, 16, "mean"),
                    dglnn.SAGEConv(16, 16, "pool"),
                ]
            )
            self.lin = torch.nn.Linear(16, 3)

        def forward(self, g, x):
            for c in self.convs:
                x = (
                    c(g, x, lambda_max=[2.0])
                    if isinstance(c, (dglnn.ChebConv, rnn.ChebConv))
                    else c(g, x)
                )
            return self.lin(torch.relu(x))  # fmt: skip

    src, dst, n = ring_graph()
    g = dgl.graph((src, dst), num_nodes=n)
    net = Net()
    x = torch.randn(n, 8)
    ref = net(g, x)
    assert rnn.convert(net) is net
    kinds = [type(c) for c in net.convs]
    assert kinds[:3] == [rnn.GraphConv, rnn.ChebConv, rnn.SAGEConv]
    assert kinds[3] is dglnn.SAGEConv  # pool: nothing to approximate
    rsc = rnn.attach(net, budget=0.5)
    assert torch.equal(net(g, x), ref)
    assert [list(layer.rsc_slots()) for layer in rnn.rsc_layers(net)] == [[0], [1, 2], [3]]
    assert all(layer.rsc_controller() is rsc for layer in rnn.rsc_layers(net))
    with pytest.raises(TypeError, match="lone conv"):
        rnn.convert(dglnn.GraphConv(2, 2))

    class Custom(dglnn.GraphConv):  # a subclass may change forward: left alone
        pass

    model = holder(Custom(2, 2))
    assert type(rnn.convert(model)[0]) is Custom


def test_reset_parameters_and_repr():
    src, dst, n = ring_graph()
    g = Graph(src, dst, n).add_self_loop()
    conv = rnn.GraphConv(6, 6)
    rsc = rnn.attach(holder(conv), budget=0.3, warmup_steps=0)
    conv(g, torch.randn(n, 6, requires_grad=True)).sum().backward()
    assert rsc.layers[0]._sample is not None
    conv.reset_parameters()
    assert rsc.layers[0]._sample is None
    assert "in=6, out=6, normalization=both" in repr(conv)
    assert "k=3" in repr(rnn.ChebConv(2, 2, 3))


def test_docstring_examples_run():
    import doctest

    import dgl_rsc.sparse.graph
    from dgl_rsc.dgl.nn import chebconv, errors, gcn2conv, graphconv, messages, sageconv

    for module in (errors, messages, graphconv, sageconv, gcn2conv, chebconv, dgl_rsc.sparse.graph):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__
