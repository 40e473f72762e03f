"""The DGL-free Graph against a dense reference; degrees, self-loops, devices, errors."""

import pytest
import torch

from dgl_rsc.sparse.graph import Graph


def dense(src, dst, n, w=None):
    A = torch.zeros(n, n)
    A.index_put_((dst, src), torch.ones(src.numel()) if w is None else w, accumulate=True)
    return A


def test_adjacency_equals_the_dense_definition():
    g = torch.Generator().manual_seed(0)
    src = torch.randint(0, 50, (300,), generator=g)
    dst = torch.randint(0, 50, (300,), generator=g)
    w = torch.rand(300, generator=g)
    G = Graph(src, dst, 50)
    torch.testing.assert_close(G.adjacency().to_dense(), dense(src, dst, 50))
    torch.testing.assert_close(G.adjacency(w).to_dense(), dense(src, dst, 50, w))
    assert torch.equal(G.in_degrees(), torch.bincount(dst, minlength=50))
    assert torch.equal(G.out_degrees(), torch.bincount(src, minlength=50))


def test_self_loops_and_to():
    G = Graph(torch.tensor([0, 1]), torch.tensor([1, 2]), 4).add_self_loop()
    assert G.num_edges() == 6 and G.in_degrees().tolist() == [1, 2, 2, 1]
    assert G.to("cpu").num_nodes() == 4


@pytest.mark.parametrize(
    "src, dst, n, exc, match",
    [
        ([0, 5], [1, 2], 4, ValueError, "node id 5 in src/dst is out of range for num_nodes=4"),
        ([0, -1], [1, 2], 4, ValueError, "node id -1"),
        ([0.0, 1.0], [1, 2], 4, TypeError, "integer node ids"),
        ([0, 1, 2], [1, 2], 4, ValueError, "equal length"),
    ],
    ids=["too-large", "negative", "float", "lengths"],
)
def test_bad_edges_are_named(src, dst, n, exc, match):
    with pytest.raises(exc, match=match):
        Graph(torch.tensor(src), torch.tensor(dst), n)


def test_edge_weight_length_is_checked():
    G = Graph(torch.tensor([0, 1]), torch.tensor([1, 0]), 2)
    with pytest.raises(ValueError, match="edge_weight has 3 entries but the graph has 2 edges"):
        G.adjacency(torch.ones(3))
