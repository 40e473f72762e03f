"""``tools/experiments/reorder_ab.py`` as a user runs it: every node order trained the same
number of timed epochs, each order's one-time cost and neighbour spread are written, and the
reference's ratio to itself is 1."""

from __future__ import annotations

import json

from .launcher.test_launcher import write_config
from .test_tools_tta import _tool


def test_reorder_ab_times_every_order_against_the_first(tmp_path):
    cfg = write_config(tmp_path, train={"epochs": 10})
    out = tmp_path / "ab.json"
    printed = _tool("experiments/reorder_ab.py", cfg, "--rounds", "2", "--block", "1",
                    "--out", str(out))  # fmt: skip
    data = json.loads(out.read_text())
    orders = data["orders"]
    assert list(orders) == ["none", "degree", "rcm"] and data["reference"] == "none"
    for name, v in orders.items():
        assert v["epochs_timed"] == 2 and v["median_epoch_ms"] > 0, name
        assert v["median_epoch_cpu_ms"] > 0 and v["edge_spread"] > 0, name
        assert (v["order_first_s"] > 0) == (name != "none"), name
    assert orders["none"]["speedup_vs_reference_median"] == 1.0
    assert data["machine"]["date"] and "rcm" in printed
