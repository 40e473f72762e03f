"""``LayerState``: one approximated product's running scores, cached sample and generator.

A state knows nothing of the controller that owns it: each backward gets a
:class:`~dgl_rsc.slot.StepInfo` (phase, cache period, allocation, config) through a
:class:`~dgl_rsc.slot.LayerSlot`, and the controller only reads the states (running scores
and row counts) to solve the budget. So a state can be built and tested alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from .csr import CSR
from .products import Scales
from .sampling import Sample, draw_sample
from .stats import LayerStats, Timer

if TYPE_CHECKING:
    from .slot import StepInfo

__all__ = ["LayerState"]


class LayerState:
    """State of approximated product ``index``: the running-average row scores of the matrix
    it last saw, the cached sample and the generator of the scale's probe rows.

    Args:
        index: the product's index in its controller.
        seed: base seed of the probe generator (``RSCConfig.seed``).

    Attributes:
        ema: ``(M,)`` running-average scores, or ``None`` before the first record.
        row_nnz: ``(M,)`` non-zeros the solver shares out per row (without a diagonal that is
            applied exactly); ``fixed_nnz``: the non-zeros every product visits anyway.
        generation: increases whenever the scores restart on another matrix; an allocation
            solved from older scores does not apply.
        stats: the layer's :class:`~dgl_rsc.stats.LayerStats`.
    """

    def __init__(self, index: int, seed: int = 0):
        self.index = index
        self.seed = seed
        self.ema: Optional[torch.Tensor] = None
        self.ema_token: Optional[int] = None
        self.generation = 0
        self.row_nnz: Optional[torch.Tensor] = None
        self.fixed_nnz = 0
        self._sample: Optional[Sample] = None
        self._gen: Optional[torch.Generator] = None
        self._gen_state: Optional[torch.Tensor] = None
        self.stats = LayerStats()

    # -- the cached sample ------------------------------------------------------------------
    @property
    def sample(self) -> Optional[Sample]:
        """The cached sample, if any."""
        return self._sample

    def clear_cache(self) -> None:
        """Drop the cached sample (the next approximate backward draws a new one)."""
        self._sample = None

    def cache_bytes(self) -> int:
        return 0 if self._sample is None else self._sample.t_slice.nbytes()

    def cached(self, A: CSR, epoch: tuple) -> Optional[Sample]:
        """The cached sample if it was cut from ``A``'s structure in cache period ``epoch``."""
        s = self._sample
        return s if s is not None and s.token == A.token and s.epoch == epoch else None

    def refresh(self, A: CSR, dY: torch.Tensor, scales: Scales, step: StepInfo, backend):
        """Draw, store and return a new sample of ``A`` for ``dY``; its scores feed the
        running average. The non-zero budget is the step's allocation when it was solved
        from this matrix's scores, else the configured fraction of ``A``'s non-zeros."""
        cfg = step.config
        alloc = step.allocation
        if alloc is not None and alloc[1] == self.generation and self.ema_token == A.token:
            budget = alloc[0] + self.fixed_nnz
        else:
            budget = int(cfg.budget * A.nnz)
        timer = Timer(dY.device)
        sample = draw_sample(
            A, dY, budget, cfg.rule, cfg.min_k, backend, cfg.rescale, scales, cfg.diagonal
        )
        self.stats.refreshed(timer.stop(), sample.k)
        self.record(A, sample.scores, cfg)
        sample.token, sample.epoch = A.token, (step.cache_epoch, step.alloc_version)
        self._sample = sample
        return sample

    # -- running scores ---------------------------------------------------------------------
    def record(self, A: CSR, scores: torch.Tensor, config) -> None:
        """Fold fresh ``(M,)`` scores into the running average (restarted, with a new
        generation, when the matrix changes)."""
        scores = torch.nan_to_num(scores.detach(), nan=0.0, posinf=0.0)
        if self.ema is None or self.ema_token != A.token or self.ema.shape != scores.shape:
            self.ema = scores.clone()
            self.ema_token = A.token
            self.generation += 1
            diag = A.diagonal() if config.diagonal == "exact" else None
            # the solver shares out the sampled (off-diagonal) non-zeros; a diagonal applied
            # exactly is a fixed cost of every step
            self.row_nnz = A.row_nnz() if diag is None else A.row_nnz() - diag[1]
            self.fixed_nnz = 0 if diag is None else int(diag[1].sum())
        else:
            self.ema.mul_(1 - config.ema).add_(scores, alpha=config.ema)

    def bind(self, A: CSR) -> None:
        """After a checkpoint restore, adopt the first matrix of the saved shape."""
        if self.ema is not None and self.ema_token is None and self.ema.shape[0] == A.shape[0]:
            self.ema_token = A.token
        s = self._sample
        if s is not None and s.token is None and s.t_slice.shape == (A.shape[1], A.shape[0]):
            s.token = A.token

    def generator(self, device) -> torch.Generator:
        """This product's generator for the scale's probe rows, on ``device`` (seeded from
        ``seed`` and the index; restored from a checkpoint when there is one)."""
        device = torch.device(device)
        if self._gen is None or self._gen.device != device:
            self._gen = torch.Generator(device=device).manual_seed(
                self.seed * 1_000_003 + self.index
            )
            if self._gen_state is not None and device.type == "cpu":
                self._gen.set_state(self._gen_state)
            self._gen_state = None
        return self._gen

    # -- checkpoints ------------------------------------------------------------------------
    def export(self) -> dict:
        """Tensors and numbers describing this state (loads with ``weights_only=True``)."""
        s = self._sample
        out = {
            "ema": self.ema,
            "row_nnz": self.row_nnz,
            "fixed_nnz": self.fixed_nnz,
            "generation": self.generation,
            "width": self.stats.width,
            "sample": None,
            "generator": None if self._gen is None else self._gen.get_state(),
        }
        if s is not None:
            t = s.t_slice
            out["sample"] = {
                "indptr": t.indptr,
                "indices": t.indices,
                "values": t.values,
                "shape": list(t.shape),
                "epoch": list(s.epoch),
                "k": s.k,
                "nnz": s.nnz,
                "factor": s.factor,
            }
        return out

    def restore(self, d: dict) -> None:
        """Inverse of :meth:`export`; the state re-binds to the graph on first use."""
        self.ema = d["ema"]
        self.row_nnz = d["row_nnz"]
        self.fixed_nnz = int(d.get("fixed_nnz", 0))
        self.generation = int(d.get("generation", 0))
        self.stats.width = int(d["width"])
        self.ema_token = None
        self._sample = None
        self._gen, self._gen_state = None, d.get("generator")
        sd = d.get("sample")
        if sd is not None:
            t = CSR(sd["indptr"], sd["indices"], sd["values"], tuple(sd["shape"]), check=False)
            epoch = tuple(int(e) for e in sd["epoch"])
            self._sample = Sample(None, epoch, t, sd["k"], sd["nnz"], sd.get("factor"))

    def __repr__(self) -> str:
        rows = None if self.ema is None else self.ema.shape[0]
        return f"LayerState(index={self.index}, rows={rows}, cached={self._sample is not None})"
