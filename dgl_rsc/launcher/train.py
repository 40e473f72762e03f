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

Test hook: with ``DGL_RSC_ABORT_AFTER_EPOCH=K`` (or ``=RUN:K``, RUN like ``rsc-seed0``) in the
environment, the process exits abruptly (``os._exit(75)``) after epoch ``K`` of the first run
(of run RUN) reaching it, after that epoch's checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import random
import sys
import time
from typing import Optional

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
from .checkpoint import atomic_write_text, load_checkpoint, save_checkpoint, set_rng_state
from .schema import RunConfig

__all__ = ["Prepared", "prepare", "resolve_device", "run_experiment", "train_one", "ABORT_ENV"]

log = logging.getLogger(__name__)
ABORT_ENV = "DGL_RSC_ABORT_AFTER_EPOCH"


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU; CUDA asked for but absent is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name!r} but CUDA is not available; use --device cpu.")
    return torch.device(name)


@dataclasses.dataclass
class Prepared:
    """The data of an experiment on its device: ``feat (N, F)``, ``label (N,)``/``(N, C)``."""

    data: object
    graph: object
    feat: torch.Tensor
    label: torch.Tensor
    masks: dict
    device: torch.device


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
    return Prepared(data, graph, data.feat.to(device), data.label.to(device), masks, device)


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


def _restore(run: _Run, state: dict) -> tuple:
    """Load a checkpoint into ``run``; returns ``(history, best)`` saved with it."""
    run.model.load_state_dict(state["model"])
    run.opt.load_state_dict(state["optimizer"])
    if run.ctl is not None and state["controller"] is not None:
        run.ctl.load_state_dict(state["controller"])
    if run.scaler is not None and state["scaler"] is not None:
        run.scaler.load_state_dict(state["scaler"])
    set_rng_state(state["rng"])
    return state["extra"]["history"], state["extra"]["best"]


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
    return {"loss": float(loss), "epoch_s": t3 - t0, "forward_s": t1 - t0,
            "backward_s": t2 - t1, "step_s": t3 - t2}  # fmt: skip


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
) -> dict:
    """Train one run; resume from ``ckpt_path`` when it exists. Returns the run's record."""
    t = cfg.train
    _seed_all(seed)
    run = _setup(cfg, prep, method)
    history, best = [], {"epoch": 0, "val": -float("inf"), "test": None, "train": None}
    if ckpt_path and os.path.exists(ckpt_path):
        history, best = _restore(run, load_checkpoint(ckpt_path, map_location=prep.device))
        log.info("%s seed %d: resumed after epoch %d", method, seed, len(history))
    quiet = not progress or not sys.stderr.isatty() or bool(os.environ.get("CI"))
    bar = tqdm(total=t.epochs, initial=len(history), desc=f"{method} seed {seed}",
               disable=quiet, dynamic_ncols=True)  # fmt: skip
    last = _counters(run.ctl)
    with run.ctx:
        for epoch in range(len(history) + 1, t.epochs + 1):
            phase = run.ctl.phase() if run.ctl is not None and method == "rsc" else "exact"
            rec = {"epoch": epoch, "phase": phase, **_train_step(run, prep)}
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
                extra = {"history": history, "best": best}
                save_checkpoint(ckpt_path, model=run.model, optimizer=run.opt, controller=run.ctl,
                                scaler=run.scaler, epoch=epoch, extra=extra)  # fmt: skip
            if os.environ.get(ABORT_ENV) in (str(epoch), f"{method}-seed{seed}:{epoch}"):
                os._exit(75)
    bar.close()
    final = next((h for h in reversed(history) if h["val"] is not None), {})
    return {
        "method": method, "seed": seed, "epochs": t.epochs, "amp": run.amp,
        "history": history, "best": best,
        "final": {k: final.get(k) for k in ("epoch", "train", "val", "test")},
        "rsc_stats": _jsonable(run.ctl.stats()) if run.ctl is not None else None,
    }  # fmt: skip


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.4f}"


def _jsonable(stats: dict) -> dict:
    return json.loads(json.dumps(stats, default=float))


def _evaluate(run: _Run, prep: Prepared) -> dict:
    """``{"train", "val", "test"}`` metric of the model in eval mode, without gradients."""
    from ..data.metrics import evaluate

    run.model.eval()
    with torch.no_grad(), run.autocast():
        logits = run.model(prep.graph, prep.feat).float()
    metric = prep.data.metric
    return {s: float(evaluate(metric, logits, prep.label, m)) for s, m in prep.masks.items()}


def run_experiment(cfg: RunConfig, prep: Prepared, out_dir: str, progress: bool = True) -> list:
    """Every (seed, method) run, interleaved by seed; finished runs are read back from
    ``out_dir/runs/`` and unfinished ones resume from ``out_dir/checkpoints/``."""
    records = []
    for seed in cfg.train.seeds:
        for method in cfg.methods:
            name = f"{method}-seed{seed}"
            done = os.path.join(out_dir, "runs", f"{name}.json")
            if os.path.exists(done):
                with open(done, encoding="utf-8") as f:
                    records.append(json.load(f))
                continue
            ckpt = os.path.join(out_dir, "checkpoints", f"{name}.pt")
            rec = train_one(cfg, prep, method, seed, ckpt, progress)
            atomic_write_text(done, json.dumps(rec))
            records.append(rec)
    return records
