"""Time to accuracy (``dgl_rsc.launcher.tta``): the definition on constructed runs, the
``report`` config section, and what the CLI writes (table, results.json, metrics.csv, png)."""

from __future__ import annotations

import csv
import doctest
import json
import os

import pytest

from dgl_rsc.core.config import ConfigError
from dgl_rsc.launcher import cli, tta
from dgl_rsc.launcher.schema import resolve
from dgl_rsc.launcher.tta import first_crossing, time_to_accuracy

from .test_launcher import SHIPPED, TINY, write_config

pytestmark = pytest.mark.usefixtures("one_thread")

# long enough that the tiny graph's validation climbs, evaluated every epoch
TRAIN = {"epochs": 12, "eval_every": 1, "seeds": [0], "stock_baseline": False}


def _record(method, seed, vals, epoch_s=1.0, best=None):
    """A run record whose epochs each take ``epoch_s`` and score ``vals`` (None: no eval)."""
    hist = [{"epoch": i + 1, "epoch_s": epoch_s, "val": v} for i, v in enumerate(vals)]
    top = max(v for v in vals if v is not None)
    return {"method": method, "seed": seed, "history": hist,
            "best": {"val": top if best is None else best}}  # fmt: skip


# -- the definition -------------------------------------------------------------------------------
def test_doctests_of_the_module_run():
    result = doctest.testmod(tta)
    assert result.failed == 0 and result.attempted >= 2


def test_first_crossing_skips_epochs_without_evaluation_but_counts_their_time():
    hist = [{"epoch": 1, "epoch_s": 2.0, "val": 0.1}, {"epoch": 2, "epoch_s": 3.0, "val": None},
            {"epoch": 3, "epoch_s": 0.5, "val": float("nan")},
            {"epoch": 4, "epoch_s": 1.0, "val": 0.7}]  # fmt: skip
    assert first_crossing(hist, 0.7) == {"epoch": 4, "time_s": 6.5, "val": 0.7}
    assert first_crossing(hist, 0.71) is None


def test_default_target_is_exact_best_minus_tolerance_per_seed_and_speedups_follow():
    records = [
        _record("exact", 0, [0.5, 0.8, 0.9], epoch_s=2.0),  # target 0.85: epoch 3, 6 s
        _record("rsc", 0, [0.6, 0.86, 0.8], epoch_s=1.0),  # epoch 2, 2 s
        _record("exact", 1, [0.4, 0.6, 0.7], epoch_s=2.0),  # target 0.65: epoch 3, 6 s
        _record("rsc", 1, [0.66, 0.6, 0.6], epoch_s=1.0),  # epoch 1, 1 s
    ]
    out = time_to_accuracy(records, tolerance=0.05)
    assert out["status"] == "ok"
    assert out["target"]["per_seed"] == {"0": pytest.approx(0.85), "1": pytest.approx(0.65)}
    exact, rsc = out["methods"]["exact"], out["methods"]["rsc"]
    assert [r["epoch"] for r in rsc["runs"]] == [2, 1] and rsc["time_s"] == 1.5
    assert exact["time_s"] == 6.0 and exact["status"] == "reached"
    assert rsc["vs_exact"] == pytest.approx(4.0) and exact["vs_exact"] == pytest.approx(1.0)
    assert "vs_stock" not in rsc  # no stock run, no ratio against it


def test_a_method_that_never_reaches_the_target_is_flagged_never_a_number():
    records = [_record("exact", 0, [0.5, 0.9]), _record("rsc", 0, [0.5, 0.7]),
               _record("stock", 0, [0.95, 0.95])]  # fmt: skip
    out = time_to_accuracy(records, tolerance=0.0)
    rsc = out["methods"]["rsc"]
    assert rsc["status"] == "not reached" and rsc["reached"] == 0
    assert rsc["time_s"] is None and rsc["vs_exact"] is None and rsc["vs_stock"] is None
    assert rsc["runs"][0]["reached"] is False and rsc["runs"][0]["time_s"] is None
    # stock gets there at epoch 1 (1 s), exact at epoch 2 (2 s): stock time over exact time
    assert out["methods"]["exact"]["vs_stock"] == pytest.approx(0.5)
    # one seed of two not reaching it makes the method's mean undefined, not a partial mean
    two = [*records, _record("exact", 1, [0.5, 0.6]), _record("rsc", 1, [0.7, 0.7]),
           _record("stock", 1, [0.9, 0.9])]  # fmt: skip
    rsc = time_to_accuracy(two, tolerance=0.0)["methods"]["rsc"]
    assert rsc["reached"] == 1 and rsc["status"] == "not reached" and rsc["time_s"] is None


