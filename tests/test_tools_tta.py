"""The tools report time to accuracy with the launcher's definition, as users run them:
``tools/experiments/accuracy_parity.py`` (through the CLI) and
``tools/bench_cpu_e2e.py --tta-epochs``."""

from __future__ import annotations

import json
import os
import sys

import pytest

from dgl_rsc.launcher.tta import first_crossing

from .conftest import requires_dgl
from .launcher.test_launcher import REPO, run_cli, write_config
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
    printed = _tool("experiments/accuracy_parity.py", cfg, "--budgets", "0.3", "--runs",
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


def test_tta_sweep_records_the_first_crossing_of_each_variant(tmp_path):
    """``tools/experiments/tta_sweep.py`` as issue 22's sweeps ran it: per seed the exact
    run, then each variant, with the time to exact's best validation minus the tolerance."""
    cfg = write_config(tmp_path, train={"epochs": 8})
    out = tmp_path / "sweep.json"
    printed = _tool("experiments/tta_sweep.py", cfg, "--seeds", "0", "1", "--variant",
                    "b05:budget=0.5", "--variant", "c1:cache_interval=1",
                    "--out", str(out))  # fmt: skip
    sweep = json.loads(out.read_text())
    assert sweep["device"] == "cpu" and sweep["torch"]
    env = sweep["environment"]  # the CPU a sweep's times come from, as the other tools say
    assert env["device"] == "cpu" and env["cpus"] >= 1 and "cpu_caches" in env and env["date"]
    assert sweep["warmup_epochs"] == 12  # untimed runs first, none of them recorded
    assert sorted(sweep["runs"]) == sorted(f"{v}-seed{s}" for v in ("exact", "b05", "c1")
                                           for s in (0, 1))  # fmt: skip
    for seed in (0, 1):
        exact = sweep["runs"][f"exact-seed{seed}"]
        target = exact["best"]["val"] - sweep["tolerance"] / 100
        e_cross = first_crossing(exact["history"], target)
        assert e_cross is not None  # exact reaches its own best
        for v in ("b05", "c1"):
            run = sweep["runs"][f"{v}-seed{seed}"]
            assert run["tta"] == first_crossing(run["history"], target)
            if run["tta"] is None:
                assert "tta_speedup" not in run
            else:
                assert run["tta_speedup"] == e_cross["time_s"] / run["tta"]["time_s"]
    assert printed.count("seed ") == 2


def test_exact_only_sweeps_pick_the_homophily_below_the_ceiling(tmp_path):
    """The preset tuning of issue 22: ``--exact-only`` sweeps at several homophilies, then
    ``tools/experiments/pick_homophily.py`` prints the largest whose exact test accuracy is
    under the ceiling (and says which sweep is unusable)."""
    cfg = write_config(tmp_path, train={"epochs": 6})
    tests = {}
    for h in ("0.2", "0.9"):
        out = tmp_path / f"grid_h{h}.json"
        _tool("experiments/tta_sweep.py", cfg, "--exact-only", "--set", f"dataset.homophily={h}",
              "--out", str(out))  # fmt: skip
        sweep = json.loads(out.read_text())
        assert list(sweep["runs"]) == ["exact-seed0"]
        tests[float(h)] = sweep["runs"]["exact-seed0"]["best"]["test"]
    grids = [str(tmp_path / f"grid_h{h}.json") for h in ("0.2", "0.9")]
    ceiling = (tests[0.2] + tests[0.9]) / 2
    assert tests[0.9] > tests[0.2], tests  # homophily makes the graph easier
    assert float(_tool("experiments/pick_homophily.py", *grids, "--ceiling", str(ceiling))) == 0.2
    assert float(_tool("experiments/pick_homophily.py", *grids, "--ceiling", "1.0")) == 0.9
    assert (
        float(_tool("experiments/pick_homophily.py", *grids, "--ceiling", "0.0")) == 0.2
    )  # none below
    bad = tmp_path / "nohomophily.json"
    bad.write_text(json.dumps({"sets": ["train.eval_every=1"], "runs": {}}))
    env = {**os.environ, "PYTHONPATH": REPO}
    tool = os.path.join(TOOLS, "experiments", "pick_homophily.py")
    done = run_cmd([sys.executable, tool, str(bad)],
                   env=env, cwd=REPO, timeout=120)  # fmt: skip
    assert done.returncode != 0 and "sets no dataset.homophily" in done.stderr


def test_interleaved_epochs_times_each_setting_on_the_overridden_config(tmp_path):
    """``tools/interleaved_epochs.py`` as the GPU suite's ``mean`` stage runs it: ``--set``
    overrides the base config (here a switch to the exact backward from the first step, which
    every variant inherits), each variant its own RSC keys (a switch that never comes within
    the rounds; with ``total_steps``, one that comes where the schedule puts it, so that RSC's
    exact phase can be timed), and the JSON says on which device the epochs ran."""
    cfg = write_config(tmp_path, train={"epochs": 6})
    out = tmp_path / "interleaved.json"
    printed = _tool("interleaved_epochs.py", cfg, "--rounds", "3", "--warmup", "1",
                    "--set", "train.device=cpu", "--set", "rsc.switch_at=0.0",
                    "--variant", "base:", "--variant", "late:switch_at=0.9",
                    "--variant", "after:switch_at=0.75,total_steps=4",
                    "--out", str(out))  # fmt: skip
    res = json.loads(out.read_text())
    assert res["sets"] == ["train.device=cpu", "rsc.switch_at=0.0"]
    assert res["device"] == "cpu" and res["gpu"] is None
    assert set(res["mean_epoch_s"]) == {"exact", "base", "late", "after"}
    assert res["ratio_to_exact"]["exact"] == 1.0
    assert all(v > 0 for v in res["mean_epoch_s"].values())
    visited = res["visited_fraction"]
    assert visited["exact"] == 1.0 and visited["base"] == 1.0  # exact from the first step
    assert visited["late"] < 0.9, visited  # sampled: the override reached only the base
    # two warm-up steps, one sampled, then the switch at step 3 of 4
    assert res["phase_at_end"] == {"exact": "exact", "base": "exact", "late": "approx",
                                   "after": "exact"}  # fmt: skip
    assert visited["late"] < visited["after"] < 1.0, visited
    assert "late" in printed


def test_budget_profile_sweep_follows_the_profile_at_each_tune(tmp_path):
    """``tools/experiments/budget_profile_sweep.py`` (issue 22's budget time profile): each
    tune's budget follows the variant's profile, falling from B0 for ``early``, rising towards
    exact for ``late``, and a malformed profile is refused before training."""
    cfg = write_config(tmp_path, train={"epochs": 8})
    out = tmp_path / "profile.json"
    _tool("experiments/budget_profile_sweep.py", cfg, "--variant", "flat:", "--variant",
          "early:profile=early-0.9-1.0", "--variant", "late:profile=late-0.25",
          "--warmup-epochs", "1", "--out", str(out))  # fmt: skip
    runs = json.loads(out.read_text())["runs"]
    logged = {v: [t["budget"] for t in runs[f"{v}-seed0"]["rsc_stats"]["budgets"]]
              for v in ("flat", "early", "late")}  # fmt: skip
    assert len(logged["flat"]) >= 3 and set(logged["flat"]) == {0.3}, logged
    # tunes at steps 1, 3, 5 of 8 (t = 1/8, 3/8, 5/8; the switch at 0.8)
    assert logged["early"] == pytest.approx([0.9 - 0.6 * t for t in (1 / 8, 3 / 8, 5 / 8)])
    late = [0.3 + 0.7 * max(t - 0.25, 0) / 0.55 for t in (1 / 8, 3 / 8, 5 / 8)]
    assert logged["late"] == pytest.approx(late)
    env = {**os.environ, "PYTHONPATH": REPO}
    tool = os.path.join(TOOLS, "experiments", "budget_profile_sweep.py")
    done = run_cmd([sys.executable, tool, cfg,
                    "--variant", "bad:profile=middle-0.5", "--out", str(tmp_path / "x.json")],
                   env=env, cwd=REPO, timeout=120)  # fmt: skip
    assert done.returncode != 0 and "expected early-B0-U" in done.stderr
    assert not (tmp_path / "x.json").exists()


WITH_STOCK = pytest.param(True, {}, marks=[requires_dgl, pytest.mark.dgl], id="with-stock")


PLATEAU = pytest.param(False, {"epochs": 60, "stop": "plateau", "patience": 3}, id="plateau")


@pytest.mark.parametrize(
    "stock, stop", [pytest.param(False, {}, id="exact-rsc"), WITH_STOCK, PLATEAU]
)
def test_interleaved_tta_trains_each_method_as_the_launcher_does(tmp_path, stock, stop):
    """``tools/experiments/interleaved_tta.py``: the methods take turns epoch by epoch, each
    with its own random-number state (dropout on), so every run's losses and evaluations are the
    launcher's bit for bit, and each stops where the launcher stops it (``train.stop``); its
    report has the launcher's summary keys and says it was interleaved; a used output directory
    is refused before anything trains."""
    train = {"epochs": 6, "eval_every": 1, "seeds": [0, 1], "stock_baseline": stock, **stop}
    model = {"name": "gcn", "hidden": 16, "layers": 2, "dropout": 0.5}
    cfg = write_config(tmp_path, train=train, model=model)
    done = run_cli(["run", cfg, "--out", str(tmp_path / "launcher")])
    assert done.returncode == 0, done.stdout + done.stderr
    launched = json.loads((tmp_path / "launcher" / "results.json").read_text())
    printed = _tool("experiments/interleaved_tta.py", cfg, "--out", str(tmp_path / "inter"))
    inter = json.loads((tmp_path / "inter" / "results.json").read_text())
    assert inter["environment"]["interleaved"] is True and "tta exact" in printed
    key = lambda r: (r["method"], r["seed"])  # noqa: E731
    runs = {key(r): r for r in launched["runs"]}
    assert sorted(runs) == sorted(key(r) for r in inter["runs"])
    assert ("stock", 0) in runs if stock else ("stock", 0) not in runs
    for r in inter["runs"]:
        want = runs[key(r)]
        for a, b in zip(r["history"], want["history"], strict=True):
            assert (a["loss"], a["val"], a["phase"]) == (b["loss"], b["val"], b["phase"]), key(r)
        assert r["best"] == want["best"] and r["stop"] == want["stop"]
        assert r["stop"]["converged"] or not stop  # plateau: stopped before the cap of 60
    assert set(inter["summary"]) == set(launched["summary"])
    assert set(inter["summary"]["rsc"]) == set(launched["summary"]["rsc"])
    tool = os.path.join(TOOLS, "experiments", "interleaved_tta.py")
    again = run_cmd([sys.executable, tool, cfg, "--out", str(tmp_path / "inter")], cwd=REPO,
                    timeout=120)  # fmt: skip
    assert again.returncode != 0 and "not empty" in again.stderr


def test_an_interleaved_variant_may_set_the_precision_and_nothing_else_outside_rsc(tmp_path):
    """``--variant`` keys: ``rsc.*`` and the per-run ``train.precision``/``train.int8_*``
    (a precision variant trains INT8 as set: ``int8_pick`` always); any other key stops
    the tool with a message naming what may change."""
    import importlib.util

    from dgl_rsc.launcher.yaml_io import load_config

    spec = importlib.util.spec_from_file_location(
        "interleaved_tta", os.path.join(TOOLS, "experiments", "interleaved_tta.py")
    )
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    cfg_path = write_config(tmp_path)
    cfg = load_config(cfg_path, [])
    (name, v8), (_, vb) = tool.rsc_variants(
        cfg_path, [], ["i8:train.precision=int8,train.int8_saved=fp32", "b:budget=0.5"], cfg
    )
    assert name == "i8" and (v8.train.precision, v8.train.int8_saved) == ("int8", "fp32")
    assert v8.train.int8_pick == "always" and vb.rsc.budget == 0.5
    with pytest.raises(SystemExit, match=r"changes more than the rsc section and train\."):
        tool.rsc_variants(cfg_path, [], ["wide:model.hidden=32"], cfg)
