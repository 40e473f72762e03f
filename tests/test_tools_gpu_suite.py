"""tools/gpu_suite.sh --dry-run on the CPU: the device stages of the GPU round print their
commands and every Python tool they name starts (``--help``); the GPU tests collect."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.heavy  # about 20-45 s: make test-heavy (CI runs it)
def test_dry_run_checks_every_stage_command(tmp_path):
    stages = ["tests", "forward", "precision", "tta5", "kernels"]
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(
        ["bash", str(ROOT / "tools" / "gpu_suite.sh"), "--dry-run", str(tmp_path), *stages],
        capture_output=True, text=True, timeout=600, env=env, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for stage in stages:
        assert f"=== {stage}" in proc.stdout
    assert "+ " + sys.executable + " tools/experiments/bench_forward.py --out" in proc.stdout
    assert proc.stdout.count("-m dgl_rsc run yaml_configs/synthetic_200k_gcn.yaml") == 3
    assert "failed" not in proc.stdout
    assert not list(tmp_path.glob("*.json")), "a dry run writes no results"


def test_unknown_stage_is_refused(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(
        ["bash", str(ROOT / "tools" / "gpu_suite.sh"), "--dry-run", str(tmp_path), "nosuch"],
        capture_output=True, text=True, timeout=60, env=env, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2 and "unknown stage nosuch" in proc.stdout
