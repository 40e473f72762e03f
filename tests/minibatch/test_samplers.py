"""Cluster-GCN and GraphSAINT loaders: both engines agree, batches are induced subgraphs,
GraphSAINT's normalization is unbiased, and bad arguments get clear errors."""

from __future__ import annotations

import contextlib
import doctest
import itertools
import os

import numpy as np
import pytest
import torch

from dgl_rsc.base import _deps
from dgl_rsc.minibatch import batch as batch_module
from dgl_rsc.minibatch import saint_loader, samplers
from dgl_rsc.minibatch.batch import (
    SubgraphBatch,
    count_inclusions,
    derive_seed,
    estimate_saint_norms,
    saint_norms,
)
from dgl_rsc.minibatch.samplers import TRAIN, ClusterLoader, SaintLoader, build_loader

from ..conftest import labelled_graph, requires_dgl

N = 1200
SAINT_CASES = [
    pytest.param("node", 300, id="node"),
    pytest.param("edge", 150, id="edge"),
    pytest.param("walk", (60, 3), id="walk"),
]


@pytest.fixture(scope="module")
def graph():
    """A symmetric power-law graph of ``N`` nodes (about 9,000 edges)."""
    src, dst, *_ = labelled_graph(N, avg_degree=8.0, seed=2)
    return src, dst


def directed_graph(n: int, e: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)


def fields(b: SubgraphBatch):
    return (b.nodes, b.src, b.dst, b.eids)


def assert_same_batches(a: list, b: list):
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert all(torch.equal(s, t) for s, t in zip(fields(x), fields(y)))
        assert (x.key, x.epoch, x.index) == (y.key, y.epoch, y.index)


def assert_induced(b: SubgraphBatch, src: torch.Tensor, dst: torch.Tensor):
    """The batch holds exactly the full graph's edges between its nodes, relabelled."""
    inside = torch.zeros(int(max(src.max(), dst.max())) + 1, dtype=torch.bool)
    inside[b.nodes] = True
    expected = torch.nonzero(inside[src] & inside[dst]).squeeze(1)
    assert torch.equal(b.eids, expected)
    assert torch.equal(b.nodes[b.src], src[b.eids]) and torch.equal(b.nodes[b.dst], dst[b.eids])


@contextlib.contextmanager
def seeded_globals(seed: int):
    """Seed NumPy's and torch's global generators as a plain DGL script would; restore after."""
    np_state, torch_state = np.random.get_state(), torch.get_rng_state()  # noqa: NPY002
    np.random.seed(seed)  # noqa: NPY002 (DGL's DataLoader shuffles with the global one)
    torch.manual_seed(seed)
    try:
        yield
    finally:
        np.random.set_state(np_state)  # noqa: NPY002
        torch.set_rng_state(torch_state)


# -- both engines draw the same batches ----------------------------------------------------


@requires_dgl
@pytest.mark.dgl
@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffle", "fixed"])
def test_cluster_engines_agree(graph, one_thread, shuffle):
    kw = dict(num_parts=24, batch_size=5, seed=3, shuffle=shuffle)
    native = ClusterLoader(*graph, N, **kw)
    dgl_loader = ClusterLoader(*graph, N, engine="dgl", **kw)
    epochs = [list(native.epoch(e)) for e in range(2)]
    for e in range(2):
        assert_same_batches(epochs[e], list(dgl_loader.epoch(e)))
    keys = [[b.key for b in batches] for batches in epochs]
    assert (keys[0] == keys[1]) is (not shuffle)  # fixed groups recur, shuffled ones do not
    assert len(epochs[0]) == len(native) == 5  # 24 clusters, 5 per batch


@requires_dgl
@pytest.mark.dgl
def test_cluster_matches_a_plain_dgl_script(graph, one_thread, tmp_path):
    """Our partition, written by this test in DGL's cache format (a pickle the test makes
    itself) and read by DGL's own sampler and loader seeded as a script would."""
    import pickle

    import dgl

    native = ClusterLoader(*graph, N, num_parts=16, batch_size=3, seed=7)
    g = dgl.graph(graph, num_nodes=N)
    dgl_file = tmp_path / "cluster_gcn.pkl"
    dgl_file.write_bytes(pickle.dumps((native.layout.offsets, native.layout.node_ids)))
    sampler = dgl.dataloading.ClusterGCNSampler(g, 16, cache_path=str(dgl_file))
    for e in range(2):
        with seeded_globals(derive_seed(7, TRAIN, e)):
            loader = dgl.dataloading.DataLoader(
                g, torch.arange(16), sampler, batch_size=3, shuffle=True, drop_last=False
            )
            subgraphs = list(loader)
        ours = list(native.epoch(e))
        assert len(ours) == len(subgraphs) == 6
        for b, sg in zip(ours, subgraphs):
            assert torch.equal(b.nodes, sg.ndata[dgl.NID])
            assert torch.equal(b.eids, torch.sort(sg.edata[dgl.EID]).values)


