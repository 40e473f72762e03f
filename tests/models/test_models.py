"""``dgl_rsc.models``: the registry, both layer engines, and the three launcher engines."""

from __future__ import annotations

import pytest
import torch

from dgl_rsc.base import _deps
from dgl_rsc.core.config import ConfigError
from dgl_rsc.launcher.cli import apply_overrides
from dgl_rsc.launcher.schema import resolve
from dgl_rsc.launcher.train import prepare, train_one
from dgl_rsc.models import GCN, GCNII, MODELS, SAGE, build_model, model_params
from dgl_rsc.sparse.graph import Graph

from ..conftest import requires_dgl

SMALL = {"hidden": 12, "layers": 2}
MODEL_NAMES = [pytest.param(name, id=name) for name in MODELS]


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_graph(n=40, extra=120, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.cat([torch.arange(n), torch.randint(0, n, (extra,), generator=g)])
    dst = torch.cat([(torch.arange(n) + 1) % n, torch.randint(0, n, (extra,), generator=g)])
    loops = torch.arange(n)
    return torch.cat([src, loops]), torch.cat([dst, loops]), n


def graphs(engine):
    src, dst, n = tiny_graph()
    if engine == "native":
        return Graph(src, dst, n)
    return _deps.require_dgl().graph((src, dst), num_nodes=n)


ENGINE_CASES = [
    pytest.param("native", "native", id="native"),
    pytest.param("dgl", "dgl", id="dgl", marks=requires_dgl),
    pytest.param("patch", "dgl", id="patch", marks=requires_dgl),
    pytest.param("stock", "dgl", id="stock", marks=requires_dgl),
]


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("engine, graph_kind", ENGINE_CASES)
def test_forward_and_backward_on_every_engine(name, engine, graph_kind):
    torch.manual_seed(0)
    model = build_model(name, in_feats=6, num_classes=3, engine=engine, **SMALL)
    x = torch.randn(40, 6)
    out = model(graphs(graph_kind), x)
    assert out.shape == (40, 3) and torch.isfinite(out).all()
    out.square().mean().backward()
    assert all(p.grad is not None for p in model.parameters())


@requires_dgl
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_same_seed_same_initial_weights_on_both_engines(name):
    torch.manual_seed(3)
    extra = {"batch_norm": True} if "batch_norm" in model_params(name) else {}
    ours = build_model(name, 6, 3, engine="native", **extra, **SMALL)
    torch.manual_seed(3)
    stock = build_model(name, 6, 3, engine="stock", **extra, **SMALL)
    a, b = ours.state_dict(), stock.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)


def test_model_structure_follows_the_parameters():
    gcn = GCN(10, 4, hidden=32, layers=3, batch_norm=True)
    assert len(gcn.convs) == 3 and len(gcn.norms) == 2
    assert isinstance(gcn.norms[0], torch.nn.BatchNorm1d)
    assert [c._out_feats for c in gcn.convs] == [32, 32, 4]
    assert len(GCN(10, 4, layers=1).convs) == 1
    sage = SAGE(10, 4, hidden=8, layers=2, aggregator="gcn")
    assert [c._aggre_type for c in sage.convs] == ["gcn", "gcn"]
    gcn2 = GCNII(10, 4, hidden=8, layers=5, alpha=0.2, lambda_=1.0)
    assert len(gcn2.convs) == 5 and gcn2.convs[0].alpha == 0.2
    assert gcn2.lin_in.in_features == 10 and gcn2.lin_out.out_features == 4
    assert GCN.SELF_LOOPS and GCNII.SELF_LOOPS and not SAGE.SELF_LOOPS


