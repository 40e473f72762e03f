"""The one-pass epilogue under ``torch.compile`` (marker ``compile``: torch >= 2.4): one custom
operator, the same numbers as the eager ``autograd.Function`` for the same seed, and the
fused forward taken by a compiled model instead of inductor's op-by-op kernels."""

import copy

import pytest
import torch
import torch.nn.functional as F

import dgl_rsc.nn as rnn
from dgl_rsc.models import fused
from dgl_rsc.models.paper import build_model
from dgl_rsc.sparse import epilogue as E
from dgl_rsc.sparse.graph import Graph

pytestmark = pytest.mark.compile
pytest.importorskip("numba")


@pytest.mark.parametrize("engine", ["numba", "torch"])
@pytest.mark.parametrize("p", [0.0, 0.4])
@pytest.mark.parametrize("terms", ["bias", "both", "none"])
def test_the_operator_equals_the_eager_function_for_the_same_seed(engine, p, terms):
    torch.manual_seed(0)
    x = torch.randn(200, 19, requires_grad=True)
    other = torch.randn(200, 19, requires_grad=True) if terms == "both" else None
    bias = torch.randn(19, requires_grad=True) if terms != "none" else None
    g = torch.randn(200, 19)
    inputs = [t for t in (x, other, bias) if t is not None]
    seed = (123456789, 2**32 - 5)
    seed_t = torch.tensor(seed, dtype=torch.int64)
    real_draw = E._draw_seed
    E._draw_seed = lambda: seed  # the eager function's draw, pinned to the operator's seed
    try:
        ref = E._BiasActDropout.apply(x, other, bias, p, True, engine)
        ref_grads = torch.autograd.grad(ref, inputs, g)
    finally:
        E._draw_seed = real_draw
    got = torch.ops.dgl_rsc.bias_act_dropout(x, other, bias, seed_t, p, True, engine)
    got_grads = torch.autograd.grad(got, inputs, g)
    assert torch.equal(got, ref)
    for a, b in zip(got_grads, ref_grads):
        assert torch.equal(a, b)


def test_the_operator_passes_torch_opcheck():
    torch.manual_seed(1)
    x = torch.randn(64, 8, requires_grad=True)
    bias = torch.randn(8, requires_grad=True)
    seed = torch.tensor([7, 9], dtype=torch.int64)
    torch.library.opcheck(E._forward_op, (x, None, bias, seed, 0.3, True, "numba"))
    dy = torch.randn(64, 8)
    y = torch.relu(x.detach())
    torch.library.opcheck(E._backward_op, (dy, y, seed, 0.3, True, "numba", True))


def _setup(dropout, name="gcn"):
    g = torch.Generator().manual_seed(0)
    n = 300
    src, dst = torch.randint(0, n, (2, 2400), generator=g)
    loops = torch.arange(n)
    graph = Graph(torch.cat([src, loops]), torch.cat([dst, loops]), n)
    x, y = torch.randn(n, 12, generator=g), torch.randint(0, 4, (n,), generator=g)
    torch.manual_seed(0)
    net = build_model(name, 12, 4, engine="native", hidden=32, layers=3, dropout=dropout)
    return graph, x, y, net


def test_a_compiled_model_with_dropout_runs_the_epilogue_operator():
    graph, x, _, net = _setup(0.5)
    rnn.attach(net, budget=0.3, warmup_steps=0, min_width=1, total_steps=100)
    assert fused.applies(net, graph, x)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(net)(graph, x)
    assert explanation.graph_break_count == 0
    code = "\n".join(gm.code for gm in explanation.graphs)
    assert code.count("dgl_rsc.bias_act_dropout") == 2  # the two hidden layers
    op_by_op = [line for line in code.splitlines()
                if "dropout" in line and "bias_act_dropout" not in line]  # fmt: skip
    assert all("dropout(l_feat_, 0.0," in line for line in op_by_op), op_by_op  # input: p 0


def test_compiled_training_with_dropout_keeps_each_element_with_probability_one_minus_p():
    """Compiled steps draw their own seeds (inductor's generator): masks differ from eager
    ones, but each step's is new and keeps about 1 - p of the elements."""
    graph, x, y, net = _setup(0.5)
    rnn.exact(net)
    fn = torch.compile(net)
    seen = []
    real = E.ENGINES["numba"]

    def forward(x_, other, bias, seed, p, relu):
        out = real[0](x_, other, bias, seed, p, relu)
        seen.append((seed, float((out != 0).float().mean())))
        return out

    E.ENGINES["numba"] = (forward, real[1])
    try:
        torch._dynamo.reset()
        for _ in range(3):
            logits = fn(graph, x)
            F.cross_entropy(logits, y).backward()
    finally:
        E.ENGINES["numba"] = real
    assert len(seen) == 6 and len({s for s, _ in seen}) == 6
    assert all(0.2 < kept < 0.6 for _, kept in seen)  # ReLU zeroes some of the kept half


@pytest.mark.parametrize("name", ["gcn", "sage"])  # SAGE: the self term's gradient too
def test_compiled_equals_eager_without_dropout(name):
    graph, x, y, eager = _setup(0.0, name)
    assert fused.applies(eager, graph, x)
    compiled = copy.deepcopy(eager)
    rnn.exact(eager), rnn.exact(compiled)
    torch._dynamo.reset()
    fn = torch.compile(compiled)
    for net, f in ((eager, eager), (compiled, fn)):
        net.zero_grad()
        F.cross_entropy(f(graph, x), y).backward()
    torch.testing.assert_close(fn(graph, x), eager(graph, x), rtol=1e-5, atol=1e-5)
    for (k, a), (_, b) in zip(compiled.named_parameters(), eager.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-5, msg=k)
