"""The ``dgl-rsc`` launcher: config validation, outputs, --force, resume, python -m."""

from __future__ import annotations

import glob
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml

from dgl_rsc.base import _deps
from dgl_rsc.core.config import ConfigError
from dgl_rsc.launcher import cli
from dgl_rsc.launcher.cli import apply_overrides, load_config
from dgl_rsc.launcher.mb_schema import steps_per_epoch
from dgl_rsc.launcher.schema import resolve

from ..proc import run as run_cmd

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIPPED = sorted(glob.glob(os.path.join(REPO, "yaml_configs", "*.yaml")))

TINY = {
    "dataset": {"name": "synthetic", "num_nodes": 300, "avg_degree": 8.0, "num_classes": 3,
                "feat_dim": 8, "seed": 1},
    "model": {"name": "gcn", "hidden": 16, "layers": 2},
    "train": {"epochs": 6, "lr": 0.02, "seeds": [0], "eval_every": 2, "stock_baseline": False},
    # min_width 0: this model's products are all narrower than the default's 16, and the
    # tests here exercise the approximated backward
    "rsc": {"budget": 0.3, "cache_interval": 2, "tune_interval": 2, "warmup_steps": 1,
            "min_width": 0},
    "compare": True,
}  # fmt: skip


def write_config(tmp_path, cfg=None, name="tiny.yaml", **sections) -> str:
    cfg = json.loads(json.dumps(cfg or TINY))
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key].update(value)
        else:
            cfg[key] = value
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def run_cli(args, env=None, **kw):
    """``python -m dgl_rsc ARGS`` in a subprocess (CI set: no progress bar)."""
    full_env = {**os.environ, "CI": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    return run_cmd([sys.executable, "-m", "dgl_rsc", *args], env=full_env, cwd=REPO,
                   timeout=300, **kw)  # fmt: skip


KILL_SCRIPT = """\
import os, sys
from dgl_rsc.launcher.cli import main

run, epoch = sys.argv[1], int(sys.argv[2])

def kill(name, done):  # dies abruptly, as a killed process would, after that checkpoint
    if (name, done) == (run, epoch):
        os._exit(75)

sys.exit(main(sys.argv[3:], on_epoch_end=kill))
"""


def run_killed(run: str, epoch: int, args) -> subprocess.CompletedProcess:
    """``dgl-rsc ARGS`` in a subprocess that exits abruptly (75) after ``epoch`` of ``run``
    (like ``"rsc-seed0"``), through the ``on_epoch_end`` callback."""
    env = {**os.environ, "CI": "1", "OMP_NUM_THREADS": "1"}
    return run_cmd([sys.executable, "-c", KILL_SCRIPT, run, str(epoch), *args], env=env,
                   cwd=REPO, timeout=300)  # fmt: skip


pytestmark = pytest.mark.usefixtures("one_thread")


# -- validation ------------------------------------------------------------------------------
@pytest.mark.parametrize("path", SHIPPED, ids=[os.path.basename(p) for p in SHIPPED])
def test_every_shipped_config_validates(path, monkeypatch):
    monkeypatch.chdir(REPO)
    cfg = load_config(path)
    assert cfg.train.epochs >= 1 and cfg.methods
    if cfg.rsc is not None:
        steps = steps_per_epoch(cfg.train.mode, cfg.minibatch, cfg.train.batches_per_epoch)
        assert cfg.rsc.total_steps == cfg.train.epochs * steps  # optimizer steps
    assert resolve(cfg.to_dict()) == cfg  # the resolved form round-trips


def test_shipped_configs_exist():
    names = {os.path.basename(p) for p in SHIPPED}
    assert {"quickstart.yaml", "cora_gcn.yaml", "citeseer_gcn.yaml", "reddit_gcn.yaml"} <= names


@pytest.mark.parametrize(
    "section, key, near",
    [
        ("train", "lrr", "lr"),
        ("train", "epoch", "epochs"),
        ("rsc", "budjet", "budget"),
        ("model", "hiden", "hidden"),
        ("dataset", "num_node", "num_nodes"),
    ],
)
def test_unknown_key_names_the_nearest_and_the_allowed(tmp_path, section, key, near):
    raw = json.loads(json.dumps(TINY))
    raw[section][key] = 1
    with pytest.raises(ConfigError) as err:
        resolve(raw)
    msg = str(err.value)
    assert f"'{key}'" in msg and f"Did you mean '{near}'" in msg and "Allowed keys" in msg


def test_unknown_top_level_section():
    raw = {**TINY, "trian": {}}
    with pytest.raises(ConfigError, match="Did you mean 'train'"):
        resolve(raw)


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("train.epochs=ten", "train.epochs must be an integer"),
        ("train.epochs=2.5", "train.epochs must be an integer"),
        ("train.lr=abc", "train.lr must be a number"),
        ("train.seeds=[]", "train.seeds must be a non-empty list"),
        ("train.optimizer=adamm", "Did you mean 'adam'"),
        ("train.engine=natve", "Did you mean 'native'"),
        ("train.amp=fp8", "train.amp='fp8' is not one of"),
        ("train.device=gpu", "train.device must be"),
        ("train.threads=two", "train.threads must be an integer"),
        ("model.batch_norm=1", "model.batch_norm must be true or false"),
        ("compare=sometimes", "compare must be true or false"),
        ("train=[1, 2]", "train must be a mapping"),
    ],
)
def test_wrong_types_are_rejected_with_the_key_path(override, fragment):
    with pytest.raises(ConfigError) as err:
        resolve(apply_overrides(TINY, [override]))
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("train.lr=-0.1", "train.lr=-0.1 is out of range"),
        ("train.epochs=0", "train.epochs=0 is out of range"),
        ("train.eval_every=0", "train.eval_every=0 is out of range"),
        ("train.threads=0", "train.threads=0 is out of range"),
        ("train.weight_decay=-1", "train.weight_decay=-1.0 is out of range"),
        ("model.dropout=1.0", "model.dropout=1.0 is out of range"),
        ("model.layers=0", "model.layers=0 is out of range"),
        ("rsc.budget=1.5", "rsc.budget=1.5 is out of range"),
        ("rsc.cache_interval=0", "rsc.cache_interval=0 is out of range"),
        ("rsc.total_steps=99", "rsc.total_steps=99 differs from the run's 6 optimizer steps"),
    ],
)
def test_out_of_range_values_are_rejected(override, fragment):
    with pytest.raises(ConfigError) as err:
        resolve(apply_overrides(TINY, [override]))
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("model.name=gnc", "Did you mean 'gcn'"),
        ("dataset.name=synthetc", "Did you mean 'synthetic'"),
        ("model.alpha=0.1", "unknown key 'alpha' in model (model.name=gcn)"),
    ],
)
def test_unknown_model_and_dataset_names(override, fragment):
    with pytest.raises(ConfigError) as err:
        resolve(apply_overrides(TINY, [override]))
    assert fragment in str(err.value)


