"""Conformance: every drop-in of ``dgl_rsc.nn.TWINS`` and every stock conv inside
``dgl_rsc.patch`` against the stock ``dgl.nn`` conv, on the same inputs and parameters.

Forward outputs must be bit-identical (``torch.equal``): the CPU product engine adds the
same numbers in the same order as DGL's message passing. Gradients (input features, edge
weights, external weights, parameters) at budget 1.0 must agree to float rounding: the
exact backward runs other kernels than DGL's (a transposed CSR, autograd's scatter), so
sums are taken in another order.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Optional

import pytest
import torch
import torch.nn.functional as F

import dgl_rsc
import dgl_rsc.nn as rnn

from ..conftest import requires_dgl

pytestmark = [requires_dgl, pytest.mark.dgl, pytest.mark.usefixtures("one_thread")]

DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.float64, id="fp64")]
GRAD_RTOL = {torch.float32: 1e-5, torch.float64: 1e-10}
EDGE_WEIGHTS = ["none", "E", "E1", "ED"]  # (E,), (E, 1), per feature (E, D)


@pytest.fixture(scope="module")
def dgl():
    import dgl as _dgl

    return _dgl


@pytest.fixture(scope="module")
def graphs(dgl):
    """Small graphs of every kind the layers take (all nodes with in-edges)."""
    gen = torch.Generator().manual_seed(0)
    n = 30
    src = torch.randint(0, n, (90,), generator=gen)
    dst = torch.randint(0, n, (90,), generator=gen)
    homo = dgl.add_self_loop(dgl.graph((src, dst), num_nodes=n))
    n_src, n_dst = 25, 12
    b_src = torch.cat([torch.randint(0, n_src, (12,), generator=gen), torch.arange(n_dst)])
    b_dst = torch.cat([torch.arange(n_dst), torch.randint(0, n_dst, (12,), generator=gen)])
    bipartite = dgl.heterograph(
        {("user", "rates", "item"): (b_src, b_dst)}, {"user": n_src, "item": n_dst}
    )
    seeds = torch.arange(10)
    block = dgl.to_block(dgl.in_subgraph(homo, seeds), seeds)
    return {"homo": homo, "bipartite": bipartite, "block": block}


# -- the comparison --------------------------------------------------------------------
@dataclass
class Run:
    out: torch.Tensor
    grads: dict = field(default_factory=dict)


def run(conv, graph, inputs: dict, call: Callable, seed: int = 7) -> Run:
    """Forward ``call(conv, graph, leaves)`` and backward a fixed random projection of it;
    the gradients of the leaves (inputs) and of the parameters, by name."""
    leaves = {k: v.detach().clone().requires_grad_(v.is_floating_point()) for k, v in
              inputs.items()}  # fmt: skip
    out = call(conv, graph, leaves)
    proj = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out)
    (out * proj).sum().backward()
    grads = {f"input {k}": v.grad for k, v in leaves.items()}
    grads.update({f"param {k}": p.grad for k, p in conv.named_parameters()})
    return Run(out.detach(), grads)


def assert_grads_close(got: Run, ref: Run, dtype, who: str) -> None:
    assert got.grads.keys() == ref.grads.keys(), who
    rtol = GRAD_RTOL[dtype]
    for name, r in ref.grads.items():
        g = got.grads[name]
        if r is None or g is None:
            assert r is None and g is None, f"{who}: {name} has a gradient on one side only"
            continue
        scale = float(r.abs().max()) if r.numel() else 0.0
        torch.testing.assert_close(g, r, rtol=rtol, atol=rtol * scale, msg=f"{who}: {name}")


def check(stock, graph, inputs, call, dtype, products: Optional[int] = 1, by_patch=None):
    """Stock conv vs its drop-in twin vs the stock conv inside the patch: outputs equal,
    gradients to rounding. ``products``: approximated products per forward (``None``: the
    call is not one RSC approximates, as per-feature edge weights); ``by_patch``: those the
    patch takes over (default: the same)."""
    stock = stock.to(dtype)
    inputs = {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}
    ours = rnn.twin(copy.deepcopy(stock))
    assert type(ours) is rnn.TWINS[type(stock).__name__]
    ctl = rnn.attach(torch.nn.ModuleList([ours]), budget=1.0, warmup_steps=0, switch_at=1.0)
    patched = copy.deepcopy(stock)
    ref = run(stock, graph, inputs, call)
    got = run(ours, graph, inputs, call)
    with dgl_rsc.patch(budget=1.0, warmup_steps=0, switch_at=1.0) as rsc:
        pat = run(patched, graph, inputs, call)
    assert got.out.dtype == ref.out.dtype == dtype
    assert torch.equal(got.out, ref.out), (got.out - ref.out).abs().max()
    assert torch.equal(pat.out, ref.out), (pat.out - ref.out).abs().max()
    assert_grads_close(got, ref, dtype, "drop-in")
    assert_grads_close(pat, ref, dtype, "patch")
    # the approximated path really ran (and nothing else was taken over)
    approx = sum(s.stats.approx_calls for s in ctl.layers)
    assert approx == (products or 0), approx
    assert len(rsc.layers) == ((products or 0) if by_patch is None else by_patch)


def edge_weight(graph, kind: str, width: int, gen) -> dict:
    e = graph.num_edges()
    shape = {"none": None, "E": (e,), "E1": (e, 1), "ED": (e, width)}[kind]
    return {} if shape is None else {"w": torch.rand(shape, generator=gen) + 0.1}


# -- GraphConv ---------------------------------------------------------------------------
WIDTHS = [pytest.param((6, 3), id="shrink"), pytest.param((3, 5), id="grow")]
WEIGHT_MODES = [  # (weight, bias); without a weight the output has the input width
    pytest.param(w, b, id=f"{w}-{'bias' if b else 'nobias'}")
    for w, b in [("own", True), ("own", False), ("none", False), ("external", True),
                 ("external", False)]
]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ew", EDGE_WEIGHTS)
@pytest.mark.parametrize("weight, bias", WEIGHT_MODES)
@pytest.mark.parametrize("widths", WIDTHS)
@pytest.mark.parametrize("norm", ["none", "both", "right", "left"])
def test_graphconv(dgl, graphs, norm, widths, weight, bias, ew, dtype):
    d_in, d_out = widths
    g = graphs["homo"]
    gen = torch.Generator().manual_seed(1)
    torch.manual_seed(0)
    stock = dgl.nn.GraphConv(d_in, d_out, norm=norm, weight=weight == "own", bias=bias)
    has_w = weight != "none"
    msg_width = d_out if has_w and d_in > d_out else d_in
    inputs = {"x": torch.randn(g.num_nodes(), d_in, generator=gen)}
    inputs.update(edge_weight(g, ew, msg_width, gen))
    if weight == "external":
        inputs["W"] = torch.randn(d_in, d_out, generator=gen)

    def call(conv, graph, t):
        return conv(graph, t["x"], weight=t.get("W"), edge_weight=t.get("w"))

    check(stock, g, inputs, call, dtype, None if ew == "ED" else 1)


STRUCTURES = [  # a bipartite graph takes a pair of features; a block a pair or one tensor
    pytest.param("bipartite", "pair", id="bipartite-pair"),
    pytest.param("block", "pair", id="block-pair"),
    pytest.param("block", "single", id="block-single"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ew", ["none", "E"])
@pytest.mark.parametrize("kind, feat", STRUCTURES)
@pytest.mark.parametrize("layer", ["gcn-both", "gcn-right", "sage-mean", "sage-gcn"])
def test_bipartite_and_blocks(dgl, graphs, layer, kind, feat, ew, dtype):
    g = graphs[kind]
    gen = torch.Generator().manual_seed(2)
    torch.manual_seed(0)
    d_src, d_dst, d_out = (5, 5, 3) if layer == "sage-gcn" or feat == "single" else (5, 4, 3)
    if layer.startswith("gcn"):
        stock = dgl.nn.GraphConv(d_src, d_out, norm=layer.split("-")[1])
    else:
        stock = dgl.nn.SAGEConv((d_src, d_dst), d_out, layer.split("-")[1])
    inputs = {"xs": torch.randn(g.num_src_nodes(), d_src, generator=gen)}
    if feat == "pair":
        inputs["xd"] = torch.randn(g.num_dst_nodes(), d_dst, generator=gen)
    inputs.update(edge_weight(g, ew, 0, gen))

    def call(conv, graph, t):
        x = (t["xs"], t["xd"]) if "xd" in t else t["xs"]
        return conv(graph, x, edge_weight=t.get("w"))

    check(stock, g, inputs, call, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layer", ["gcn-both", "sage-mean", "sage-gcn"])
def test_graph_restricted_to_coo(dgl, graphs, layer, dtype):
    """DGL passes messages over the COO edges of such a graph (on one thread: each node's
    in-edges in edge-id order); the drop-ins read the same order from the edges, the patch
    leaves these calls to DGL."""
    g = graphs["homo"].formats("coo")
    torch.manual_seed(0)
    if layer.startswith("gcn"):
        stock = dgl.nn.GraphConv(4, 3)
    else:
        stock = dgl.nn.SAGEConv(4, 3, layer.split("-")[1])
    inputs = {"x": torch.randn(g.num_nodes(), 4), "w": torch.rand(g.num_edges()) + 0.1}

    def call(conv, graph, t):
        return conv(graph, t["x"], edge_weight=t["w"])

    check(stock, g, inputs, call, dtype, 1, by_patch=0)
    assert g.formats()["created"] == ["coo"]  # nothing made another format


# -- SAGEConv ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ew", EDGE_WEIGHTS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("widths", WIDTHS)
@pytest.mark.parametrize("aggregator", ["mean", "gcn"])
def test_sageconv(dgl, graphs, aggregator, widths, bias, ew, dtype):
    d_in, d_out = widths
    g = graphs["homo"]
    gen = torch.Generator().manual_seed(3)
    torch.manual_seed(0)
    stock = dgl.nn.SAGEConv(d_in, d_out, aggregator, bias=bias, activation=F.relu)
    inputs = {"x": torch.randn(g.num_nodes(), d_in, generator=gen)}
    inputs.update(edge_weight(g, ew, d_out if d_in > d_out else d_in, gen))

    def call(conv, graph, t):
        return conv(graph, t["x"], edge_weight=t.get("w"))

    check(stock, g, inputs, call, dtype, None if ew == "ED" else 1)


# -- GCN2Conv ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ew", ["none", "E"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("project", [True, False], ids=["project", "separate"])
def test_gcn2conv(dgl, graphs, project, bias, ew, dtype):
    g = graphs["homo"]
    gen = torch.Generator().manual_seed(4)
    torch.manual_seed(0)
    stock = dgl.nn.GCN2Conv(4, layer=2, alpha=0.2, project_initial_features=project, bias=bias)
    inputs = {"x": torch.randn(g.num_nodes(), 4, generator=gen)}
    inputs["x0"] = torch.randn(g.num_nodes(), 4, generator=gen)
    inputs.update(edge_weight(g, ew, 0, gen))

    def call(conv, graph, t):
        return conv(graph, t["x"], t["x0"], edge_weight=t.get("w"))

    check(stock, g, inputs, call, dtype)


# -- ChebConv ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lam", ["given", "default"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_chebconv(dgl, graphs, k, bias, lam, dtype):
    g = dgl.to_bidirected(graphs["homo"])  # ChebConv's Laplacian assumes symmetry
    gen = torch.Generator().manual_seed(5)
    torch.manual_seed(0)
    stock = dgl.nn.ChebConv(4, 3, k, bias=bias)
    inputs = {"x": torch.randn(g.num_nodes(), 4, generator=gen)}
    lambda_max = [1.7] if lam == "given" else None

    def call(conv, graph, t):
        return conv(graph, t["x"], lambda_max=lambda_max)

    if lam == "default":
        with pytest.warns(UserWarning, match="lambda_max"):
            check(stock, g, inputs, call, dtype, k - 1)
    else:
        check(stock, g, inputs, call, dtype, k - 1)


def test_chebconv_batched_graphs_take_one_lambda_per_graph(dgl, graphs):
    g = dgl.to_bidirected(graphs["homo"])
    batch = dgl.batch([g, dgl.add_self_loop(dgl.rand_graph(7, 20))])
    torch.manual_seed(0)
    stock = dgl.nn.ChebConv(4, 3, 3)
    inputs = {"x": torch.randn(batch.num_nodes(), 4)}

    def call(conv, graph, t):
        return conv(graph, t["x"], lambda_max=torch.tensor([1.5, 1.9]))

    check(stock, batch, inputs, call, torch.float32, 2)
    with pytest.raises(dgl.DGLError, match="one value per graph"):
        rnn.ChebConv(4, 3, 3)(batch, inputs["x"], lambda_max=[2.0])


# -- zero in-degrees, empty relations, errors -------------------------------------------
ZERO_IN_LAYERS = {
    "GraphConv": lambda dglnn, allow: dglnn.GraphConv(4, 3, allow_zero_in_degree=allow),
    "GCN2Conv": lambda dglnn, allow: dglnn.GCN2Conv(4, 1, allow_zero_in_degree=allow),
}


def _call_any(conv, graph, t):
    if isinstance(conv, (rnn.GCN2Conv,)) or type(conv).__name__ == "GCN2Conv":
        return conv(graph, t["x"], t["x"])
    return conv(graph, t["x"])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(ZERO_IN_LAYERS))
def test_zero_in_degree(dgl, name, dtype):
    g = dgl.graph((torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 1])), num_nodes=6)
    torch.manual_seed(0)
    inputs = {"x": torch.randn(6, 4)}
    refused = ZERO_IN_LAYERS[name](dgl.nn, False)
    ours = rnn.twin(copy.deepcopy(refused))
    with pytest.raises(dgl.DGLError, match="0-in-degree") as theirs:
        _call_any(refused, g, inputs)
    with pytest.raises(dgl.DGLError, match="0-in-degree") as mine:
        _call_any(ours, g, inputs)
    assert "add_self_loop" in str(theirs.value) and "add_self_loop" in str(mine.value)
    assert isinstance(mine.value, (ValueError, rnn.RSCLayerError))
    check(ZERO_IN_LAYERS[name](dgl.nn, True), g, inputs, _call_any, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("aggregator", ["mean", "gcn"])
def test_sageconv_on_nodes_without_in_edges(dgl, aggregator, dtype):
    """SAGEConv has no zero-in-degree check: such nodes get zero (mean) or their own (gcn)
    neighbour term, in both."""
    g = dgl.graph((torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 1])), num_nodes=6)
    torch.manual_seed(0)
    stock = dgl.nn.SAGEConv(4, 3, aggregator)
    inputs = {"x": torch.randn(6, 4), "w": torch.rand(4) + 0.1}

    def call(conv, graph, t):
        return conv(graph, t["x"], edge_weight=t["w"])

    check(stock, g, inputs, call, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layer", ["GraphConv", "SAGEConv"])
def test_hetero_relation_with_zero_source_nodes(dgl, layer, dtype):
    g = dgl.heterograph(
        {
            ("a", "r", "b"): (torch.tensor([], dtype=torch.long),) * 2,
            ("b", "s", "b"): (torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1])),
        },
        {"a": 0, "b": 3},
    )
    torch.manual_seed(0)

    def conv():
        if layer == "GraphConv":
            return dgl.nn.GraphConv(4, 2, allow_zero_in_degree=True)
        return dgl.nn.SAGEConv(4, 2, "mean")

    stock = dgl.nn.HeteroGraphConv({"r": conv(), "s": conv()}).to(dtype)
    ours = rnn.convert(copy.deepcopy(stock))
    assert all(isinstance(m, rnn.TWINS[layer]) for m in ours.mods.values())
    rnn.attach(ours, budget=1.0, warmup_steps=0)
    inputs = {"a": torch.randn(0, 4, dtype=dtype), "b": torch.randn(3, 4, dtype=dtype)}

    def call(model, graph, t):
        return model(graph, {"a": t["a"], "b": t["b"]})["b"]

    ref = run(stock, g, inputs, call)
    got = run(ours, g, inputs, call)
    with dgl_rsc.patch(budget=1.0, warmup_steps=0):
        pat = run(copy.deepcopy(stock), g, inputs, call)
    assert torch.equal(got.out, ref.out) and torch.equal(pat.out, ref.out)
    assert_grads_close(got, ref, dtype, "drop-in")
    assert_grads_close(pat, ref, dtype, "patch")


def test_refusals_are_dgl_errors_like_dgl(dgl, graphs):
    g = graphs["homo"]
    x = torch.randn(g.num_nodes(), 4)
    cases = [
        ("SAGEConv gcn, widths differ", lambda m: m.SAGEConv((4, 3), 2, "gcn"),
         lambda c: c(graphs["bipartite"], (torch.randn(25, 4), torch.randn(12, 3))),
         "feature shape"),
        ("GCN2Conv (E, 1) weights", lambda m: m.GCN2Conv(4, 1),
         lambda c: c(g, x, x, edge_weight=torch.rand(g.num_edges(), 1)), "scalar edge weight"),
        ("GCN2Conv weight <= 0", lambda m: m.GCN2Conv(4, 1),
         lambda c: c(g, x, x, edge_weight=torch.zeros(g.num_edges())), "Non-positive"),
        ("GraphConv external + own weight", lambda m: m.GraphConv(4, 2),
         lambda c: c(g, x, weight=torch.randn(4, 2)), "External weight"),
        ("GraphConv weight dtype", lambda m: m.GraphConv(4, 2),
         lambda c: c(g, x, edge_weight=torch.rand(g.num_edges(), dtype=torch.float64)),
         "float64"),
        ("GraphConv bad norm", lambda m: m.GraphConv(4, 2, norm="sym"), None, "norm"),
        ("SAGEConv bad aggregator", lambda m: m.SAGEConv(4, 2, "sum"), None, "sum"),
    ]  # fmt: skip
    for what, build, call, pattern in cases:
        for mod in (dgl.nn, rnn):
            with pytest.raises(dgl.DGLError) as exc:
                conv = build(mod)
                call(conv)
            assert pattern.lower() in str(exc.value).lower(), (what, mod.__name__)
    # per-feature weights of the wrong width: DGL fails in its kernel, we name the shapes
    w = torch.rand(g.num_edges(), 5)
    with pytest.raises(dgl.DGLError):
        dgl.nn.GraphConv(4, 2)(g, x, edge_weight=w)
    with pytest.raises(dgl.DGLError, match=rf"\({g.num_edges()}, 5\).*\(E, 2\).*message width"):
        rnn.GraphConv(4, 2)(g, x, edge_weight=w)


def test_convert_keeps_dtype_device_and_parameter_objects(dgl, graphs):
    g = graphs["homo"]
    model = torch.nn.ModuleDict(
        {"a": dgl.nn.GraphConv(4, 4), "b": dgl.nn.SAGEConv(4, 3, "gcn"),
         "c": dgl.nn.ChebConv(3, 2, 3), "d": dgl.nn.SAGEConv(4, 3, "pool")}
    ).double()  # fmt: skip
    model["a"].bias.requires_grad_(False)
    params = {k: p for k, p in model.named_parameters()}
    x = torch.randn(g.num_nodes(), 4, dtype=torch.float64)

    def forward(m):
        return m["c"](g, m["b"](g, m["a"](g, x)), lambda_max=[2.0])

    ref = forward(model)
    rng = torch.get_rng_state()
    rnn.convert(model)
    assert torch.equal(torch.get_rng_state(), rng)  # converting draws no random numbers
    assert [type(m).__name__ for m in model.values()] == ["GraphConv", "SAGEConv",
                                                          "ChebConv", "SAGEConv"]  # fmt: skip
    assert isinstance(model["d"], dgl.nn.SAGEConv)  # pool: nothing to approximate
    now = dict(model.named_parameters())
    assert now.keys() == params.keys() and all(now[k] is p for k, p in params.items())
    assert all(p.dtype == torch.float64 for p in model.parameters())
    assert not model["a"].bias.requires_grad
    rnn.exact(model)
    assert torch.equal(forward(model), ref)


def test_every_twin_of_the_convert_table_has_a_grid_here(dgl):
    grids = {
        "GraphConv": test_graphconv,
        "SAGEConv": test_sageconv,
        "GCN2Conv": test_gcn2conv,
        "ChebConv": test_chebconv,
    }
    assert set(grids) == set(rnn.TWINS)  # a new twin needs its conformance grid
    for name, layer in rnn.TWINS.items():
        assert issubclass(layer, rnn.RSCLayer) and hasattr(getattr(dgl.nn, name), "forward")
