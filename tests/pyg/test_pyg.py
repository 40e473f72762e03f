"""dgl_rsc.pyg: the drop-in PyG convs and the PyG patch against stock PyTorch Geometric.

Every test but the first needs torch_geometric (marker ``pyg``: deselected where it does not
import, run by the modern environment's leg). At budget 1.0 the drop-ins and the patched
stock convs give PyG's outputs and gradients to 1e-5, on ``edge_index`` (with and without
edge weights) and on ``torch.sparse`` adjacencies.
"""

import copy
import warnings

import pytest
import torch

import dgl_rsc.pyg as rp
from dgl_rsc.base import _deps


def test_package_imports_without_torch_geometric_and_names_the_fix():
    assert callable(rp.patch) and callable(rp.attach) and callable(rp.convert)
    with pytest.raises(ValueError, match="dgl_rsc.pyg.convert"):
        rp.attach(torch.nn.Linear(2, 2), budget=0.1)
    if _deps.torch_geometric_available():
        import torch_geometric.nn as tgnn

        assert issubclass(rp.GCNConv, tgnn.GCNConv)
    else:
        with pytest.raises(ImportError, match="pip install torch-geometric"):
            rp.GCNConv  # noqa: B018


N = 24


def graph(seed=0):
    """A random directed graph with a few self-loops and a parallel edge."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, N, (90,), generator=g)
    dst = torch.randint(0, N, (90,), generator=g)
    src = torch.cat([src, torch.tensor([3, 5, 7])])
    dst = torch.cat([dst, torch.tensor([3, 5, 7])])
    return torch.stack([src, dst]), torch.rand(src.numel(), generator=g) + 0.1


def layers():
    import torch_geometric.nn as tgnn

    return {
        "gcn": lambda: tgnn.GCNConv(8, 6),
        "gcn-improved-nobias": lambda: tgnn.GCNConv(8, 6, improved=True, bias=False),
        "gcn-noloops": lambda: tgnn.GCNConv(8, 6, add_self_loops=False),
        "gcn-nonorm": lambda: tgnn.GCNConv(8, 6, normalize=False),
        "gcn-cached": lambda: tgnn.GCNConv(8, 6, cached=True),
        "sage": lambda: tgnn.SAGEConv(8, 6),
        "sage-project-normalize": lambda: tgnn.SAGEConv(8, 6, project=True, normalize=True),
        "sage-noroot": lambda: tgnn.SAGEConv(8, 6, root_weight=False),
        "gcn2": lambda: tgnn.GCN2Conv(8, alpha=0.2, theta=0.5, layer=2),
        "gcn2-separate": lambda: tgnn.GCN2Conv(
            8, alpha=0.1, theta=1.0, layer=1, shared_weights=False
        ),  # fmt: skip
        "gcn2-noloops": lambda: tgnn.GCN2Conv(8, alpha=0.2, add_self_loops=False),
    }


LAYER_NAMES = list(
    ["gcn", "gcn-improved-nobias", "gcn-noloops", "gcn-nonorm", "gcn-cached", "sage",
     "sage-project-normalize", "sage-noroot", "gcn2", "gcn2-separate", "gcn2-noloops"]
)  # fmt: skip
INPUTS = ["edge_index", "edge_weight", "csr", "coo", "sparse_tensor"]


def adjacency(kind, ei, w):
    """``(graph argument, edge weight or None)`` of input ``kind``."""
    from torch_geometric.utils import to_torch_coo_tensor, to_torch_csc_tensor

    if kind == "edge_index":
        return ei, None
    if kind == "edge_weight":
        return ei, w
    if kind == "csr":  # the transposed CSC adjacency is CSR (PyG's own tests do this)
        return to_torch_csc_tensor(ei, w, size=(N, N)).t(), None
    if kind == "sparse_tensor":  # torch_sparse's adj_t, as PyG's own tests build it
        from torch_sparse import SparseTensor

        return SparseTensor.from_edge_index(ei, w, sparse_sizes=(N, N)).t(), None
    return to_torch_coo_tensor(ei, w, size=(N, N)).t().coalesce(), None


def run(conv, name, adj, w, x, x0, upstream):
    """``(out, x.grad, edge_weight.grad, {param: grad})`` of ``(out * upstream).sum()``."""
    x = x.detach().clone().requires_grad_(True)
    w = None if w is None else w.detach().clone().requires_grad_(True)
    if name.startswith("gcn2"):
        out = conv(x, x0, adj, w)
    elif name.startswith("sage"):
        out = conv(x, adj)
    else:
        out = conv(x, adj, w)
    (out * upstream).sum().backward()
    grads = {k: p.grad.clone() for k, p in conv.named_parameters()}
    return out.detach(), x.grad, None if w is None else w.grad, grads


def assert_same(got, ref, what):
    for a, b, part in zip(got[:3], ref[:3], ("output", "x.grad", "edge_weight.grad")):
        assert (a is None) == (b is None), (what, part)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"{what}: {part}")
    assert got[3].keys() == ref[3].keys()
    for k in ref[3]:
        torch.testing.assert_close(got[3][k], ref[3][k], rtol=1e-5, atol=1e-5,
                                   msg=f"{what}: grad of {k}")  # fmt: skip


#: every layer on every input kind (SAGEConv takes no edge weights); a SparseTensor case needs
#: torch_sparse (the `torch_sparse` marker: deselected where it does not import)
CASES = [
    pytest.param(
        n, k, id=f"{n}-{k}", marks=[pytest.mark.torch_sparse] if k == "sparse_tensor" else []
    )
    for n in LAYER_NAMES
    for k in INPUTS
    if not (n.startswith("sage") and k == "edge_weight")
]


@pytest.mark.pyg
@pytest.mark.parametrize("name, kind", CASES)
def test_budget_one_equals_stock_pyg(name, kind):
    ei, w = graph()
    adj, weight = adjacency(kind, ei, w)
    torch.manual_seed(0)
    stock = layers()[name]()
    x, x0, up = torch.randn(N, 8), torch.randn(N, 8), torch.randn(N, 6 if "gcn2" not in name else 8)
    ours = rp.twin(copy.deepcopy(stock))
    assert (
        type(ours).__module__ == "dgl_rsc.pyg.convs" and type(ours).__name__ == type(stock).__name__
    )
    ctl = rp.attach(torch.nn.ModuleList([ours]), budget=1.0, warmup_steps=0)
    patched = copy.deepcopy(stock)
    ref = run(stock, name, adj, weight, x, x0, up)
    got = run(ours, name, adj, weight, x, x0, up)
    with rp.patch(budget=1.0, warmup_steps=0) as rsc:
        pat = run(patched, name, adj, weight, x, x0, up)
    assert_same(got, ref, "drop-in")
    assert_same(pat, ref, "patch")
    # RSC's sampled backward really ran, once per forward
    assert sum(s.stats.approx_calls for s in ctl.layers) == 1
    assert sum(s.stats.approx_calls for s in rsc.layers) == 1


@pytest.mark.pyg
def test_sage_bipartite_pairs_and_sizes():
    import torch_geometric.nn as tgnn

    ei = torch.tensor([[0, 1, 2, 3, 3], [0, 0, 1, 1, 2]])
    x1, x2 = torch.randn(4, 8), torch.randn(3, 16)
    torch.manual_seed(0)
    stock = tgnn.SAGEConv((8, 16), 5)
    ours = rp.twin(copy.deepcopy(stock))
    rp.attach(torch.nn.ModuleList([ours]), budget=1.0, warmup_steps=0)
    for dst, kw in [(x2, {}), (None, {"size": (4, 3)})]:
        a = x1.clone().requires_grad_(True)
        b = x1.clone().requires_grad_(True)
        ref = stock((a, dst), ei, **kw)
        got = ours((b, dst), ei, **kw)
        assert got.shape == ref.shape == (3, 5)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        ref.sum().backward()
        got.sum().backward()
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.pyg
def test_sage_other_aggregations_are_refused_with_the_fix():
    for aggr in ("sum", "max", "lstm", ["mean", "max"]):
        with pytest.raises(ValueError, match="aggr='mean' only.*torch_geometric.nn.SAGEConv"):
            rp.SAGEConv(8, 4, aggr=aggr)
    import torch_geometric.nn as tgnn

    assert rp.twin(tgnn.SAGEConv(8, 4, aggr="max")) is None  # convert leaves it alone
    import inspect

    def params(f):
        return [(p.name, p.default, p.kind) for p in inspect.signature(f).parameters.values()]

    for name in ("GCNConv", "SAGEConv", "GCN2Conv"):  # PyG's signatures and defaults
        ours, theirs = getattr(rp, name), getattr(tgnn, name)
        assert params(ours.forward) == params(theirs.forward), name
        assert params(ours.__init__) == params(theirs.__init__), name


@pytest.mark.pyg
def test_convert_keeps_parameters_options_and_repr():
    import torch_geometric.nn as tgnn

    model = torch.nn.ModuleDict({
        "a": tgnn.GCNConv(8, 6, improved=True, cached=True),
        "b": torch.nn.Sequential(
            tgnn.SAGEConv(6, 4, project=True), tgnn.SAGEConv(4, 4, aggr="max")
        ),
        "c": tgnn.GCN2Conv(4, alpha=0.3, theta=0.7, layer=3, shared_weights=False),
        "d": tgnn.GATConv(4, 4),
    })  # fmt: skip
    model.eval()
    before = {k: p for k, p in model.named_parameters()}
    reprs = [repr(m) for m in model.modules()]
    state = torch.random.get_rng_state()
    rp.convert(model)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert type(model["a"]) is rp.GCNConv and model["a"].improved and model["a"].cached
    assert type(model["b"][0]) is rp.SAGEConv and model["b"][0].project
    assert type(model["b"][1]) is tgnn.SAGEConv  # max: no twin
    assert type(model["c"]) is rp.GCN2Conv and model["c"].weight2 is not None
    assert model["c"].beta == pytest.approx(torch.log(torch.tensor(0.7 / 3 + 1)).item())
    assert type(model["d"]) is tgnn.GATConv
    assert all(p is before[k] for k, p in model.named_parameters())  # the same objects
    assert [repr(m) for m in model.modules()] == reprs
    assert not model["a"].training
    layers = rp.rsc_layers(model)
    ctl = rp.attach(model, budget=0.5)
    assert [m.rsc_slots() for m in layers] == [range(0, 1), range(1, 2), range(2, 3)]
    assert ctl.config.budget == 0.5


@pytest.mark.pyg
def test_gcn_structure_is_sorted_once_per_graph():
    ei, _ = graph()
    conv = rp.GCNConv(8, 6)  # not cached: gcn_norm makes a new edge list every call
    ctl = rp.attach(torch.nn.ModuleList([conv]), budget=0.5, warmup_steps=0)
    tokens, norms = set(), set()
    for _ in range(3):
        x = torch.randn(N, 8, requires_grad=True)
        conv(x, ei).sum().backward()
        entries = {k[0]: v for k, v in ctl.structures._entries.items()}
        tokens.add(entries["pyg"][1][0].token)  # (kept-alive edge_index, (A, perm))
        norms.add(id(entries["gcn_norm_values"][1]))  # gcn_norm's output, kept too
        ctl.step()
    assert len(ctl.structures) == 2 and len(tokens) == 1 and len(norms) == 1


@pytest.mark.pyg
def test_reset_parameters_clears_rsc_caches_and_pyg_cache():
    ei, _ = graph()
    conv = rp.GCNConv(8, 6, cached=True)
    ctl = rp.attach(torch.nn.ModuleList([conv]), budget=0.3, warmup_steps=0)
    conv(torch.randn(N, 8, requires_grad=True), ei).sum().backward()
    assert conv._cached_edge_index is not None
    assert {k[0] for k in ctl.structures._entries} == {"pyg", "gcn_norm_values"}
    cleared = []
    ctl.layers[0].clear_cache = lambda: cleared.append(True)
    conv.reset_parameters()
    assert conv._cached_edge_index is None and cleared == [True]


@pytest.mark.pyg
def test_sampled_backward_is_approximate_but_aligned():
    ei, _ = graph(3)
    torch.manual_seed(0)
    conv = rp.GCNConv(8, 16)
    x = torch.randn(N, 8)
    up = torch.randn(N, 16)

    def xgrad():
        xx = x.clone().requires_grad_(True)
        (conv(xx, ei) * up).sum().backward()
        return xx.grad

    rp.exact(torch.nn.ModuleList([conv]))
    exact = xgrad()
    ctl = rp.attach(torch.nn.ModuleList([conv]), budget=0.3, warmup_steps=0)
    approx = xgrad()
    stats = ctl.stats()
    assert stats["visited_fraction"] < 0.6
    assert not torch.allclose(approx, exact)
    cos = torch.nn.functional.cosine_similarity(approx.flatten(), exact.flatten(), dim=0)
    assert cos > 0.5, cos


class Net(torch.nn.Module):
    def __init__(self, extra=False):
        import torch_geometric.nn as tgnn

        super().__init__()
        self.c1 = tgnn.GCNConv(8, 8)
        self.c2 = tgnn.GATConv(8, 4) if extra else tgnn.SAGEConv(8, 4)

    def forward(self, x, ei):
        return self.c2(self.c1(x, ei).relu(), ei)


@pytest.mark.pyg
def test_patch_restores_every_symbol_on_exit_and_on_error():
    import torch_geometric.nn as tgnn
    import torch_geometric.nn.conv.gcn_conv as gcn_mod
    import torch_geometric.utils as tgu

    before = {(o, n): o.__dict__[n] for o, n in rp.patched_symbols()}
    assert (gcn_mod, "spmm") in before and (tgu, "spmm") in before
    with rp.patch(budget=0.5):
        assert rp.is_patched() and tgnn.GCNConv.forward is not before[(tgnn.GCNConv, "forward")]
        with pytest.raises(RuntimeError, match="do not nest"):
            with rp.patch(budget=0.5):
                pass
    assert not rp.is_patched()
    with pytest.raises(KeyError):
        with rp.patch(budget=0.5):
            raise KeyError("boom")
    assert all(o.__dict__[n] is f for (o, n), f in before.items())


@pytest.mark.pyg
def test_patch_warns_once_naming_uncovered_layers_and_trains_covered_ones():
    ei, _ = graph()
    x = torch.randn(N, 8)
    torch.manual_seed(0)
    covered, partly = Net(), Net(extra=True)
    with rp.patch(budget=0.5, warmup_steps=0) as rsc:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a covered model raises no warning
            covered(x, ei).sum().backward()
        # the first layer aggregates x (no gradient) before its transform: no backward product
        assert [d["approx_calls"] for d in rsc.stats()["layers"]] == [1]
        rsc.step()
        with pytest.warns(UserWarning, match="GATConv ran its training forward"):
            partly(x, ei).sum().backward()
        rsc.step()  # one step per training pass (a missing step() warns on its own)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once
            partly(x, ei).sum().backward()
        partly.eval()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # evaluation never warns
            with torch.no_grad():
                partly(x, ei)


@pytest.mark.pyg
@pytest.mark.parametrize(
    "kind", ["csr", pytest.param("sparse_tensor", marks=pytest.mark.torch_sparse)]
)
def test_patch_covers_fused_spmm_of_other_layers(kind):
    import torch_geometric.nn as tgnn

    ei, _ = graph()
    adj_t, _ = adjacency(kind, ei, None)
    torch.manual_seed(0)
    conv = tgnn.GINConv(torch.nn.Linear(8, 4))
    x = torch.randn(N, 8, requires_grad=True)
    ref = conv(x, adj_t)
    with rp.patch(budget=1.0, warmup_steps=0) as rsc:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = conv(x, adj_t)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert len(rsc.layers) == 1
