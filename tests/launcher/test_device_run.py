"""The CLI with RSC's defaults on each device (``cuda`` where there is one, marked ``gpu``):
what a user runs first. On the H200 (2026-11-26) this failed at the first sampled step: the
least-squares scale's error curve built a CPU tensor next to CUDA ones."""

from __future__ import annotations

import json
import math

from .test_launcher import run_cli, write_config


def test_default_rsc_trains_through_the_cli(device, tmp_path):
    cfg = write_config(
        tmp_path,
        train={"epochs": 8, "eval_every": 1},
        rsc={"budget": 0.1},  # the rest of the section: RSC's defaults
        dataset={"num_nodes": 2000, "avg_degree": 12.0},
    )
    out = tmp_path / "run"
    done = run_cli(["run", cfg, "--device", device.type, "--out", str(out), "--no-progress"])
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["environment"]["device"].startswith(device.type)
    rsc = [r for r in results["runs"] if r["method"] == "rsc"]
    assert rsc, sorted(r["method"] for r in results["runs"])
    history = rsc[0]["history"]
    approx = [h for h in history if h["phase"] == "approx"]
    assert approx and all(0 < h["nnz_fraction"] < 1 for h in approx[1:])
    assert all(math.isfinite(h["loss"]) for h in history)
    assert 0 <= rsc[0]["best"]["test"] <= 1
