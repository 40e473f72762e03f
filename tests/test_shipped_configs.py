"""Every file in ``yaml_configs/`` runs through the real CLI (one test per file, by glob).

Each config is run for 2 epochs and one seed, with ``--set`` overrides that shrink what is
large (synthetic graphs, hidden widths, mini-batch sizes) and keep everything else as
shipped: model, engine, mode, sampler, RSC settings, ``compare``. A config whose data ship
with the repository's CI (``dataset.name: npz``, the graphs in ``../shared/data``) must finish
with a complete results record; a config whose dataset cannot be on this machine (OGB,
Reddit, Yelp) is pointed at an empty root and must stop with exit 2 and the one-line
dataset-missing message, before writing anything. Adding a config adds a test.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from dgl_rsc.launcher import cli
from dgl_rsc.launcher.train import methods
from dgl_rsc.launcher.yaml_io import load_config

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "yaml_configs").glob("*.yaml"))
EPOCHS = 2
LOCAL = ("synthetic", "npz")  # datasets a test machine can have


def _shared_data():
    """The ``shared/data`` folder of the checkout's ancestors (CI: ``../shared/data``)."""
    for parent in REPO.parents:
        if (parent / "shared" / "data" / "cora.npz").is_file():
            return parent / "shared" / "data"
    return None


def _shrink(raw: dict, tmp_path: Path) -> list:
    """``--set`` overrides that make the config a seconds-long run of the same kind."""
    sets = [f"train.epochs={EPOCHS}", "train.seeds=[0]", "train.eval_every=1"]
    data, model = raw["dataset"], raw.get("model", {})
    train, mb = raw.get("train", {}), raw.get("minibatch") or {}
    if "hidden" in model:
        sets.append(f"model.hidden={min(int(model['hidden']), 16)}")
    if data["name"] == "synthetic":
        sets += ["dataset.num_nodes=1500", "dataset.avg_degree=8", "dataset.feat_dim=16"]
    elif data["name"] == "npz":
        shared = _shared_data()
        folder = shared if shared is not None else tmp_path / "no_shared_data"
        sets.append(f"dataset.path={folder / Path(data['path']).name}")
    else:  # a dataset this machine cannot download: an empty root
        (tmp_path / "empty_root").mkdir()
        sets.append(f"dataset.root={tmp_path / 'empty_root'}")
    mode = train.get("mode", "full")
    if mode == "cluster":
        sets += [f"minibatch.num_parts={min(int(mb.get('num_parts', 8)), 8)}",
                 "minibatch.batch_size=2"]  # fmt: skip
    elif mode == "saint":
        sets += ["train.batches_per_epoch=2", "minibatch.num_presample=4"]
        if mb.get("sampler", "node") in ("node", "edge"):
            sets.append(f"minibatch.budget={min(int(mb['budget']), 400)}")
    return sets


def _expects_data(raw: dict) -> bool:
    return raw["dataset"]["name"] == "synthetic" or (
        raw["dataset"]["name"] == "npz" and _shared_data() is not None
    )


def _needs_pyg(path) -> bool:
    """A config on a PyG engine: it runs where torch_geometric imports (the modern leg)."""
    raw = yaml.safe_load(path.read_text()) or {}
    return str((raw.get("train") or {}).get("engine", "")).startswith("pyg")


CASES = [pytest.param(c, id=c.stem, marks=[pytest.mark.pyg] if _needs_pyg(c) else [])
         for c in CONFIGS]  # fmt: skip


@pytest.mark.parametrize("config", CASES)
def test_shipped_config_runs(config, tmp_path, capsys, one_thread):
    raw = yaml.safe_load(config.read_text())
    sets = _shrink(raw, tmp_path)
    out = tmp_path / "out"
    argv = ["run", str(config), "--out", str(out), "--no-progress"]
    for s in sets:
        argv += ["--set", s]
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if not _expects_data(raw):
        assert code == 2, err
        assert err.count("\n") == 1 and "could not be loaded" in err, err
        # it names where the data were looked for, or (an environment without the dataset's
        # loader library, such as DGL on torch 2.15) the library and how to get it
        assert str(tmp_path) in err or ("is required" in err and "not usable" in err), err
        assert not out.exists()  # refused before anything was written
        return
    assert code == 0, err
    results = json.loads((out / "results.json").read_text())
    want = methods(load_config(str(config), sets))
    assert [r["method"] for r in results["runs"]] == list(want)
    assert set(results["summary"]) == set(want)
    mode = raw.get("train", {}).get("mode", "full")
    for rec in results["runs"]:
        assert [h["epoch"] for h in rec["history"]] == list(range(1, EPOCHS + 1))
        assert all(math.isfinite(h["loss"]) for h in rec["history"])
        assert rec["best"]["test"] is not None and math.isfinite(rec["best"]["test"])
        if mode != "full":  # every epoch trained on at least one batch
            assert all(h["batches"] >= 1 for h in rec["history"]), rec["history"]
    assert (out / "table.txt").is_file() and (out / "metrics.csv").is_file()


def test_every_shipped_config_is_collected():
    """The glob sees the configs (an empty or moved folder would make the cases vanish)."""
    assert len(CONFIGS) >= 20
    assert {"quickstart", "cora_cluster_gcn", "cora_saint_gcn"} <= {c.stem for c in CONFIGS}
    assert all(yaml.safe_load(c.read_text())["dataset"]["name"] for c in CONFIGS)