def test_compare_needs_rsc_and_yaml_float_strings_are_numbers():
    with pytest.raises(ConfigError, match="compare: true needs an rsc section"):
        resolve(apply_overrides(TINY, ["rsc=null"]))
    cfg = resolve(apply_overrides(TINY, ["rsc=null", "compare=false", "train.lr=1e-3"]))
    assert cfg.rsc is None and cfg.methods == ("exact",) and cfg.train.lr == 0.001


def test_set_overrides_parse_values_as_yaml():
    raw = apply_overrides(TINY, ["train.seeds=[3, 4]", "rsc.rule=topk", "model.batch_norm=true"])
    cfg = resolve(raw)
    assert cfg.train.seeds == (3, 4) and cfg.rsc.rule == "topk" and cfg.model["batch_norm"]
    assert TINY["train"]["seeds"] == [0]  # the input is not modified
    with pytest.raises(ConfigError, match="section.key=value"):
        apply_overrides(TINY, ["trainlr"])
    with pytest.raises(ConfigError, match="train.lr is not a section"):
        apply_overrides(TINY, ["train.lr.x=1"])


def test_relative_paths_resolve_against_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = resolve(apply_overrides(TINY, ["dataset.root=data/"]))
    assert cfg.dataset["root"] == os.path.join(str(tmp_path), "data")


