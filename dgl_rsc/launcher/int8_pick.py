"""``train.int8_pick: speed``: INT8 training in the form that measured fastest on this machine
and this config, fp32 where none beats it; the pick is made once per output directory.

Each INT8 product already runs in INT8 or fp32, whichever measured faster for its shape
(:mod:`dgl_rsc.int8.choose`); what a product's timing cannot see is the work around it:
quantizing operands, the saved activations' codes, the conversions. Whether that pays depends
on the CPU (int8 dot products or not), the torch build and the widths: on an AVX2 EPYC the 200k
preset's INT8 epoch is 1.26x fp32's and quickstart's (64 wide) about 0.7x, where the INT8
sparse products still pay and the saved activations' codes (dequantized for the weight
gradients) do not. So before the runs train, :func:`measure` trains the config's exact method
a few untimed-then-timed epochs in INT8 and in fp32 in turns and keeps INT8 where it is faster;
where it is not, INT8 with the saved activations in fp32 gets the same trial against fp32
(:data:`CANDIDATES`); the runs then train in the pick. The stock baseline is
unaffected (it is fp32).

The pick is written to ``OUT/int8_pick.json`` before the first run; a resumed run reads it
instead of measuring again, so a resumed run trains in the precision the interrupted one did.
``train.int8_pick: always`` trains INT8 as configured whatever it measured (for its memory:
the saved activations' codes, :mod:`dgl_rsc.int8.saved`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import statistics
import time
from typing import Callable, Optional

from .checkpoint import atomic_write_text, claim

__all__ = ["CANDIDATES", "PICKS", "PICK_FILE", "measure", "pick_precision"]

log = logging.getLogger(__name__)

#: ``train.int8_pick``: by measured epoch time, or INT8 always
PICKS = ("speed", "always")
PICK_FILE = "int8_pick.json"
#: what ``speed`` times: name -> the ``train`` settings it changes (``int8``: as configured;
#: ``int8-saved-fp32``: INT8 products, the activations saved for the backward in fp32, timed
#: only where INT8 as configured lost to fp32 and the config saves them in INT8)
CANDIDATES = {
    "fp32": {"precision": "fp32"},
    "int8": {},
    "int8-saved-fp32": {"int8_saved": "fp32"},
}


def _as(cfg, name: str, **train):
    """``cfg`` in candidate ``name`` (and the other ``train`` settings given)."""
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **CANDIDATES[name],
                                                              **train))  # fmt: skip


def measure(cfg, prep, seed: int, train_one: Callable, rounds: int = 2, epochs: int = 3) -> dict:
    """Median epoch seconds of ``cfg``'s exact method per candidate (``epochs`` epochs per
    turn, the first of each untimed; ``rounds`` turns each against fp32, the order reversed
    each round): INT8 as configured first; where it is not faster than fp32, INT8 with the
    saved activations in fp32 next (unless the config saves them so). Returns the pick:
    ``{"chosen", "epoch_s": {candidate: s}, "int8_epoch_s", "fp32_epoch_s", "int8_vs_fp32",
    "rounds", "epochs", "measured_s"}`` (``int8_*``: INT8 as configured). ``train_one`` is
    :func:`dgl_rsc.launcher.train.train_one`."""
    start = time.perf_counter()
    times: dict = {"fp32": []}

    def against_fp32(name):
        times[name] = []
        for r in range(rounds):
            for n in ("fp32", name) if r % 2 == 0 else (name, "fp32"):
                short = _as(cfg, n, epochs=epochs, stop="fixed", checkpoint_every=0)
                rec = train_one(short, prep, "exact", seed, progress=False)
                times[n] += [h["epoch_s"] for h in rec["history"][1:]]
        return statistics.median(times[name]) < statistics.median(times["fp32"])

    chosen = "int8" if against_fp32("int8") else "fp32"
    if chosen == "fp32" and cfg.train.int8_saved != "fp32" and against_fp32("int8-saved-fp32"):
        chosen = "int8-saved-fp32"
    med = {n: statistics.median(t) for n, t in times.items()}
    return {"chosen": chosen, "epoch_s": med, "int8_epoch_s": med["int8"],
            "fp32_epoch_s": med["fp32"], "int8_vs_fp32": med["fp32"] / med["int8"],
            "rounds": rounds, "epochs": epochs,
            "measured_s": time.perf_counter() - start}  # fmt: skip


def _read(path: str) -> dict:
    from ..core.config import ConfigError

    try:
        with open(path) as f:
            pick = json.load(f)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} cannot be read ({exc}); it holds the INT8 pick of the runs "
                          "in this directory: restore it, or start the runs afresh "
                          "(a new --out).") from None  # fmt: skip
    if not isinstance(pick, dict) or pick.get("chosen") not in CANDIDATES:
        raise ConfigError(f"{path} is not an INT8 pick (no 'chosen': "
                          f"{' | '.join(CANDIDATES)}); restore it, or start the runs afresh "
                          "(a new --out).")  # fmt: skip
    return pick


def pick_precision(cfg, prep, out_dir: Optional[str], seed: int, train_one: Callable,
                   write: bool = True) -> tuple:  # fmt: skip
    """``(cfg, pick)``: ``cfg`` as the runs train it (``train.precision`` fp32 where INT8
    measured slower) and the pick's record (``None`` where nothing was picked: fp32 runs, or
    ``int8_pick: always``). Reads ``out_dir/int8_pick.json`` where it exists (a resumed run),
    else measures and, with ``write`` (rank 0), writes it there."""
    t = cfg.train
    if t.precision != "int8" or t.int8_pick != "speed":
        return cfg, None
    path = None if out_dir is None else os.path.join(out_dir, PICK_FILE)
    if path is not None and os.path.exists(path):
        pick = {**_read(path), "read_from": PICK_FILE}
    else:
        pick = measure(cfg, prep, seed, train_one)
        prep.setup_s["int8_pick"] = pick["measured_s"]
        if path is not None and write:
            claim(out_dir, path)
            atomic_write_text(path, json.dumps(pick, indent=1))
    chosen = pick["chosen"]
    if chosen != "int8":
        ms = {n: 1e3 * v for n, v in pick.get("epoch_s", {}).items()}
        ms.setdefault("int8", 1e3 * pick["int8_epoch_s"])
        ms.setdefault("fp32", 1e3 * pick["fp32_epoch_s"])
        log.warning(
            "train.precision=int8: epochs measured %s on this machine, so the runs train in "
            "%s (set train.int8_pick: always to train in INT8 as configured anyway, e.g. for "
            "its memory)", ", ".join(f"{n} {v:.0f} ms" for n, v in ms.items()),
            {"fp32": "fp32", "int8-saved-fp32": "INT8 with the activations saved for the "
             "backward in fp32"}[chosen])  # fmt: skip
        cfg = _as(cfg, chosen)
    return cfg, pick