def test_absolute_target_replaces_the_exact_one_and_is_the_only_way_without_exact():
    rsc_only = [_record("rsc", 0, [0.5, 0.7, 0.8])]
    none = time_to_accuracy(rsc_only)
    assert none["status"] == "unavailable" and none["methods"] == {}
    assert "no 'exact' run" in none["reason"]
    out = time_to_accuracy(rsc_only, target=0.7)
    assert out["methods"]["rsc"]["epoch"] == 2 and out["target"]["absolute"] == 0.7
    both = [_record("exact", 0, [0.99, 0.99]), *rsc_only]
    assert time_to_accuracy(both, target=0.75)["methods"]["rsc"]["epoch"] == 3


# -- config ---------------------------------------------------------------------------------------
def test_report_section_defaults_and_round_trip():
    cfg = resolve(json.loads(json.dumps(TINY)))
    assert cfg.report.tta_tolerance == 0.003 and cfg.report.tta_target is None
    given = resolve({**TINY, "report": {"tta_target": "8.5e-1"}})  # YAML 1.1 float string
    assert given.report.tta_target == 0.85
    assert resolve(given.to_dict()) == given


@pytest.mark.parametrize("path", SHIPPED, ids=[p.rsplit("/", 1)[-1] for p in SHIPPED])
def test_shipped_configs_evaluate_often_enough_to_resolve_the_crossing(path, monkeypatch):
    """Full-graph configs evaluate every 1 or 2 epochs (evaluation is not training time);
    mini-batch ones, whose epochs are whole passes over many batches, at most every 2."""
    from dgl_rsc.launcher.cli import load_config

    monkeypatch.chdir(os.path.dirname(os.path.dirname(path)))
    cfg = load_config(path)
    assert cfg.train.eval_every <= 2


@pytest.mark.parametrize(
    "report, fragment",
    [
        ({"tta_tolerance": -0.1}, "report.tta_tolerance=-0.1 is out of range"),
        ({"tta_tolerance": 1.5}, "0.003 is 0.3 points"),
        ({"tta_tolerance": "lots"}, "report.tta_tolerance must be a number"),
        ({"tta_target": float("nan")}, "report.tta_target=nan is not a finite number"),
        ({"tta_target": [0.9]}, "report.tta_target must be a number"),
        ({"tta_target": 0.9, "tta_tolerance": 0.01}, "keep tta_target"),
        ({"tta_tolerence": 0.01}, "Did you mean 'tta_tolerance'?"),
        ([0.9], "report must be a mapping"),
    ],
)
def test_report_section_is_validated_with_the_key(report, fragment):
    with pytest.raises(ConfigError, match=None) as err:
        resolve({**TINY, "report": report})
    assert fragment in str(err.value)


