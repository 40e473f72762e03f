"""``tools/experiments/step_costs.py`` as a user runs it: every piece of RSC's step it
reports was called, and the pieces add up within the backward they are part of."""

from __future__ import annotations

import json

from .launcher.test_launcher import write_config
from .test_tools_tta import _tool


def test_step_costs_times_every_piece_of_the_step(tmp_path):
    cfg = write_config(tmp_path, train={"epochs": 30, "eval_every": 5})
    out = tmp_path / "costs.json"
    printed = _tool("experiments/step_costs.py", cfg, "--epochs", "16", "--out", str(out))
    data = json.loads(out.read_text())
    exact, rsc = data["methods"]["exact"]["pieces"], data["methods"]["rsc"]["pieces"]
    assert exact["exact product"]["calls"] == exact["backward (all)"]["calls"] > 0
    assert "refresh" not in exact and "step product (sample + group)" not in exact
    kept = "  partition (drawn once per matrix, then kept)"
    for name in ("refresh", "  draw (score, select, cut)", kept, "step product (sample + group)",
                 "    partition cut (once per matrix)"):  # fmt: skip
        assert rsc[name]["calls"] > 0, name
    # the default step on the CPU: its product, once per step, inside the step
    step = rsc["step product (sample + group)"]
    assert rsc["  of which the product"]["calls"] == step["calls"]
    assert rsc["  of which the product"]["median_ms"] <= step["median_ms"]
    # one partition per layer, cut once; asked for at every refresh that drops rows
    looked_up = rsc[kept]["calls"]
    assert 0 < rsc["    partition cut (once per matrix)"]["calls"] < looked_up
    assert looked_up <= rsc["refresh"]["calls"]
    assert rsc["  of which the group's slice"]["calls"] == step["calls"]
    assert set(data["methods"]["rsc"]["epoch_ms_mean"]) == {"approx", "exact"}
    assert set(data["methods"]["rsc"]["epoch_ms"]) == {"approx", "exact"}  # switched at 0.8
    assert "step product (sample + group)" in printed and data["machine"]["date"]


def test_step_costs_bounds_what_rsc_can_save_per_epoch(tmp_path):
    # three layers: the middle product's gradient is 16 wide (sampled), the last one's 3 wide
    # (narrower than min_width 4: exact in every phase)
    cfg = write_config(tmp_path, model={"name": "gcn", "hidden": 16, "layers": 3},
                       rsc={"min_width": 4}, train={"epochs": 30, "eval_every": 5})  # fmt: skip
    out = tmp_path / "costs.json"
    printed = _tool("experiments/step_costs.py", cfg, "--epochs", "16", "--out", str(out))
    data = json.loads(out.read_text())
    exact, rsc = data["methods"]["exact"], data["methods"]["rsc"]
    split = exact["products"]
    assert split["sampled"]["calls"] == split["narrow"]["calls"] == 16  # one each per epoch
    assert (
        split["sampled"]["calls"] + split["narrow"]["calls"]
        == (exact["pieces"]["backward (all)"]["calls"])
    )
    assert exact["products"]["visited_approx"] is None  # no approximate phase
    v = rsc["products"]["visited_approx"]
    assert 0 < v < 1
    c = data["ceiling"]
    assert c["visited"] == v and c["exact_epoch_ms"] == exact["epoch_ms_mean"]["exact"]
    assert 0 < c["sampled_share"] < 1
    e, x = c["exact_epoch_ms"], c["sampled_ms_per_epoch"]
    assert c["free"] == e / (e - x) and c["free"] > c["at_visited"] > 1
    assert c["at_visited"] == e / (e - (1 - v) * x)
    assert c["measured_mean"] == e / rsc["epoch_ms_mean"]["approx"]
    assert "ceiling: the products RSC samples take" in printed
