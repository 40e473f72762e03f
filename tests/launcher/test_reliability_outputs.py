"""Reliability of the launcher's outputs (issue 12): --force removes only what dgl-rsc wrote,
bad --out paths are refused before any data load, files follow the umask, stale temporary
files are cleaned, a diverging run stops with a clear error, JSON is strict, and the Ctrl-C
hint is a command that works."""

from __future__ import annotations

import json
import os
import re
import shlex
import stat

import pytest

from dgl_rsc.core.config import ConfigError
from dgl_rsc.launcher import cli, outputs, prepare, train
from dgl_rsc.launcher.checkpoint import (
    LOCK,
    MANIFEST,
    atomic_write_text,
    claim,
    manifest_files,
    remove_stale_temps,
)
from dgl_rsc.launcher.report import strict_json, write_report

from .test_launcher import write_config

pytestmark = pytest.mark.usefixtures("one_thread")
FAST = {"epochs": 2, "eval_every": 1}


def tree(root) -> dict:
    """``{relative path: bytes}`` of every file under ``root`` (links not followed)."""
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            out[os.path.relpath(path, root)] = open(path, "rb").read()
    return out


def no_data(monkeypatch):
    """Make any data load fail the test (what must be refused happens before it)."""

    def fail(*args, **kwargs):
        raise AssertionError("the dataset was loaded")

    monkeypatch.setattr("dgl_rsc.data.load_dataset", fail)


def strict_load(text: str):
    def refuse(token):
        raise ValueError(f"non-JSON token {token}")

    return json.loads(text, parse_constant=refuse)


# -- case 1: --force removes only what dgl-rsc wrote ---------------------------------------------
def test_force_on_a_directory_dgl_rsc_did_not_write_is_refused_untouched(
    tmp_path, monkeypatch, capsys
):
    """``dgl-rsc run CFG --out . --force`` used to delete every runs/ and checkpoints/ there."""
    work = tmp_path / "project"
    for rel in ("runs/old/results.json", "checkpoints/mine.pt", "notes.txt", "runs/x/runs/a"):
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(rel)
    before = tree(work)
    cfg = write_config(tmp_path, train=FAST)
    monkeypatch.chdir(work)
    no_data(monkeypatch)
    assert cli.main(["run", cfg, "--out", ".", "--force"]) == 2
    err = capsys.readouterr().err
    assert f"is not empty and has no readable {MANIFEST}" in err
    assert "It holds checkpoints, notes.txt, runs." in err and "Traceback" not in err
    assert tree(work) == before


def test_force_removes_only_the_files_of_the_manifest(tmp_path, capsys):
    cfg = write_config(tmp_path, train={**FAST, "checkpoint_every": 1})
    out = tmp_path / "out"
    assert cli.main(["run", cfg, "--out", str(out), "--no-progress"]) == 0
    listed = manifest_files(str(out))
    written = set(tree(out)) - {MANIFEST, LOCK}  # the two control files are not outputs
    assert set(listed) == written  # every file the run wrote is listed, and nothing else
    assert {"config.yaml", "results.json", "runs/rsc-seed0.json", "checkpoints/rsc-seed0.pt"} <= (
        written
    )
    mine = {"notes.txt": b"n", "runs/my-analysis.txt": b"a", "checkpoints/keep.bin": b"k"}
    for rel, data in mine.items():
        (out / rel).write_bytes(data)
    args = ["run", cfg, "--out", str(out), "--force", "--no-progress", "--set", "train.seeds=[3]"]
    assert cli.main(args) == 0
    after = tree(out)
    assert all(after[rel] == data for rel, data in mine.items())
    assert "runs/exact-seed0.json" not in after and "runs/exact-seed3.json" in after
    assert set(manifest_files(str(out))) == set(after) - set(mine) - {MANIFEST, LOCK}
    capsys.readouterr()


