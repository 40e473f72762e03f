"""Time to accuracy of the launcher's methods trained side by side, one epoch each in turn.

``dgl-rsc run`` with ``compare: true`` trains stock, exact and RSC one after the other; on a
machine whose speed drifts (on the 2-core VM the same tolokers epoch took 520 ms at the start
of a run and 740 ms at its end), whole runs one after the other compare machine states.
Here the methods of a seed take turns one epoch at a time, the order rotating each round, so
every round sees about the same load. Each method keeps its own random-number state (torch,
NumPy, Python), restored around its epochs: it trains as it would in the launcher (the same
losses and evaluations, bit for bit), only its clock is shared. Evaluation is not timed.

Each run stops as the launcher stops it (``train.stop: plateau`` with ``--set
train.stop=plateau``: early stopping on the validation metric, ``train.epochs`` the cap; the
report says per run whether it converged). Writes the launcher's report to ``--out``
(``results.json``, ``table.txt``, ``metrics.csv``, ``summary.png``; the same summary and
time-to-target definition), which
``tools/render_benchmarks.py collect`` keeps for the benchmarks page. Full-graph runs on one
process (no patched engine, mini-batch or distributed config); every method lives in memory
at once.

    python tools/experiments/interleaved_tta.py yaml_configs/tolokers_gcn.yaml --seeds 0 1 2 \\
        --out runs/tolokers_interleaved
    python tools/experiments/interleaved_tta.py yaml_configs/quickstart.yaml \\
        --set train.stop=plateau --variant switch10:switch_patience=10 --out runs/qs_variants

``--variant NAME:key=value,...`` adds an RSC run under other ``rsc`` settings, trained in turn
with the others and reported as method ``NAME``; ``train.precision`` and the ``train.int8_*``
keys may change too (``--variant int8-rsc:train.precision=int8``: INT8 + RSC, forced, against
fp32 exact).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_common import parse_variant

from dgl_rsc.launcher.checkpoint import atomic_write_text, rng_state, set_rng_state
from dgl_rsc.launcher.epochs import EpochLog
from dgl_rsc.launcher.prepare import TrainingDiverged
from dgl_rsc.launcher.report import environment, format_table, write_report
from dgl_rsc.launcher.train import _seed_all, _setup, methods, prepare, warm_up
from dgl_rsc.launcher.yaml_io import dump_yaml, load_config
from dgl_rsc.models.engines import get_engine


class Run:
    """One (method, seed) run stepped an epoch at a time, recorded as ``train_one`` records
    it (the launcher's :class:`~dgl_rsc.launcher.epochs.EpochLog`), with its own RNG state."""

    def __init__(self, cfg, prep, method: str, seed: int, name=None):
        _seed_all(seed)
        self.log = EpochLog(cfg, prep, _setup(cfg, prep, method, seed), method, seed)
        self.rng = rng_state()
        self.name = name or method  # the method the record names (a variant's name)

    def epoch(self, epoch: int) -> None:
        """Train epoch ``epoch`` (1-based) and evaluate it when the config says so."""
        set_rng_state(self.rng)
        try:
            self.log.train(epoch)
        except TrainingDiverged as e:
            raise SystemExit(str(e)) from None
        self.rng = rng_state()

    def record(self) -> dict:
        """The launcher's run record; no peak memory (one process holds every method)."""
        return {**self.log.record(None, None), "method": self.name}


def check(cfg) -> None:
    """Refuse what the tool does not step epoch by epoch, before the data loads."""
    if get_engine(cfg.train.engine).patched:
        raise SystemExit(f"train.engine={cfg.train.engine!r} trains inside a patch, which is "
                         "one context per run; use dgl-rsc run for it.")  # fmt: skip
    if cfg.train.mode != "full" or cfg.distributed is not None:
        raise SystemExit("interleaved_tta.py trains full-graph runs on one process; use "
                         "dgl-rsc run for mini-batch or distributed configs.")  # fmt: skip
    if not cfg.compare:
        raise SystemExit("the config trains one method; set compare: true to compare them.")


def interleave(cfg, prep, seed: int, variants=()) -> list:
    """The records of ``seed``'s runs, trained in turns; the order rotates each epoch. Each
    run stops by the config's rule (``train.stop``: at ``train.epochs``, or on its validation
    plateau, the same rule for every method); the others go on taking turns. ``variants``:
    ``(name, config)`` pairs, RSC runs under other ``rsc`` settings that take turns too,
    recorded as method ``name``."""
    runs = [Run(cfg, prep, m, seed) for m in methods(cfg)]
    runs += [Run(vcfg, prep, "rsc", seed, name) for name, vcfg in variants]
    for epoch in range(1, cfg.train.epochs + 1):
        live = [run for run in runs if not run.log.done]
        if not live:
            break
        k = epoch % len(live)
        for run in live[k:] + live[:k]:
            run.epoch(epoch)
    return [run.record() for run in runs]


#: settings outside ``rsc`` a variant may change: applied per run when its model is set up
#: (``launcher.train._setup``), so the runs share one prepared dataset
RUN_KEYS = ("precision", "int8_rounding", "int8_dense", "int8_sparse", "int8_saved")


def _shared(cfg) -> dict:
    """``cfg`` as a dict without what a variant may change (``rsc``, :data:`RUN_KEYS` and
    ``train.int8_pick``): equal for a variant and its base config."""
    d = cfg.to_dict()
    train = {k: v for k, v in d["train"].items() if k not in (*RUN_KEYS, "int8_pick")}
    return {**d, "rsc": None, "train": train}


def rsc_variants(config: str, sets: list, texts: list, cfg) -> list:
    """``(name, config)`` of each ``--variant NAME:key=value,...`` (keys without a section
    are ``rsc`` keys); a variant may change the ``rsc`` section and the per-run training
    settings of :data:`RUN_KEYS` (``train.precision=int8``: INT8 + RSC)."""
    out = []
    for text in texts:
        name, changes = parse_variant(text)
        if name in ("stock", "exact", "rsc") or name in dict(out) or not name:
            raise SystemExit(f"--variant {text!r}: name it other than stock, exact, rsc and "
                             "the other variants.")  # fmt: skip
        if any(k.startswith("train.") for k in changes):  # INT8 picked, not measured
            changes.setdefault("train.int8_pick", "always")
        vcfg = load_config(config, [*sets, *(f"{k}={json.dumps(v)}" for k, v in changes.items())])
        if _shared(vcfg) != _shared(cfg) or vcfg.rsc is None:
            raise SystemExit(f"--variant {text!r} changes more than the rsc section and "
                             f"train.{{{','.join(RUN_KEYS)}}}; give those keys only.")  # fmt: skip
        out.append((name, vcfg))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("--seeds", type=int, nargs="+", help="default: the config's train.seeds")
    p.add_argument("--set", dest="sets", action="append", default=[], help="KEY.SUB=VALUE")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME:key=value,... an RSC run under these rsc.* (and train.precision, "
        "train.int8_*) settings, in turn too",
    )
    p.add_argument("--out", required=True, help="a new or empty directory")
    args = p.parse_args(argv)
    sets = [*args.sets, "train.checkpoint_every=0"]
    if args.seeds:
        sets.append(f"train.seeds={args.seeds}")
    cfg = load_config(args.config, sets)
    check(cfg)
    variants = rsc_variants(args.config, sets, args.variant, cfg)
    if os.path.isdir(args.out) and os.listdir(args.out):
        raise SystemExit(f"--out {args.out} is not empty; name a new directory.")
    os.makedirs(args.out, exist_ok=True)
    atomic_write_text(os.path.join(args.out, "config.yaml"), dump_yaml(cfg))
    start = time.perf_counter()
    prep = prepare(cfg)
    warm_up(cfg, prep, [(s, m) for s in cfg.train.seeds for m in methods(cfg)])
    records = []
    for seed in cfg.train.seeds:
        records += interleave(cfg, prep, seed, variants)
        print(f"seed {seed} done, {time.perf_counter() - start:.0f} s", flush=True)
    env = environment(prep.device)
    env["setup_s"] = dict(prep.setup_s)
    env["interleaved"] = True  # the methods took turns epoch by epoch (this tool)
    summary = write_report(args.out, cfg.to_dict(), records, env, prep.data.metric)
    print(format_table(summary, prep.data.metric))
    return 0


if __name__ == "__main__":
    sys.exit(main())
