"""The launcher's PyG engines (``train.engine: pyg`` / ``pyg_patch``, baseline ``pyg_stock``):
config checks (no torch_geometric needed) and end-to-end runs (marker ``pyg``)."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch
import yaml

from dgl_rsc.core.config import ConfigError
from dgl_rsc.launcher.cli import load_config
from dgl_rsc.launcher.schema import resolve
from dgl_rsc.models.engines import get_engine

from ..proc import run as run_cmd

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUICK = os.path.join(REPO, "yaml_configs", "quickstart_pyg.yaml")
TINY = [
    "dataset.num_nodes=400", "dataset.avg_degree=8", "dataset.feat_dim=16", "model.hidden=16",
    "model.layers=2", "train.epochs=4", "train.eval_every=2", "rsc.tune_interval=2",
    "rsc.cache_interval=2", "rsc.budget=0.3",
    "rsc.min_width=0",  # the last layer's 10 columns too: the test checks that RSC samples
]  # fmt: skip


def test_pyg_engines_are_registered_with_their_baseline():
    for name in ("pyg", "pyg_patch"):
        e = get_engine(name)
        assert e.approximates and e.needs_pyg and not e.needs_dgl and e.graph == "pyg"
        assert e.baseline == "pyg_stock"
    assert get_engine("pyg_patch").patched and not get_engine("pyg").patched
    assert not get_engine("pyg_stock").approximates
    assert get_engine("native").baseline == "stock"
    cfg = load_config(QUICK)
    assert cfg.train.engine == "pyg" and resolve(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    "override, message",
    [
        ({"model": {"name": "resgcn"}}, "builds model gcn, sage or gcn2"),
        ({"model": {"name": "sage", "aggregator": "gcn"}}, "model.aggregator='gcn'"),
        ({"train": {"mode": "saint"}}, "trains full-batch only"),
    ],
)
def test_pyg_engine_refuses_what_it_cannot_build(override, message):
    raw = yaml.safe_load(open(QUICK))
    for section, values in override.items():
        if section == "model":
            raw["model"] = {
                "name": values["name"],
                **{k: v for k, v in values.items() if k != "name"},
            }
        else:
            raw[section].update(values)
    with pytest.raises(ConfigError, match=message):
        resolve(raw)


@pytest.mark.pyg
@pytest.mark.parametrize("name", ["gcn", "sage", "gcn2"])
def test_pyg_models_match_the_stock_pyg_models(name):
    from dgl_rsc.models import build_model

    g = torch.Generator().manual_seed(0)
    n = 50
    src, dst = torch.randint(0, n, (300,), generator=g), torch.randint(0, n, (300,), generator=g)
    loops = torch.arange(n)
    ei = torch.stack([torch.cat([src, dst, loops]), torch.cat([dst, src, loops])])
    x = torch.randn(n, 12, generator=g)
    outs = []
    for engine in ("pyg", "pyg_stock"):
        torch.manual_seed(0)
        model = build_model(name, in_feats=12, num_classes=3, engine=engine, hidden=8, layers=2)
        model.eval()
        outs.append(model(ei, x))
    assert outs[0].shape == (n, 3)
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-6)


def run_cli(*args):
    env = {**os.environ, "CI": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    return run_cmd([sys.executable, "-m", "dgl_rsc", *args], env=env, cwd=REPO, timeout=600)


@pytest.mark.pyg
@pytest.mark.parametrize("engine", ["pyg", "pyg_patch"])
def test_launcher_trains_on_pyg_against_stock_pyg(engine, tmp_path):
    sets = [a for s in TINY + [f"train.engine={engine}"] for a in ("--set", s)]
    done = run_cli("run", QUICK, *sets, "--out", str(tmp_path / "out"), "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.load(open(tmp_path / "out" / "results.json"))
    summary = results["summary"]
    assert set(summary) == {"stock", "exact", "rsc"}  # stock = stock PyG (pyg_stock)
    assert results["environment"]["packages"]["torch-geometric"]
    assert summary["rsc"]["nnz_fraction"] < 0.9  # RSC sampled the backward
    assert summary["exact"]["nnz_fraction"] == 1.0
    for method in summary:
        assert 0.0 <= summary[method]["test_mean"] <= 1.0
    rsc_run = next(r for r in results["runs"] if r["method"] == "rsc")
    assert rsc_run["rsc_stats"]["layers"], rsc_run["rsc_stats"]


def test_pyg_engine_without_torch_geometric_is_a_config_error(monkeypatch):
    from dgl_rsc.base import _deps
    from dgl_rsc.launcher import train
    from dgl_rsc.launcher.cli import apply_overrides

    monkeypatch.setattr(_deps, "torch_geometric_available", lambda: False)
    cfg = resolve(apply_overrides(yaml.safe_load(open(QUICK)), TINY))
    with pytest.raises(ConfigError, match="needs torch_geometric.*pip install torch-geometric"):
        train.prepare(cfg)
    assert train.methods(cfg) == ("exact", "rsc")  # no stock PyG baseline without PyG