def test_force_refuses_foreign_files_it_would_replace(tmp_path, capsys):
    out = tmp_path / "out"
    claim(str(out), str(out / "config.yaml"))  # a manifest that does not list what follows
    (out / "results.json").write_text("my own results")
    (out / "runs").mkdir()
    (out / "runs" / "exact-seed0.json").write_text("{}")
    cfg = write_config(tmp_path, train=FAST)
    assert cli.main(["run", cfg, "--out", str(out), "--force"]) == 2
    err = capsys.readouterr().err
    assert "holds results.json, runs/exact-seed0.json, which its" in err
    assert (out / "results.json").read_text() == "my own results"


def test_a_crafted_manifest_cannot_remove_anything_outside(tmp_path, capsys):
    out, victim = tmp_path / "out", tmp_path / "victim"
    victim.mkdir()
    for name in ("victim.txt", "results.json", "exact-seed0.json"):
        (victim / name).write_text("precious")
    out.mkdir()
    (out / "results.json").symlink_to(victim / "results.json")
    listed = [
        "../victim/victim.txt",
        str(victim / "victim.txt"),
        "runs/../../victim/victim.txt",
        "results.json",
        "notes.txt",
        "runs/exact-seed0.json",
    ]
    text = json.dumps({"tool": "dgl-rsc", "format": 1, "files": listed})
    (out / MANIFEST).write_text(text)
    (out / "notes.txt").write_text("mine")
    os.symlink(victim, out / "runs")
    cfg = write_config(tmp_path, train=FAST)
    assert cli.main(["run", cfg, "--out", str(out), "--force"]) == 2
    err = capsys.readouterr().err
    assert "holds results.json, runs, which" in err  # the links are not ours: refused
    assert all((victim / n).read_text() == "precious" for n in os.listdir(victim))
    assert (out / "notes.txt").read_text() == "mine"


