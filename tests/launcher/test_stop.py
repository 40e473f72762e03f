"""``train.stop: plateau`` (early stopping) in the launcher and the interleaved tool: every
method stops by the same rule, the report says per run whether it converged, the config is
checked, and the rule's state resumes with the run."""

from __future__ import annotations

import json

import pytest

from dgl_rsc.core.config import ConfigError
from dgl_rsc.launcher import cli
from dgl_rsc.launcher.cli import load_config

from .test_launcher import write_config

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(
    "sets, fragment",
    [
        (["train.stop=early"], "train.stop='early' is not one of fixed, plateau"),
        (["train.patience=0"], "train.patience=0 is out of range"),
        (["train.min_delta=-0.1"], "train.min_delta=-0.1 is out of range"),
        (["rsc.switch_patience=-1"], "rsc.switch_patience=-1 is out of range"),
        (["train.stop=plateau", "train.patience=5", "rsc.switch_patience=5"],
         "rsc.switch_patience=5 must be below train.patience=5"),
    ],
)  # fmt: skip
def test_stop_keys_are_checked_naming_the_key(tmp_path, sets, fragment):
    cfg = write_config(tmp_path)
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace("[", r"\[")):
        load_config(cfg, sets)


@pytest.mark.parametrize(
    "sets, expected",
    [
        (["train.stop=plateau", "train.patience=30"], 10),  # a third of the stop's patience
        (["train.stop=plateau", "train.patience=2"], 1),
        (["train.stop=plateau", "train.patience=1"], 0),  # no room for a switch before the stop
        (["train.stop=plateau", "train.patience=30", "rsc.switch_patience=0"], 0),  # the user's
        (["train.stop=fixed", "train.patience=30"], 0),  # switch_at decides
    ],
)  # fmt: skip
def test_plateau_stopping_switches_rsc_on_a_third_of_its_patience_unless_set(
    tmp_path, sets, expected
):
    cfg = write_config(tmp_path)
    assert load_config(cfg, sets).rsc.switch_patience == expected


