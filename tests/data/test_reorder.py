"""Node orders (dgl_rsc.data.reorder): each is a permutation, the data follow it, the degree
order is sorted, RCM narrows the band of graphs with a band to find, and an unknown name is an
error that names the nearest order."""

import pytest
import torch

from dgl_rsc.data import GraphData, synthetic_graph
from dgl_rsc.data.reorder import NODE_ORDERS, inverse, permute, reorder, to_original


@pytest.fixture(scope="module")
def data():
    return synthetic_graph(num_nodes=400, avg_degree=8.0, num_classes=3, feat_dim=5, seed=2)


def _grid(k: int, seed: int = 0) -> GraphData:
    """A ``k x k`` grid graph with its node ids shuffled (both edge directions)."""
    ids = torch.arange(k * k).reshape(k, k)
    a = torch.cat([ids[:, :-1].reshape(-1), ids[:-1].reshape(-1)])
    b = torch.cat([ids[:, 1:].reshape(-1), ids[1:].reshape(-1)])
    shuffle = torch.randperm(k * k, generator=torch.Generator().manual_seed(seed))
    src, dst = shuffle[torch.cat([a, b])], shuffle[torch.cat([b, a])]
    n, node = k * k, torch.arange(k * k)
    return GraphData(src, dst, n, torch.ones(n, 1), node % 2, node % 3 == 0, node % 3 == 1,
                     node % 3 == 2, "multiclass", "accuracy", 2, "grid")  # fmt: skip


def _bandwidth(d: GraphData) -> int:
    return int((d.src - d.dst).abs().max())


def _edges(d: GraphData) -> set:
    return set(zip(d.src.tolist(), d.dst.tolist()))


@pytest.mark.parametrize("method", [m for m in NODE_ORDERS if m != "none"])
def test_an_order_is_a_permutation_and_the_data_follow_it(data, method):
    r, perm = reorder(data, method)
    n = data.num_nodes
    assert perm.dtype == torch.int64 and torch.equal(torch.sort(perm).values, torch.arange(n))
    assert not torch.equal(perm, torch.arange(n))  # the order changed something
    for attr in ("feat", "label", "train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(r, attr), getattr(data, attr)[perm]), attr
        assert torch.equal(to_original(getattr(r, attr), perm), getattr(data, attr)), attr
    inv = inverse(perm)
    assert torch.equal(inv[perm], torch.arange(n))
    # the same edges under the new names, sorted by destination then source
    renamed = set(zip(inv[data.src].tolist(), inv[data.dst].tolist()))
    assert _edges(r) == renamed and r.num_edges == data.num_edges
    key = r.dst * n + r.src
    assert bool((key[1:] > key[:-1]).all())
    assert torch.equal(to_original(r.in_degrees(), perm), data.in_degrees())


def test_none_keeps_the_data(data):
    r, perm = reorder(data, "none")
    assert r is data and perm is None
    x = torch.randn(data.num_nodes, 2)
    assert to_original(x, None) is x


def test_degree_order_is_sorted_high_first_and_stable(data):
    r, perm = reorder(data, "degree")
    deg = r.in_degrees()
    assert bool((deg[:-1] >= deg[1:]).all()) and deg[0] > deg[-1]
    before = data.in_degrees()[perm]
    ties = before[1:] == before[:-1]
    assert bool((perm[1:][ties] > perm[:-1][ties]).all())  # ties keep the dataset's order


def test_rcm_finds_the_band_of_a_shuffled_grid():
    k = 12
    g = _grid(k)
    r, perm = reorder(g, "rcm")
    assert _bandwidth(g) > 4 * k  # shuffled: a wide band
    assert _bandwidth(r) <= k + 1  # a breadth-first sweep numbers the grid by diagonals
    assert _edges(permute(g, perm)) == _edges(r)


def test_rcm_walks_every_component():
    # two shuffled grids side by side, plus isolated nodes: every node gets a new id
    a, b = _grid(5, seed=1), _grid(4, seed=2)
    n = a.num_nodes + b.num_nodes + 3
    src = torch.cat([a.src, b.src + a.num_nodes])
    dst = torch.cat([a.dst, b.dst + a.num_nodes])
    node = torch.arange(n)
    g = GraphData(src, dst, n, torch.ones(n, 1), node % 2, node % 3 == 0, node % 3 == 1,
                  node % 3 == 2, "multiclass", "accuracy", 2, "two")  # fmt: skip
    r, perm = reorder(g, "rcm")
    assert torch.equal(torch.sort(perm).values, node)
    assert _bandwidth(r) <= 6


def test_an_unknown_order_names_the_nearest():
    d = _grid(3)
    with pytest.raises(ValueError, match=r"unknown node order='rmc'\. Did you mean 'rcm'\?"):
        reorder(d, "rmc")


def test_permute_refuses_what_is_not_a_permutation(data):
    with pytest.raises(ValueError, match="permutation"):
        permute(data, torch.zeros(data.num_nodes, dtype=torch.int64))
