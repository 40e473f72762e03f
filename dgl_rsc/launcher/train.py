"""Full-batch training runs: the data once, then one run per (seed, method).

Engines (``train.engine``, :mod:`dgl_rsc.models.engines`): ``native`` runs :mod:`dgl_rsc.nn` layers
on a DGL-free :class:`~dgl_rsc.Graph`; ``dgl`` runs the same layers on a ``DGLGraph``;
``patch`` runs the stock ``dgl.nn`` model inside :func:`dgl_rsc.patch`. Methods: ``rsc``;
``exact``, the same engine driven by a controller switched to the exact backward from step 0
(the same layers, kernels and bookkeeping, so a comparison measures RSC, not two engines); and
with ``compare`` where DGL imports, ``stock``: the stock ``dgl.nn`` model without dgl_rsc,
what DGL users run.

Epoch timing (synchronized on CUDA) separates forward (with the loss), backward (which
contains RSC's row selection, reported apart as ``select_s``) and the optimizer step;
evaluation runs every ``eval_every`` epochs under ``torch.no_grad`` and is not timed as
training. Each epoch's record holds ``train_time_s``, the training seconds so far (the sum of
``epoch_s``), from which :mod:`.tta` reads the time to accuracy. The reported test metric is
the one at the epoch of best validation metric.

A run stops with :class:`TrainingDiverged` at the first epoch whose training loss is NaN or
infinite, before that epoch's optimizer step (checkpoints and finished runs stay). Before
anything trains, a resumed experiment checks every finished run record and checkpoint in its
directory: readable, made from the same data (:meth:`GraphData.fingerprint`, a sha256 of the
loaded tensors, is stored with both) and fitting the model. ``on_epoch_end(run, epoch)``
(``run`` like ``"rsc-seed0"``) is called after each epoch and its checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import random
import sys
from typing import Callable, Optional

import numpy as np
import torch
from tqdm import tqdm

from ..backends.compile_watch import CompileWatch
from ..base import _deps
from ..base.memory import peak_rss_bytes
from ..base.progress import Phase
from ..core.config import RSCConfig
from ..core.controller import RSCController
from ..dgl.nn import attach
from ..dgl.patch import patch
from ..int8 import quantize_model
from ..models.engines import get_engine
from ..models.paper import build_model
from .checkpoint import atomic_write_text, claim, save_checkpoint
from .ckpt_settle import move_aside, previous_path, settle_set
from .compiled import compiled_forward
from .dist_run import start_run
from .epochs import EpochLog, rewarm
from .epochs import counters as _counters  # noqa: F401 (tools and tests import these names)
from .epochs import evaluate as _evaluate  # noqa: F401
from .epochs import train_step as _train_step  # noqa: F401
from .int8_pick import pick_precision
from .prepare import (
    Prepared,
    TrainingDiverged,
    check_backend,
    methods,
    prepare,
    resolve_device,
)
from .report import strict_json
from .resume import merged_stats, read_checkpoint, read_record, restore
from .run_state import RunState
from .runid import gather_ranks, read_run_id, verify_set
from .runid import identity as run_identity
from .schema import RunConfig

__all__ = [
    "Prepared",
    "TrainingDiverged",
    "check_backend",
    "methods",
    "prepare",
    "resolve_device",
    "run_experiment",
    "train_one",
]

log = logging.getLogger(__name__)
EpochCallback = Callable[[str, int], None]


def _pyg_patch(ctl, **kwargs):
    from ..pyg import patch as pyg_patch

    return pyg_patch(ctl, **kwargs)


#: the patch of each engine family (``train.engine: patch`` / ``pyg_patch``)
_PATCHES = {"dgl": patch, "pyg": _pyg_patch}


def _optimizer(cfg: RunConfig, params):
    t = cfg.train
    if t.optimizer == "sgd":
        return torch.optim.SGD(params, lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
    cls = torch.optim.AdamW if t.optimizer == "adamw" else torch.optim.Adam
    return cls(params, lr=t.lr, weight_decay=t.weight_decay)


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 (the global RNG that other code draws from)
    torch.manual_seed(seed)


def _setup(cfg: RunConfig, prep: Prepared, method: str, seed: int = 0) -> RunState:
    """Model, optimizer, controller, patch context and AMP of one run (seeded before).

    ``rsc`` and ``exact`` run on ``train.engine`` with a controller (the exact one switched to
    the exact backward from step 0); ``stock`` on the stock engine without one."""
    t = cfg.train
    engine = get_engine(get_engine(t.engine).baseline if method == "stock" else t.engine)
    params = {k: v for k, v in cfg.model.items() if k != "name"}
    in_feats, classes = prep.feat.shape[1], int(prep.data.num_classes)
    model = build_model(cfg.model["name"], in_feats, classes, engine=engine.name, **params)
    model = model.to(prep.device)
    if hasattr(model, "fused_epilogue"):  # GCN/SAGE: one-pass epilogue (models.fused)
        model.fused_epilogue = t.fused_epilogue
    ctl, ctx = None, contextlib.nullcontext()
    if engine.approximates:
        rsc_cfg = cfg.rsc if method == "rsc" else RSCConfig(switch_at=0.0, total_steps=t.epochs)
        if prep.dist is not None:
            from ..distributed.controller import DistributedRSCController
            from ..distributed.dropout import localize_dropout

            ctl = attach(model, DistributedRSCController(prep.dist, rsc_cfg))
            localize_dropout(model, prep.owned, prep.data.num_nodes, cfg.distributed.dropout)
        elif engine.patched:
            ctl = RSCController(rsc_cfg)
            ctx = _PATCHES[engine.family](ctl, keep_freed_memory=t.keep_freed_memory)
        else:
            ctl = attach(model, rsc_cfg)
    if t.precision == "int8" and method != "stock":  # the stock baseline stays stock (fp32)
        quantize_model(model, t.int8_rounding, seed=seed, dense=t.int8_dense,
                       sparse=t.int8_sparse, saved=t.int8_saved)  # fmt: skip
    amp = t.amp if prep.device.type == "cuda" else "none"
    if t.amp != amp:
        log.warning("train.amp=%s ignored: AMP runs on CUDA only", t.amp)
    scaler = None
    if amp == "fp16":  # torch.cuda.amp.GradScaler is deprecated from torch 2.3 on
        new_api = _deps.TORCH_VERSION >= (2, 3)
        scaler = torch.amp.GradScaler("cuda") if new_api else torch.cuda.amp.GradScaler()
    graph = prep.graph(engine.graph)
    batches = None
    if t.mode != "full":
        from .minibatch_run import BatchSource

        keep = cfg.rsc.subgraph_cache if cfg.rsc is not None else 64
        batches = BatchSource(cfg, prep, seed, keep=max(keep, 1), graph_kind=engine.graph)
    forward = compiled_forward(model) if t.compile and method != "stock" else None
    return RunState(model, graph, _optimizer(cfg, model.parameters()), ctl, ctx, amp, scaler,
                    batches, forward)  # fmt: skip


def train_one(
    cfg: RunConfig,
    prep: Prepared,
    method: str,
    seed: int,
    ckpt_path: Optional[str] = None,
    progress: bool = True,
    on_epoch_end: Optional[EpochCallback] = None,
    identity: Optional[dict] = None,
) -> dict:
    """Train one run; resume from ``ckpt_path`` when it exists. Returns the run's record.

    ``on_epoch_end(run, epoch)`` is called after each epoch (and its checkpoint), ``run``
    being ``f"{method}-seed{seed}"``.

    Raises:
        TrainingDiverged: the training loss became NaN or infinite.
        ConfigError: the checkpoint is unreadable, of other data or does not fit the model.
    """
    t, name = cfg.train, f"{method}-seed{seed}"
    _seed_all(seed)
    run = _setup(cfg, prep, method, seed)
    history, best, stop = None, None, None
    base = None  # the controller's counters before a resume
    if ckpt_path and os.path.exists(ckpt_path):
        state = read_checkpoint(ckpt_path, prep, name)
        history, best, base = restore(run, state, ckpt_path, name)
        stop = state["extra"].get("epoch_log")  # the stop rule's state (None: older files)
        log.info("%s: resumed after epoch %d", name, len(history))
    quiet = not progress or not sys.stderr.isatty() or bool(os.environ.get("CI"))
    bar = tqdm(total=t.epochs, initial=len(history or ()), desc=f"{method} seed {seed}",
               disable=quiet, dynamic_ncols=True)  # fmt: skip
    start_run(prep)
    runlog = EpochLog(cfg, prep, run, method, seed, history, best, stop)
    with run.ctx, contextlib.closing(bar):
        if history:  # what the run computed once and kept in memory, computed again
            rewarm(run, prep)
        for epoch in range(len(runlog.history) + 1, t.epochs + 1):
            if runlog.done:  # train.stop: plateau (checked first: a resumed run may be done)
                break
            rec = runlog.train(epoch)
            bar.set_postfix(loss=f"{rec['loss']:.4f}", val=_fmt(rec["val"]),
                            ep_s=f"{rec['epoch_s']:.3f}", refresh=False)  # fmt: skip
            bar.update(1)
            if ckpt_path and t.checkpoint_every and epoch % t.checkpoint_every == 0:
                extra = {"history": runlog.history, "best": runlog.best,
                         "epoch_log": runlog.state_dict(), "data_sha256": prep.fingerprint,
                         "rsc_stats": merged_stats(run.ctl, base), **(identity or {})}  # fmt: skip
                if prep.dist is not None:  # kept for a set that a stop splits (ckpt_settle)
                    move_aside(ckpt_path)
                save_checkpoint(ckpt_path, model=run.model, optimizer=run.opt, controller=run.ctl,
                                scaler=run.scaler, epoch=epoch, extra=extra)  # fmt: skip
            if on_epoch_end is not None:
                on_epoch_end(name, epoch)
    return runlog.record(base, peak_rss_bytes() / 2**20)


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.4f}"


def warm_up(cfg: RunConfig, prep: Prepared, todo: list) -> None:
    """Train each method of ``todo`` (``(seed, method)`` pairs still to run) for
    ``train.warmup_epochs`` untimed epochs, writing nothing, when there are two methods or
    more: the first run of a process pays one-off costs (DGL's first call, about 0.7 s on the
    2-core machine; Numba's start, about 0.3 s) that the others do not, which would tilt their
    comparison. Every rank of a distributed run warms up alike. A setup phase
    (``prep.setup_s["warm_up"]``, shown on stderr past a few seconds)."""
    names = list(dict.fromkeys(m for _, m in todo))
    n = min(cfg.train.warmup_epochs, cfg.train.epochs)
    if n <= 0 or len(names) < 2:
        return
    short = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, epochs=n))
    if cfg.train.mode != "full":  # the seed's loader (GraphSAINT's weights) is a phase apart
        from .minibatch_run import BatchSource

        BatchSource(cfg, prep, todo[0][0])
    done = itertools.count(1)
    desc = f"setup: warm-up, {n} untimed epoch(s) per method"
    with Phase(desc, prep.setup_s, "warm_up", enabled=prep.progress) as phase:
        tick = lambda *_: phase.update(next(done), n * len(names))  # noqa: E731
        for method in names:
            train_one(short, prep, method, todo[0][0], progress=False, on_epoch_end=tick)


def run_experiment(
    cfg: RunConfig,
    prep: Prepared,
    out_dir: str,
    progress: bool = True,
    on_epoch_end: Optional[EpochCallback] = None,
    resume_anyway: bool = False,
) -> list:
    """Every (seed, method) run, interleaved by seed; finished runs are read back from
    ``out_dir/runs/`` and unfinished ones resume from ``out_dir/checkpoints/``. All of
    those files are checked before the first epoch trains. Each file is listed in the
    directory's manifest before it is written; records are strict JSON. The seconds spent
    compiling kernels meanwhile (Numba, CuPy: a machine's first run) go to
    ``prep.setup_s["kernel_compile"]``; with ``progress`` they are announced on stderr once
    they pass a second."""
    plan = [(seed, method) for seed in cfg.train.seeds for method in methods(cfg)]
    dist = prep.dist
    main = dist is None or dist.is_main
    rank = "" if dist is None else f".rank{dist.rank}"
    paths = {
        (s, m): (os.path.join(out_dir, "runs", f"{m}-seed{s}.json"),
                 os.path.join(out_dir, "checkpoints", f"{m}-seed{s}{rank}.pt"))
        for s, m in plan
    }  # fmt: skip
    done = {}
    run_id = read_run_id(out_dir)
    ident = run_identity(cfg, run_id, dist)
    for (seed, method), (record, ckpt) in paths.items():
        name = f"{method}-seed{seed}"
        state = None
        if os.path.exists(record):
            done[seed, method] = read_record(record, prep, name)
        finished = (seed, method) in done  # every rank checks every run's set together:
        if dist is not None:  # a save that a stop interrupted: back to a common epoch
            settle_set(name, ckpt, dist, finished, lambda row: gather_ranks(row, dist))
        if not finished and os.path.exists(ckpt):  # loaded again on its turn
            state = read_checkpoint(ckpt, prep, name, map_location="cpu")
        verify_set(cfg, name, ckpt, state, run_id, dist, resume_anyway, finished)
    todo = [p for p in plan if p not in done]
    with CompileWatch(_say if progress and main else None) as watch:  # first run only
        if todo:  # INT8 only where it measured faster (train.int8_pick: speed)
            cfg, prep.int8_pick = pick_precision(cfg, prep, out_dir, todo[0][0], train_one,
                                                 write=main)  # fmt: skip
        warm_up(cfg, prep, todo)
        watch.flush()
        records = []
        for seed, method in plan:
            if (seed, method) not in done:
                record, ckpt = paths[seed, method]
                if main:  # the manifest and the records are rank 0's; checkpoints every rank's
                    ranks = [ckpt] if dist is None else [
                        ckpt.replace(rank, f".rank{q}") for q in range(dist.world_size)
                    ]  # fmt: skip
                    ckpts = ranks if dist is None else [
                        p for c in ranks for p in (c, previous_path(c))
                    ]  # fmt: skip
                    claim(out_dir, record, *(ckpts if cfg.train.checkpoint_every else []))
                if dist is not None:
                    dist.barrier(f"starting {method}-seed{seed}")
                rec = train_one(cfg, prep, method, seed, ckpt, progress and main, on_epoch_end,
                                identity=ident)  # fmt: skip
                watch.flush()
                if main:
                    atomic_write_text(record, strict_json(rec))
                done[seed, method] = rec
            records.append(done[seed, method])
    prep.setup_s["kernel_compile"] = float(watch.total)
    return records


def _say(text: str) -> None:
    """A setup line on stderr (kernel compiles)."""
    sys.stderr.write(f"setup: {text}\n")
    sys.stderr.flush()
