"""``train.node_order``: a run on renumbered nodes gives, for the same weights, the same
per-node outputs back in the dataset's order, the same metrics and the same training steps
(up to the order of floating point sums); a bad setting is refused before any data load."""

import pytest
import torch

from dgl_rsc.core.config import ConfigError
from dgl_rsc.launcher.schema import resolve
from dgl_rsc.launcher.train import _evaluate, _setup, _train_step, prepare, train_one
from dgl_rsc.launcher.yaml_io import apply_overrides

BASE = {
    "dataset": {"name": "synthetic", "num_nodes": 500, "avg_degree": 8.0, "num_classes": 3,
                "feat_dim": 6, "homophily": 0.8, "seed": 3},
    "model": {"name": "gcn", "hidden": 8, "layers": 2, "dropout": 0.0},
    "train": {"epochs": 2, "lr": 0.05, "seeds": [0], "device": "cpu", "stock_baseline": False},
    "rsc": None,
}  # fmt: skip
MODELS = {"gcn": ["model.name=gcn"], "sage": ["model.name=sage"]}


def _prep(sets):
    return prepare(resolve(apply_overrides(BASE, sets)))


@pytest.fixture(scope="module")
def plain():
    return {m: _prep(s) for m, s in MODELS.items()}


@pytest.mark.parametrize("order", ["degree", "rcm"])
@pytest.mark.parametrize("model", list(MODELS))
def test_reordered_predictions_metrics_and_steps_match(one_thread, plain, model, order):
    sets = [*MODELS[model], f"train.node_order={order}"]
    cfg = resolve(apply_overrides(BASE, sets))
    ref, prep = plain[model], prepare(cfg)
    assert prep.node_perm is not None and not torch.equal(
        prep.node_perm, torch.arange(prep.data.num_nodes)
    )
    assert torch.equal(prep.in_original_order(prep.label), ref.label)
    for split in ("train", "val", "test"):
        assert torch.equal(prep.in_original_order(prep.masks[split]), ref.masks[split])
    torch.manual_seed(0)
    a = _setup(cfg, ref, "exact")
    b = _setup(cfg, prep, "exact")
    b.model.load_state_dict(a.model.state_dict())
    for _ in range(3):  # a few optimizer steps: the gradients agree too
        out = ref.predict(a.model), prep.predict(b.model)
        assert out[0].abs().max() > 0
        torch.testing.assert_close(out[1], out[0], rtol=1e-5, atol=1e-5)
        ma, mb = _evaluate(a, ref), _evaluate(b, prep)
        assert ma.keys() == mb.keys() == {"train", "val", "test"}
        for k in ma:
            assert mb[k] == pytest.approx(ma[k], abs=1e-9), k
        la, lb = _train_step(a, ref)["loss"], _train_step(b, prep)["loss"]
        assert lb == pytest.approx(la, rel=1e-5)
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        torch.testing.assert_close(pb, pa, rtol=1e-5, atol=1e-6)


def test_the_order_is_timed_among_the_setup_phases(one_thread):
    prep = _prep(["train.node_order=degree"])
    assert prep.setup_s["node_order_degree"] >= 0.0
    # nothing recorded without a node order
    assert not any(k.startswith("node_order") for k in _prep([]).setup_s)
    rec = train_one(resolve(apply_overrides(BASE, ["train.node_order=degree"])), prep,
                    "exact", 0, progress=False)  # fmt: skip
    assert rec["final"]["test"] is not None and rec["data_sha256"] == prep.fingerprint


def test_a_bad_node_order_is_refused_before_loading():
    with pytest.raises(ConfigError, match=r"train\.node_order='rmc' is not one of .*'rcm'"):
        resolve(apply_overrides(BASE, ["train.node_order=rmc"]))
    dist = ["train.node_order=rcm", "distributed={partitions: 2}"]
    with pytest.raises(ConfigError, match="train.node_order='rcm' renumbers .* single-process"):
        resolve(apply_overrides(BASE, dist))
