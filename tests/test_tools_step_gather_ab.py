"""``tools/experiments/step_gather_ab.py`` as a user runs it: both ways of the step product
ran at every call of the approximate phase, only the package's way gathered, and they agreed
bit for bit."""

from __future__ import annotations

import json

from .launcher.test_launcher import write_config
from .test_tools_tta import _tool


def test_step_gather_ab_runs_both_ways_and_compares_the_bits(tmp_path):
    # 80 edges per node: each slice holds more than a third of N * D entries, so neither
    # engine folds the column factor into its values (torch.sparse would: DGL's never does)
    cfg = write_config(tmp_path, dataset={"avg_degree": 80.0},
                       model={"name": "gcn", "hidden": 16, "layers": 3},
                       rsc={"min_width": 4}, train={"epochs": 30, "eval_every": 5})  # fmt: skip
    out = tmp_path / "ab.json"
    printed = _tool("experiments/step_gather_ab.py", cfg, "--epochs", "12", "--out", str(out))
    data = json.loads(out.read_text())
    assert data["calls"] > 0 and data["bit_equal_every_call"] is True
    assert data["operands_gathered"]["gathered"] > 0 == data["operands_gathered"]["whole"]
    for mode in ("gathered", "whole"):
        assert data["median_ms"][mode] > 0 and data["mean_ms"][mode] > 0
    assert data["whole_over_gathered_median"] == (data["median_ms"]["whole"]
                                                   / data["median_ms"]["gathered"])  # fmt: skip
    assert data["cache_bytes"] > 0 and data["machine"]["date"]
    assert "bit-equal every call: True" in printed
