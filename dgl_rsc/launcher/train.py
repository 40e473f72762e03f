"""Full-batch training runs: the data once, then one run per (seed, method).

Engines (``train.engine``): ``native`` runs :mod:`dgl_rsc.nn` layers on a DGL-free
:class:`~dgl_rsc.graph.Graph`; ``dgl`` runs the same layers on a ``DGLGraph``; ``patch`` runs
the stock ``dgl.nn`` model inside :func:`dgl_rsc.patch`. The exact baseline uses the same
layers and sparse engine with the exact backward (:func:`dgl_rsc.nn.exact`; on ``patch`` a
controller switched to exact from step 0), so a comparison measures RSC, not two engines.

Epoch timing (synchronized on CUDA) separates forward (with the loss), backward (which
contains RSC's row selection, reported apart as ``select_s``) and the optimizer step;
evaluation runs every ``eval_every`` epochs under ``torch.no_grad`` and is not timed as
training. The reported test metric is the one at the epoch of best validation metric.

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
import json
import logging
import math
import os
import random
import sys
import time
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from .. import _deps
from ..config import ConfigError, RSCConfig
from ..controller import RSCController
from ..models import build_model
from ..nn import attach, exact
from ..patch import patch
from .checkpoint import atomic_write_text, claim, load_checkpoint, save_checkpoint, set_rng_state
from .report import strict_json
from .schema import RunConfig

__all__ = [
    "Prepared",
    "TrainingDiverged",
    "check_backend",
    "prepare",
    "resolve_device",
    "run_experiment",
    "train_one",
]

log = logging.getLogger(__name__)
EpochCallback = Callable[[str, int], None]
#: controller counters that add up over a run (summed across a resume)
_COUNTERS = ("nnz_visited", "nnz_exact", "select_seconds", "cache_hits", "cache_misses",
             "approx_calls", "exact_calls")  # fmt: skip


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite; the message names the run and the epoch."""


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU; CUDA asked for but absent is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name!r} but CUDA is not available; use --device cpu.")
    return torch.device(name)


def check_backend(cfg: RunConfig, device: torch.device) -> None:
    """``rsc.backend`` can run on ``device`` (checked before any data are loaded)."""
    if cfg.rsc is None:
        return
    from ..backends import resolve

    try:
        resolve(cfg.rsc.backend, device)
    except (ImportError, ValueError) as exc:
        raise ConfigError(
            f"rsc.backend={cfg.rsc.backend!r} cannot run on {device}: {exc}"
        ) from None


@dataclasses.dataclass
class Prepared:
    """The data of an experiment on its device: ``feat (N, F)``, ``label (N,)``/``(N, C)``;
    ``fingerprint`` is the data's sha256, ``source`` names where they came from."""

    data: object
    graph: object
    feat: torch.Tensor
    label: torch.Tensor
    masks: dict
    device: torch.device
    fingerprint: str = ""
    source: str = ""


def prepare(cfg: RunConfig) -> Prepared:
    """Load the dataset and build the graph the engine needs (once per experiment)."""
    from ..data import load_dataset
    from ..models import MODELS

    engine = cfg.train.engine
    if engine != "native" and not _deps.dgl_available():
        raise ConfigError(
            f"train.engine={engine!r} needs DGL, which is not importable here; "
            "use train.engine=native (dgl_rsc layers on a DGL-free graph)."
        )
    device = resolve_device(cfg.train.device)
    check_backend(cfg, device)
    params = {k: v for k, v in cfg.dataset.items() if k not in ("name", "root")}
    try:
        data = load_dataset(cfg.dataset["name"], root=cfg.dataset["root"], **params)
    except (FileNotFoundError, ImportError, ValueError) as exc:  # missing files, bad params
        raise ConfigError(f"dataset {cfg.dataset['name']!r} could not be loaded: {exc}") from None
    src, dst, n = data.src, data.dst, int(data.num_nodes)
    if MODELS[cfg.model["name"]].SELF_LOOPS:
        loops = torch.arange(n, dtype=src.dtype)
        src, dst = torch.cat([src, loops]), torch.cat([dst, loops])
    if engine == "native":
        from ..graph import Graph

        graph = Graph(src, dst, n).to(device)
    else:
        graph = _deps.require_dgl().graph((src, dst), num_nodes=n).to(device)
    masks = {s: getattr(data, f"{s}_mask").to(device) for s in ("train", "val", "test")}
    path, root = cfg.dataset.get("path"), cfg.dataset["root"]
    source = os.path.join(root, path) if path and root else path or root
    return Prepared(data, graph, data.feat.to(device), data.label.to(device), masks, device,
                    data.fingerprint(), source or f"the {cfg.dataset['name']} graph")  # fmt: skip


