"""A distributed checkpoint set left at different epochs by a stop during a save: the previous
checkpoint kept beside each rank's file, and the roll back to the newest common epoch.

The end-to-end cases (a 2-process run interrupted, then resumed) are in
``tests/distributed/test_distributed_slow.py``."""

from __future__ import annotations

import os
import types

import pytest
import torch

from dgl_rsc.launcher.checkpoint import load_checkpoint, save_checkpoint
from dgl_rsc.launcher.ckpt_settle import common_epoch, move_aside, previous_path, settle_set


def _save(path, epoch, keep=True):
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if keep:  # what a distributed run's ranks do before each save
        move_aside(str(path))
    save_checkpoint(str(path), model=model, optimizer=opt, epoch=epoch)


def _epochs(path):
    out = []
    for p in (str(path), previous_path(str(path))):
        out.append(float(load_checkpoint(p)["epoch"]) if os.path.exists(p) else -1.0)
    return out


def test_previous_path_names_a_launcher_checkpoint():
    got = previous_path("/o/checkpoints/rsc-seed0.rank1.pt")
    assert got == "/o/checkpoints/rsc-seed0.rank1.prev.pt"


def test_a_save_keeps_the_last_checkpoint_as_the_previous_one(tmp_path):
    path = tmp_path / "rsc-seed0.rank0.pt"
    _save(path, 2)
    assert not os.path.exists(previous_path(str(path)))
    _save(path, 4)
    _save(path, 6)
    assert _epochs(path) == [6.0, 4.0]
    _save(tmp_path / "one.pt", 2, keep=False)
    _save(tmp_path / "one.pt", 4, keep=False)  # one process: no previous file
    assert not os.path.exists(previous_path(str(tmp_path / "one.pt")))


@pytest.mark.parametrize(
    "rows, want",
    [
        ([[4, 2], [2, -1]], 2),  # rank 1 stopped before its save of epoch 4
        ([[4, 2], [-1, 2]], 2),  # rank 1 stopped between moving aside and writing
        ([[6, 4], [4, 2], [6, 4]], 4),
        ([[4, 2], [8, 6]], None),  # nothing in common: refused later, not guessed
        ([[-1, -1], [-1, -1]], None),
    ],
)
def test_the_common_epoch_is_the_newest_every_rank_holds(rows, want):
    assert common_epoch([[float(e) for e in r] for r in rows]) == want


def _settle(tmp_path, ranks, finished=False):
    """Run :func:`settle_set` for every simulated rank (files ``r{q}.pt``) with a gather
    that hands each rank the rows all ranks see before any of them moves a file."""
    paths = [str(tmp_path / f"r{q}.pt") for q in range(ranks)]
    rows = [[*_epochs(p), float(finished)] for p in paths]
    got = []
    for q, p in enumerate(paths):
        dist = types.SimpleNamespace(rank=q, is_main=q == 0)
        got.append(settle_set("rsc-seed0", p, dist, finished, lambda row, q=q: (
            [row if r == q else rows[r] for r in range(ranks)])))  # fmt: skip
    return paths, got


def test_a_set_stopped_during_a_save_goes_back_to_the_common_epoch(tmp_path, caplog):
    _save(tmp_path / "r0.pt", 2)
    _save(tmp_path / "r0.pt", 4)
    _save(tmp_path / "r1.pt", 2)  # rank 1 never wrote epoch 4
    with caplog.at_level("WARNING"):
        paths, got = _settle(tmp_path, 2)
    assert got == [2, 2]
    assert [load_checkpoint(p)["epoch"] for p in paths] == [2, 2]
    assert "rank 0: 4, rank 1: 2" in caplog.text and "resumes from epoch 2" in caplog.text


def test_a_rank_stopped_between_moving_aside_and_writing_is_recovered(tmp_path):
    for e in (2, 4):
        _save(tmp_path / "r0.pt", e)
        _save(tmp_path / "r1.pt", e)
    _save(tmp_path / "r0.pt", 6)
    os.replace(tmp_path / "r1.pt", previous_path(str(tmp_path / "r1.pt")))
    paths, got = _settle(tmp_path, 2)
    assert got == [4, 4]
    assert [load_checkpoint(p)["epoch"] for p in paths] == [4, 4]


@pytest.mark.parametrize("case", ["agree", "finished", "nothing_common"])
def test_a_set_that_needs_no_repair_or_has_none_is_left_as_it_is(tmp_path, case):
    for e in (2, 4):
        _save(tmp_path / "r0.pt", e)
        _save(tmp_path / "r1.pt", e)
    if case != "agree":
        _save(tmp_path / "r0.pt", 6)
    if case == "nothing_common":
        _save(tmp_path / "r0.pt", 8)
    before = [_epochs(tmp_path / f"r{q}.pt") for q in range(2)]
    _, got = _settle(tmp_path, 2, finished=case == "finished")
    assert got == [None, None]
    assert [_epochs(tmp_path / f"r{q}.pt") for q in range(2)] == before