@requires_dgl
@pytest.mark.dgl
def test_saint_node_engines_agree_and_match_a_plain_dgl_script(graph, one_thread):
    import dgl

    kw = dict(mode="node", budget=300, batches_per_epoch=4, seed=11, normalize=False)
    native = SaintLoader(*graph, N, **kw)
    dgl_loader = SaintLoader(*graph, N, engine="dgl", **kw)
    g = dgl.graph(graph, num_nodes=N)
    for e in range(2):
        ours = list(native.epoch(e))
        assert_same_batches(ours, list(dgl_loader.epoch(e)))
        with seeded_globals(derive_seed(11, TRAIN, e)):
            sampler = dgl.dataloading.SAINTSampler("node", 300)
            subgraphs = list(dgl.dataloading.DataLoader(g, torch.arange(4), sampler))
        assert len(subgraphs) == len(ours) == 4
        for b, sg in zip(ours, subgraphs):
            assert torch.equal(b.nodes, sg.ndata[dgl.NID])


@requires_dgl
@pytest.mark.dgl
def test_saint_edge_probabilities_are_dgls(graph, one_thread):
    kw = dict(mode="edge", budget=150, batches_per_epoch=1, normalize=False)
    dgl_loader = SaintLoader(*graph, N, engine="dgl", **kw)
    next(dgl_loader.epoch(0))  # DGL computes (and keeps) its probabilities on first use
    native = SaintLoader(*graph, N, **kw)
    assert torch.equal(native._impl.edge_prob, dgl_loader._impl.sampler.prob)


@requires_dgl
@pytest.mark.dgl
def test_saint_walk_roots_are_dgls(graph, one_thread):
    """The roots come from torch in DGL too: the same roots start both engines' walks."""
    kw = dict(mode="walk", budget=(40, 2), batches_per_epoch=3, seed=5, normalize=False)
    native, dgl_loader = SaintLoader(*graph, N, **kw), SaintLoader(*graph, N, engine="dgl", **kw)
    for e in range(2):
        gen = torch.Generator().manual_seed(derive_seed(5, TRAIN, e))
        torch.empty((), dtype=torch.int64).random_(generator=gen)  # the DataLoader's draw
        for a, b in zip(native.epoch(e), dgl_loader.epoch(e)):
            roots = torch.randint(0, N, (40,), generator=gen)
            assert torch.isin(roots, a.nodes).all() and torch.isin(roots, b.nodes).all()


@requires_dgl
@pytest.mark.dgl
@pytest.mark.parametrize("mode,budget", SAINT_CASES[1:])
def test_saint_dgl_rng_modes_agree_in_distribution(graph, one_thread, mode, budget):
    """DGL's C++ RNG cannot be replayed: compare how often each node is drawn, in 150
    batches of each engine (other seeds: with one seed the walks share their roots)."""
    freq = []
    for engine, seed in (("native", 2), ("dgl", 3)):
        loader = SaintLoader(*graph, N, mode, budget, 150, seed, engine, normalize=False)
        count, _, k = count_inclusions(loader.epoch(0), N, graph[0].numel())
        freq.append(count.double() / k)
    p = (freq[0] + freq[1]) / 2
    drawn = p > 0
    var = 2 * p[drawn] * (1 - p[drawn]) / 150
    chi2 = float(((freq[0] - freq[1])[drawn] ** 2 / var).mean())  # about 1 when they agree
    assert 0.8 < chi2 < 1.25, chi2
    assert abs(float(freq[0].sum() / freq[1].sum()) - 1) < 0.02  # mean batch sizes