def _loss(task: str, logits: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """Cross-entropy (multiclass; binary as two classes) or BCE on (N, C) 0/1 targets."""
    if task == "multilabel":
        return F.binary_cross_entropy_with_logits(logits, label.to(logits.dtype))
    return F.cross_entropy(logits, label)


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


@dataclasses.dataclass
class _Run:
    """What one run trains with; ``ctl`` is ``None`` for the exact run on dgl_rsc layers."""

    model: torch.nn.Module
    opt: torch.optim.Optimizer
    ctl: Optional[RSCController]
    ctx: contextlib.AbstractContextManager
    amp: str
    scaler: Optional[torch.cuda.amp.GradScaler]

    def autocast(self):
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.amp)
        return torch.autocast("cuda", dtype=dtype) if dtype else contextlib.nullcontext()


def _setup(cfg: RunConfig, prep: Prepared, method: str) -> _Run:
    """Model, optimizer, controller, patch context and AMP of one run (seeded before)."""
    t = cfg.train
    params = {k: v for k, v in cfg.model.items() if k != "name"}
    engine = "dgl-stock" if t.engine == "patch" else "rsc"
    in_feats, classes = prep.feat.shape[1], int(prep.data.num_classes)
    model = build_model(cfg.model["name"], in_feats, classes, engine=engine, **params)
    model = model.to(prep.device)
    ctx = contextlib.nullcontext()
    if t.engine == "patch":
        rsc_cfg = cfg.rsc if method == "rsc" else RSCConfig(switch_at=0.0, total_steps=t.epochs)
        ctl = RSCController(rsc_cfg)
        ctx = patch(ctl)
    elif method == "rsc":
        ctl = attach(model, cfg.rsc)
    else:
        ctl = None
        exact(model)
    amp = t.amp if prep.device.type == "cuda" else "none"
    if t.amp != amp:
        log.warning("train.amp=%s ignored: AMP runs on CUDA only", t.amp)
    scaler = None
    if amp == "fp16":  # torch.cuda.amp.GradScaler is deprecated from torch 2.3 on
        new_api = _deps.TORCH_VERSION >= (2, 3)
        scaler = torch.amp.GradScaler("cuda") if new_api else torch.cuda.amp.GradScaler()
    return _Run(model, _optimizer(cfg, model.parameters()), ctl, ctx, amp, scaler)


def _read_checkpoint(path: str, prep: Prepared, name: str, map_location=None) -> dict:
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
    _check_data(extra.get("data_sha256"), prep, f"checkpoint {path}")
    return state


def _check_data(saved: Optional[str], prep: Prepared, what: str) -> None:
    """Refuse what was made from other data than ``prep`` holds (by sha256)."""
    if saved is None:
        log.warning("%s has no dataset hash (an older dgl-rsc wrote it): not checked", what)
    elif saved != prep.fingerprint:
        raise ConfigError(
            f"{what} was made from other data than {prep.source} holds now (sha256 "
            f"{saved[:12]}... then, {prep.fingerprint[:12]}... now): the dataset changed since "
            "the run started. Restore the original data, or start a new run with --out."
        )


