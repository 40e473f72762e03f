"""Checkpoints as a set: the run id and the checks a resume makes before anything trains.

A run writes ``run.json`` (``{"run_id": 16 hex digits}``) into its output directory when it
starts; a resume keeps it. Every checkpoint carries its identity in ``extra``: the run id,
the rank that wrote it and the world size (``None`` on one process), and the resolved config
(flattened, as JSON). Before training, a resume checks for every unfinished run:

- on every rank: the checkpoint exists on all ranks or on none (a partial set would let one
  rank restart from epoch 0 while the others continue);
- each file was written by this rank of a run on as many processes, all at the same epoch
  (a set that a stop during a save left at several epochs is first brought back to the
  newest common one: :mod:`dgl_rsc.launcher.ckpt_settle`), all by one run;
- that run is this one (its id), under the same config (``train.lr`` included).

The last two may be overridden with ``--resume-anyway`` (logged); a broken set may not. All
ranks see the same gathered facts, so they refuse together with the same message.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from typing import Optional

import torch

from ..core.config import ConfigError
from .checkpoint import atomic_write_text, claim
from .outputs import changes_results

__all__ = [
    "RUN_FILE",
    "start_run_id",
    "read_run_id",
    "identity",
    "flatten",
    "verify_set",
    "gather_ranks",
]

log = logging.getLogger(__name__)

RUN_FILE = "run.json"


def start_run_id(out: str, resume: bool) -> str:
    """A new run id written to ``out/run.json`` (kept as it is on resume, written when an
    older dgl-rsc left none)."""
    if resume:
        old = read_run_id(out)
        if old is not None:
            return old
    run_id = secrets.token_hex(8)
    path = os.path.join(out, RUN_FILE)
    claim(out, path)
    atomic_write_text(path, json.dumps({"tool": "dgl-rsc", "run_id": run_id}))
    return run_id


def read_run_id(out: str) -> Optional[str]:
    """The id in ``out/run.json``; ``None`` when there is none (or it is not ours)."""
    try:
        with open(os.path.join(out, RUN_FILE), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    rid = data.get("run_id") if isinstance(data, dict) else None
    return rid if isinstance(rid, str) else None


def flatten(d, prefix: str = "") -> dict:
    """``{"train.lr": 0.01, ...}`` of a nested dict (lists compared as lists)."""
    if not isinstance(d, dict):
        return {prefix: d}
    out = {}
    for key, value in d.items():
        sub = f"{prefix}{key}." if isinstance(value, dict) else f"{prefix}{key}"
        out.update(flatten(value, sub))
    return out


def identity(cfg, run_id: Optional[str], dist) -> dict:
    """What a checkpoint records of who wrote it (stored in its ``extra``)."""
    return {
        "run_id": run_id or "",
        "rank": -1 if dist is None else int(dist.rank),
        "world_size": 1 if dist is None else int(dist.world_size),
        "config": json.dumps(flatten(cfg.to_dict()), sort_keys=True, default=str),
    }


def _id_number(run_id) -> float:
    """A run id as a float64-exact number (48 bits of it), 0 for none."""
    if not isinstance(run_id, str) or not run_id:
        return 0.0
    try:
        return float(int(run_id[:12], 16) + 1)
    except ValueError:
        return -1.0


def verify_set(cfg, name: str, path: str, state: Optional[dict], run_id: Optional[str],
               dist, resume_anyway: bool = False, finished: bool = False) -> None:  # fmt: skip
    """Check the checkpoint set of run ``name`` (see the module docstring); ``path`` is this
    rank's checkpoint and ``state`` its content (``None`` when it does not exist). Called on
    every rank for every run of the plan (a collective), ``finished`` when this rank sees
    the run's record: then nothing is checked.

    Raises:
        ConfigError: what is wrong and what to do (the same on every rank).
    """
    extra = state["extra"] if state is not None else {}
    has_id = state is not None and "run_id" in extra
    row = [
        float(state is not None),
        float(state["epoch"]) if state is not None else -1.0,
        float(extra.get("rank", -2)) if has_id else -2.0,
        float(extra.get("world_size", 0)) if has_id else 0.0,
        _id_number(extra.get("run_id")) if has_id else 0.0,
        float(finished),
    ]
    rows = gather_ranks(row, dist)
    if any(r[5] for r in rows):
        return
    world = 1 if dist is None else dist.world_size
    exists = [int(r[0]) for r in rows]
    if not any(exists):
        return
    where = os.path.dirname(path)
    pattern = os.path.join(where, f"{name}.rank*.pt" if dist is not None else f"{name}.pt")
    fresh = (f"Delete {pattern} to train {name} again from epoch 0 (--resume keeps the other "
             "runs), or start a new run with --force or --out.")  # fmt: skip
    if not all(exists):
        missing = [q for q, e in enumerate(exists) if not e]
        have = [q for q, e in enumerate(exists) if e]
        raise ConfigError(
            f"the checkpoints of {name} are not a complete set: rank(s) {missing} have none "
            f"while rank(s) {have} have one (epoch {int(rows[have[0]][1])}); the ranks "
            f"would resume from different states. Restore the missing file(s), or: {fresh}"
        )
    legacy = [q for q, r in enumerate(rows) if r[2] == -2.0]
    if legacy and (dist is not None) and not resume_anyway:
        raise ConfigError(
            f"the checkpoints of {name} of rank(s) {legacy} carry no run identity (written by "
            "an older dgl-rsc), so they cannot be checked as a set; pass --resume-anyway to "
            f"use them as they are, or: {fresh}"
        )
    for q, r in enumerate(rows):
        if r[2] == -2.0:
            continue
        owner, size = int(r[2]), int(r[3])
        if owner != (q if dist is not None else -1) or size != world:
            wrote = "one process" if owner == -1 else f"rank {owner} of {size} processes"
            this = "one process" if dist is None else f"rank {q} of {world} processes"
            raise ConfigError(
                f"the checkpoint of {name} for {this} was written by {wrote}: the files were "
                f"swapped, copied or come from another partitioning. {fresh}"
            )
    epochs = sorted({int(r[1]) for r in rows})
    if len(epochs) > 1:
        per = ", ".join(f"rank {q}: {int(r[1])}" for q, r in enumerate(rows))
        raise ConfigError(
            f"the checkpoints of {name} are from different epochs ({per}), and no epoch is "
            f"held by every rank's current or previous (.prev.pt) checkpoint to go back to: "
            f"a set must be saved at one epoch. {fresh}"
        )
    ids = {r[4] for r in rows if r[2] != -2.0}
    if len(ids) > 1:
        raise ConfigError(f"the checkpoints of {name} come from different runs. {fresh}")
    if ids and ids != {_id_number(run_id)} and run_id is not None:
        other = (f"the checkpoints of {name} were written by another run than the one this "
                 f"output directory holds (its run.json; copied?). {fresh}")  # fmt: skip
        _overridable(resume_anyway, other)
    if has_id:
        _check_config(cfg, name, path, extra.get("config"), resume_anyway, fresh)


def _check_config(cfg, name, path, saved, resume_anyway, fresh) -> None:
    try:
        before = json.loads(saved) if isinstance(saved, str) else None
    except ValueError:
        before = None
    if not isinstance(before, dict):
        return
    now = json.loads(json.dumps(flatten(cfg.to_dict()), sort_keys=True, default=str))
    diff = [
        k
        for k in sorted(set(before) | set(now))
        if before.get(k) != now.get(k) and changes_results(k)
    ]
    if diff:
        shown = "; ".join(f"{k}: {before.get(k)!r} then, {now.get(k)!r} now" for k in diff[:6])
        _overridable(resume_anyway, f"checkpoint {path} was written under another config "
                     f"({shown}); resuming would mix the two. Resume with the config it was "
                     f"written under, pass --resume-anyway to continue under this one, or: "
                     f"{fresh}")  # fmt: skip


def _overridable(resume_anyway: bool, message: str) -> None:
    if not resume_anyway:
        raise ConfigError(message)
    log.warning("--resume-anyway: %s", message)


def gather_ranks(row: list, dist) -> list:
    """Every rank's ``row`` (a list of floats), in rank order."""
    t = torch.tensor([row], dtype=torch.float64)
    if dist is None:
        return t.tolist()
    from ..distributed.controller import gather_rows

    rows, _ = gather_rows(t.to(dist.device), dist)
    return rows.cpu().tolist()
