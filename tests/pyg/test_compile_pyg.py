"""Stock PyG models compiled inside ``dgl_rsc.pyg.patch`` (markers ``pyg`` and ``compile``):
no graph break in dgl_rsc (a stock GCN breaks five times in PyG's own ``gcn_norm``; inside the
patch its normalization is one custom operator), and the compiled model computes what the
eager one does, outputs and gradients to 1e-5, exactly and with a sampled backward."""

import copy

import pytest
import torch

import dgl_rsc.pyg as rp

pytestmark = [pytest.mark.pyg, pytest.mark.compile]

N = 200


def data(seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, N, (2, 1600), generator=g)
    return torch.randn(N, 16, generator=g), ei, torch.randint(0, 4, (N,), generator=g)


class Net(torch.nn.Module):
    def __init__(self, kind):
        import torch_geometric.nn as tgnn

        super().__init__()
        conv = {"gcn": tgnn.GCNConv, "sage": tgnn.SAGEConv}[kind]
        self.c1, self.c2 = conv(16, 32), conv(32, 4)

    def forward(self, x, ei):
        return self.c2(self.c1(x, ei).relu(), ei)


@pytest.mark.parametrize("kind", ["gcn", "sage"])
def test_patched_pyg_model_traces_without_graph_breaks(kind):
    x, ei, _ = data()
    torch.manual_seed(0)
    net = Net(kind)
    with rp.patch(budget=0.3, warmup_steps=0, min_width=1, total_steps=100) as rsc:
        torch._dynamo.reset()
        explanation = torch._dynamo.explain(net)(x, ei)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    assert len(rsc.layers) == (2 if kind == "gcn" else 1)  # SAGE's first aggregates x


def train(net, fn, rsc, x, ei, y, steps):
    out = []
    for _ in range(steps):
        net.train()
        logits = fn(x, ei)
        net.zero_grad()
        torch.nn.functional.cross_entropy(logits, y).backward()
        out.append((logits.detach(), {k: p.grad.clone() for k, p in net.named_parameters()}))
        with torch.no_grad():
            for p in net.parameters():
                p -= 0.05 * p.grad
        rsc.step()
    return out


@pytest.mark.parametrize("kind", ["gcn", "sage"])
@pytest.mark.parametrize("budget", [1.0, 0.3])
def test_compiled_patched_equals_eager_patched(kind, budget):
    x, ei, y = data()
    torch.manual_seed(0)
    eager = Net(kind)
    compiled = copy.deepcopy(eager)
    kw = dict(budget=budget, warmup_steps=2, cache_interval=10, min_width=1, total_steps=100)
    # compiled code aggregates in PyG's order (no input cache): eager does too, to compare
    with rp.patch(cache_inputs=False, **kw) as rsc:
        ref = train(eager, eager, rsc, x, ei, y, 6)
        ref_stats = rsc.stats()
    with rp.patch(**kw) as rsc:
        torch._dynamo.reset()
        got = train(compiled, torch.compile(compiled), rsc, x, ei, y, 6)
        stats = rsc.stats()
    for step, ((a, ga), (b, gb)) in enumerate(zip(got, ref)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"step {step} logits")
        for k in gb:
            torch.testing.assert_close(ga[k], gb[k], rtol=1e-5, atol=1e-5,
                                       msg=f"step {step} grad of {k}")  # fmt: skip
    assert stats["nnz_visited"] == ref_stats["nnz_visited"]
    assert stats["cache_hits"] == ref_stats["cache_hits"]
    if budget < 1.0:
        assert stats["visited_fraction"] < 0.9 and stats["cache_hits"] > 0


def test_eval_forward_under_compile_takes_no_slot():
    x, ei, y = data()
    torch.manual_seed(0)
    net = Net("gcn")
    with rp.patch(budget=0.3, warmup_steps=0, min_width=1, total_steps=100) as rsc:
        torch._dynamo.reset()
        fn = torch.compile(net, backend="aot_eager")
        train(net, fn, rsc, x, ei, y, 2)
        net.eval()
        fn(x, ei)  # grad enabled, eval mode
        train(net, fn, rsc, x, ei, y, 1)
        stats = rsc.stats()
    assert len(stats["layers"]) == 2
    assert [d["approx_calls"] for d in stats["layers"]] == [3, 3]


class DropIn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = rp.GCNConv(16, 32), rp.GCNConv(32, 4)

    def forward(self, x, ei):
        return self.c2(self.c1(x, ei).relu(), ei)


def test_pyg_drop_in_convs_compile_like_eager():
    x, ei, y = data()
    torch.manual_seed(0)
    eager = DropIn()
    compiled = copy.deepcopy(eager)
    kw = dict(budget=0.3, warmup_steps=2, cache_interval=10, min_width=1, total_steps=100)
    rp.attach(compiled, **kw)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(compiled)(x, ei)
    assert explanation.graph_break_count == 0
    r_eager, r_comp = rp.attach(eager, **kw), rp.attach(compiled, **kw)  # fresh controllers
    rp.cache_input_aggregation(eager, False)  # compiled code aggregates in PyG's order
    torch._dynamo.reset()
    ref = train(eager, eager, r_eager, x, ei, y, 5)
    got = train(compiled, torch.compile(compiled), r_comp, x, ei, y, 5)
    for (a, ga), (b, gb) in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        for k in gb:
            torch.testing.assert_close(ga[k], gb[k], rtol=1e-5, atol=1e-5)
    assert r_comp.stats()["nnz_visited"] == r_eager.stats()["nnz_visited"]
