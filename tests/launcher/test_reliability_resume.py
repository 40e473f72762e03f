"""Reliability of --resume (issue 12): counters over the whole run, changed data refused by
content hash, and damaged checkpoints, run records and configs refused with one clear message
before any training starts."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dgl_rsc.launcher import cli

from .test_launcher import TINY, write_config
from .test_reliability_data import arrays

pytestmark = pytest.mark.usefixtures("one_thread")
COUNTERS = ("nnz_visited", "nnz_exact", "cache_hits", "cache_misses")


def interrupt_at(run: str, epoch: int):
    """An ``on_epoch_end`` that stops the process's run after ``epoch`` of ``run``."""

    def stop(name, done):
        if (name, done) == (run, epoch):
            raise KeyboardInterrupt

    return stop


def interrupted(tmp_path, cfg: str, run="rsc-seed0", epoch=3):
    """A run directory whose ``run`` stopped after ``epoch`` (its checkpoint is older)."""
    out = tmp_path / "out"
    args = ["run", cfg, "--out", str(out), "--no-progress"]
    assert cli.main(args, on_epoch_end=interrupt_at(run, epoch)) == 130
    return out


def resume_refused(out, cfg, capsys) -> str:
    """Resume ``out``: exit 2, no epoch trained, one line without a traceback; the message."""
    capsys.readouterr()
    trained = []
    args = ["run", cfg, "--resume", str(out), "--no-progress"]
    assert cli.main(args, on_epoch_end=lambda run, epoch: trained.append(run)) == 2
    err = capsys.readouterr().err
    assert trained == [] and "Traceback" not in err and err.count("\n") == 1
    return err


# -- case 7: counters and data ---------------------------------------------------------------------
def test_rsc_stats_after_a_resume_count_every_epoch(tmp_path, capsys):
    cfg = write_config(
        tmp_path, train={"epochs": 10, "checkpoint_every": 3}, rsc={"switch_at": 0.9}
    )
    out = interrupted(tmp_path, cfg, epoch=7)  # checkpoint of epoch 6 on disk
    assert cli.main(["run", cfg, "--resume", str(out), "--no-progress"]) == 0
    clean = tmp_path / "clean"
    assert cli.main(["run", cfg, "--out", str(clean), "--no-progress"]) == 0
    resumed = json.loads((out / "results.json").read_text())["runs"][1]
    whole = json.loads((clean / "results.json").read_text())["runs"][1]
    stats, ref = resumed["rsc_stats"], whole["rsc_stats"]
    assert resumed["method"] == "rsc" and stats["step"] == ref["step"] == 10
    # the totals are the sums of the per-epoch metrics, including the epochs before the resume
    for key in ("nnz_visited", "nnz_exact"):
        assert stats[key] == sum(h[key] for h in resumed["history"]) > 0
    assert stats["visited_fraction"] == pytest.approx(stats["nnz_visited"] / stats["nnz_exact"])
    for a, b in zip(stats["layers"], ref["layers"]):  # the schedule's counts do not depend on data
        assert (a["approx_calls"], a["exact_calls"]) == (b["approx_calls"], b["exact_calls"])
        assert a["cache_hits"] + a["cache_misses"] == b["cache_hits"] + b["cache_misses"]
        assert a["nnz_exact"] == b["nnz_exact"] and a["rows"] == b["rows"]
    calls = [x["approx_calls"] + x["exact_calls"] for x in stats["layers"]]
    assert 10 in calls and set(calls) <= {0, 10}  # one backward per epoch, before and after
    capsys.readouterr()


def npz_run(tmp_path, **train):
    path = tmp_path / "graph.npz"
    np.savez(path, **arrays())
    raw = {**TINY, "dataset": {"name": "npz", "path": str(path)}}
    raw["model"] = {**TINY["model"], "dropout": 0.0}
    cfg = write_config(tmp_path, raw, train={"epochs": 6, "checkpoint_every": 2, **train})
    return path, cfg


def test_changed_dataset_with_the_same_shapes_is_refused_naming_the_file(tmp_path, capsys):
    path, cfg = npz_run(tmp_path)
    out = interrupted(tmp_path, cfg)
    assert (out / "checkpoints" / "rsc-seed0.pt").exists()
    changed = arrays()
    changed["feat"] = changed["feat"].copy()
    changed["feat"][3, 1] += 0.5
    np.savez(path, **changed)
    err = resume_refused(out, cfg, capsys)
    assert f"was made from other data than {path} holds now" in err
    assert "Restore the original data" in err
    np.savez(path, **arrays())  # restored: the resume goes on
    assert cli.main(["run", cfg, "--resume", str(out), "--no-progress"]) == 0