# -- command line ----------------------------------------------------------------------------
def test_show_prints_the_resolved_config(tmp_path, capsys):
    path = write_config(tmp_path)
    assert cli.main(["show", path, "--set", "train.lr=0.05"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["train"]["lr"] == 0.05 and shown["rsc"]["total_steps"] == 6
    assert shown["model"]["dropout"] == 0.5  # a default filled in
    assert resolve(shown) == load_config(path, ["train.lr=0.05"])


def test_bad_config_exits_2_with_one_paragraph_and_writes_nothing(tmp_path, capsys):
    path = write_config(tmp_path, train={"lrr": 0.1})
    out = tmp_path / "out"
    assert cli.main(["run", path, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Did you mean 'lr'" in err and "Traceback" not in err and err.count("\n") == 1
    assert not out.exists()


def test_missing_config_file_exits_2(tmp_path, capsys):
    assert cli.main(["show", str(tmp_path / "nope.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_python_m_help(capsys):
    top = run_cli(["--help"])
    assert top.returncode == 0 and "run" in top.stdout and "show" in top.stdout
    assert "python -m dgl_rsc" in top.stdout
    with pytest.raises(SystemExit) as done:
        cli.main(["run", "--help"])
    sub = capsys.readouterr().out
    assert done.value.code == 0 and "--resume" in sub and "--force" in sub and "--set" in sub


def test_run_writes_results_csv_png_and_force_is_needed_to_replace(tmp_path, capsys):
    path = write_config(tmp_path, train={"seeds": [0, 1], "stock_baseline": True})
    out = tmp_path / "out"
    assert cli.main(["run", path, "--out", str(out), "--no-progress"]) == 0
    printed, err = capsys.readouterr()
    assert "speedup" in printed and "exact" in printed and "rsc" in printed
    res = json.loads((out / "results.json").read_text())
    setup = res["environment"]["setup_s"]  # seconds of each setup phase, one line printed
    assert {"dataset", "graph", "warm_up", "kernel_compile"} <= set(setup)
    assert min(setup.values()) >= 0
    assert f"setup: dataset {setup['dataset']:.1f} s, graph" in printed
    assert "setup:" not in err  # --no-progress: the phases are timed, not shown
    assert {"environment", "config", "summary", "runs", "table", "metric"} <= set(res)
    assert {"torch", "dgl", "device", "date", "machine", "cpu"} <= set(res["environment"])
    assert isinstance(res["environment"]["cpu_caches"], dict)
    for method in ("exact", "rsc"):
        s = res["summary"][method]
        assert s["runs"] == 2 and 0.0 <= s["test_mean"] <= 1.0 and s["epoch_s_mean"] > 0
        assert {"test_std", "speedup", "nnz_fraction", "backward_s_mean"} <= set(s)
    assert res["summary"]["exact"]["nnz_fraction"] == 1.0
    assert res["summary"]["rsc"]["nnz_fraction"] < 1.0
    # with DGL installed, the stock dgl.nn model runs too, and speedups are against the
    # faster of the two exact baselines
    methods = ["exact", "rsc"] + (["stock"] if _deps.dgl_available() else [])
    assert sorted(res["summary"]) == sorted(methods)
    base = min(("exact", "stock"), key=lambda m: res["summary"].get(m, {}).get("epoch_s_mean", 1e9))
    s = res["summary"]["rsc"]
    assert s["baseline"] == base
    assert s["speedup"] == pytest.approx(res["summary"][base]["epoch_s_mean"] / s["epoch_s_mean"])
    assert "faster baseline" in printed
    rows = (out / "metrics.csv").read_text().strip().splitlines()
    assert rows[0].startswith("method,seed,epoch,phase,loss")
    assert len(rows) == 1 + len(methods) * 2 * 6  # methods x seeds x epochs
    assert (out / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert yaml.safe_load((out / "config.yaml").read_text())["train"]["seeds"] == [0, 1]
    before = (out / "results.json").stat().st_mtime_ns
    # an existing output directory is refused without --force ...
    assert cli.main(["run", path, "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert (out / "results.json").stat().st_mtime_ns == before
    # ... and replaced with it (other files in it are left alone)
    (out / "notes.txt").write_text("mine")
    assert cli.main(["run", path, "--out", str(out), "--force", "--set", "train.seeds=[2]"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["summary"]["rsc"]["seeds"] == [2] and (out / "notes.txt").exists()
    stock = ["stock-seed2.json"] if _deps.dgl_available() else []
    assert sorted(os.listdir(out / "runs")) == sorted(
        ["exact-seed2.json", "rsc-seed2.json", *stock]
    )


def test_resume_after_a_crash_equals_an_uninterrupted_run(tmp_path, capsys):
    path = write_config(
        tmp_path,
        train={"epochs": 10, "checkpoint_every": 3},
        model={"batch_norm": True, "layers": 3},
        rsc={"switch_at": 0.9},
    )
    crashed, clean = tmp_path / "crashed", tmp_path / "clean"
    # the process dies abruptly after epoch 7 of the RSC run (checkpoint of epoch 6 on disk)
    first = run_killed("rsc-seed0", 7, ["run", path, "--out", str(crashed)])
    assert first.returncode == 75, first.stderr
    assert not (crashed / "results.json").exists()
    assert (crashed / "checkpoints" / "rsc-seed0.pt").exists()
    assert (crashed / "runs" / "exact-seed0.json").exists()
    # a resume with another config is refused
    assert cli.main(["run", path, "--resume", str(crashed), "--set", "train.lr=0.5"]) == 2
    assert "train.lr" in capsys.readouterr().err
    # ... but not with another warm-up, which changes no run's numbers (the checkpoint's
    # config and config.yaml both say 5, the default)
    resume = ["run", path, "--resume", str(crashed), "--set", "train.warmup_epochs=0"]
    assert cli.main([*resume, "--no-progress"]) == 0
    assert cli.main(["run", path, "--out", str(clean), "--no-progress"]) == 0
    a = json.loads((crashed / "results.json").read_text())["runs"]
    b = json.loads((clean / "results.json").read_text())["runs"]
    # equal to float32 rounding: MKL's GEMMs can differ by an ulp between processes (seen
    # here: the first run of the crashed process against the same run in this process), and
    # early in training a few of the 75 validation/test nodes sit at near-ties of their logits
    for ra, rb in zip(a, b):
        assert ra["method"] == rb["method"]
        loss_b = [h["loss"] for h in rb["history"]]
        assert [h["loss"] for h in ra["history"]] == pytest.approx(loss_b, rel=1e-5)
        assert [h["phase"] for h in ra["history"]] == [h["phase"] for h in rb["history"]]
        assert ra["best"]["epoch"] == rb["best"]["epoch"]
        assert ra["final"] == pytest.approx(rb["final"], abs=0.05)
    # resumed mid-approximation: epochs 7-9 approximate with the restored sample and scores
    assert [h["phase"] for h in a[1]["history"]][6:] == ["approx"] * 3 + ["exact"]


def test_checkpoint_loads_with_weights_only(tmp_path):
    from dgl_rsc.launcher.checkpoint import load_checkpoint, rng_state, set_rng_state

    path = write_config(tmp_path, train={"epochs": 4, "checkpoint_every": 2})
    out = tmp_path / "out"
    assert cli.main(["run", path, "--out", str(out), "--no-progress"]) == 0
    state = load_checkpoint(str(out / "checkpoints" / "rsc-seed0.pt"))
    assert state["epoch"] == 4 and state["controller"]["step_count"] == 4
    assert torch.load(str(out / "checkpoints" / "rsc-seed0.pt"), weights_only=True)
    saved = rng_state()
    a = (torch.rand(3), random.random(), np.random.rand())  # noqa: NPY002 (global state)
    set_rng_state(saved)
    b = (torch.rand(3), random.random(), np.random.rand())  # noqa: NPY002
    assert torch.equal(a[0], b[0]) and a[1:] == b[1:]


def test_threads_hold_for_the_run_and_are_restored(tmp_path, monkeypatch, capsys):
    from dgl_rsc.launcher import train

    seen = []
    real = train.run_experiment

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(train, "run_experiment", spy)
    torch.set_num_threads(2)
    path = write_config(tmp_path, train={"epochs": 2, "threads": 1}, compare=False)
    assert cli.main(["run", path, "--out", str(tmp_path / "a"), "--no-progress"]) == 0
    assert seen == [1] and torch.get_num_threads() == 2
    # null keeps the process's setting
    path = write_config(tmp_path, train={"epochs": 2, "threads": None}, compare=False)
    assert cli.main(["run", path, "--out", str(tmp_path / "b"), "--no-progress"]) == 0
    assert seen == [1, 2] and torch.get_num_threads() == 2
    capsys.readouterr()


def test_rsc_alone_reports_without_a_baseline(tmp_path, capsys):
    """``compare: false`` trains RSC alone: its approximate phase has no baseline to be compared
    with, and the report says so instead of failing at the end of training."""
    path = write_config(tmp_path, compare=False)
    out = tmp_path / "run"
    assert cli.main(["run", path, "--out", str(out), "--no-progress"]) == 0
    res = json.loads((out / "results.json").read_text())
    s = res["summary"]["rsc"]
    assert s["approx_epoch_s_mean"] is not None and "speedup_approx" not in s
    line = next(ln for ln in res["table"].splitlines() if ln.startswith("rsc"))
    assert line.split()[-3:-1] == ["-", "-"]  # speedup, approx
    capsys.readouterr()


def test_warm_up_trains_each_method_untimed_first_and_changes_no_result(tmp_path, monkeypatch):
    """``train.warmup_epochs``: before the first timed run, each method trains that many
    epochs with nothing written (so no timed run pays the process's one-off costs for the
    others); the timed runs then give the same losses and accuracies as without it."""
    from dgl_rsc.launcher import train as train_mod

    calls = []
    real = train_mod.train_one

    def spy(cfg, prep, method, seed, ckpt_path=None, *args, **kwargs):
        calls.append((method, seed, cfg.train.epochs, ckpt_path is None))
        return real(cfg, prep, method, seed, ckpt_path, *args, **kwargs)

    monkeypatch.setattr(train_mod, "train_one", spy)
    results = {}
    for warm in (3, 0):
        path = write_config(tmp_path, name=f"w{warm}.yaml",
                            train={"seeds": [1, 0], "warmup_epochs": warm})  # fmt: skip
        out = tmp_path / f"out{warm}"
        calls.clear()
        assert cli.main(["run", path, "--out", str(out), "--no-progress"]) == 0
        timed = [(m, s, 6, False) for s in (1, 0) for m in ("exact", "rsc")]
        warm_calls = [(m, 1, 3, True) for m in ("exact", "rsc")] if warm else []
        assert calls == warm_calls + timed
        assert sorted(os.listdir(out / "runs")) == sorted(
            f"{m}-seed{s}.json" for m in ("exact", "rsc") for s in (0, 1)
        )  # fmt: skip
        res = json.loads((out / "results.json").read_text())
        results[warm] = {(r["method"], r["seed"]): [(h["loss"], h["val"]) for h in r["history"]]
                         for r in res["runs"]}  # fmt: skip
        assert len(results[warm]) == 4
    assert results[3] == results[0]
    # one method only (compare off): nothing to tilt, no warm-up
    path = write_config(tmp_path, name="one.yaml", compare=False, train={"warmup_epochs": 3})
    calls.clear()
    assert cli.main(["run", path, "--out", str(tmp_path / "one"), "--no-progress"]) == 0
    assert calls == [("rsc", 0, 6, False)]


def test_cpu_caches_reads_sysfs_levels_and_kinds(tmp_path):
    """Cache sizes by level (d/i for data and instruction), entries that cannot be read
    skipped, and nothing (not an error) where the directory does not exist."""
    from dgl_rsc.launcher.report import cpu_caches

    for name, level, kind, size in [("index0", 1, "Data", "48K"), ("index1", 1, "Instruction",
                                     "64K"), ("index2", 2, "Unified", "2048K")]:  # fmt: skip
        d = tmp_path / name
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    (tmp_path / "index3").mkdir()  # no files: skipped
    assert cpu_caches(str(tmp_path)) == {"L1d": "48K", "L1i": "64K", "L2": "2048K"}
    assert cpu_caches(str(tmp_path / "absent")) == {}
