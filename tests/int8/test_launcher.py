"""INT8 training as users run it: ``train.precision`` in the launcher's schema and CLI, the
shipped INT8 config, and the guide's example."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from dgl_rsc.core.config import ConfigError
from dgl_rsc.int8 import int8_layers

from ..proc import run as run_cmd

ROOT = Path(__file__).resolve().parents[2]


# -- launcher -----------------------------------------------------------------------------------
TINY = {
    "dataset": {"name": "synthetic", "num_nodes": 300, "avg_degree": 8.0, "num_classes": 3,
                "feat_dim": 8, "seed": 1},
    "model": {"name": "gcn", "hidden": 16, "layers": 2},
    "train": {"epochs": 4, "lr": 0.02, "seeds": [0], "eval_every": 2, "stock_baseline": False,
              "precision": "int8", "int8_rounding": "nearest", "int8_pick": "always"},
    "rsc": {"budget": 0.3, "cache_interval": 2, "tune_interval": 2, "warmup_steps": 1},
    "compare": True,
}  # fmt: skip


def _resolve(**train):
    from dgl_rsc.launcher.schema import resolve

    cfg = json.loads(json.dumps(TINY))
    cfg["train"].update(train)
    return resolve(cfg)


def test_schema_precision_rules():
    assert _resolve().train.precision == "int8"
    assert _resolve(precision="fp32").train.precision == "fp32"
    assert _resolve(precision="fp32").train.int8_rounding == "nearest"
    with pytest.raises(ConfigError, match=r"train.precision='int4' is not one of fp32, int8"):
        _resolve(precision="int4")
    with pytest.raises(ConfigError, match="int8_rounding"):
        _resolve(int8_rounding="up")
    assert _resolve().train.int8_dense == "auto"
    with pytest.raises(ConfigError, match=r"train.int8_dense='gemm' is not one of auto, int8"):
        _resolve(int8_dense="gemm")
    assert _resolve().train.int8_sparse == "auto"
    with pytest.raises(ConfigError, match=r"train.int8_sparse='csr' is not one of auto, int8"):
        _resolve(int8_sparse="csr")
    assert _resolve().train.int8_saved == "int8"
    with pytest.raises(ConfigError, match=r"train.int8_saved='int4' is not one of int8, fp32"):
        _resolve(int8_saved="int4")
    with pytest.raises(ConfigError, match="train.engine: native"):
        _resolve(engine="patch")
    with pytest.raises(ConfigError, match="train.amp"):
        _resolve(amp="bf16")


@pytest.mark.parametrize(
    "dense, sparse, saved",
    [("auto", "int8", "int8"), ("int8", "fp32", "fp32"), ("fp32", "auto", "int8")],
)
def test_int8_dense_sparse_and_saved_reach_the_layers(dense, sparse, saved):
    from dgl_rsc.launcher.train import _setup, prepare

    cfg = _resolve(int8_dense=dense, int8_sparse=sparse, int8_saved=saved)
    run = _setup(cfg, prepare(cfg), "rsc")
    specs = {m.rsc_int8().spec for _, m in run.model.named_modules()
             if hasattr(m, "rsc_int8") and m.rsc_int8() is not None}  # fmt: skip
    assert int8_layers(run.model)
    assert {(s.dense, s.sparse, s.saved) for s in specs} == {(dense, sparse, saved)}


def test_shipped_int8_config_resolves():
    from dgl_rsc.launcher.cli import load_config

    cfg = load_config(str(ROOT / "yaml_configs" / "cora_gcn_int8.yaml"))
    assert cfg.train.precision == "int8" and cfg.rsc is not None and cfg.compare


def test_cli_trains_in_int8(tmp_path):
    import yaml

    path = tmp_path / "int8.yaml"
    path.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "out"
    proc = run_cmd(
        [sys.executable, "-m", "dgl_rsc", "run", str(path), "--out", str(out), "--no-progress"],
        cwd=ROOT, timeout=300,
        env={**os.environ, "CI": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    runs = res["runs"]
    assert {r["method"] for r in runs} == {"exact", "rsc"}
    assert all(r["precision"] == "int8" for r in runs)
    assert all(0.0 <= r["best"]["test"] <= 1.0 for r in runs)


def test_readme_int8_example_runs():
    import re

    page = ROOT / "docs" / "guide" / "int8.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    code = next(b for b in blocks if "quantize_model" in b)
    scope = {}
    exec(compile(code, str(page), "exec"), scope)
    assert int8_layers(scope["model"]) == ["convs.0", "convs.1"]
    grads = [p.grad for p in scope["model"].parameters() if p.grad is not None]
    assert grads and all(bool(torch.isfinite(gr).all()) for gr in grads)
