"""``train.compile`` in the launcher: a clear error where torch cannot compile dgl_rsc's
products (torch < 2.4) or the run is not one it compiles; on torch >= 2.4 a compiled run
trains (marker ``compile``) and reports its compile apart from its epochs."""

from __future__ import annotations

import json

import pytest

from dgl_rsc.base import _deps
from dgl_rsc.core.config import ConfigError

TINY = {
    "dataset": {"name": "synthetic", "num_nodes": 300, "avg_degree": 8.0, "num_classes": 3,
                "feat_dim": 8, "seed": 1},
    "model": {"name": "gcn", "hidden": 16, "layers": 2},
    "train": {"epochs": 6, "lr": 0.02, "seeds": [0], "eval_every": 2, "stock_baseline": False,
              "warmup_epochs": 0, "compile": True},
    "rsc": {"budget": 0.3, "cache_interval": 2, "tune_interval": 2, "warmup_steps": 1,
            "min_width": 1},
    "compare": True,
}  # fmt: skip


def _resolve(**train):
    from dgl_rsc.launcher.schema import resolve

    cfg = json.loads(json.dumps(TINY))
    cfg["train"].update(train)
    return resolve(cfg)


def test_compile_defaults_off_and_is_a_bool():
    assert _resolve(compile=False).train.compile is False
    with pytest.raises(ConfigError, match="train.compile"):
        _resolve(compile="yes")


def test_compile_needs_torch_2_4_or_says_so():
    if _deps.TORCH_VERSION >= (2, 4):
        assert _resolve().train.compile is True
    else:
        with pytest.raises(ConfigError, match=r"train.compile=true needs torch >= 2.4"):
            _resolve()


@pytest.mark.parametrize(
    "train, message",
    [
        ({"precision": "int8"}, "train.precision='int8'"),
        ({"mode": "cluster"}, "full-graph training"),
    ],
)
def test_compile_refuses_runs_it_does_not_compile(train, message):
    if _deps.TORCH_VERSION < (2, 4):
        message = "needs torch >= 2.4"  # the first thing a user on an old torch must fix
    with pytest.raises(ConfigError, match=message):
        _resolve(**train)


@pytest.mark.compile
def test_compiled_run_trains_and_reports_its_compile(tmp_path):
    from dgl_rsc.launcher.prepare import prepare
    from dgl_rsc.launcher.train import run_experiment

    cfg = _resolve()
    runs = run_experiment(cfg, prepare(cfg), str(tmp_path), progress=False)
    assert {r["method"] for r in runs} == {"exact", "rsc"}
    for r in runs:
        comp = r["compile"]
        assert comp["seconds"] is not None and comp["seconds"] > 0
        assert comp["frames"] is not None and 1 <= comp["frames"] <= 3
        hist = r["history"]
        assert hist[-1]["train_time_s"] >= comp["seconds"]  # counted in the time to accuracy
        assert 0.0 <= r["best"]["test"] <= 1.0
    rsc = next(r for r in runs if r["method"] == "rsc")
    assert rsc["rsc_stats"]["visited_fraction"] < 1.0