# -- case 15: the output location is checked before the data are loaded --------------------------
def test_out_that_is_a_file_or_under_a_file(tmp_path, monkeypatch, capsys):
    no_data(monkeypatch)
    cfg = write_config(tmp_path, train=FAST)
    (tmp_path / "file.txt").write_text("x")
    assert cli.main(["run", cfg, "--out", str(tmp_path / "file.txt")]) == 2
    assert "file.txt exists and is not a directory" in capsys.readouterr().err
    assert cli.main(["run", cfg, "--out", str(tmp_path / "file.txt" / "sub" / "dir")]) == 2
    assert "which is not a directory" in capsys.readouterr().err
    assert cli.main(["run", cfg, "--resume", str(tmp_path / "file.txt")]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err
    assert (tmp_path / "file.txt").read_text() == "x"


def test_out_that_is_not_writable(tmp_path, monkeypatch, capsys):
    if os.geteuid() != 0:
        target = tmp_path / "ro"
        target.mkdir()
        target.chmod(0o555)
        out = target / "run"
    else:  # root writes through permission bits; /proc refuses new files even to root
        out = "/proc/self/dgl-rsc-run"
    no_data(monkeypatch)
    cfg = write_config(tmp_path, train=FAST)
    try:
        assert cli.main(["run", cfg, "--out", str(out)]) == 2
    finally:
        if os.geteuid() != 0:
            (tmp_path / "ro").chmod(0o755)
    err = capsys.readouterr().err
    assert "cannot write in" in err and "choose a writable path" in err


def test_another_process_checking_the_same_directory_does_not_make_it_refused(tmp_path, capsys):
    """check_location's probe file (another rank or run checking ``out`` at this moment) is
    not a run: a directory with only it, a lock and an empty manifest is free (the stop of
    2026-11-26: a 2-rank run refused its own directory)."""
    cfg = write_config(tmp_path, train=FAST)
    out = tmp_path / "run"
    out.mkdir()
    claim(str(out))
    (out / LOCK).write_text("")
    (out / f"{outputs.PROBE_PREFIX}x1y2z3").write_text("")
    assert cli.main(["run", cfg, "--out", str(out), "--no-progress"]) == 0, capsys.readouterr()
    assert (out / "config.yaml").is_file()
    (out / f"{outputs.PROBE_PREFIX}x1y2z3").unlink()
    assert cli.main(["run", cfg, "--out", str(out)]) == 2  # a finished run is still refused
    assert "exists and is not empty" in capsys.readouterr().err


def test_only_rank_0_checks_the_directory_it_writes(tmp_path, monkeypatch, capsys):
    """Rank 1 does not refuse a directory in which rank 0 has started writing the run."""
    cfg = write_config(tmp_path, train=FAST, distributed={"partitions": 2})
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text("rank 0 wrote this\n")
    reached = []

    def stop(cfg, out_dir, progress=False):
        reached.append(out_dir)
        raise ConfigError("stopped after the directory checks")

    monkeypatch.setattr("dgl_rsc.launcher.prepare.prepare", stop)
    for rank, checked in (("1", False), ("0", True)):
        monkeypatch.setenv("RANK", rank)
        assert cli.main(["run", cfg, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert ("exists and is not empty" in err) is checked, err
    assert reached == [str(out)]
    assert (out / "config.yaml").read_text() == "rank 0 wrote this\n"


# -- permissions and temporary files --------------------------------------------------------------
def test_outputs_follow_the_umask(tmp_path, capsys):
    old = os.umask(0o022)
    try:
        cfg = write_config(tmp_path, train={**FAST, "checkpoint_every": 1}, compare=False)
        assert cli.main(["run", cfg, "--out", str(tmp_path / "out"), "--no-progress"]) == 0
        os.umask(0o077)
        atomic_write_text(str(tmp_path / "private.txt"), "x")
    finally:
        os.umask(old)
    for rel in tree(tmp_path / "out"):
        assert stat.S_IMODE(os.stat(tmp_path / "out" / rel).st_mode) == 0o644, rel
    assert stat.S_IMODE(os.stat(tmp_path / "private.txt").st_mode) == 0o600
    capsys.readouterr()


def test_stale_temporary_files_of_ours_are_removed_on_the_next_start(tmp_path, capsys):
    cfg = write_config(tmp_path, train={**FAST, "checkpoint_every": 1}, compare=False)
    out = tmp_path / "out"
    assert cli.main(["run", cfg, "--out", str(out), "--no-progress"]) == 0
    ours = [
        "checkpoints/.dgl-rsc-tmp-0123456789abcdef-rsc-seed0.pt",
        ".dgl-rsc-tmp-fedcba9876543210-results.json",
    ]
    others = ["checkpoints/.tmp-abc-rsc-seed0.pt", ".dgl-rsc-tmp-notes.txt", "runs/x.pt.tmp"]
    for rel in ours + others:
        (out / rel).write_text("half-written")
    assert cli.main(["run", cfg, "--resume", str(out), "--no-progress"]) == 0
    left = tree(out)
    assert not any(rel in left for rel in ours) and all(rel in left for rel in others)
    (out / ours[0]).write_text("again")
    assert remove_stale_temps(str(out)) == [str(out / ours[0])]
    capsys.readouterr()


# -- case 4: a diverging run, strict JSON ---------------------------------------------------------
def test_diverging_run_stops_with_exit_3_naming_the_epoch(tmp_path, capsys):
    from dgl_rsc.launcher.checkpoint import load_checkpoint

    cfg = write_config(
        tmp_path, train={"epochs": 6, "lr": 1e30, "checkpoint_every": 1}, compare=False
    )
    out = tmp_path / "out"
    assert cli.main(["run", cfg, "--out", str(out), "--no-progress"]) == 3
    err = capsys.readouterr().err
    assert re.search(r"run rsc-seed0 diverged: its training loss is (nan|inf) at epoch 2\.", err)
    assert "Lower train.lr (now 1e+30)" in err and "Traceback" not in err
    assert not (out / "results.json").exists() and not (out / "runs" / "rsc-seed0.json").exists()
    assert (out / "config.yaml").exists()
    kept = load_checkpoint(str(out / "checkpoints" / "rsc-seed0.pt"))  # epoch 1's, untouched
    assert kept["epoch"] == 1 and all(bool(t.isfinite().all()) for t in kept["model"].values())


def test_diverging_run_raises_before_the_optimizer_step(tmp_path, monkeypatch):
    steps, real = [], train._optimizer

    def counting(cfg, params):
        opt = real(cfg, params)
        step = opt.step
        opt.step = lambda *a, **k: (steps.append(1), step(*a, **k))[1]
        return opt

    monkeypatch.setattr(train, "_optimizer", counting)
    raw = write_config(tmp_path, train={"epochs": 4, "lr": 1e30}, rsc=None, compare=False)
    cfg = cli.load_config(raw)
    seen = []
    with pytest.raises(train.TrainingDiverged, match="run exact-seed0 diverged: .* at epoch 2"):
        train.train_one(
            cfg,
            train.prepare(cfg),
            "exact",
            0,
            progress=False,
            on_epoch_end=lambda run, epoch: seen.append((run, epoch)),
        )
    assert seen == [("exact-seed0", 1)] and len(steps) == 1  # epoch 2 took no step


def test_results_are_strict_json(tmp_path):
    assert strict_json({"a": [float("nan"), float("inf"), 1.0]}) == '{"a": [null, null, 1.0]}'
    times = dict.fromkeys(("epoch_s", "forward_s", "backward_s", "step_s", "select_s"), 0.01)
    history = [
        {
            "epoch": 1,
            "phase": "exact",
            "loss": 0.5,
            "train": 0.5,
            "val": 0.5,
            "test": 0.5,
            "nnz_fraction": 1.0,
            **times,
        }
    ]
    record = {
        "method": "rsc",
        "seed": 0,
        "history": history,
        "best": {"epoch": 1, "val": 0.5, "test": 0.5, "train": 0.5},
        "final": {"epoch": 1, "val": float("nan")},
        "rsc_stats": {"visited_fraction": float("inf"), "layers": [{"x": float("nan")}]},
    }
    write_report(str(tmp_path), {}, [record], {"device": "cpu"}, "accuracy")
    run = strict_load((tmp_path / "results.json").read_text())["runs"][0]
    assert run["final"]["val"] is None and run["rsc_stats"]["visited_fraction"] is None
    assert run["rsc_stats"]["layers"][0]["x"] is None and run["best"]["val"] == 0.5


# -- Ctrl-C: the hint is the full command ---------------------------------------------------------
def test_interrupt_prints_a_resume_command_that_works(tmp_path, monkeypatch, capsys):
    cfg = write_config(tmp_path, train={**FAST, "checkpoint_every": 1})
    out = tmp_path / "my out"
    real = train.run_experiment

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "run_experiment", interrupted)
    args = [
        "run",
        cfg,
        "--out",
        str(out),
        "--set",
        "train.lr=0.05",
        "--set",
        "rsc.budget=0.4",
        "--device",
        "cpu",
        "--no-progress",
    ]
    assert cli.main(args) == 130
    hint = capsys.readouterr().err.split("continue with: ")[1].strip()
    words = shlex.split(hint)
    assert words[:2] == ["dgl-rsc", "run"] and words[words.index("--resume") + 1] == str(out)
    assert "train.lr=0.05" in words and "rsc.budget=0.4" in words and "cpu" in words
    monkeypatch.setattr(train, "run_experiment", real)
    assert cli.main(words[1:] + ["--no-progress"]) == 0
    assert strict_load((out / "results.json").read_text())["config"]["train"]["lr"] == 0.05


def test_interrupt_before_training_exits_130_without_a_traceback(tmp_path, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare, "prepare", interrupted)
    assert (
        cli.main(["run", write_config(tmp_path, train=FAST), "--out", str(tmp_path / "o")]) == 130
    )
    assert "interrupted before training started" in capsys.readouterr().err


def test_docstring_examples_of_the_changed_modules_run():
    import doctest

    from dgl_rsc.launcher import checkpoint, cli, report

    for module in (checkpoint, cli, report):
        assert doctest.testmod(module).failed == 0
    assert doctest.testmod(report).attempted >= 1
