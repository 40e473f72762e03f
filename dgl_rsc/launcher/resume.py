"""Resuming a launcher run: every checkpoint and finished run record is checked before anything
trains (readable, made from the same data by sha256, fitting the model), and the RSC
controller's counters saved with a checkpoint are added back to the resumed run's."""

from __future__ import annotations

import json
import logging
from typing import Optional

from ..core.config import ConfigError
from ..core.controller import RSCController
from .checkpoint import load_checkpoint, set_rng_state

__all__ = ["read_checkpoint", "check_data", "restore", "read_record", "merged_stats", "COUNTERS"]

log = logging.getLogger(__name__)

#: controller counters that add up over a run (summed across a resume)
COUNTERS = ("nnz_visited", "nnz_exact", "select_seconds", "cache_hits", "cache_misses",
            "approx_calls", "exact_calls")  # fmt: skip


def read_checkpoint(path: str, prep, name: str, map_location=None) -> dict:
    """:func:`load_checkpoint` of run ``name``'s checkpoint, made from this data."""
    try:
        state = load_checkpoint(path, map_location=map_location or prep.device)
    except ValueError as exc:
        raise ConfigError(
            f"{exc}. Delete it to train {name} again from epoch 0 (--resume keeps the other "
            "runs), or start a new run with --force or --out."
        ) from None
    extra = state["extra"]
    if not isinstance(extra, dict) or not {"history", "best"} <= set(extra):
        raise ConfigError(f"checkpoint {path} lacks the metrics of {name}; delete it to "
                          "train that run again from epoch 0.")  # fmt: skip
    check_data(extra.get("data_sha256"), prep, f"checkpoint {path}")
    return state


def check_data(saved: Optional[str], prep, what: str) -> None:
    """Refuse what was made from other data than ``prep`` holds (by sha256)."""
    if saved is None:
        log.warning("%s has no dataset hash (an older dgl-rsc wrote it): not checked", what)
    elif saved != prep.fingerprint:
        raise ConfigError(
            f"{what} was made from other data than {prep.source} holds now (sha256 "
            f"{saved[:12]}... then, {prep.fingerprint[:12]}... now): the dataset changed since "
            "the run started. Restore the original data, or start a new run with --out."
        )


def restore(run, state: dict, path: str, name: str) -> tuple:
    """Load a checkpoint into ``run``; returns ``(history, best, rsc_stats)`` saved with it."""
    try:
        run.model.load_state_dict(state["model"])
        run.opt.load_state_dict(state["optimizer"])
        if run.ctl is not None and state["controller"] is not None:
            run.ctl.load_state_dict(state["controller"])
        if run.scaler is not None and state["scaler"] is not None:
            run.scaler.load_state_dict(state["scaler"])
        set_rng_state(state["rng"])
    except (RuntimeError, KeyError, ValueError, TypeError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise ConfigError(
            f"checkpoint {path} does not fit run {name} ({type(exc).__name__}: {first}); "
            "the data or the model changed since it was written. Delete it to train the run "
            "again, or start a new run with --out."
        ) from None
    extra = state["extra"]
    return extra["history"], extra["best"], extra.get("rsc_stats")


def merged_stats(ctl: Optional[RSCController], base: Optional[dict]) -> Optional[dict]:
    """The controller's stats plus ``base``, the counters saved before a resume."""
    if ctl is None:
        return None
    now = json.loads(json.dumps(ctl.stats(), default=float))
    if not base:
        return now
    out = _add_counters(base, now)
    layers = base.get("layers") or []
    out["layers"] = [_add_counters(layers[i] if i < len(layers) else {}, layer)
                     for i, layer in enumerate(now["layers"])]  # fmt: skip
    return out


def _add_counters(base: dict, now: dict) -> dict:
    out = dict(now)
    for key in COUNTERS:
        if key in now and key in base:
            out[key] = base[key] + now[key]
    for key in ("rows", "k"):  # the last product's size: from before the resume if none since
        if key in out and not out[key] and base.get(key) is not None:
            out[key] = base[key]
    exact = out.get("nnz_exact")
    if "visited_fraction" in out:
        out["visited_fraction"] = out["nnz_visited"] / exact if exact else 1.0
    return out


def read_record(path: str, prep, name: str) -> dict:
    """The record of finished run ``name``, checked to be one and made from this data."""
    try:
        with open(path, encoding="utf-8") as f:
            rec = json.load(f)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"the finished run record {path} is damaged ({type(exc).__name__}: "
                          f"{exc}); delete it to train {name} again.") from None  # fmt: skip
    keys = ("method", "seed", "history", "best", "final")
    if not isinstance(rec, dict) or not all(k in rec for k in keys):
        raise ConfigError(f"{path} is not a dgl-rsc run record (it lacks one of "
                          f"{', '.join(keys)}); delete it to train {name} again.")  # fmt: skip
    check_data(rec.get("data_sha256"), prep, f"the finished run {path}")
    return rec
