"""What the PyG front end computes once per run (marker ``pyg``): a first layer's aggregation
of the dataset's features (``GCNConv`` then aggregates before its transform, ``SAGEConv``
keeps its order) and ``gcn_norm``'s output while the same graph comes back. Both are exact
levers: outputs and gradients equal PyG's order to 1e-5, at budget 1.0 and with a sampled
backward; each applies only where its conditions hold."""

import copy

import pytest
import torch

import dgl_rsc.pyg as rp

pytestmark = pytest.mark.pyg

N = 60


def data(seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, N, (2, 500), generator=g)
    return torch.randn(N, 12, generator=g), ei, torch.rand(500, generator=g) + 0.1


class Net(torch.nn.Module):
    def __init__(self, kind, drop_input=False):
        import torch_geometric.nn as tgnn

        super().__init__()
        conv = {"gcn": tgnn.GCNConv, "sage": tgnn.SAGEConv}[kind]
        self.c1, self.c2 = conv(12, 16), conv(16, 4)
        self.drop_input = drop_input

    def forward(self, x, ei):
        if self.drop_input:
            x = torch.nn.functional.dropout(x, 0.3, self.training)
        return self.c2(self.c1(x, ei).relu(), ei)


def train(net, rsc, x, ei, steps=6, seed=0):
    """``[(logits, {param: grad})]`` per step of plain SGD."""
    torch.manual_seed(seed)
    out = []
    for _ in range(steps):
        logits = net(x, ei)
        net.zero_grad()
        logits.square().mean().backward()
        out.append((logits.detach(), {k: p.grad.clone() for k, p in net.named_parameters()}))
        with torch.no_grad():
            for p in net.parameters():
                p -= 0.1 * p.grad
        rsc.step()
    return out


def assert_same(got, ref):
    for step, ((a, ga), (b, gb)) in enumerate(zip(got, ref)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"step {step} logits")
        for k in gb:
            torch.testing.assert_close(ga[k], gb[k], rtol=1e-5, atol=1e-5,
                                       msg=f"step {step} grad of {k}")  # fmt: skip


KW = dict(warmup_steps=1, cache_interval=2, tune_interval=2, min_width=1, total_steps=100)


# a sampled backward compares only for SAGE: a reused GCN layer has no sampled product left
@pytest.mark.parametrize("kind, budget", [("gcn", 1.0), ("sage", 1.0), ("sage", 0.4)])
def test_patch_reuses_the_first_layers_aggregation_with_the_same_numbers(kind, budget):
    x, ei, _ = data()
    torch.manual_seed(0)
    plain = Net(kind)
    reused = copy.deepcopy(plain)
    with rp.patch(budget=budget, cache_inputs=False, **KW) as rsc:
        ref = train(plain, rsc, x, ei)
        ref_stats = rsc.stats()
    with rp.patch(budget=budget, **KW) as rsc:
        got = train(reused, rsc, x, ei)
        stats = rsc.stats()
    assert_same(got, ref)
    # built the second time the same x came, then reused at every later step
    assert stats["cached_input_aggregation"] == {"builds": 1, "hits": 4}
    assert ref_stats["cached_input_aggregation"] == {"builds": 0, "hits": 0}
    # GCN: the first layer has no backward product any more (SAGE never had one)
    assert len(stats["layers"]) == 1 and len(ref_stats["layers"]) == (2 if kind == "gcn" else 1)
    if budget < 1.0:
        assert stats["visited_fraction"] < 0.9


def test_a_reused_gcn_layer_leaves_the_budget_to_the_sampled_ones():
    x, ei, _ = data()
    torch.manual_seed(0)
    with rp.patch(budget=0.4, **KW) as rsc:
        train(Net("gcn"), rsc, x, ei)
    stats = rsc.stats()
    assert stats["cached_input_aggregation"] == {"builds": 1, "hits": 4}
    (layer,) = stats["layers"]  # the second conv's product alone, sampled
    assert layer["approx_calls"] > 0 and stats["visited_fraction"] < 0.9


@pytest.mark.parametrize("kind", ["gcn", "sage"])
def test_drop_in_convs_reuse_it_too_and_cache_input_aggregation_turns_it_off(kind):
    x, ei, _ = data(1)
    torch.manual_seed(0)
    reused = rp.convert(Net(kind))
    plain = copy.deepcopy(reused)
    rp.cache_input_aggregation(plain, False)
    ref = train(plain, rp.attach(plain, budget=1.0, **KW), x, ei)
    ctl = rp.attach(reused, budget=1.0, **KW)
    got = train(reused, ctl, x, ei)
    assert_same(got, ref)
    assert ctl.stats()["cached_input_aggregation"] == {"builds": 1, "hits": 4}
    assert reused.c1._rsc_input_cache.nbytes() == N * 12 * 4
    assert plain.c1._rsc_input_cache.nbytes() == 0


