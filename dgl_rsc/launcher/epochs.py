"""One run's epochs as the launcher records them: the optimizer step, the divergence guard,
the epoch's record (timings, RSC's counters, distributed traffic, the evaluation), the best
evaluation so far and the stop rule (``train.stop``), then the run's record.

:func:`~.train.train_one` drives an :class:`EpochLog` epoch after epoch (with its progress
bar and checkpoints around it); tools that step several runs in turn
(``tools/experiments/interleaved_tta.py``) drive one per run, so every run records its
epochs the same way, and stops by the same rule.

Each evaluation's validation metric goes to the run's controller
(``RSCController.observe_validation``: RSC's plateau switch to the exact backward,
``rsc.switch_patience``) and to the run's :class:`~dgl_rsc.core.plateau.Plateau`
(``train.patience``, ``train.min_delta``): under ``train.stop: plateau`` the run is
:attr:`EpochLog.done` when it fires. A loop steps ``train`` until ``done`` or the cap::

    for epoch in range(1, cfg.train.epochs + 1):
        log.train(epoch)
        if log.done:
            break
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ..core.controller import RSCController
from ..core.plateau import Plateau
from .compiled import compile_summary
from .dist_run import dist_summary, epoch_traffic, traffic_now
from .prepare import Prepared, TrainingDiverged
from .resume import merged_stats
from .run_state import RunState
from .schema import RunConfig
from .tta import train_time

__all__ = ["EpochLog", "counters", "evaluate", "rewarm", "train_step"]


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


def rewarm(run: RunState, prep: Prepared) -> None:
    """After a resume: evaluate the restored model once (as the interrupted run evaluated it
    after its epochs), which shows each layer its constant input again, so that the next
    training step reuses the input's aggregation as the uninterrupted run does
    (:mod:`dgl_rsc.dgl.nn.input_cache`; the first sighting of an input only records it).
    Nothing else changes: an evaluation takes no RSC slot, no random number and no
    optimizer step."""
    evaluate(run, prep)


class EpochLog:
    """The epochs of run ``f"{method}-seed{seed}"``: :meth:`train` runs and records one,
    :meth:`record` is the run's record.

    ``history`` and ``best`` continue a resumed run (its checkpoint's); the controller's
    counters and the traffic counters are read at construction, so build it right before
    the first epoch it trains. ``state`` continues the stop rule (:meth:`state_dict`).
    """

    def __init__(self, cfg: RunConfig, prep: Prepared, run: RunState, method: str, seed: int,
                 history: Optional[list] = None, best: Optional[dict] = None,
                 state: Optional[dict] = None):  # fmt: skip
        self.cfg, self.prep, self.run, self.method, self.seed = cfg, prep, run, method, seed
        self.name = f"{method}-seed{seed}"
        self.history: list = [] if history is None else history
        self.best = best or {"epoch": 0, "val": -float("inf"), "test": None, "train": None}
        self.plateau = Plateau(cfg.train.patience, cfg.train.min_delta)
        self.stopped_at: Optional[int] = None  # the epoch train.stop: plateau stopped it
        if state:
            self.plateau.load_state_dict(state["plateau"])
            self.stopped_at = state.get("stopped_at")
        self._last = counters(run.ctl)
        self._traffic = traffic_now(prep)

    @property
    def done(self) -> bool:
        """The stop rule ended the run (``train.stop: plateau``; the cap is the caller's)."""
        return self.stopped_at is not None

    def state_dict(self) -> dict:
        """The stop rule's state, for a checkpoint (numbers only)."""
        return {"plateau": self.plateau.state_dict(), "stopped_at": self.stopped_at}

    def _observe(self, epoch: int, val) -> None:
        """One evaluation's validation metric: RSC's switch, then the stop rule."""
        if self.run.ctl is not None:
            self.run.ctl.observe_validation(val)
        if self.plateau.update(val) and self.cfg.train.stop == "plateau":
            self.stopped_at = epoch

    def stop_record(self) -> dict:
        """How the run ended: ``converged`` when the plateau rule holds at its end (under
        ``stop: plateau`` it stopped there; under ``fixed`` it had plateaued by the end),
        else it hit the cap of ``epochs`` still improving."""
        t = self.cfg.train
        return {"rule": t.stop, "patience": t.patience, "min_delta": t.min_delta,
                "cap": t.epochs, "epochs": self.history[-1]["epoch"] if self.history else 0,
                "converged": self.plateau.plateaued, "best_epoch": self.best["epoch"]}  # fmt: skip

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
            self._observe(epoch, rec["val"])
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
            "history": self.history, "best": self.best, "stop": self.stop_record(),
            "final": {k: final.get(k) for k in ("epoch", "train", "val", "test")},
            "rsc_stats": merged_stats(run.ctl, base), "data_sha256": prep.fingerprint,
            "distributed": dist_summary(prep, self.history), "allocator": prep.allocator,
            "peak_rss_mb": peak_rss_mb,
            "compile": None if run.forward is None else compile_summary(self.history, run.forward),
        }  # fmt: skip