def test_changed_class_count_is_refused(tmp_path, capsys):
    path, cfg = npz_run(tmp_path)
    out = interrupted(tmp_path, cfg)
    (out / "runs" / "exact-seed0.json").unlink()  # only the checkpoint can tell
    label = arrays()["label"].copy()
    label[8] = 3  # a fourth class, same shapes
    np.savez(path, **arrays(label=label))
    err = resume_refused(out, cfg, capsys)
    assert "checkpoint" in err and f"other data than {path}" in err


def test_checkpoint_that_does_not_fit_the_model_is_refused(tmp_path, capsys):
    cfg = write_config(tmp_path, train={"epochs": 6, "checkpoint_every": 2})
    out = interrupted(tmp_path, cfg)
    ckpt = out / "checkpoints" / "rsc-seed0.pt"
    state = torch.load(ckpt, weights_only=True)
    key = next(k for k in state["model"] if k.endswith("weight"))
    state["model"][key] = torch.zeros(1, 1)  # as after a change of the class count
    torch.save(state, ckpt)
    err = resume_refused(out, cfg, capsys)
    assert f"checkpoint {ckpt} does not fit run rsc-seed0 (RuntimeError:" in err


# -- case 16: damaged files in the run directory ---------------------------------------------------
@pytest.mark.parametrize("damage", ["truncated", "empty", "random", "foreign", "tensor"])
def test_damaged_checkpoint_is_one_clear_error(tmp_path, capsys, damage):
    cfg = write_config(tmp_path, train={"epochs": 6, "checkpoint_every": 2})
    out = interrupted(tmp_path, cfg)
    ckpt = out / "checkpoints" / "rsc-seed0.pt"
    data = ckpt.read_bytes()
    if damage == "truncated":
        ckpt.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        ckpt.write_bytes(b"")
    elif damage == "random":
        ckpt.write_bytes(np.random.default_rng(0).bytes(5000))
    elif damage == "foreign":
        torch.save({"weights": torch.ones(3)}, ckpt)
    else:
        torch.save(torch.ones(3), ckpt)
    err = resume_refused(out, cfg, capsys)
    if damage in ("foreign", "tensor"):
        assert "is not a dgl-rsc checkpoint (format 1); it lacks" in err
    else:
        assert f"checkpoint {ckpt} cannot be read safely" in err
    assert "Delete it to train rsc-seed0 again from epoch 0" in err


def test_checkpoint_that_is_not_weights_only_is_one_clear_error(tmp_path, capsys):
    cfg = write_config(tmp_path, train={"epochs": 6, "checkpoint_every": 2})
    out = interrupted(tmp_path, cfg)
    ckpt = out / "checkpoints" / "rsc-seed0.pt"
    state = torch.load(ckpt, weights_only=True)
    state["extra"]["note"] = np.float64(1.0)  # a numpy scalar needs the full unpickler
    torch.save(state, ckpt)
    err = resume_refused(out, cfg, capsys)
    assert "cannot be read safely (UnpicklingError: Weights only load failed" in err


@pytest.mark.parametrize(
    "data, fragment",
    [
        (b'{"method": "exact", "seed": 0, "hist', "is damaged (JSONDecodeError"),
        (b"\xff\xfe{}", "is damaged (UnicodeDecodeError"),
        (b"[1, 2]", "is not a dgl-rsc run record"),
    ],
)
def test_damaged_run_record_is_one_clear_error(tmp_path, capsys, data, fragment):
    cfg = write_config(tmp_path, train={"epochs": 4, "checkpoint_every": 2})
    out = interrupted(tmp_path, cfg)
    record = out / "runs" / "exact-seed0.json"
    record.write_bytes(data)
    err = resume_refused(out, cfg, capsys)
    assert f"{record} {fragment}" in err and "exact-seed0 again" in err


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("train: [unclosed\n", "is not valid YAML"),
        ("train: {lr: 1}\ntrain: {lr: 2}\n", "appears twice"),
    ],
)
def test_damaged_run_config_is_one_clear_error(tmp_path, capsys, text, fragment):
    cfg = write_config(tmp_path, train={"epochs": 4, "checkpoint_every": 2})
    out = interrupted(tmp_path, cfg)
    (out / "config.yaml").write_text(text)
    err = resume_refused(out, cfg, capsys)
    assert "the run's config.yaml is damaged" in err and fragment in err
    (out / "config.yaml").write_bytes(b"\xff\xfe garbage")
    assert "is not UTF-8 text" in resume_refused(out, cfg, capsys)


def test_damaged_results_json_is_rewritten_by_the_resume(tmp_path, capsys):
    """results.json is an output, never read: a damaged one is replaced (documented)."""
    cfg = write_config(tmp_path, train={"epochs": 4, "checkpoint_every": 2})
    out = interrupted(tmp_path, cfg)
    (out / "results.json").write_text("{not json")
    assert cli.main(["run", cfg, "--resume", str(out), "--no-progress"]) == 0
    assert len(json.loads((out / "results.json").read_text())["runs"]) == 2
    capsys.readouterr()