@requires_dgl
@pytest.mark.dgl
@pytest.mark.parametrize("mode,budget", SAINT_CASES[1:])
def test_dgl_engine_is_reproducible_and_leaves_global_rngs(graph, one_thread, mode, budget):
    kw = dict(mode=mode, budget=budget, batches_per_epoch=3, seed=4, normalize=False)
    torch_before, np_before = torch.get_rng_state(), np.random.get_state()[1].copy()  # noqa: NPY002
    first = list(SaintLoader(*graph, N, engine="dgl", **kw).epoch(1))
    assert torch.equal(torch.get_rng_state(), torch_before)
    assert np.array_equal(np.random.get_state()[1], np_before)  # noqa: NPY002
    again = SaintLoader(*graph, N, engine="dgl", **kw)
    second = []
    for b in again.epoch(1):  # draws between batches change nothing
        torch.rand(7)
        np.random.rand(3)  # noqa: NPY002
        second.append(b)
    assert_same_batches(first, second)


# -- batches are what the samplers promise -------------------------------------------------


def test_cluster_epochs_cover_every_node_once(graph, one_thread):
    loader = ClusterLoader(*graph, N, num_parts=20, batch_size=6, seed=1)
    part = samplers.metis_clusters(*graph, N, 20, seed=1)
    size = torch.bincount(part, minlength=20)
    for batches in (list(loader), list(loader)):  # iter() goes on to the next epoch
        nodes = torch.cat([b.nodes for b in batches])
        assert torch.equal(torch.sort(nodes).values, torch.arange(N))
        assert len(batches) == len(loader) == 4  # 20 clusters, 6 per batch
        for b in batches:
            assert_induced(b, *graph)
            clusters = torch.unique_consecutive(part[b.nodes])  # one cluster after another
            assert clusters.numel() == torch.unique(clusters).numel() <= 6
            assert b.num_nodes == int(size[clusters].sum())  # whole clusters
            assert bool((torch.diff(b.nodes)[torch.diff(part[b.nodes]) == 0] > 0).all())
    assert [b.key for b in batches] == [b.key for b in loader.epoch(1)]
    assert [b.key for b in batches] != [b.key for b in loader.epoch(0)]


@pytest.mark.parametrize("mode,budget", SAINT_CASES)
def test_saint_batches_respect_their_budgets(graph, one_thread, mode, budget):
    loader = SaintLoader(*graph, N, mode, budget, batches_per_epoch=4, seed=6, normalize=False)
    for b in loader.epoch(0):
        assert_induced(b, *graph)
        assert torch.equal(b.nodes, b.nodes.unique())
        touched = torch.zeros(b.num_nodes, dtype=torch.bool)
        touched[b.src], touched[b.dst] = True, True
        entered = torch.zeros(b.num_nodes, dtype=torch.bool)
        entered[b.dst] = True
        if mode == "node":
            assert b.num_nodes <= budget
        elif mode == "edge":  # every node is an end of a drawn edge, which is in the batch
            assert b.num_nodes <= 2 * budget and bool(touched.all())
        else:  # every node but a root was entered from the node before it on a walk
            roots, length = budget
            assert b.num_nodes <= roots * (length + 1) and int((~entered).sum()) <= roots


def test_native_walks_follow_out_edges():
    src, dst = torch.tensor([0, 1, 2, 4]), torch.tensor([1, 2, 3, 0])  # 3 is a dead end
    loader = SaintLoader(src, dst, 6, "walk", (1, 10), batches_per_epoch=30, normalize=False)
    chains = {(0, 1, 2, 3), (1, 2, 3), (2, 3), (3,), (0, 1, 2, 3, 4), (5,)}  # from each root
    seen = {tuple(b.nodes.tolist()) for b in loader.epoch(0)}
    assert seen <= chains and len(seen) >= 4


def test_cdf_draws_follow_the_weights(monkeypatch, one_thread):
    """The draws that replace ``torch.multinomial`` past its 2**24 categories."""
    weights = torch.tensor([0.0, 1.0, 3.0, 0.0, 4.0])
    gen = torch.Generator().manual_seed(0)
    draws = saint_loader._from_cdf(torch.cumsum(weights.double(), 0), 40000, gen)
    freq = torch.bincount(draws, minlength=5).double() / 40000
    torch.testing.assert_close(freq, weights.double() / 8, atol=0.01, rtol=0)
    assert freq[0] == freq[3] == 0
    monkeypatch.setattr(saint_loader, "_MULTINOMIAL_MAX", 4)  # take that path on a small graph
    src, dst = torch.tensor([0, 0, 0, 1]), torch.tensor([1, 2, 3, 2])
    loader = SaintLoader(src, dst, 5, "node", 2, batches_per_epoch=400, normalize=False)
    count, _, _ = count_inclusions(loader.epoch(0), 5, 4)
    assert count[0] > 1.5 * count[1:].max()  # out-degree 3 against 1


