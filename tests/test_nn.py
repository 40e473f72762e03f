"""Drop-in convolutions: DGL parity, the DGL-free Graph path, convert() and attach()."""

import pytest
import torch

import dgl_rsc
import dgl_rsc.nn as rnn
from dgl_rsc.graph import Graph

from .conftest import requires_dgl


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
}


def call(layer, g, x, w=None):
    if type(layer).__name__ == "GCN2Conv":
        return layer(g, x, x, edge_weight=w)
    return layer(g, x, edge_weight=w)


@pytest.mark.parametrize("name", list(LAYERS))
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "edge_weight"])
def test_native_graph_matches_dense_reference(name, weighted):
    src, dst, n = ring_graph()
    g = Graph(src, dst, n)
    torch.manual_seed(0)
    layer = LAYERS[name]()
    rnn.attach(layer_model(layer), budget=1.0, warmup_steps=0)
    in_dim = 4 if "wide" in name else 10
    x = torch.randn(n, in_dim, requires_grad=True)
    w = torch.rand(src.numel()) + 0.1 if weighted else None
    out = call(layer, g, x, w)
    assert out.shape == (n, 10 if name == "gcn2" else 6)
    out.square().sum().backward()
    gx = x.grad.clone()
    # same layer, exact backward: gradients must match at budget 1.0
    x.grad = None
    rnn.attach(layer_model(layer), budget=1.0, warmup_steps=10)
    call(layer, g, x, w).square().sum().backward()
    torch.testing.assert_close(gx, x.grad, rtol=1e-5, atol=1e-5)


def layer_model(layer):
    m = torch.nn.Module()
    m.layer = layer
    return m


@requires_dgl
@pytest.mark.dgl
@pytest.mark.parametrize("name", list(LAYERS))
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "edge_weight"])
def test_same_output_as_dgl_for_same_weights(name, weighted):
    import dgl
    import dgl.nn as dglnn

    src, dst, n = ring_graph()
    dg = dgl.graph((src, dst), num_nodes=n)
    ours = LAYERS[name]()
    kind = type(ours).__name__
    if kind == "GraphConv":
        theirs = dglnn.GraphConv(
            ours._in_feats, ours._out_feats, norm=ours._norm, bias=ours.bias is not None
        )
    elif kind == "SAGEConv":
        theirs = dglnn.SAGEConv(ours._in_src_feats, ours._out_feats, ours._aggre_type)
    else:
        theirs = dglnn.GCN2Conv(10, 2)
    theirs.load_state_dict(ours.state_dict())
    rnn.attach(layer_model(ours), budget=1.0, warmup_steps=0)
    x = torch.randn(n, 4 if "wide" in name else 10, requires_grad=True)
    w = torch.rand(src.numel()) + 0.1 if weighted else None
    ref = call(theirs, dg, x, w)
    ref.square().sum().backward()
    gref = x.grad.clone()
    x.grad = None
    for graph in (dg, Graph(src, dst, n)):  # DGL graph and DGL-free graph
        out = call(ours, graph, x, w)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        out.square().sum().backward()
        torch.testing.assert_close(x.grad, gref, rtol=1e-4, atol=1e-5)
        x.grad = None


@requires_dgl
@pytest.mark.dgl
def test_convert_swaps_convs_and_keeps_weights():
    import dgl
    import dgl.nn as dglnn

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = torch.nn.ModuleList(
                [
                    dglnn.GraphConv(8, 16),
                    dglnn.SAGEConv(16, 16, "mean"),
                    dglnn.SAGEConv(16, 16, "pool"),
                ]
            )
            self.lin = torch.nn.Linear(16, 3)

        def forward(self, g, x):
            for c in self.convs:
                x = torch.relu(c(g, x))
            return self.lin(x)

    src, dst, n = ring_graph()
    g = dgl.graph((src, dst), num_nodes=n)
    net = Net()
    x = torch.randn(n, 8)
    ref = net(g, x)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    assert dgl_rsc.nn.convert(net) is net
    assert isinstance(net.convs[0], rnn.GraphConv) and isinstance(net.convs[1], rnn.SAGEConv)
    assert isinstance(net.convs[2], dglnn.SAGEConv)  # pool: nothing to approximate
    for k, v in net.state_dict().items():
        torch.testing.assert_close(v, state[k])
    rsc = rnn.attach(net, budget=0.5)
    torch.testing.assert_close(net(g, x), ref, rtol=1e-5, atol=1e-5)
    assert [layer._rsc_index for layer in rnn.rsc_layers(net)] == [0, 1]
    assert all(layer.rsc_controller() is rsc for layer in rnn.rsc_layers(net))


