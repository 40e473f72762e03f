"""``tools/profile_run.py`` as a user runs it: each method's epoch split into the categories,
with RSC's sampled backward booked apart from the exact one."""

from __future__ import annotations

import json

import pytest

from .launcher.test_launcher import write_config
from .test_tools_tta import _tool


@pytest.mark.heavy  # about 20-45 s: make test-heavy (CI runs it)
def test_profile_run_splits_each_methods_epoch(tmp_path):
    cfg = write_config(tmp_path, train={"epochs": 30, "eval_every": 5})
    out = tmp_path / "profile.json"
    printed = _tool("profile_run.py", cfg, "--epochs", "6", "--methods", "exact", "rsc",
                    "--repeat", "2", "--out", str(out))  # fmt: skip
    data = json.loads(out.read_text())
    exact, rsc = data["methods"]["exact"], data["methods"]["rsc"]
    for row in (exact, rsc):
        assert row["split_ms"]["sparse_forward"] > 0 and row["split_ms"]["dense"] > 0
        assert row["epoch_ms"] > 0 and row["peak_rss_mb"] > 0
        assert row["minor_faults_per_epoch"] >= 0
        assert len(row["runs"]) == 2  # one process per turn; the record is their median
        dense = sorted(r["split_ms"]["dense"] for r in row["runs"])
        assert row["split_ms"]["dense"] == pytest.approx(sum(dense) / 2, abs=0.01)
        assert row["peak_rss_mb"] == max(r["peak_rss_mb"] for r in row["runs"])
    assert exact["split_ms"]["sparse_backward_sampled"] == 0
    assert rsc["split_ms"]["sparse_backward_sampled"] > 0  # the profiled epoch is approximate
    assert "speedup vs exact" in printed and data["machine"]["date"]


def test_profile_run_refuses_too_few_epochs(tmp_path):
    cfg = write_config(tmp_path)
    with pytest.raises(AssertionError, match="at least 5"):  # non-zero exit, argparse's message
        _tool("profile_run.py", cfg, "--epochs", "3", "--out", str(tmp_path / "p.json"))


@pytest.mark.parametrize("opt", ["--repeat", "--profiled"])
def test_profile_run_refuses_no_process_or_no_profiled_epoch(tmp_path, opt):
    cfg = write_config(tmp_path)
    with pytest.raises(AssertionError, match="at least 1 process per method and 1 profiled"):
        _tool("profile_run.py", cfg, opt, "0", "--out", str(tmp_path / "p.json"))


@pytest.mark.heavy  # about 20-45 s: make test-heavy (CI runs it)
def test_profile_run_books_int8_work_in_its_own_categories(tmp_path):
    # three layers: the middle one's products run in INT8 (the first aggregates its constant
    # input once, in fp32; the last stays fp32); INT8 forced: `auto` measures, and on a graph
    # this small fp32 may win
    cfg = write_config(
        tmp_path,
        train={"epochs": 30, "eval_every": 5, "int8_sparse": "int8"},
        model={"name": "gcn", "hidden": 16, "layers": 3},
    )
    out = tmp_path / "profile.json"
    _tool("profile_run.py", cfg, "--epochs", "6", "--methods", "exact", "int8", "--out", str(out))
    methods = json.loads(out.read_text())["methods"]
    exact, int8 = methods["exact"]["split_ms"], methods["int8"]["split_ms"]
    assert int8["int8_products"] > 0 and int8["int8_quantize"] + int8["int8_scales"] > 0
    assert all(exact[k] == 0 for k in exact if k.startswith("int8_"))  # fp32: none of them