def test_iteration_and_keys(graph):
    loader = SaintLoader(*graph, N, "node", 50, batches_per_epoch=2, seed=0, normalize=False)
    first, second = list(loader), list(loader)
    assert_same_batches(first, list(loader.epoch(0)))
    assert_same_batches(second, list(loader.epoch(1)))
    b = first[0]
    same = SubgraphBatch(b.nodes.clone(), b.src, b.dst, b.eids, epoch=9, index=9)
    assert same.key == b.key != second[0].key
    g = b.to_graph()
    assert (g.num_nodes(), g.num_edges()) == (b.num_nodes, b.num_edges)


@requires_dgl
@pytest.mark.dgl
def test_to_dgl(graph):
    import dgl

    b = next(SaintLoader(*graph, N, "node", 50, 1, normalize=False).epoch(0))
    g = b.to_dgl()
    assert g.num_nodes() == b.num_nodes and torch.equal(g.ndata[dgl.NID], b.nodes)
    s, d = g.edges()
    assert torch.equal(s, b.src) and torch.equal(d, b.dst)


# -- GraphSAINT's normalization ------------------------------------------------------------


def exact_node_sampler_probabilities(src, dst, n: int, budget: int):
    """``(p_v, p_e)`` of the node sampler by enumerating its ``n ** budget`` draw sequences."""
    weight = torch.bincount(src, minlength=n).double().clamp(min=1)
    q = weight / weight.sum()
    p_node = torch.zeros(n, dtype=torch.float64)
    p_edge = torch.zeros(src.numel(), dtype=torch.float64)
    for draws in itertools.product(range(n), repeat=budget):
        prob = float(torch.prod(q[list(draws)]))
        inside = torch.zeros(n, dtype=torch.bool)
        inside[list(draws)] = True
        p_node += prob * inside
        p_edge += prob * (inside[src] & inside[dst])
    return p_node, p_edge


def tiny_directed():
    """6 nodes, an asymmetric graph with a self-loop, a repeated edge and a node 5 that no
    edge reaches (a destination's and a source's weights differ everywhere)."""
    src = torch.tensor([0, 0, 1, 2, 2, 3, 3, 3, 4, 4, 1, 5])
    dst = torch.tensor([1, 2, 2, 0, 3, 3, 4, 0, 1, 2, 2, 0])
    return src, dst, 6


def test_normalized_estimates_are_exactly_unbiased_by_enumeration():
    """With exact probabilities, E[normalized loss] is the mean loss and, given that v is in
    the batch, E[normalized aggregation at v] is the full aggregation at v."""
    src, dst, n = tiny_directed()
    p_node, p_edge = exact_node_sampler_probabilities(src, dst, n, budget=3)
    norms = saint_norms(p_node, p_edge, dst)
    g = torch.Generator().manual_seed(0)
    loss, x, a = torch.rand(n, generator=g), torch.rand(n, generator=g), torch.rand(12, generator=g)
    full = torch.zeros(n, dtype=torch.float64).index_add_(0, dst, (a * x[src]).double())
    weight = torch.bincount(src, minlength=n).double().clamp(min=1)
    q = weight / weight.sum()
    expected_loss, expected_agg = 0.0, torch.zeros(n, dtype=torch.float64)
    for draws in itertools.product(range(n), repeat=3):
        prob = float(torch.prod(q[list(draws)]))
        inside = torch.zeros(n, dtype=torch.bool)
        inside[list(draws)] = True
        kept = inside[src] & inside[dst]
        expected_loss += prob * float((norms.node * loss)[inside].sum())
        msg = (norms.edge * a * x[src]).double() * kept
        agg = torch.zeros(n, dtype=torch.float64).index_add_(0, dst, msg)
        expected_agg += prob * agg * inside / p_node  # E[. | v in batch]
    assert expected_loss == pytest.approx(float(loss.mean()), rel=1e-6)
    torch.testing.assert_close(expected_agg, full, rtol=1e-6, atol=1e-9)
    src_based = p_node[src] / p_edge  # the source's probability instead: biased
    assert not torch.allclose(src_based.float(), norms.edge)