def test_bad_report_value_exits_2_before_training(tmp_path, capsys):
    path = write_config(tmp_path, report={"tta_tolerance": 0.5, "tta_target": 0.8})
    out = tmp_path / "out"
    assert cli.main(["run", path, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "report.tta_tolerance" in err and "Traceback" not in err and not out.exists()


# -- what the CLI writes --------------------------------------------------------------------------
def _csv_rows(out):
    with open(out / "metrics.csv", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_cli_records_time_to_target_at_the_first_crossing_in_metrics_csv(tmp_path, capsys):
    path = write_config(tmp_path, train=TRAIN)
    out = tmp_path / "out"
    assert cli.main(["run", path, "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    res = json.loads((out / "results.json").read_text())
    rows = _csv_rows(out)
    target = res["summary"]["exact"]["tta_target"]["per_seed"]["0"]
    best = max(float(r["val"]) for r in rows if r["method"] == "exact" and r["val"])
    assert target == pytest.approx(best - 0.003)
    for method in ("exact", "rsc"):
        s = res["summary"][method]
        mine = [r for r in rows if r["method"] == method]
        times = [float(r["train_time_s"]) for r in mine]
        assert times == sorted(times) and times[-1] == pytest.approx(
            sum(float(r["epoch_s"]) for r in mine)
        )  # cumulative training time, evaluation excluded
        hit = next((r for r in mine if r["val"] and float(r["val"]) >= target), None)
        if hit is None:
            assert s["tta_status"] == "not reached" and s["time_to_target_s"] is None
            continue
        assert s["tta_status"] == "reached"
        assert s["time_to_target_s"] == float(hit["train_time_s"])
        assert s["time_to_target_epoch"] == int(hit["epoch"])
    assert res["summary"]["exact"]["tta_status"] == "reached"  # its own best minus 0.003
    exact, rsc = res["summary"]["exact"], res["summary"]["rsc"]
    if rsc["time_to_target_s"] is not None:
        assert rsc["tta_speedup"] == pytest.approx(
            exact["time_to_target_s"] / rsc["time_to_target_s"]
        )
    head = printed.splitlines()[printed.splitlines().index(res["table"].splitlines()[0])]
    assert "to target" in head and "tta exact" in head
    assert "to target: training seconds (evaluation excluded)" in printed
    assert (out / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    run = json.loads((out / "runs" / "rsc-seed0.json").read_text())
    assert [h["train_time_s"] for h in run["history"]] == pytest.approx(
        [float(r["train_time_s"]) for r in rows if r["method"] == "rsc"]
    )


def test_cli_unreachable_absolute_target_is_reported_as_not_reached(tmp_path, capsys):
    path = write_config(tmp_path, train={**TRAIN, "epochs": 4})
    out = tmp_path / "out"
    args = ["run", path, "--out", str(out), "--no-progress", "--set", "report.tta_target=1.01"]
    assert cli.main(args) == 0
    printed = capsys.readouterr().out
    res = json.loads((out / "results.json").read_text())
    for method in ("exact", "rsc"):
        s = res["summary"][method]
        assert s["tta_status"] == "not reached" and s["tta_reached"] == 0
        assert s["time_to_target_s"] is None and s["tta_speedup"] is None
        row = next(ln for ln in res["table"].splitlines() if ln.startswith(method))
        assert "not reached 0/1" in row
    assert "absolute target 1.01" in printed
    assert (out / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_without_exact_says_tta_is_unavailable_unless_a_target_is_given(tmp_path, capsys):
    path = write_config(tmp_path, train={**TRAIN, "epochs": 3}, compare=False)
    out = tmp_path / "out"
    assert cli.main(["run", path, "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    s = json.loads((out / "results.json").read_text())["summary"]["rsc"]
    assert s["tta_status"] == "unavailable" and s["time_to_target_s"] is None
    assert "time to target unavailable" in printed and "report.tta_target" in printed
    args = ["run", path, "--out", str(out), "--no-progress", "--force",
            "--set", "report.tta_target=0.0"]  # fmt: skip
    assert cli.main(args) == 0
    capsys.readouterr()
    s = json.loads((out / "results.json").read_text())["summary"]["rsc"]
    assert s["tta_status"] == "reached" and s["time_to_target_epoch"] == 1
    assert s["tta_speedup"] is None  # no exact run to compare with


def _full_record(method, vals):
    """A record with everything :func:`summarize` reads (one seed, 10 ms epochs)."""
    rec = _record(method, 0, vals, epoch_s=0.01)
    times = dict.fromkeys(("forward_s", "backward_s", "step_s", "select_s"), 0.002)
    for h in rec["history"]:
        h.update(times, phase="exact", nnz_visited=1, nnz_exact=2 if method == "rsc" else 1)
    rec["best"]["test"] = rec["best"]["val"]
    return rec


def test_readme_example_table_has_the_layout_the_cli_prints():
    """The guide's launcher output has the header, columns and notes format_table writes."""
    import re

    from dgl_rsc.launcher.report import format_table, summarize

    readme = open(
        os.path.join(os.path.dirname(SHIPPED[0]), "..", "docs", "guide", "configuration.md")
    ).read()
    block = next(b for b in re.findall(r"```text\n(.*?)```", readme, re.S) if "to target" in b)
    lines = block.splitlines()
    recs = [_full_record(m, [0.5, 0.9]) for m in ("stock", "exact", "rsc")]
    table = format_table(summarize(recs), "accuracy").splitlines()
    assert lines[:2] == table[:2]  # header and rule
    for mine, theirs in zip(lines[2:5], table[2:5]):
        assert len(mine) == len(theirs) and mine.split()[0] == theirs.split()[0]
    assert lines[5].split("(")[0] == table[5].split("(")[0]  # "speedup: ... baseline "
    assert lines[6].split("(")[0] == table[6].split("(")[0]  # "to target: ... the target "
    assert lines[6].split(")")[-1] == table[6].split(")")[-1]


def test_resume_may_change_only_the_report_section_to_read_finished_runs_again(tmp_path, capsys):
    path = write_config(tmp_path, train={**TRAIN, "epochs": 4})
    out = tmp_path / "out"
    assert cli.main(["run", path, "--out", str(out), "--no-progress"]) == 0
    before = json.loads((out / "runs" / "rsc-seed0.json").read_text())
    assert json.loads((out / "results.json").read_text())["summary"]["exact"]["tta_status"] == (
        "reached"
    )
    args = ["run", path, "--resume", str(out), "--no-progress"]
    assert cli.main([*args, "--set", "report.tta_target=1.01"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["summary"]["exact"]["tta_status"] == "not reached"
    assert res["runs"][1]["history"] == before["history"]  # read back, not trained again
    assert cli.main([*args, "--set", "train.lr=0.5"]) == 2  # training keys still must match
    assert "train.lr" in capsys.readouterr().err
