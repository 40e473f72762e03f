"""The first layer's aggregation reused across compiled steps (``dgl_rsc::spmm_memo``; marker
``compile``: torch >= 2.4): the same numbers as eager, built once, and recomputed whenever
eager code would recompute it."""

import copy

import pytest
import torch
import torch.nn.functional as F

import dgl_rsc.nn as rnn
from dgl_rsc.core import ops_memo
from dgl_rsc.dgl.nn.input_cache import InputAggregationCache, input_cache_counts
from dgl_rsc.models.paper import build_model
from dgl_rsc.sparse.graph import Graph, csr_by_destination
from dgl_rsc.sparse.products import NO_SCALES, Scales, csr_mm

pytestmark = pytest.mark.compile
pytest.importorskip("numba")

N, FEAT = 300, 12


def setup(input_dropout=0.0):
    g = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, N, (2, 2400), generator=g)
    loops = torch.arange(N)
    graph = Graph(torch.cat([src, loops]), torch.cat([dst, loops]), N)
    x, y = torch.randn(N, FEAT, generator=g), torch.randint(0, 4, (N,), generator=g)
    torch.manual_seed(0)
    net = build_model("gcn", FEAT, 4, engine="native", hidden=16, layers=2, dropout=0.0,
                      input_dropout=input_dropout)  # fmt: skip
    rnn.exact(net)
    return graph, x, y, net


def steps(net, fn, graph, x, y, n):
    out = []
    for _ in range(n):
        net.zero_grad()
        logits = fn(graph, x)
        F.cross_entropy(logits, y).backward()
        out.append((logits.detach(), {k: p.grad.clone() for k, p in net.named_parameters()}))
    return out


def test_compiled_steps_reuse_the_aggregation_and_equal_eager():
    graph, x, y, eager = setup()
    compiled = copy.deepcopy(eager)
    torch._dynamo.reset()
    ref = steps(eager, eager, graph, x, y, 4)
    got = steps(compiled, torch.compile(compiled), graph, x, y, 4)
    for (a, ga), (b, gb) in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        for k in gb:
            torch.testing.assert_close(ga[k], gb[k], rtol=1e-5, atol=1e-5, msg=k)
    counts = input_cache_counts(compiled)
    assert counts["builds"] == 1 and counts["hits"] == 2, counts  # seen, built, reused twice


def test_features_changed_in_place_are_aggregated_again():
    graph, x, y, eager = setup()
    compiled = copy.deepcopy(eager)
    fn = torch.compile(compiled)
    torch._dynamo.reset()
    steps(compiled, fn, graph, x, y, 3)
    x.mul_(2.0)  # the version counter moves: the stored product is stale
    (got, _), = steps(compiled, fn, graph, x, y, 1)  # fmt: skip
    (ref, _), = steps(eager, eager, graph, x, y, 1)  # fmt: skip
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_input_dropout_never_builds_a_product():
    graph, x, y, net = setup(input_dropout=0.5)
    torch._dynamo.reset()
    steps(net, torch.compile(net), graph, x, y, 4)
    assert input_cache_counts(net)["builds"] == 0


def test_the_memo_compares_scales_by_value():
    torch.manual_seed(0)
    src, dst = torch.randint(0, 50, (2, 300))
    A, _ = csr_by_destination(src, dst, 50, 50)
    X = torch.randn(50, 6)
    memo = InputAggregationCache()
    r1, r2 = torch.rand(50) + 0.5, torch.rand(50) + 0.5
    for row in (r1, r1.clone(), r1.clone()):  # equal values in fresh tensors: built, then hit
        got = ops_memo._product(memo.handle, A, X, Scales(row, None))
        torch.testing.assert_close(got, csr_mm(A, X, Scales(row, None)))
    assert (memo.builds, memo.hits) == (1, 1)
    got = ops_memo._product(memo.handle, A, X, Scales(r2, None))  # other values: no hit
    torch.testing.assert_close(got, csr_mm(A, X, Scales(r2, None)))
    assert (memo.builds, memo.hits) == (1, 1)
    got = ops_memo._product(memo.handle, A, X, NO_SCALES)
    torch.testing.assert_close(got, csr_mm(A, X, NO_SCALES))


def test_a_copied_cache_is_its_own_memo():
    memo = InputAggregationCache()
    twin = copy.deepcopy(memo)
    assert twin.handle != memo.handle
    assert ops_memo._memos[twin.handle]() is twin and ops_memo._memos[memo.handle]() is memo


def test_the_controller_reports_compiled_reuse():
    graph, x, y, net = setup()
    rsc = rnn.attach(net, budget=0.3, warmup_steps=0, min_width=1, total_steps=100)
    fn = torch.compile(net)
    torch._dynamo.reset()
    for _ in range(4):
        net.zero_grad()
        F.cross_entropy(fn(graph, x), y).backward()
        rsc.step()
    assert rsc.stats()["cached_input_aggregation"] == {"hits": 2, "builds": 1}
