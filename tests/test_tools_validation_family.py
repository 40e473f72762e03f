"""``tools/validation_family.py`` on its tiny member: exact and RSC interleaved as the
launcher trains them, each to convergence by the plateau rule, and the summary computed from
the runs (test gap, seeds that reached exact's target, time-to-accuracy ratio and interval)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from .launcher.test_launcher import REPO
from .proc import run as run_cmd

TOOL = os.path.join(REPO, "tools", "validation_family.py")


@pytest.mark.heavy  # about 20-45 s: make test-heavy (CI runs it)
def test_the_family_tool_runs_a_member_to_convergence_and_summarizes_it(tmp_path):
    out = tmp_path / "family.json"
    env = {**os.environ, "CI": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    # two RSC variants in turns with one exact run (the package's defaults, and a plateau switch)
    args = [sys.executable, TOOL, "--members", "tiny", "--seeds", "0", "1", "--patience", "8",
            "--cap", "80", "--warmup-epochs", "1", "--variant", "defaults:",
            "--variant", "switch:switch_patience=4", "--out", str(out)]  # fmt: skip
    done = run_cmd(args, env=env, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    res = json.loads((tmp_path / "family_defaults.json").read_text())
    other = json.loads((tmp_path / "family_switch.json").read_text())
    member = res["members"]["tiny"]
    rows, s = member["rows"], member["summary"]
    assert [r["seed"] for r in rows] == [0, 1] and res["label"] == "defaults"
    assert member["config"]["rsc"]["switch_patience"] == 2  # the default: a third of patience 8
    assert other["members"]["tiny"]["config"]["rsc"]["switch_patience"] == 4
    for a, b in zip(rows, other["members"]["tiny"]["rows"]):  # one exact run for both
        assert {k: v for k, v in a.items() if k.startswith("exact_")} == {
            k: v for k, v in b.items() if k.startswith("exact_")
        }
    for r in rows:
        for m in ("exact", "rsc"):  # every run stopped on its plateau, before the cap
            assert r[f"{m}_converged"] is True and r[f"{m}_epochs"] < 80
            assert r[f"{m}_epochs"] >= r[f"{m}_best_epoch"] + 8
        assert r["target"] == r["exact_val"] - 0.3  # exact's best validation minus 0.3 points
    gaps = [r["rsc_test"] - r["exact_test"] for r in rows]
    assert abs(s["gap"] - sum(gaps) / 2) < 1e-9
    reached = [r for r in rows if r["rsc_tta_s"] is not None]
    assert s["reached"] == len(reached)
    if reached:  # the ratio of mean times over the seeds both reached, inside its interval
        want = sum(r["exact_tta_s"] for r in reached) / sum(r["rsc_tta_s"] for r in reached)
        assert abs(s["tta_ratio"] - want) < 1e-9 and s["tta_low"] <= want <= s["tta_high"]
    assert res["family"]["graphs"] == 1
    table = (tmp_path / "family_defaults.md").read_text()
    assert table.startswith("| graph | model |") and "| tiny | gcn 3x16 | 600," in table
    # a finished member is not trained again; --compare prints the variants side by side
    again = run_cmd(args, env=env, cwd=REPO, timeout=300)
    assert again.returncode == 0 and "tiny [" not in again.stdout
    files = [str(tmp_path / f"family_{v}.json") for v in ("defaults", "switch")]
    cmp = run_cmd([sys.executable, TOOL, "--compare", *files], env=env, cwd=REPO, timeout=120)
    assert cmp.returncode == 0 and "| graph | defaults | switch |" in cmp.stdout
    assert "| tiny | " in cmp.stdout