def test_registry_errors_name_the_fix():
    with pytest.raises(ConfigError, match="Did you mean 'sage'"):
        build_model("sag", 4, 2)
    with pytest.raises(ConfigError, match="Did you mean 'hidden'"):
        build_model("gcn", 4, 2, hiden=8)
    with pytest.raises(ValueError, match="Did you mean 'stock'"):
        build_model("gcn", 4, 2, engine="stocks")
    with pytest.raises(ValueError, match="aggregator"):
        SAGE(4, 2, aggregator="pool")
    assert set(model_params("gcn2")) == {"hidden", "layers", "dropout", "alpha", "lambda_"}
    assert "aggregator" in model_params("sage") and "alpha" not in model_params("gcn")


def _losses(name, engine, rsc=True):
    raw = {
        "dataset": {"name": "synthetic", "num_nodes": 200, "avg_degree": 8.0, "num_classes": 3,
                    "feat_dim": 8, "seed": 2},
        "model": {"name": name, "hidden": 16, "layers": 2, "dropout": 0.5},
        # op by op: the one-pass epilogue draws dropout by its hash, the stock layers by torch
        "train": {"epochs": 6, "lr": 0.02, "engine": engine, "device": "cpu",
                  "fused_epilogue": False},
        # no remainder groups: they are drawn from each product's generator, seeded by the
        # product's index, and the patch numbers products differently from the drop-ins
        # (min_width 0: these products are narrower than the default's 16)
        "rsc": {"budget": 0.3, "cache_interval": 2, "tune_interval": 2, "warmup_steps": 1,
                "remainder_groups": 0, "min_width": 0},
    }  # fmt: skip
    cfg = resolve(apply_overrides(raw, [] if rsc else ["rsc=null"]))
    rec = train_one(cfg, prepare(cfg), "rsc" if rsc else "exact", seed=0, progress=False)
    return torch.tensor([h["loss"] for h in rec["history"]], dtype=torch.float64), rec


@requires_dgl
@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("rsc", [True, False], ids=["rsc", "exact"])
def test_patch_dgl_and_native_engines_train_alike(name, rsc):
    patch, rec_p = _losses(name, "patch", rsc)
    dgl, rec_d = _losses(name, "dgl", rsc)
    native, _ = _losses(name, "native", rsc)
    assert [h["phase"] for h in rec_p["history"]] == [h["phase"] for h in rec_d["history"]]
    if rsc:  # the approximation was active, on the same layers in both engines
        assert "approx" in [h["phase"] for h in rec_d["history"]]
        assert rec_p["history"][3]["nnz_fraction"] < 1 and rec_d["history"][3]["nnz_fraction"] < 1
    assert not torch.equal(patch[0], patch[-1])  # it trained
    # The drop-ins score rows of the normalized matrix D^-1/2 A D^-1/2; stock GraphConv and
    # GCN2Conv apply the column normalization to the features before message passing, where
    # the patch cannot see it, so under RSC they keep other rows (a row normalization is seen
    # either way: it sits in dY). Exact, and SAGE (row-normalized), they must agree.
    if rsc and name in ("gcn", "gcn2", "resgcn"):
        assert not torch.equal(patch, dgl)
        return
    # stock DGL layers under the patch and dgl_rsc layers on the same DGLGraph run the same
    # sparse products in the same order; the dense GEMMs (MKL) may round differently by one
    # ulp from process to process (buffer alignment), so "equal" is to float32 rounding.
    # Under RSC the least-squares scale is estimated from dY / deg (patch: the division sits
    # outside message passing) or from dY with a 1 / deg row factor (drop-in): the same
    # number up to rounding, which a few training steps amplify to ~1e-4 (the estimate reads
    # one sampled entry per probe row, so it moves with the rounding of that entry).
    tol = dict(rtol=1e-3, atol=3e-4) if rsc else dict(rtol=1e-6, atol=1e-7)
    if rsc:
        assert rec_p["history"][3]["nnz_fraction"] == rec_d["history"][3]["nnz_fraction"]
    torch.testing.assert_close(patch, dgl, **tol)
    torch.testing.assert_close(native, dgl, rtol=1e-3 if rsc else 1e-5, atol=3e-4 if rsc else 1e-6)