def _restore(run: _Run, state: dict, path: str, name: str) -> tuple:
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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _train_step(run: _Run, prep: Prepared) -> dict:
    """One full-batch optimizer step, timed in three parts (seconds)."""
    mask, dev = prep.masks["train"], prep.device
    run.model.train()
    t0 = time.perf_counter()
    with run.autocast():
        logits = run.model(prep.graph, prep.feat)
        loss = _loss(prep.data.task, logits[mask].float(), prep.label[mask])
    _sync(dev)
    t1 = time.perf_counter()
    value = float(loss)
    if not math.isfinite(value):
        return {"loss": value}  # no backward, no step: the caller stops the run
    run.opt.zero_grad(set_to_none=True)
    (run.scaler.scale(loss) if run.scaler else loss).backward()
    _sync(dev)
    t2 = time.perf_counter()
    if run.scaler:
        run.scaler.step(run.opt)
        run.scaler.update()
    else:
        run.opt.step()
    if run.ctl is not None:
        run.ctl.step()
    _sync(dev)
    t3 = time.perf_counter()
    return {"loss": value, "epoch_s": t3 - t0, "forward_s": t1 - t0,
            "backward_s": t2 - t1, "step_s": t3 - t2}  # fmt: skip


def _stats(ctl: Optional[RSCController], base: Optional[dict]) -> Optional[dict]:
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
    for key in _COUNTERS:
        if key in now and key in base:
            out[key] = base[key] + now[key]
    for key in ("rows", "k"):  # the last sample's size: from before the resume if none since
        if key in out and out[key] is None:
            out[key] = base.get(key)
    exact = out.get("nnz_exact")
    if "visited_fraction" in out:
        out["visited_fraction"] = out["nnz_visited"] / exact if exact else 1.0
    return out


def _counters(ctl: Optional[RSCController]) -> tuple:
    """``(nnz visited, nnz exact, select seconds)`` so far (zeros without a controller)."""
    if ctl is None:
        return (0, 0, 0.0)
    s = ctl.stats()
    return (s["nnz_visited"], s["nnz_exact"], s["select_seconds"])


def train_one(
    cfg: RunConfig,
    prep: Prepared,
    method: str,
    seed: int,
    ckpt_path: Optional[str] = None,
    progress: bool = True,
    on_epoch_end: Optional[EpochCallback] = None,
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
    run = _setup(cfg, prep, method)
    history, best = [], {"epoch": 0, "val": -float("inf"), "test": None, "train": None}
    base = None  # the controller's counters before a resume
    if ckpt_path and os.path.exists(ckpt_path):
        state = _read_checkpoint(ckpt_path, prep, name)
        history, best, base = _restore(run, state, ckpt_path, name)
        log.info("%s: resumed after epoch %d", name, len(history))
    quiet = not progress or not sys.stderr.isatty() or bool(os.environ.get("CI"))
    bar = tqdm(total=t.epochs, initial=len(history), desc=f"{method} seed {seed}",
               disable=quiet, dynamic_ncols=True)  # fmt: skip
    last = _counters(run.ctl)
    with run.ctx, contextlib.closing(bar):
        for epoch in range(len(history) + 1, t.epochs + 1):
            phase = run.ctl.phase() if run.ctl is not None and method == "rsc" else "exact"
            step = _train_step(run, prep)
            if not math.isfinite(step["loss"]):
                raise TrainingDiverged(
                    f"run {name} diverged: its training loss is {step['loss']} at epoch "
                    f"{epoch}. It stopped before that epoch's optimizer step; the runs and "
                    f"checkpoints written so far are kept. Lower train.lr (now {t.lr}) or "
                    "check the data; resuming unchanged would diverge again."
                )
            rec = {"epoch": epoch, "phase": phase, **step}
            now = _counters(run.ctl)
            visited, total, select_s = (a - b for a, b in zip(now, last))
            last = now
            rec.update(select_s=select_s, nnz_visited=visited, nnz_exact=total,
                       nnz_fraction=visited / total if total else 1.0,
                       train=None, val=None, test=None)  # fmt: skip
            if epoch % t.eval_every == 0 or epoch == t.epochs:
                rec.update(_evaluate(run, prep))
                if rec["val"] > best["val"]:
                    best = {k: rec[k] for k in ("epoch", "val", "test", "train")}
            history.append(rec)
            bar.set_postfix(loss=f"{rec['loss']:.4f}", val=_fmt(rec["val"]),
                            ep_s=f"{rec['epoch_s']:.3f}", refresh=False)  # fmt: skip
            bar.update(1)
            if ckpt_path and t.checkpoint_every and epoch % t.checkpoint_every == 0:
                extra = {"history": history, "best": best, "data_sha256": prep.fingerprint,
                         "rsc_stats": _stats(run.ctl, base)}  # fmt: skip
                save_checkpoint(ckpt_path, model=run.model, optimizer=run.opt, controller=run.ctl,
                                scaler=run.scaler, epoch=epoch, extra=extra)  # fmt: skip
            if on_epoch_end is not None:
                on_epoch_end(name, epoch)
    final = next((h for h in reversed(history) if h["val"] is not None), {})
    return {
        "method": method, "seed": seed, "epochs": t.epochs, "amp": run.amp,
        "history": history, "best": best,
        "final": {k: final.get(k) for k in ("epoch", "train", "val", "test")},
        "rsc_stats": _stats(run.ctl, base), "data_sha256": prep.fingerprint,
    }  # fmt: skip


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.4f}"