def test_presampled_probabilities_converge_to_the_exact_ones(one_thread):
    src, dst, n = tiny_directed()
    p_node, p_edge = exact_node_sampler_probabilities(src, dst, n, budget=3)
    loader = SaintLoader(src, dst, n, "node", 3, batches_per_epoch=50, normalize=False)
    k = 4000
    node_count, edge_count, drawn = count_inclusions(itertools.islice(loader.presample(), k), n, 12)
    assert drawn == k
    for count, p in ((node_count, p_node), (edge_count, p_edge)):
        sigma = torch.sqrt(p * (1 - p) / k)
        assert bool(((count / k - p).abs() <= 5 * sigma + 1e-12).all())
    norms = estimate_saint_norms(loader, num_presample=k)
    exact = saint_norms(p_node, p_edge, dst)
    torch.testing.assert_close(norms.node, exact.node, rtol=0.1, atol=0)
    torch.testing.assert_close(norms.edge, exact.edge, rtol=0.1, atol=0)
    assert norms.num_presample == k


def test_estimated_norms_make_the_aggregation_unbiased(one_thread):
    """Monte Carlo over fresh edge-sampler batches of a directed graph."""
    n = 60
    src, dst = directed_graph(n, 240, seed=4)
    loader = SaintLoader(src, dst, n, "edge", 12, batches_per_epoch=500, num_presample=3000)
    g = torch.Generator().manual_seed(1)
    x, loss = torch.rand(n, generator=g), torch.rand(n, generator=g)
    full = torch.zeros(n, dtype=torch.float64).index_add_(0, dst, x[src].double())
    agg_sum, hits, loss_sum, k = torch.zeros(n, dtype=torch.float64), torch.zeros(n), 0.0, 0
    for e in range(4):
        for b in loader.epoch(e):
            msg = (b.edge_norm * x[b.nodes[b.src]]).double()
            agg_sum[b.nodes] += torch.zeros(b.num_nodes, dtype=torch.float64).index_add_(
                0, b.dst, msg
            )
            hits[b.nodes] += 1
            loss_sum += float((b.node_norm * loss[b.nodes]).sum())
            k += 1
    assert loss_sum / k == pytest.approx(float(loss.mean()), rel=0.03)
    seen = hits >= 100
    assert int(seen.sum()) > n // 2
    rel = (agg_sum[seen] / hits[seen] - full[seen]).abs() / full[seen].clamp(min=1e-9)
    assert float(rel.mean()) < 0.05 and float(rel.max()) < 0.25
    unnormalized = SaintLoader(src, dst, n, "edge", 12, batches_per_epoch=1, normalize=False)
    assert next(unnormalized.epoch(0)).edge_norm is None


def test_norms_stay_finite_for_nodes_never_drawn(graph):
    loader = SaintLoader(*graph, N, "node", 20, batches_per_epoch=1, num_presample=1)
    norms = loader.norms
    # one batch: every count is 0 or 1, read as 1, so p = 1 everywhere
    torch.testing.assert_close(norms.node, torch.full((N,), 1.0 / N))
    torch.testing.assert_close(norms.edge, torch.ones(graph[0].numel()))
    b = next(loader.epoch(0))
    assert torch.equal(b.node_norm, norms.node[b.nodes])
    assert torch.equal(b.edge_norm, norms.edge[b.eids])


def test_default_presampling_covers_each_node_fifty_times(graph, one_thread):
    loader = SaintLoader(*graph, N, "node", 600, batches_per_epoch=1, num_loss_nodes=100)
    k = loader.norms.num_presample
    sizes = [b.num_nodes for b in itertools.islice(loader.presample(), k)]
    assert sum(sizes) >= 50 * N > sum(sizes[:-1])
    count = torch.bincount(torch.cat([b.nodes for b in itertools.islice(loader.presample(), k)]))
    torch.testing.assert_close(loader.norms.node, k / (100 * count.clamp(min=1).float()))


# -- errors --------------------------------------------------------------------------------