def run(tmp_path, capsys, name="out", **sections):
    cfg = write_config(tmp_path, **sections)
    out = tmp_path / name
    assert cli.main(["run", cfg, "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    return json.loads((out / "results.json").read_text()), printed


def test_plateau_stops_every_method_by_the_same_rule(tmp_path, capsys):
    train = {"epochs": 200, "eval_every": 1, "stop": "plateau", "patience": 4}
    res, _ = run(tmp_path, capsys, train=train, rsc={"switch_patience": 2})
    for rec in res["runs"]:
        stop, hist = rec["stop"], rec["history"]
        assert stop["rule"] == "plateau" and stop["converged"] is True
        assert len(hist) == stop["epochs"] < 200  # stopped before the cap ...
        vals = [h["val"] for h in hist]
        best = max(range(len(vals)), key=lambda i: (vals[i], -i))
        assert len(vals) - 1 - best == 4  # ... four evaluations after its best
        assert max(vals[:-1]) >= vals[-1]
    rsc = res["runs"][1]
    switch = rsc["rsc_stats"]["switch"]
    assert rsc["method"] == "rsc" and switch["signal"] == "plateau"
    assert [h["phase"] for h in rsc["history"]][-1] == "exact"
    assert res["summary"]["rsc"]["converged"] == 1 and res["summary"]["rsc"]["hit_cap"] == []


def test_a_run_that_hits_the_cap_is_marked_unconverged(tmp_path, capsys):
    train = {"epochs": 6, "stop": "plateau", "patience": 10, "seeds": [0, 1]}
    res, printed = run(tmp_path, capsys, train=train)
    assert all(r["stop"]["converged"] is False and r["stop"]["epochs"] == 6 for r in res["runs"])
    summary = res["summary"]
    assert summary["exact"]["converged"] == 0 and summary["exact"]["hit_cap"] == [0, 1]
    note = "hit the epoch cap still improving (unconverged): exact-seed0, exact-seed1, rsc-seed0"
    assert note in res["table"] and note in printed
    assert "   0/2" in res["table"].splitlines()[2]


def test_fixed_runs_report_whether_they_had_plateaued(tmp_path, capsys):
    res, _ = run(tmp_path, capsys, train={"epochs": 40, "eval_every": 1, "patience": 3})
    for rec in res["runs"]:
        vals = [h["val"] for h in rec["history"]]
        last_best = max(i for i, v in enumerate(vals) if v > max(vals[:i], default=-1))
        assert len(rec["history"]) == 40  # fixed: every epoch trained
        assert rec["stop"]["converged"] == (len(vals) - 1 - last_best >= 3)


# -- a resumed run is the run --------------------------------------------------------------------
#: every default but the graph's size and the run's length; no input dropout, and input features
#: wider than twice the hidden layer, so that the first layer's aggregation is computed once and
#: reused (in DGL's order it would transform first): what a resume must carry over
DEFAULTS = {
    "dataset": {"name": "synthetic", "num_nodes": 400, "avg_degree": 10.0, "num_classes": 3,
                "feat_dim": 48, "seed": 2},
    "model": {"name": "gcn", "hidden": 16, "layers": 3},
    "train": {"epochs": 40, "seeds": [0], "stock_baseline": False, "checkpoint_every": 10},
    "rsc": {},
    "compare": True,
}  # fmt: skip
#: long enough a patience to sit out the validation's early dip (epochs 8-20 on this graph)
PLATEAU = {"epochs": 150, "stop": "plateau", "patience": 20, "checkpoint_every": 5, "lr": 0.002}
SLOW = {"num_nodes": 1200, "feature_noise": 3.0, "homophily": 0.5}  # still rising at epoch 50
KEYS = ("loss", "train", "val", "test", "phase", "nnz_visited", "nnz_exact")


def _same_numbers(a: dict, b: dict) -> None:
    for ra, rb in zip(a["runs"], b["runs"]):
        assert ra["method"] == rb["method"] and len(ra["history"]) == len(rb["history"])
        for ha, hb in zip(ra["history"], rb["history"]):
            assert {k: ha[k] for k in KEYS} == {k: hb[k] for k in KEYS}, ha["epoch"]
        assert (ra["best"], ra["final"], ra["stop"]) == (rb["best"], rb["final"], rb["stop"])
        sa, sb = ra["rsc_stats"], rb["rsc_stats"]
        for key in ("nnz_visited", "nnz_exact", "cache_hits", "cache_misses", "switch", "step",
                    "budgets", "guard"):  # fmt: skip
            assert sa[key] == sb[key], key
        for la, lb in zip(sa["layers"], sb["layers"]):
            assert {k: v for k, v in la.items() if k != "select_seconds"} == {
                k: v for k, v in lb.items() if k != "select_seconds"
            }


@pytest.mark.parametrize(
    "train", [{}, pytest.param(PLATEAU, marks=pytest.mark.heavy)], ids=["defaults", "plateau"]
)
def test_a_killed_and_resumed_run_equals_the_uninterrupted_one_bit_for_bit(tmp_path, train):
    from .test_launcher import run_cli, run_killed

    sections = {**DEFAULTS, "train": {**DEFAULTS["train"], **train}}
    if train:  # RSC switches on its plateau before the run stops on its own
        sections["rsc"] = {"switch_patience": 10}
        sections["dataset"] = {**DEFAULTS["dataset"], **SLOW}
    cfg = write_config(tmp_path, sections)
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    # dies after epoch 13 of the RSC run (its checkpoint of epoch 10 on disk, the exact run done)
    assert run_killed("rsc-seed0", 13, ["run", cfg, "--out", str(killed)]).returncode == 75
    resumed = run_cli(["run", cfg, "--resume", str(killed), "--no-progress"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    whole = run_cli(["run", cfg, "--out", str(clean), "--no-progress"])
    assert whole.returncode == 0, whole.stderr[-2000:]
    a = json.loads((killed / "results.json").read_text())
    b = json.loads((clean / "results.json").read_text())
    _same_numbers(a, b)
    rsc = b["runs"][1]
    phases = [h["phase"] for h in rsc["history"]]
    assert phases[10:14] == ["approx"] * 4  # resumed in the approximate phase ...
    assert phases[-1] == "exact"  # ... which switched later (at 0.8 or on the plateau)
    if train:
        assert rsc["stop"]["converged"] and len(phases) < 150
        assert rsc["rsc_stats"]["switch"]["signal"] == "plateau" and len(phases) > 13


def test_a_checkpoint_on_a_full_disk_is_one_line(tmp_path, capsys, monkeypatch):
    """ENOSPC while torch.save writes the checkpoint (torch turns it into its own error)."""
    import errno
    import os

    from dgl_rsc.base.atomic import TMP_PREFIX

    real = os.fdopen

    class Full:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def fdopen(fd, *args, **kwargs):
        f = real(fd, *args, **kwargs)
        return Full(f) if os.readlink(f"/proc/self/fd/{fd}").endswith(".pt") else f

    monkeypatch.setattr(os, "fdopen", fdopen)
    cfg = write_config(tmp_path, train={"epochs": 4, "checkpoint_every": 2})
    out = tmp_path / "out"
    assert cli.main(["run", cfg, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    ckpt = out / "checkpoints" / "exact-seed0.pt"
    assert f"cannot write {ckpt}: No space left on device (ENOSPC)" in err[0]
    assert not ckpt.exists() and not any(p.name.startswith(TMP_PREFIX) for p in out.rglob("*"))
