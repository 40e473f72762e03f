"""DGL interop: dgl_rsc.spmm on a SparseMatrix, CSR from a graph index, Graph.from_dgl."""

import torch

from dgl_rsc import RSCController, spmm
from dgl_rsc.dgl.interop import csr_from_graph
from dgl_rsc.sparse.graph import Graph

from ..conftest import requires_dgl


@requires_dgl
def test_spmm_on_a_sparse_matrix_matches_dgl():
    import dgl.sparse as dglsp

    g = torch.Generator().manual_seed(0)
    row, col = torch.randint(0, 40, (200,), generator=g), torch.randint(0, 30, (200,), generator=g)
    val = torch.rand(200, generator=g, requires_grad=True)
    A = dglsp.spmatrix(torch.stack([row, col]), val, shape=(40, 30))
    X = torch.randn(30, 4, requires_grad=True)
    ref = dglsp.spmm(A, X)
    got = spmm(A, X, rsc=RSCController(budget=1.0, warmup_steps=0))
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    G = torch.randn(40, 4)
    (gx, gv) = torch.autograd.grad(got, (X, val), G)
    (rx, rv) = torch.autograd.grad(ref, (X, val), G)
    torch.testing.assert_close(gx, rx, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gv, rv, rtol=1e-5, atol=1e-6)


@requires_dgl
def test_csr_from_graph_follows_edge_ids():
    import dgl

    src, dst = torch.tensor([2, 0, 1, 2]), torch.tensor([0, 1, 2, 1])
    g = dgl.graph((src, dst), num_nodes=3)
    w = torch.tensor([1.0, 2.0, 3.0, 4.0])
    A = csr_from_graph(g, w)
    expect = torch.zeros(3, 3)
    expect[dst, src] = w
    torch.testing.assert_close(A.to_dense(), expect)


@requires_dgl
def test_graph_from_dgl_and_back():
    import dgl

    g = dgl.rand_graph(30, 90)
    G = Graph.from_dgl(g)
    assert G.num_nodes() == 30 and G.num_edges() == 90
    assert torch.equal(G.in_degrees(), g.in_degrees())
    assert torch.equal(G.out_degrees(), g.out_degrees())
