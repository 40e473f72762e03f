"""``train.int8_pick: speed``: INT8 training where it measured faster than fp32 on this
machine and this config, fp32 otherwise; the pick is made once per output directory.

Each INT8 product already runs in INT8 or fp32, whichever measured faster for its shape
(:mod:`dgl_rsc.int8.choose`); what a product's timing cannot see is the work around it:
quantizing operands, the saved activations' codes, the conversions. Whether that pays depends
on the CPU (int8 dot products or not), the torch build and the widths: on an AVX2 EPYC the 200k
preset's INT8 epoch is 1.26x fp32's and quickstart's (64 wide) about 0.7x. So before the runs
train, :func:`measure` trains the config's exact method a few untimed-then-timed epochs in each
precision, in turns (``rounds`` rounds, the order reversed each round), and keeps the faster;
the runs then train in it. The stock baseline is unaffected (it is fp32).

The pick is written to ``OUT/int8_pick.json`` before the first run; a resumed run reads it
instead of measuring again, so a resumed run trains in the precision the interrupted one did.
``train.int8_pick: always`` trains INT8 whatever it measured (for its memory: the saved
activations' codes, :mod:`dgl_rsc.int8.saved`).
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

__all__ = ["PICKS", "PICK_FILE", "measure", "pick_precision"]

log = logging.getLogger(__name__)

#: ``train.int8_pick``: by measured epoch time, or INT8 always
PICKS = ("speed", "always")
PICK_FILE = "int8_pick.json"


def _short(cfg, precision: str, epochs: int):
    """``cfg`` trained ``epochs`` epochs in ``precision``, fixed length, no checkpoints."""
    train = dataclasses.replace(cfg.train, precision=precision, epochs=epochs, stop="fixed",
                                checkpoint_every=0)  # fmt: skip
    return dataclasses.replace(cfg, train=train)


def measure(cfg, prep, seed: int, train_one: Callable, rounds: int = 2, epochs: int = 3) -> dict:
    """Median epoch seconds of ``cfg``'s exact method in INT8 and in fp32 (``epochs`` epochs
    per turn, the first of each untimed; ``rounds`` turns each, alternating), and the pick:
    ``{"chosen", "int8_epoch_s", "fp32_epoch_s", "int8_vs_fp32", "rounds", "epochs",
    "measured_s"}``. ``train_one`` is :func:`dgl_rsc.launcher.train.train_one`."""
    start = time.perf_counter()
    times: dict = {"int8": [], "fp32": []}
    for r in range(rounds):
        for precision in ("fp32", "int8") if r % 2 == 0 else ("int8", "fp32"):
            rec = train_one(_short(cfg, precision, epochs), prep, "exact", seed, progress=False)
            times[precision] += [h["epoch_s"] for h in rec["history"][1:]]
    int8_s, fp32_s = statistics.median(times["int8"]), statistics.median(times["fp32"])
    return {"chosen": "int8" if int8_s < fp32_s else "fp32", "int8_epoch_s": int8_s,
            "fp32_epoch_s": fp32_s, "int8_vs_fp32": fp32_s / int8_s, "rounds": rounds,
            "epochs": epochs, "measured_s": time.perf_counter() - start}  # fmt: skip


def _read(path: str) -> dict:
    from ..core.config import ConfigError

    try:
        with open(path) as f:
            pick = json.load(f)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} cannot be read ({exc}); it holds the INT8 pick of the runs "
                          "in this directory: restore it, or start the runs afresh "
                          "(a new --out).") from None  # fmt: skip
    if not isinstance(pick, dict) or pick.get("chosen") not in ("int8", "fp32"):
        raise ConfigError(f"{path} is not an INT8 pick (no 'chosen': int8 | fp32); restore "
                          "it, or start the runs afresh (a new --out).")  # fmt: skip
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
    if pick["chosen"] == "fp32":
        log.warning(
            "train.precision=int8: an INT8 epoch measured %.0f ms against fp32's %.0f ms on "
            "this machine, so the runs train in fp32 (set train.int8_pick: always to train in "
            "INT8 anyway, e.g. for its memory)", 1e3 * pick["int8_epoch_s"],
            1e3 * pick["fp32_epoch_s"])  # fmt: skip
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(t, precision="fp32"))
    return cfg, pick
