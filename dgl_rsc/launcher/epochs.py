"""One run's epochs as the launcher records them: the optimizer step, the divergence guard,
the epoch's record (timings, RSC's counters, distributed traffic, the evaluation) and the best
evaluation so far, then the run's record.

:func:`~.train.train_one` drives an :class:`EpochLog` epoch after epoch (with its progress
bar and checkpoints around it); tools that step several runs in turn
(``tools/experiments/interleaved_tta.py``) drive one per run, so every run records its
epochs the same way.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ..core.controller import RSCController
from .compiled import compile_summary
from .dist_run import dist_summary, epoch_traffic, traffic_now
from .prepare import Prepared, TrainingDiverged
from .resume import merged_stats
from .run_state import RunState
from .schema import RunConfig
from .tta import train_time

__all__ = ["EpochLog", "counters", "evaluate", "train_step"]


def train_step(run: RunState, prep: Prepared) -> dict:
    """One full-graph optimizer step (:meth:`RunState.train_step`; in a distributed run the
    reducer sums the loss and the gradients over ranks); the loss feeds the guard."""
    mask = prep.masks["train"]

    def forward_loss():
        logits = run(run.graph, prep.feat)
        return prep.reducer.loss(prep.data.task, logits[mask].float(), prep.label[mask])

    return run.train_step(forward_loss, prep.reducer, prep.device)


def counters(ctl: Optional[RSCController]) -> tuple:
    """``(nnz visited, nnz exact, select seconds)`` so far (zeros without a controller)."""
    if ctl is None:
        return (0, 0, 0.0)
    s = ctl.stats()
    return (s["nnz_visited"], s["nnz_exact"], s["select_seconds"])


def evaluate(run: RunState, prep: Prepared) -> dict:
    """``{"train", "val", "test"}`` metric of the model in eval mode, without gradients."""
    run.model.eval()
    with torch.no_grad(), run.autocast():
        logits = run.model(run.graph, prep.feat).float()
    return prep.reducer.metrics(prep.data.metric, logits, prep.label, prep.masks)


class EpochLog:
    """The epochs of run ``f"{method}-seed{seed}"``: :meth:`train` runs and records one,
    :meth:`record` is the run's record.

    ``history`` and ``best`` continue a resumed run (its checkpoint's); the controller's
    counters and the traffic counters are read at construction, so build it right before
    the first epoch it trains.
    """

    def __init__(self, cfg: RunConfig, prep: Prepared, run: RunState, method: str, seed: int,
                 history: Optional[list] = None, best: Optional[dict] = None):  # fmt: skip
        self.cfg, self.prep, self.run, self.method, self.seed = cfg, prep, run, method, seed
        self.name = f"{method}-seed{seed}"
        self.history: list = [] if history is None else history
        self.best = best or {"epoch": 0, "val": -float("inf"), "test": None, "train": None}
        self._last = counters(run.ctl)
        self._traffic = traffic_now(prep)

    def train(self, epoch: int) -> dict:
        """Train epoch ``epoch`` (1-based), evaluate it when ``train.eval_every`` says so and
        return its record (appended to :attr:`history`).

        Raises:
            TrainingDiverged: the training loss is NaN or infinite (before the optimizer
                step of that epoch).
        """
        run, prep, t = self.run, self.prep, self.cfg.train
        phase = run.ctl.phase() if run.ctl is not None and self.method == "rsc" else "exact"
        if run.batches is not None:
            from .minibatch_run import minibatch_epoch

            step = minibatch_epoch(run, prep, run.batches, epoch)
        else:
            step = train_step(run, prep)
        if not math.isfinite(step["loss"]):
            raise TrainingDiverged(
                f"run {self.name} diverged: its training loss is {step['loss']} at epoch "
                f"{epoch}. It stopped before that epoch's optimizer step; the runs and "
                f"checkpoints written so far are kept. Lower train.lr (now {t.lr}) or "
                "check the data; resuming unchanged would diverge again."
            )
        rec = {"epoch": epoch, "phase": phase, **step}
        rec["train_time_s"] = train_time(self.history) + step["epoch_s"]
        if prep.dist is not None:
            rec["dist"] = epoch_traffic(prep, self._traffic)
            self._traffic = traffic_now(prep)
        now = counters(run.ctl)
        visited, total, select_s = (a - b for a, b in zip(now, self._last))
        self._last = now
        rec.update(select_s=select_s, nnz_visited=visited, nnz_exact=total,
                   nnz_fraction=visited / total if total else 1.0,
                   train=None, val=None, test=None)  # fmt: skip
        if epoch % t.eval_every == 0 or epoch == t.epochs:
            rec.update(evaluate(run, prep))
            if rec["val"] > self.best["val"]:
                self.best = {k: rec[k] for k in ("epoch", "val", "test", "train")}
        self.history.append(rec)
        return rec

    def record(self, base: Optional[dict], peak_rss_mb: Optional[float]) -> dict:
        """The run's record: its history, best and final evaluations, RSC's statistics
        (added to ``base``, a resumed run's counters before the resume) and the setup it ran
        with; ``peak_rss_mb`` ``None`` where the process held other runs too."""
        run, prep, t = self.run, self.prep, self.cfg.train
        final = next((h for h in reversed(self.history) if h["val"] is not None), {})
        return {
            "method": self.method, "seed": self.seed, "epochs": t.epochs, "amp": run.amp,
            "precision": "fp32" if self.method == "stock" else t.precision,
            "history": self.history, "best": self.best,
            "final": {k: final.get(k) for k in ("epoch", "train", "val", "test")},
            "rsc_stats": merged_stats(run.ctl, base), "data_sha256": prep.fingerprint,
            "distributed": dist_summary(prep, self.history), "allocator": prep.allocator,
            "peak_rss_mb": peak_rss_mb,
            "compile": None if run.forward is None else compile_summary(self.history, run.forward),
        }  # fmt: skip