def test_sparse_adjacency_reuses_it_like_edge_index():
    from torch_geometric.utils import to_torch_csc_tensor

    x, ei, _ = data(2)
    ei = torch.unique(ei, dim=1)  # no parallel edges: the sparse tensor would merge them
    adj = to_torch_csc_tensor(ei, size=(N, N)).t()
    stats = {}
    for name, graph in (("edge_index", ei), ("csr", adj)):
        torch.manual_seed(0)
        with rp.patch(budget=0.4, **KW) as rsc:
            train(Net("gcn"), rsc, x, graph)
        stats[name] = rsc.stats()
    assert stats["csr"]["cached_input_aggregation"] == {"builds": 1, "hits": 4}
    assert stats["csr"]["nnz_exact"] == stats["edge_index"]["nnz_exact"]


@pytest.mark.parametrize("why", ["input dropout", "features need a gradient"])
def test_nothing_is_reused_where_the_input_changes_or_needs_a_gradient(why):
    x, ei, _ = data()
    torch.manual_seed(0)
    net = Net("gcn", drop_input=why == "input dropout")
    if why != "input dropout":
        x = x.clone().requires_grad_(True)
    with rp.patch(budget=0.4, **KW) as rsc:
        train(net, rsc, x, ei)
    stats = rsc.stats()
    assert stats["cached_input_aggregation"] == {"builds": 0, "hits": 0}
    if why == "features need a gradient":  # PyG's order: both layers sample their backward
        assert len(stats["layers"]) == 2 and x.grad is not None


def test_a_changed_graph_or_feature_tensor_is_aggregated_afresh():
    x, ei, _ = data()
    torch.manual_seed(0)
    net = Net("gcn")
    with rp.patch(budget=1.0, **KW) as rsc:
        train(net, rsc, x, ei, steps=3)
        ei[0, :50] = ei[0, 50:100].clone()  # in place: a new graph, same tensor
        x.mul_(2.0)
        net.eval()
        with torch.no_grad():
            got = net(x, ei)
    with torch.no_grad():
        ref = net(x, ei)  # stock PyG on the changed inputs
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_gcn_norm_runs_once_per_graph_and_afresh_for_weights_that_need_a_gradient(monkeypatch):
    import torch_geometric.nn.conv.gcn_conv as gcn_mod

    calls = []
    real = gcn_mod.gcn_norm

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(gcn_mod, "gcn_norm", counting)
    x, ei, w = data()
    torch.manual_seed(0)
    net = Net("gcn")
    with rp.patch(budget=0.5, **KW) as rsc:
        train(net, rsc, x, ei, steps=4)
    assert len(calls) == 1  # both layers, four steps: one normalization of the same graph

    calls.clear()
    w = w.requires_grad_(True)
    stock = copy.deepcopy(net.c1)
    conv = copy.deepcopy(net.c1)
    with rp.patch(budget=1.0, warmup_steps=0) as rsc:
        for _ in range(2):
            conv(x, ei, w).sum().backward()
            rsc.step()
    assert len(calls) == 2  # the gradient flows through the normalization: every call
    got = w.grad.clone()
    w.grad = None
    for _ in range(2):
        stock(x, ei, w).sum().backward()
    torch.testing.assert_close(got, w.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["gcn", "sage"])
def test_the_launchers_pyg_drop_in_models_fuse_relu_and_dropout(monkeypatch, name):
    """Over the drop-ins the GCN/SAGE stack runs ReLU and dropout in the one-pass epilogue
    (torch's dropout is 11x slower on torch 2.15's CPU); equal to op by op at the same
    masks; the stock convs (the stock PyG baseline) keep torch's dropout."""
    pytest.importorskip("numba")
    from dgl_rsc.models import build_model, fused
    from dgl_rsc.sparse import epilogue as E

    x, ei, _ = data()
    torch.manual_seed(0)
    model = build_model(name, 12, 4, engine="pyg", hidden=16, layers=3, dropout=0.0)
    ref = copy.deepcopy(model)
    ref.fused_epilogue = False
    stock = build_model(name, 12, 4, engine="pyg_patch", hidden=16, layers=3, dropout=0.0)
    assert fused.applies(model, ei, x) and not fused.applies(ref, ei, x)
    assert not fused.applies(stock, ei, x)
    for m in (model, ref):
        rp.exact(m)
    out, out_ref = model(ei, x), ref(ei, x)
    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-6)
    out.square().sum().backward()
    out_ref.square().sum().backward()
    for (k, a), b in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6, msg=k)
    model.dropout.p = 0.5

    real_dropout = torch.nn.functional.dropout

    def refused(x, p=0.5, *args, **kwargs):
        assert p == 0.0, "torch's dropout ran"  # the input dropout (p=0) may
        return real_dropout(x, p, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "dropout", refused)
    seen = []
    real = E.bias_act_dropout
    monkeypatch.setattr(fused, "bias_act_dropout",
                        lambda *a, **k: seen.append(k["p"]) or real(*a, **k))  # fmt: skip
    model(ei, x)
    assert seen == [0.5, 0.5]