def test_unattached_layer_runs_rsc_with_a_private_controller():
    src, dst, n = ring_graph(n=200, extra=3000)
    g = Graph(src, dst, n).add_self_loop()
    conv = rnn.GraphConv(8, 8)
    x = torch.randn(n, 8, requires_grad=True)
    for _ in range(6):
        conv(g, x).sum().backward()
    ctl = conv.rsc_controller()
    assert ctl.step_count == 5  # one step per training forward after the first
    st = ctl.stats()
    assert st["layers"][0]["approx_calls"] >= 1 and st["visited_fraction"] < 1.0


def test_constructor_and_forward_errors_say_how_to_fix():
    with pytest.raises(ValueError, match="Invalid norm value"):
        rnn.GraphConv(3, 3, norm="sym")
    with pytest.raises(ValueError, match="pool"):
        rnn.SAGEConv(3, 3, "pool")
    g = Graph(torch.tensor([0, 1]), torch.tensor([1, 0]), 3)  # node 2 has no in-edge
    with pytest.raises(ValueError, match="add_self_loop"):
        rnn.GraphConv(3, 3)(g, torch.randn(3, 3))
    rnn.GraphConv(3, 3, allow_zero_in_degree=True)(g, torch.randn(3, 3))
    with pytest.raises(ValueError, match="External weight"):
        rnn.GraphConv(3, 3, allow_zero_in_degree=True)(
            g, torch.randn(3, 3), weight=torch.randn(3, 3)
        )
    with pytest.raises(ValueError, match="edge_weight has"):
        rnn.SAGEConv(3, 3, "mean")(g, torch.randn(3, 3), edge_weight=torch.ones(5))
    with pytest.raises(ValueError, match="no dgl_rsc layers"):
        rnn.attach(torch.nn.Linear(2, 2))


def test_reset_parameters_clears_cached_sample_and_repr():
    src, dst, n = ring_graph()
    g = Graph(src, dst, n).add_self_loop()
    conv = rnn.GraphConv(6, 6)
    rsc = rnn.attach(layer_model(conv), budget=0.3, warmup_steps=0)
    conv(g, torch.randn(n, 6, requires_grad=True)).sum().backward()
    assert rsc.layers[0]._sample is not None
    conv.reset_parameters()
    assert rsc.layers[0]._sample is None
    assert "in=6, out=6, normalization=both" in repr(conv)


def test_exact_mode_does_no_sampling_and_matches_dense():
    src, dst, n = ring_graph(n=100, extra=800)
    g = Graph(src, dst, n).add_self_loop()
    model = layer_model(rnn.GraphConv(5, 5, bias=False))
    rnn.exact(model)
    x = torch.randn(n, 5, requires_grad=True)
    model.layer(g, x).sum().backward()
    assert model.layer._rsc_ctl is None  # no controller was created
    A = g.adj.to_dense()
    deg_out = A.sum(0).clamp(min=1)
    deg_in = A.sum(1).clamp(min=1)
    P = deg_in.rsqrt()[:, None] * A * deg_out.rsqrt()[None, :]
    w = model.layer.weight.detach()
    expect = P.t() @ torch.ones(n, 5) @ w.t()
    torch.testing.assert_close(x.grad, expect, rtol=1e-5, atol=1e-5)
    rsc = rnn.attach(model, budget=0.2)
    model.layer(g, x).sum().backward()
    assert rsc.layers and model.layer._rsc_exact is False
