"""What a PyG user meets inside ``dgl_rsc.pyg.patch``: evaluation forwards, warnings at the
user's line, models the patch does not cover, the off switch (marker ``pyg``)."""

import warnings

import pytest
import torch

import dgl_rsc.pyg as rp

pytestmark = pytest.mark.pyg

N = 40


def graph(seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, N, (2, 240), generator=g)
    return torch.randn(N, 8, generator=g), ei


class GCN(torch.nn.Module):
    def __init__(self, conv="GCNConv"):
        import torch_geometric.nn as tgnn

        super().__init__()
        cls = getattr(tgnn, conv)
        self.c1, self.c2 = cls(8, 8), cls(8, 4)

    def forward(self, x, adj):
        return self.c2(self.c1(x, adj).relu(), adj)  # the user's line: warnings name it


def train_step(model, x, adj, rsc):
    model.train()
    model(x, adj).square().sum().backward()
    rsc.step()


@pytest.mark.parametrize("kind", ["edge_index", "csr"])
def test_eval_forward_with_grad_enabled_takes_no_product_slot(kind):
    x, ei = graph()
    adj = ei if kind == "edge_index" else torch.sparse_coo_tensor(
        ei.flip(0), torch.ones(ei.shape[1]), (N, N)).coalesce().to_sparse_csr()  # fmt: skip
    torch.manual_seed(0)
    model = GCN()
    with rp.patch(budget=0.5, warmup_steps=0, min_width=1) as rsc:
        for _ in range(3):
            train_step(model, x, adj, rsc)
            model.eval()
            ref = model(x, adj)  # grad enabled, as PyG's examples/gcn.py's test() is not
            assert ref.requires_grad
        stats = rsc.stats()
    # c1 aggregates the dataset's x (no gradient): reused, no product slot; c2 takes slot 0
    assert len(stats["layers"]) == 1, stats["layers"]
    assert [d["approx_calls"] for d in stats["layers"]] == [3]
    assert stats["cached_input_aggregation"] == {"builds": 1, "hits": 4}
    with torch.no_grad():
        plain = model(x, adj)
    torch.testing.assert_close(ref.detach(), plain)  # the forward is exact either way


