"""No silent waits: a setup phase that runs past a few seconds shows itself on stderr and its
seconds reach the report; a short one, a quiet run and an import print nothing. The phases are
made slow with a clock that advances one second per reading (nothing here times anything)."""

from __future__ import annotations

import io
import itertools
import sys

import pytest
from numba import njit

from dgl_rsc.backends import compile_watch
from dgl_rsc.backends.compile_watch import CompileWatch, compiling
from dgl_rsc.base import progress
from dgl_rsc.base.progress import Phase
from dgl_rsc.data import synthetic_graph
from dgl_rsc.launcher.prepare import prepare
from dgl_rsc.launcher.schema import resolve

from ..proc import run as run_cmd

TINY = {
    "dataset": {"name": "synthetic", "num_nodes": 300, "avg_degree": 6.0, "num_classes": 3,
                "feat_dim": 8},
    "model": {"name": "gcn", "hidden": 8, "layers": 2},
    "train": {"epochs": 1, "device": "cpu"},
}  # fmt: skip


@pytest.fixture
def slow_clock(monkeypatch):
    """Every reading of the phases' clock is one second after the last."""
    ticks = itertools.count()
    monkeypatch.setattr(progress, "clock", lambda: float(next(ticks)))


def test_a_phase_past_its_threshold_shows_its_progress_and_its_seconds(slow_clock):
    out, times = io.StringIO(), {}
    with Phase("setup: thing", times, "thing", show_after=2, stream=out) as phase:
        for done in (1, 2, 3, 4):
            phase.update(done, 4)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("setup: thing: ") and lines[0].endswith("% ...")
    assert lines[-1] == f"setup: thing: done in {times['thing']:.1f} s" and times["thing"] > 2


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_in_a_terminal_the_phase_is_a_bar_then_one_line(slow_clock, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    out = Terminal()
    with Phase("setup: thing", show_after=2, stream=out) as phase:
        for done in (1, 2, 3, 4):
            phase.update(done, 4)
    text = out.getvalue()
    assert "setup: thing:" in text and "%|" in text  # tqdm's bar, redrawn in place
    assert text.endswith(f"setup: thing: done in {phase.seconds:.1f} s\n")


def test_a_short_or_quiet_phase_prints_nothing_but_is_timed(slow_clock):
    out, times = io.StringIO(), {}
    with Phase("setup: short", times, "short", show_after=100, stream=out) as phase:
        phase.update(1, 2)
    with Phase("setup: quiet", times, "quiet", show_after=0, stream=out, enabled=False) as ph:
        ph.update(1, 2)
    assert out.getvalue() == "" and set(times) == {"short", "quiet"}


def test_the_synthetic_graph_reports_its_steps_to_the_end():
    calls = []
    synthetic_graph(num_nodes=200, avg_degree=4.0, progress=lambda d, t: calls.append((d, t)))
    assert calls[-1] == (100, 100) and [d for d, _ in calls] == sorted(d for d, _ in calls)
    assert len(calls) >= 4 and {t for _, t in calls} == {100}


def test_prepare_shows_a_slow_dataset_only_when_asked(slow_clock, capsys):
    cfg = resolve(TINY)
    quiet = prepare(cfg)  # the library's default: silent
    assert capsys.readouterr().err == ""
    assert {"dataset", "graph"} <= set(quiet.setup_s)
    loud = prepare(cfg, progress=True)
    err = capsys.readouterr().err
    assert "setup: dataset synthetic: " in err and "%" in err
    done = f"setup: dataset synthetic: done in {loud.setup_s['dataset']:.1f} s"
    assert done in err.splitlines()


def test_compiles_are_counted_and_announced_once_past_the_threshold(slow_clock):
    said = []
    with compiling("CUDA"):  # no watch entered: nothing counted, nothing said
        pass
    with CompileWatch(said.append, show_after=2) as watch:
        with compiling("CUDA"):  # one second
            with compiling("CUDA"):  # nested: counted once, in the outer one
                pass
        watch.flush()
        assert said == [] and watch.seconds["CUDA"] > 0
        with compiling("CUDA"):
            pass
        watch.flush()
    assert said[0] == "compiling CUDA kernels (first run only) ..."
    assert said[1].startswith("compiled kernels: done in ") and len(said) == 2
    assert watch.total == pytest.approx(sum(watch.seconds.values())) and watch.total >= 2
    assert compile_watch._WATCHES == []


def test_a_numba_compile_reaches_the_watch():
    @njit
    def plus_one(x):  # a new function: Numba compiles it on its first call
        return x + 1

    with CompileWatch() as watch:
        assert plus_one(1) == 2
    assert watch.seconds["CPU"] > 0
    before = dict(watch.seconds)
    assert plus_one(2) == 3 and watch.seconds == before  # not counted once exited


def test_importing_the_package_prints_nothing_and_watches_nothing():
    code = (
        "import dgl_rsc, dgl_rsc.launcher.cli, dgl_rsc.backends.compile_watch as w\n"
        "from numba.core import event\n"
        "assert not w._WATCHES and not event._registered['numba:compile']\n"
    )
    res = run_cmd([sys.executable, "-c", code], timeout=300)
    assert res.returncode == 0 and res.stdout == "" and res.stderr == "", res.stderr
