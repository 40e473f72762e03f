"""``train.int8_pick``: INT8 in the form whose epoch measured fastest (as configured, or with
the saved activations in fp32), fp32 where none beats it (a faked timing here), the pick kept
in the output directory for a resumed run."""

from __future__ import annotations

import json
import logging

import pytest

from dgl_rsc.core.config import ConfigError
from dgl_rsc.launcher import int8_pick
from dgl_rsc.launcher.int8_pick import PICK_FILE, pick_precision

from .test_launcher import TINY, _resolve


class Prep:
    def __init__(self):
        self.setup_s = {}


def fake_trainer(int8_s: float, fp32_s: float, calls: list, saved_fp32_s=None):
    """A ``train_one`` whose epochs take the given seconds per candidate (INT8 with the saved
    activations in fp32: ``saved_fp32_s``, else as INT8)."""

    def train_one(cfg, prep, method, seed, progress=True):
        t = cfg.train
        name = t.precision if t.precision == "fp32" or t.int8_saved != "fp32" else "saved"
        calls.append((name, t.epochs, method, t.stop))
        s = {"int8": int8_s, "fp32": fp32_s,
             "saved": int8_s if saved_fp32_s is None else saved_fp32_s}[name]  # fmt: skip
        return {"history": [{"epoch_s": 9.0}] + [{"epoch_s": s}] * (cfg.train.epochs - 1)}

    return train_one


def test_int8_slower_trains_fp32_and_says_so(tmp_path, caplog):
    cfg, calls = _resolve(int8_pick="speed"), []
    with caplog.at_level(logging.WARNING, logger="dgl_rsc.launcher.int8_pick"):
        out, pick = pick_precision(cfg, Prep(), str(tmp_path), 0, fake_trainer(0.3, 0.2, calls))
    assert out.train.precision == "fp32" and cfg.train.precision == "int8"
    assert pick["chosen"] == "fp32" and pick["int8_vs_fp32"] == pytest.approx(2 / 3)
    assert (
        "fp32 200 ms, int8 300 ms, int8-saved-fp32 300 ms" in caplog.text
        and "train in fp32" in caplog.text
        and "int8_pick: always" in caplog.text
    )
    # two rounds, the order reversed in the second, the exact method, fixed length
    # INT8 against fp32, then (INT8 lost) INT8 with fp32 saved activations against fp32:
    # two rounds each, the order reversed in the second
    order = ["fp32", "int8", "int8", "fp32", "fp32", "saved", "saved", "fp32"]
    assert [c[0] for c in calls] == order
    assert {c[1:] for c in calls} == {(3, "exact", "fixed")}
    assert json.loads((tmp_path / PICK_FILE).read_text())["chosen"] == "fp32"


def test_int8_with_fp32_saved_activations_is_picked_where_only_it_pays(tmp_path, caplog):
    """INT8 as configured slower than fp32, INT8 products with fp32 saved activations faster:
    the runs train that (the INT8 products, the saved activations as fp32), and say so.
    Where the config already saves them in fp32, that candidate is not timed twice."""
    cfg, calls = _resolve(int8_pick="speed"), []
    with caplog.at_level(logging.WARNING, logger="dgl_rsc.launcher.int8_pick"):
        out, pick = pick_precision(cfg, Prep(), str(tmp_path), 0,
                                   fake_trainer(0.3, 0.2, calls, saved_fp32_s=0.15))  # fmt: skip
    assert pick["chosen"] == "int8-saved-fp32"
    assert pick["epoch_s"] == {"fp32": 0.2, "int8": 0.3, "int8-saved-fp32": 0.15}
    # INT8 faster than fp32 keeps INT8 as configured (its memory too): nothing more timed
    calls.clear()
    _, fast = pick_precision(cfg, Prep(), None, 0, fake_trainer(0.1, 0.2, calls, 0.05))
    assert fast["chosen"] == "int8" and "saved" not in {c[0] for c in calls}
    assert (out.train.precision, out.train.int8_saved) == ("int8", "fp32")
    assert "activations saved for the backward in fp32" in caplog.text
    again, _ = pick_precision(cfg, Prep(), str(tmp_path), 0, None)  # read back, not measured
    assert (again.train.precision, again.train.int8_saved) == ("int8", "fp32")
    calls.clear()
    saved = _resolve(int8_pick="speed", int8_saved="fp32")
    pick_precision(saved, Prep(), None, 0, fake_trainer(0.3, 0.2, calls))
    assert sorted({c[0] for c in calls}) == ["fp32", "saved"] and len(calls) == 4


def test_int8_faster_keeps_int8_and_a_resumed_run_reads_the_pick(tmp_path):
    cfg = _resolve(int8_pick="speed")
    out, pick = pick_precision(cfg, Prep(), str(tmp_path), 0, fake_trainer(0.1, 0.2, []))
    assert out.train.precision == "int8" and pick["chosen"] == "int8"

    def never(*a, **k):
        raise AssertionError("a resumed run measures nothing")

    again, read = pick_precision(cfg, Prep(), str(tmp_path), 0, never)
    assert again.train.precision == "int8" and read["read_from"] == PICK_FILE
    (tmp_path / PICK_FILE).write_text('{"chosen": "int4"}')
    with pytest.raises(ConfigError, match="not an INT8 pick"):
        pick_precision(cfg, Prep(), str(tmp_path), 0, never)
    (tmp_path / PICK_FILE).write_text("{")
    with pytest.raises(ConfigError, match="cannot be read"):
        pick_precision(cfg, Prep(), str(tmp_path), 0, never)


def test_always_and_fp32_measure_nothing():
    def never(*a, **k):
        raise AssertionError("nothing to measure")

    for cfg in (_resolve(int8_pick="always"), _resolve(precision="fp32")):
        assert pick_precision(cfg, Prep(), None, 0, never) == (cfg, None)
    assert _resolve().train.int8_pick == "always"  # the test config's; the default is speed
    raw = json.loads(json.dumps(TINY))
    del raw["train"]["int8_pick"]
    from dgl_rsc.launcher.schema import resolve

    assert resolve(raw).train.int8_pick == "speed"
    with pytest.raises(ConfigError, match=r"train.int8_pick='fast' is not one of speed, always"):
        _resolve(int8_pick="fast")


def test_the_launcher_trains_in_the_picked_precision(tmp_path, monkeypatch):
    """End to end: the faked measurement picks fp32; the runs train fp32 and say why."""
    from dgl_rsc.launcher import cli

    def slow_int8(cfg, prep, seed, train_one, rounds=2, epochs=3):
        return {
            "chosen": "fp32",
            "int8_epoch_s": 0.3,
            "fp32_epoch_s": 0.2,
            "int8_vs_fp32": 2 / 3,
            "rounds": rounds,
            "epochs": epochs,
            "measured_s": 0.0,
        }

    monkeypatch.setattr(int8_pick, "measure", slow_int8)
    raw = json.loads(json.dumps(TINY))
    raw["train"]["int8_pick"] = "speed"
    path = tmp_path / "int8.yaml"
    import yaml

    path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    assert cli.main(["run", str(path), "--out", str(out), "--no-progress"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert {r["precision"] for r in res["runs"]} == {"fp32"}
    assert res["environment"]["int8_pick"]["chosen"] == "fp32"
    assert json.loads((out / PICK_FILE).read_text())["chosen"] == "fp32"