def test_uncovered_layer_warning_points_at_the_users_line():
    x, ei = graph()
    model = GCN("GATConv")
    with rp.patch(budget=0.5) as rsc:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model(x, ei).sum().backward()
        rsc.step()
    ours = [w for w in caught if "GATConv ran its training forward" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    import inspect

    lines, start = inspect.getsourcelines(GCN.forward)
    line = start + next(i for i, t in enumerate(lines) if "the user's line" in t)
    assert (ours[0].filename, ours[0].lineno) == (__file__, line)


def test_model_not_covered_at_all_says_so_in_stats():
    x, ei = graph()
    model = GCN("GATConv")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with rp.patch(budget=0.5) as rsc:
            for _ in range(2):
                train_step(model, x, ei, rsc)
    stats = rsc.stats()
    assert stats["layers"] == [] and stats["nnz_exact"] == 0
    assert stats["visited_fraction"] is None  # not 1.0: nothing was approximated
    assert stats["not_approximated"] == 4  # two layers, two training steps
    assert list(stats["not_approximated_reasons"]) == ["GATConv: not covered by the patch"]


def test_partly_covered_model_counts_the_uncovered_layer():
    from torch_geometric.nn import GATConv

    x, ei = graph()
    model = GCN()
    model.c2 = GATConv(8, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with rp.patch(budget=0.5, warmup_steps=0, min_width=1, cache_inputs=False) as rsc:
            train_step(model, x, ei, rsc)
    stats = rsc.stats()
    assert len(stats["layers"]) == 1 and stats["visited_fraction"] is not None
    assert stats["not_approximated_reasons"] == {"GATConv: not covered by the patch": 1}


def test_disabled_patch_is_stock_pyg_and_step_is_a_no_op():
    x, ei = graph()
    torch.manual_seed(0)
    model = GCN()
    x = x.requires_grad_(True)
    ref = model(x, ei)
    (gref,) = torch.autograd.grad(ref.square().sum(), x)
    before = {(o, n): o.__dict__[n] for o, n in rp.patched_symbols()}
    with rp.patch(budget=0.1, enabled=False) as rsc:
        assert not rp.is_patched()
        assert all(o.__dict__[n] is f for (o, n), f in before.items())
        for _ in range(3):
            out = model(x, ei)
            (g,) = torch.autograd.grad(out.square().sum(), x)
            rsc.step()
    assert torch.equal(out, ref) and torch.equal(g, gref)
    stats = rsc.stats()
    assert stats["enabled"] is False and stats["step"] == 0 and stats["layers"] == []
    assert stats["visited_fraction"] is None
    with pytest.raises(ValueError, match="budget"):  # the configuration is still checked
        with rp.patch(budget=7.0, enabled=False):
            pass


@pytest.mark.parametrize(
    "kind", ["csr", "coo", pytest.param("sparse_tensor", marks=pytest.mark.torch_sparse)]
)
def test_sparse_adjacency_reuses_its_sample_like_edge_index(kind):
    """``gcn_norm`` makes a new ``adj_t`` at every forward; the patch keys its structure on
    the input's, so the cached sample is reused and the visited fraction is the edge_index's
    (it was 0.25 against 0.53: a fresh sample at every step)."""
    from torch_geometric.utils import to_torch_coo_tensor, to_torch_csc_tensor

    g = torch.Generator().manual_seed(0)
    n = 300
    ei = torch.unique(torch.randint(0, n, (2, 3000), generator=g), dim=1)  # no duplicates
    x = torch.randn(n, 16, generator=g)
    if kind == "sparse_tensor":
        from torch_sparse import SparseTensor

        adj = SparseTensor.from_edge_index(ei, sparse_sizes=(n, n)).t()
    elif kind == "csr":
        adj = to_torch_csc_tensor(ei, size=(n, n)).t()
    else:
        adj = to_torch_coo_tensor(ei, size=(n, n)).t().coalesce()
    stats = {}
    for name, graph_input in (("edge_index", ei), (kind, adj)):
        torch.manual_seed(0)
        model = GCN()
        model.c1, model.c2 = type(model.c1)(16, 16), type(model.c2)(16, 4)
        with rp.patch(budget=0.1, min_width=1, total_steps=1000) as rsc:
            for _ in range(12):
                train_step(model, x, graph_input, rsc)
        stats[name] = rsc.stats()
    got, ref = stats[kind], stats["edge_index"]
    assert got["cache_hits"] == ref["cache_hits"] > 0
    assert got["nnz_exact"] == ref["nnz_exact"]
    assert abs(got["visited_fraction"] - ref["visited_fraction"]) < 0.02, (got, ref)


@pytest.mark.parametrize("keep", [True, False])
def test_patch_keeps_freed_memory_for_its_block_only(fake_glibc, keep):
    from dgl_rsc.base import memory

    x, ei = graph()
    with rp.patch(budget=0.5, keep_freed_memory=keep) as rsc:
        assert memory._KEPT[0] is keep
        train_step(GCN(), x, ei, rsc)
    assert fake_glibc == ([True, False] if keep else [])
    assert memory._KEPT[0] is False


@pytest.mark.parametrize("arg", ["enabled", "keep_freed_memory", "cache_inputs"])
def test_a_string_switch_is_refused_before_the_patch_starts(arg):
    from dgl_rsc.pyg.patch import is_patched

    said = rf"dgl_rsc.pyg.patch\({arg}=\.\.\.\) takes True or False"
    with pytest.raises(TypeError, match=said):
        with rp.patch(**{arg: "false"}):
            pass
    assert not is_patched()
