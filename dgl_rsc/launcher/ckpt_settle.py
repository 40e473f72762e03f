"""A distributed checkpoint set that an interruption left at different epochs, and its repair.

Each rank of a distributed run writes its own checkpoint. A stop that reaches the ranks at
different moments (Ctrl-C in a terminal sends SIGINT to every rank at once, but one rank may
be inside its save while another is still training) can leave rank 0's file at epoch ``E``
and rank 1's at the epoch before. Such a set cannot be resumed as it is: the ranks would
continue from different states.

A distributed run therefore keeps each rank's previous checkpoint beside the current one
(``<name>.rank<r>.prev.pt``, moved aside just before the new one is written). On resume,
:func:`settle_set` gathers every rank's current and previous epochs; when the current ones
differ, every rank goes back to the newest epoch that all ranks hold (the previous file
becomes the current one where that is the older of the two), and the run continues from a
consistent set. Nothing but the launcher's own checkpoint files is moved; a set without a
common epoch is left as it is, for :func:`~dgl_rsc.launcher.runid.verify_set` to refuse.
"""

from __future__ import annotations

import logging
import os
from typing import Optional

from .checkpoint import load_checkpoint

__all__ = ["previous_path", "move_aside", "settle_set"]

log = logging.getLogger(__name__)

_NONE = -1.0  # no file (or an unreadable one) in a gathered row


def previous_path(path: str) -> str:
    """The previous checkpoint kept beside ``path`` (``x.rank1.pt`` -> ``x.rank1.prev.pt``)."""
    stem = path[:-3] if path.endswith(".pt") else path
    return f"{stem}.prev.pt"


def move_aside(path: str) -> None:
    """Keep the checkpoint at ``path`` (if any) as its previous one, replacing the older."""
    if os.path.isfile(path):
        os.replace(path, previous_path(path))


def _epoch(path: str) -> float:
    """The epoch the checkpoint at ``path`` was saved after; ``-1`` when it is missing or
    cannot be read (an unreadable current file is reported by the resume's own checks)."""
    if not os.path.isfile(path):
        return _NONE
    try:
        return float(load_checkpoint(path)["epoch"])
    except ValueError:
        return _NONE


def common_epoch(rows: list) -> Optional[int]:
    """The newest epoch that every rank holds, current or previous, from rows ``[current,
    previous]`` (``-1``: none); ``None`` when there is none."""
    held = [{e for e in row if e != _NONE} for row in rows]
    shared = set.intersection(*held) if held else set()
    return int(max(shared)) if shared else None


def settle_set(name: str, path: str, dist, finished: bool, gather) -> Optional[int]:
    """Bring run ``name``'s checkpoint set to one epoch when an interrupted save left it at
    several (a collective: every rank calls it for every run of the plan, ``finished`` when
    this rank sees the run's record, then nothing changes).

    ``path`` is this rank's checkpoint; ``gather(row)`` returns every rank's row of floats
    in rank order. Returns the epoch the set was brought back to, or ``None`` when nothing
    changed (the set agreed already, or has no epoch in common: the resume's checks then say
    what is wrong).
    """
    prev = previous_path(path)
    rows = gather([_epoch(path), _epoch(prev), float(finished)])
    if any(r[2] for r in rows) or len({r[0] for r in rows}) == 1:
        return None
    target = common_epoch([r[:2] for r in rows])
    if target is None:
        return None
    mine = rows[dist.rank]
    if mine[0] != target:  # the previous file holds the target epoch
        os.replace(prev, path)
    if dist.is_main:
        per = ", ".join(
            f"rank {q}: {int(r[0])}" if r[0] != _NONE else f"rank {q}: none"
            for q, r in enumerate(rows)
        )
        log.warning(
            "the checkpoints of %s were saved at different epochs (%s), as a stop during a "
            "save leaves them; every rank resumes from epoch %d, the newest that all ranks hold.",
            name, per, target,
        )  # fmt: skip
    return target
