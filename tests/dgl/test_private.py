"""The private DGL interfaces of ``dgl_rsc.dgl.private`` against DGL's public behaviour on the
installed DGL, and the version gate that keeps them to the DGL versions they were checked on.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from dgl_rsc.dgl import private as dgl_private

pytestmark = pytest.mark.dgl


@pytest.fixture
def dgl():
    return dgl_private.require()


@pytest.fixture
def graph(dgl):
    g = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, 30, (120,), generator=g), torch.randint(0, 20, (120,), generator=g)
    return dgl.heterograph({("u", "e", "v"): (src, dst)}, {"u": 30, "v": 20})


def test_the_installed_dgl_is_a_checked_version(dgl):
    assert dgl_private.version_checked(dgl.__version__) and dgl_private.available()


def test_the_in_edge_csr_is_dgls_adjacency(dgl, graph):
    gidx = dgl_private.graph_index(graph)
    assert dgl_private.index_counts(gidx) == (1, graph.num_edges())
    assert dgl_private.has_in_csr(gidx)
    assert not dgl_private.has_in_csr(dgl_private.graph_index(graph.formats("coo")))
    num_dst, num_src, indptr, indices, eids = dgl_private.in_csr_tensors(gidx)
    assert (num_dst, num_src) == (20, 30)
    indptr_pub, indices_pub, eids_pub = graph.adj_tensors("csc")  # the public in-edge CSR
    assert torch.equal(indptr, indptr_pub) and torch.equal(indices, indices_pub)
    assert torch.equal(eids, eids_pub)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_c_kernel_sums_as_dgl_ops_does(dgl, graph, weighted, dtype):
    indptr, indices, eids = graph.adj_tensors("csc")
    gidx = dgl_private.build_index(indptr, indices, 30, 20)
    x = torch.randn(30, 5, dtype=dtype)
    w = torch.rand(graph.num_edges(), dtype=dtype)
    out = torch.zeros(20, 5, dtype=dtype)
    dgl_private.spmm_into(gidx, x, w[eids].reshape(-1, 1) if weighted else None, out)
    ref = dgl.ops.u_mul_e_sum(graph, x, w) if weighted else dgl.ops.copy_u_sum(graph, x)
    torch.testing.assert_close(out, ref, rtol=1e-12 if dtype == torch.float64 else 1e-5,
                               atol=1e-12 if dtype == torch.float64 else 1e-5)  # fmt: skip


def test_the_patched_function_and_the_helpers_exist_with_their_signatures(dgl):
    module, name = dgl_private.GSPMM
    gspmm = getattr(__import__(module, fromlist=[name]), name)
    params = list(inspect.signature(gspmm).parameters)
    assert params == ["gidx", "op", "reduce_op", "lhs_data", "rhs_data"]
    x, w = torch.randn(3, 2), torch.randn(4)
    (lhs, rhs), off = dgl_private.autocast_operands(x, w)
    assert lhs is x and rhs is w  # autocast is off: the operands pass through
    with off():
        pass
    for norm in ("both", "right", "none", "left"):
        assert dgl_private.graphconv_norm(dgl.nn.GraphConv(2, 2, norm=norm)) == norm


def test_an_unchecked_dgl_version_is_refused_with_a_clear_error(dgl, monkeypatch):
    monkeypatch.setattr(dgl, "__version__", "9.0.0")
    assert not dgl_private.available()
    with pytest.raises(ImportError, match=r"checked on DGL 2\.1 to 2\.4; DGL 9\.0\.0 is installed"):
        dgl_private.require()
    import dgl_rsc

    with pytest.raises(ImportError, match="DGL 9.0.0"):
        with dgl_rsc.patch(budget=0.5, total_steps=10):
            pass


def test_an_unchecked_dgl_leaves_the_drop_in_layers_on_public_calls(dgl, graph, monkeypatch):
    """Without the internals the drop-in layers read the graph through ``g.edges``: the same
    adjacency, the same outputs."""
    from dgl_rsc.dgl.interop import message_structure

    hom = dgl.graph(graph.edges(), num_nodes=30)
    A, eids = message_structure(hom)
    monkeypatch.setattr(dgl, "__version__", "9.0.0")
    B, eids_b = message_structure(hom)
    assert torch.equal(A.to_dense(), B.to_dense())
    ids = torch.arange(hom.num_edges()) if eids is None else eids
    assert torch.equal(ids, eids_b)
