"""The tools report time to accuracy with the launcher's definition, as users run them:
``tools/accuracy_parity.py`` (through the CLI) and ``tools/bench_cpu_e2e.py --tta-epochs``."""

from __future__ import annotations

import json
import os
import sys

import pytest

from dgl_rsc.launcher.tta import first_crossing

from .conftest import requires_dgl
from .launcher.test_launcher import REPO, write_config
from .proc import run as run_cmd

TOOLS = os.path.join(REPO, "tools")


def _tool(name, *args):
    env = {**os.environ, "CI": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    done = run_cmd([sys.executable, os.path.join(TOOLS, name), *args], env=env, cwd=REPO,
                   timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_accuracy_parity_reports_the_launchers_time_to_target(tmp_path):
    cfg = write_config(tmp_path, train={"epochs": 10, "eval_every": 1})
    out = tmp_path / "parity.json"
    printed = _tool("accuracy_parity.py", cfg, "--budgets", "0.3", "--runs",
                    str(tmp_path / "runs"), "--out", str(out))  # fmt: skip
    row = json.loads(out.read_text())["rows"][0]
    summary = json.loads((tmp_path / "runs" / "tiny-b0.3" / "results.json").read_text())
    s = summary["summary"]
    for m in ("exact", "rsc"):
        assert row[f"{m}_tta_s"] == s[m]["time_to_target_s"]
        assert row[f"{m}_tta_status"] == s[m]["tta_status"]
    assert row["exact_tta_status"] == "reached" and row["tta_speedup"] == s["rsc"]["tta_speedup"]
    assert "tta exact" in printed


@requires_dgl
@pytest.mark.dgl
@pytest.mark.parametrize("target", [None, "1.01"], ids=["exact-best", "unreachable"])
def test_bench_cpu_e2e_time_to_accuracy_is_the_first_crossing(tmp_path, target):
    out = tmp_path / "bench.json"
    extra = ["--tta-target", target] if target else []
    _tool("bench_cpu_e2e.py", "--graphs", "small", "--models", "gcn", "--threads", "1",
          "--engines", "native-exact", "native-rsc", "--rounds", "1", "--warmup", "1",
          "--epochs", "1", "--tta-epochs", "6", "--out", str(out), *extra)  # fmt: skip
    tta = json.loads(out.read_text())["cases"][0]["time_to_accuracy"]
    assert tta["status"] == "ok" and tta["reference"] == "native-exact"
    for engine, t in tta["methods"].items():
        curve = tta["curves"][engine]
        hist = [{"epoch": i + 1, "epoch_s": 0.0, "val": v} for i, v in enumerate(curve["val"])]
        level = tta["target"]["per_seed"]["0"]
        hit = first_crossing(hist, level)
        if target:
            assert t["status"] == "not reached" and t["time_s"] is None and hit is None
            continue
        assert t["epoch"] == hit["epoch"]
        assert t["time_s"] == curve["train_time_s"][hit["epoch"] - 1]
    if not target:
        assert tta["methods"]["native-exact"]["status"] == "reached"
        assert tta["methods"]["native-exact"]["vs_native-exact"] == 1.0
