"""RSC under ``torch.compile`` (marker ``compile``: torch >= 2.4, the modern leg): the products
are custom operators, so a native model traces without graph breaks, recompiles a bounded
number of times over a run, and computes what eager computes (outputs and gradients to 1e-5).
"""

import copy

import pytest
import torch
import torch.nn.functional as F

import dgl_rsc.nn as rnn
from dgl_rsc.core import ops
from dgl_rsc.models.paper import build_model
from dgl_rsc.sparse.graph import Graph

pytestmark = pytest.mark.compile

N, FEAT, CLASSES = 300, 12, 4


def graph(seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, N, (2400,), generator=g)
    dst = torch.randint(0, N, (2400,), generator=g)
    loops = torch.arange(N)
    x = torch.randn(N, FEAT, generator=g)
    y = torch.randint(0, CLASSES, (N,), generator=g)
    return Graph(torch.cat([src, loops]), torch.cat([dst, loops]), N), x, y


def model(name="gcn", seed=0):
    torch.manual_seed(seed)
    return build_model(name, FEAT, CLASSES, engine="native", hidden=32, layers=3, dropout=0.0)


def dgl_rsc_breaks(explanation) -> list:
    """Graph-break reasons whose stack passes through dgl_rsc."""
    out = []
    for reason in explanation.break_reasons:
        frames = [f.filename for f in getattr(reason, "user_stack", [])]
        if any("dgl_rsc" in f for f in frames) or "dgl_rsc" in str(reason.reason):
            out.append(reason)
    return out


@pytest.mark.parametrize("name", ["gcn", "sage", "gcn2", "resgcn"])
def test_native_models_trace_without_graph_breaks(name):
    g, x, y = graph()
    net = model(name)
    rsc = rnn.attach(net, budget=0.3, warmup_steps=0, min_width=1, total_steps=100)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(net)(g, x)
    assert dgl_rsc_breaks(explanation) == [], explanation.break_reasons
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    assert len(rsc.layers) == sum(c.rsc_products for c in rnn.rsc_layers(net))  # one run


def run(net, rsc, g, x, y, steps, fn=None):
    """Per step: ``(logits, {param: grad})``."""
    fn = net if fn is None else fn
    out = []
    for _ in range(steps):
        logits = fn(g, x)
        net.zero_grad()
        F.cross_entropy(logits, y).backward()
        out.append((logits.detach(), {k: p.grad.clone() for k, p in net.named_parameters()}))
        with torch.no_grad():
            for p in net.parameters():
                p -= 0.05 * p.grad
        rsc.step()
    return out


@pytest.mark.parametrize("budget", [1.0, 0.3])
def test_compiled_equals_eager_outputs_and_gradients(budget):
    """Budget 1.0 (exact) and 0.3 (a sample drawn at step 2, reused from the cache until
    step 6): the compiled model (inductor) gets the same sample, the same numbers."""
    g, x, y = graph()
    eager = model()
    compiled = copy.deepcopy(eager)
    kw = dict(budget=budget, warmup_steps=2, cache_interval=10, min_width=1, total_steps=100)
    r_eager, r_comp = rnn.attach(eager, **kw), rnn.attach(compiled, **kw)
    torch._dynamo.reset()
    ref = run(eager, r_eager, g, x, y, 6)
    got = run(compiled, r_comp, g, x, y, 6, fn=torch.compile(compiled))
    for step, ((a, ga), (b, gb)) in enumerate(zip(got, ref)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"step {step} logits")
        for k in gb:
            torch.testing.assert_close(ga[k], gb[k], rtol=1e-5, atol=1e-5,
                                       msg=f"step {step} grad of {k}")  # fmt: skip
    se, sc = r_eager.stats(), r_comp.stats()
    for key in ("nnz_visited", "nnz_exact", "cache_hits", "cache_misses"):
        assert sc[key] == se[key], key
    if budget < 1.0:
        assert sc["visited_fraction"] < 0.9 and sc["cache_hits"] > 0


def test_recompiles_are_bounded_over_a_run():
    """50 steps through warm-up, the approximate phase (re-tuned every 5 steps, the cache
    refreshed every 3) and the switch to exact: the phase and the samples change, the
    compiled graph does not."""
    from torch._dynamo.testing import CompileCounterWithBackend

    g, x, y = graph()
    net = model()
    rsc = rnn.attach(net, budget=0.3, warmup_steps=3, tune_interval=5, cache_interval=3,
                     min_width=1, total_steps=50)  # fmt: skip
    counter = CompileCounterWithBackend("aot_eager")
    torch._dynamo.reset()
    run(net, rsc, g, x, y, 50, fn=torch.compile(net, backend=counter))
    stats = rsc.stats()
    assert stats["phase"] == "exact"
    layers = stats["layers"][1:]  # the first aggregates the input: no backward product
    assert len(layers) == 2 and all(d["approx_calls"] > 0 and d["exact_calls"] > 0
                                    for d in layers)  # fmt: skip
    assert counter.frame_count <= 3, counter.frame_count


def test_tickets_do_not_outlive_their_backward():
    g, x, y = graph()
    net = model()
    rsc = rnn.attach(net, budget=0.3, warmup_steps=0, min_width=1, total_steps=100)
    torch._dynamo.reset()
    before = set(ops._tickets)  # forwards of other tests that ran no backward
    run(net, rsc, g, x, y, 3, fn=torch.compile(net, backend="aot_eager"))
    assert set(ops._tickets) <= before