def _evaluate(run: _Run, prep: Prepared) -> dict:
    """``{"train", "val", "test"}`` metric of the model in eval mode, without gradients."""
    from ..data.metrics import evaluate

    run.model.eval()
    with torch.no_grad(), run.autocast():
        logits = run.model(prep.graph, prep.feat).float()
    metric = prep.data.metric
    return {s: float(evaluate(metric, logits, prep.label, m)) for s, m in prep.masks.items()}


def _read_record(path: str, prep: Prepared, name: str) -> dict:
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
    _check_data(rec.get("data_sha256"), prep, f"the finished run {path}")
    return rec


def run_experiment(
    cfg: RunConfig,
    prep: Prepared,
    out_dir: str,
    progress: bool = True,
    on_epoch_end: Optional[EpochCallback] = None,
) -> list:
    """Every (seed, method) run, interleaved by seed; finished runs are read back from
    ``out_dir/runs/`` and unfinished ones resume from ``out_dir/checkpoints/``. All of
    those files are checked before the first epoch trains. Each file is listed in the
    directory's manifest before it is written; records are strict JSON."""
    plan = [(seed, method) for seed in cfg.train.seeds for method in cfg.methods]
    paths = {
        (s, m): (os.path.join(out_dir, "runs", f"{m}-seed{s}.json"),
                 os.path.join(out_dir, "checkpoints", f"{m}-seed{s}.pt"))
        for s, m in plan
    }  # fmt: skip
    done = {}
    for (seed, method), (record, ckpt) in paths.items():
        name = f"{method}-seed{seed}"
        if os.path.exists(record):
            done[seed, method] = _read_record(record, prep, name)
        elif os.path.exists(ckpt):
            _read_checkpoint(ckpt, prep, name, map_location="cpu")  # loaded again on its turn
    records = []
    for seed, method in plan:
        if (seed, method) not in done:
            record, ckpt = paths[seed, method]
            claim(out_dir, record, *([ckpt] if cfg.train.checkpoint_every else []))
            rec = train_one(cfg, prep, method, seed, ckpt, progress, on_epoch_end)
            atomic_write_text(record, strict_json(rec))
            done[seed, method] = rec
        records.append(done[seed, method])
    return records