ERRORS = [
    (lambda s, d: ClusterLoader(s, d, N, N + 1, 1), "num_parts=1201 must be"),
    (lambda s, d: ClusterLoader(s, d, N, 8, 9), "batch_size=9 must be .*at most num_parts"),
    (lambda s, d: ClusterLoader(s, d, N, 8, 2, engine="dgll"), "Did you mean 'dgl'"),
    (lambda s, d: ClusterLoader(s, d, N, 8, 2, partition=torch.zeros(3)), "partition must be"),
    (lambda s, d: ClusterLoader(s, d, N, 8, 2, seed=-1), r"seed=-1 must be in \[0, 2147483647\]"),
    (lambda s, d: SaintLoader(s, d, N, "walks", (2, 2), 1), "Did you mean 'walk'"),
    (lambda s, d: SaintLoader(s, d, N, "node", 0, 1), "budget=0 must be >= 1"),
    (lambda s, d: SaintLoader(s, d, N, "edge", -5, 1), "budget=-5 must be >= 1"),
    (lambda s, d: SaintLoader(s, d, N, "walk", 5, 1), r"budget=\(num_roots, walk_length\)"),
    (lambda s, d: SaintLoader(s, d, N, "walk", (0, 2), 1), r"budget\[0\] \(num_roots\)=0"),
    (lambda s, d: SaintLoader(s, d, N, "node", 5, 0), "batches_per_epoch=0"),
    (lambda s, d: SaintLoader(s, d, N, "node", 5, 1, num_presample=0), "num_presample=0"),
    (lambda s, d: SaintLoader(s, d, N - 10, "node", 5, 1), "node ids must lie in"),
    (lambda s, d: SaintLoader(s, d[:-1], N, "node", 5, 1), "pass pairs"),
    (lambda s, d: SaintLoader(s[:0], d[:0], N, "edge", 5, 1), "has none; use mode='node'"),
    (lambda s, d: build_loader("clusters"), "Did you mean 'cluster'"),
    (lambda s, d: next(ClusterLoader(s, d, N, 4, 2).epoch(-1)), "epoch=-1 must be >= 0"),
]


@pytest.mark.parametrize("make,message", ERRORS, ids=[m for _, m in ERRORS])
def test_errors(graph, make, message):
    with pytest.raises(ValueError, match=message):
        make(*graph)


def _without(module: str, monkeypatch):
    probe = _deps._probe

    def fake(name):
        return (
            (None, f"ModuleNotFoundError: No module named {module!r}")
            if name == module
            else probe(name)
        )

    monkeypatch.setattr(_deps, "_probe", fake)


def test_missing_pymetis_is_named(graph, monkeypatch):
    _without("pymetis", monkeypatch)
    with pytest.raises(ImportError, match="pip install pymetis"):
        ClusterLoader(*graph, N, 8, 2)
    given = ClusterLoader(*graph, N, 4, 2, partition=torch.arange(N) % 4)  # no METIS needed
    assert len(list(given.epoch(0))) == 2


def test_missing_dgl_is_named(graph, monkeypatch):
    _without("dgl", monkeypatch)
    with pytest.raises(ImportError, match="pip install dgl"):
        SaintLoader(*graph, N, "node", 5, 1, engine="dgl")


def test_partition_cache_is_reused_and_a_wrong_entry_recomputed(graph, tmp_path, caplog):
    first = ClusterLoader(*graph, N, 8, 2, seed=2, cache_dir=tmp_path)
    path = first.layout_file
    assert path.endswith(".npz") and os.listdir(tmp_path) == [os.path.basename(path)]
    stamp = os.stat(path).st_mtime_ns
    again = ClusterLoader(*graph, N, 8, 2, seed=2, cache_dir=tmp_path)
    assert os.stat(path).st_mtime_ns == stamp
    assert torch.equal(again.layout.node_ids, first.layout.node_ids)
    other = ClusterLoader(*graph, N, 8, 2, seed=3, cache_dir=tmp_path)
    assert other.layout_file != path  # another METIS seed, another file
    with np.load(path) as z:
        key = str(z["key"])
    samplers.ClusterLayout.from_parts(torch.arange(N) % 4, 4).save(path, key)  # a wrong file
    with caplog.at_level("WARNING"):
        fixed = ClusterLoader(*graph, N, 8, 2, seed=2, cache_dir=tmp_path)
    assert "recomputing" in caplog.text
    assert torch.equal(fixed.layout.node_ids, first.layout.node_ids)
    assert torch.equal(fixed.layout.offsets, first.layout.offsets)


@pytest.mark.parametrize("module", [batch_module, saint_loader], ids=["batch", "saint_loader"])
def test_docstring_examples_run(module):
    result = doctest.testmod(module, extraglobs={"torch": torch})
    assert result.attempted > 0 and result.failed == 0
