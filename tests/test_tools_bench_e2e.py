"""The benchmark tools as a user runs them: each one starts (its ``--help``), and
``tools/bench_e2e.py`` reports time to target from the evaluations it records."""

from __future__ import annotations

import json
import os
import sys

import pytest

from dgl_rsc.launcher.tta import first_crossing

from .proc import run as run_cmd
from .test_tools_tta import REPO, TOOLS, _tool

# the commands of tools/ and tools/experiments/ (not the shared helper; the pytest plugin of
# pyg_conformance.py lives in tools/plugins/)
NOT_COMMANDS = {"bench_common.py"}
COMMANDS = sorted(
    f"{sub}{f}"
    for sub in ("", "experiments/")
    for f in os.listdir(os.path.join(TOOLS, sub))
    if f.endswith(".py") and f not in NOT_COMMANDS
)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_tool_starts(name):
    """An import that moved breaks a tool before it prints anything: ``--help`` catches it."""
    assert "usage:" in _tool(name, "--help")


def test_bench_e2e_reports_time_to_target(tmp_path):
    out = tmp_path / "e2e.json"
    printed = _tool("bench_e2e.py", "--device", "cpu", "--preset", "tiny", "--epochs", "12",
                    "--hidden", "16", "--amp", "none", "--tolerance", "1.0",
                    "--out", str(out))  # fmt: skip
    data = json.loads(out.read_text())
    rows = [r for r in data["rows"] if "speedup_all" in r]
    assert [(r["model"], r["amp"]) for r in rows] == [("gcn", "none"), ("sage", "none")]
    for r in rows:
        # evaluated every 2 epochs (and the last), evaluation outside the epoch times
        assert [h["epoch"] for h in r["exact_history"] if h["val"] is not None] == list(
            range(2, 13, 2)
        )
        assert r["target_val"] == pytest.approx(r["exact_val"] - 0.01)
        for m in ("exact", "rsc"):
            assert r[f"{m}_tta"] == first_crossing(r[f"{m}_history"], r["target_val"])
        assert r["exact_tta"] is not None  # exact reaches its own best
        if r["rsc_tta"] is None:
            assert r["tta_speedup"] is None
        else:
            want = r["exact_tta"]["time_s"] / r["rsc_tta"]["time_s"]
            assert r["tta_speedup"] == pytest.approx(want)
        shown = "not reached" if r["tta_speedup"] is None else f"{r['tta_speedup']:.2f}"
        assert any(line.startswith(r["model"]) and line.endswith(shown)
                   for line in printed.splitlines())  # fmt: skip
    assert data["machine"] and data["epochs"] == 12


def test_bench_e2e_profile_needs_cuda(tmp_path):
    done = run_cmd([sys.executable, os.path.join(TOOLS, "bench_e2e.py"), "--device", "cpu",
                    "--profile", "--out", str(tmp_path / "x.json")], cwd=REPO, timeout=120,
                   env={**os.environ, "PYTHONPATH": REPO})  # fmt: skip
    assert done.returncode == 2
    assert "--profile times CUDA kernels and needs --device cuda" in done.stderr
    assert not (tmp_path / "x.json").exists()


def test_bench_e2e_refuses_a_run_with_no_approximate_epoch(tmp_path):
    """Four epochs end in the exact phase before any approximate epoch: one usage error
    before the graph is made, not a statistics error at the end."""
    done = run_cmd([sys.executable, os.path.join(TOOLS, "bench_e2e.py"), "--device", "cpu",
                    "--preset", "tiny", "--epochs", "4", "--out", str(tmp_path / "x.json")],
                   cwd=REPO, timeout=120, env={**os.environ, "PYTHONPATH": REPO})  # fmt: skip
    assert done.returncode == 2
    assert "--epochs 4 leaves no approximate epoch to time" in done.stderr
    assert "graph:" not in done.stdout and not (tmp_path / "x.json").exists()
