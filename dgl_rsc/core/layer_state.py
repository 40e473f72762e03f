"""``LayerState``: one approximated product's running scores, cached sample and generator.

A state knows nothing of the controller that owns it: each backward gets a
:class:`~dgl_rsc.core.step_info.StepInfo` (phase, cache period, allocation, config) through a
:class:`~dgl_rsc.core.slot.LayerSlot`, and the controller only reads the states (running scores
and row counts) to solve the budget. So a state can be built and tested alone.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Optional

import torch

from ..sampling import Sample, draw_sample, row_norms, selection_key
from ..sampling.error import ErrorCurve, error_curve
from ..sampling.remainder import Groups, Partition, drops_any
from ..sparse.csr import CSR
from ..sparse.products import Scales
from .stats import LayerStats, Timer

if TYPE_CHECKING:
    from .step_info import StepInfo

__all__ = ["LayerState"]


def _checksum(t: Optional[torch.Tensor]):
    """A value checksum of a CPU vector (``None`` for none): its length, its sum and the sum
    of every 7th entry, in float64."""
    if t is None:
        return None
    d = t.detach().reshape(-1)
    return (d.numel(), float(d.sum(dtype=torch.float64)), float(d[::7].sum(dtype=torch.float64)))


class LayerState:
    """State of approximated product ``index``: per matrix it saw (its structure token), the
    running-average row scores and the cached sample, and the generator of the scale's probe
    rows.

    Full-graph training sees one matrix. Mini-batch training sees one per subgraph: the state
    of the subgraph at hand is the current one, and the states of up to ``capacity`` others
    wait in a least-recently-used cache, so a subgraph that comes back (Cluster-GCN's fixed
    batches) finds its scores and sample again, and a sample is never used for another
    subgraph (it is keyed by the structure token).

    Args:
        index: the product's index in its controller.
        seed: base seed of the probe generator (``RSCConfig.seed``).
        capacity: subgraph states kept besides the current one.

    Attributes:
        ema: ``(M,)`` running-average scores of the current matrix, or ``None``.
        row_nnz: ``(M,)`` non-zeros the solver shares out per row (without a diagonal that is
            applied exactly); ``fixed_nnz``: the non-zeros every product visits anyway.
        generation: a number unique to the current matrix's scores; an allocation solved
            from other scores does not apply.
        row_work: the solver's cost of one row of the gradient this product reads, besides
            its non-zeros, when the backward before it is row-restricted (set by that
            backward's forward, :class:`~dgl_rsc.core.restrict.RestrictedSegment`; ``0``
            otherwise).
        stats: the layer's :class:`~dgl_rsc.core.stats.LayerStats`.
    """

    def __init__(self, index: int, seed: int = 0, capacity: int = 32):
        self.index = index
        self.seed = seed
        self.capacity = capacity
        self.ema: Optional[torch.Tensor] = None
        self.ema_token: Optional[int] = None
        self.generation = 0
        self._generations = 0
        self.row_nnz: Optional[torch.Tensor] = None
        self.fixed_nnz = 0
        self.row_work = 0.0
        self._sample: Optional[Sample] = None
        self._others: OrderedDict = OrderedDict()  # token -> saved state of that matrix
        self.subgraph_hits = 0  # a matrix seen before came back with its state
        self.backward_calls = 0  # backward products run (the controller's missing-step check)
        self._gen: Optional[torch.Generator] = None
        self._gen_state: Optional[torch.Tensor] = None
        self.stats = LayerStats()
        self.curve: Optional[ErrorCurve] = None  # the last estimated error curve
        self._norms: Optional[tuple] = None  # (key, (M,) row norms) of the last matrix
        self.probes = 0  # error curves estimated so far
        self._partition: Optional[Partition] = None  # the remainder groups of the last matrix

    # -- the matrix at hand --------------------------------------------------------------------
    def switch_to(self, A: CSR) -> None:
        """Make ``A``'s state current: park the current one, take back ``A``'s if it was
        parked (called at the start of every backward)."""
        token = A.token
        if self.ema_token == token or (self.ema_token is None and self.ema is None):
            return
        if self.ema_token is not None:
            self._others[self.ema_token] = (self.ema, self.row_nnz, self.fixed_nnz,
                                            self.generation, self._sample)  # fmt: skip
            while len(self._others) > self.capacity:
                self._others.popitem(last=False)
        saved = self._others.pop(token, None)
        if saved is not None:
            self.subgraph_hits += 1
            self.ema, self.row_nnz, self.fixed_nnz, self.generation, self._sample = saved
            self.ema_token = token
        elif self.ema_token is not None:
            self.ema = self.ema_token = self.row_nnz = self._sample = None
            self.fixed_nnz = 0

    # -- the cached sample ------------------------------------------------------------------
    @property
    def sample(self) -> Optional[Sample]:
        """The current matrix's cached sample, if any."""
        return self._sample

    def clear_cache(self) -> None:
        """Drop the cached samples (the next approximate backward draws a new one) and the
        remainder partition's slices (drawn again at the next refresh)."""
        self._sample = None
        self._partition = None
        self._others = OrderedDict(
            (t, (e, r, f, g, None)) for t, (e, r, f, g, _) in self._others.items()
        )

    def cache_bytes(self) -> int:
        samples = [self._sample] + [v[4] for v in self._others.values()]
        part = 0 if self._partition is None else self._partition.nbytes()
        return part + sum(s.t_slice.nbytes() + (0 if s.rest is None else s.rest.nbytes())
                          for s in samples if s is not None)  # fmt: skip

    def cached(self, A: CSR, step: StepInfo) -> Optional[Sample]:
        """The sample of ``A`` when it may serve this step: cut from ``A``'s structure, under
        the current allocation, used fewer than ``cache_interval`` times."""
        s = self._sample
        if s is None or s.token != A.token or s.alloc_version != step.alloc_version:
            return None
        if step.config.remainder_groups and s.rest is None:  # restored without its groups
            return None
        return s if s.uses < step.config.cache_interval else None

    def refresh(self, A: CSR, dY: torch.Tensor, scales: Scales, step: StepInfo, backend):
        """Draw, store and return a new sample of ``A`` for ``dY``; its scores feed the
        running average. The non-zero budget is the step's allocation when it was solved
        from this matrix's scores, else the configured fraction of ``A``'s non-zeros (less
        a diagonal applied exactly, which every product visits on top of the sample)."""
        cfg = step.config
        alloc = step.allocation
        diag = A.diagonal() if cfg.diagonal == "exact" else None
        if alloc is not None and alloc[1] == self.generation and self.ema_token == A.token:
            budget = alloc[0]  # the solver's unit: sampled non-zeros
        else:
            budget = int(cfg.fraction * A.nnz) - (0 if diag is None else int(diag[1].sum()))
        timer = Timer(dY.device)
        norms = self.norms(A, scales, diag is not None)
        sample = draw_sample(A, dY, budget, cfg.rule, cfg.min_k, backend, cfg.scale_mode,
                             scales, cfg.diagonal, norms)  # fmt: skip
        if cfg.remainder_groups:  # the partition's groups, from a random one
            sample.rest = Groups(None)
            if drops_any(A, sample):
                gen = self.generator(dY.device)
                part = self.partition(A, cfg.remainder_groups, gen)
                first = torch.randint(0, part.groups, (1,), generator=gen, device=gen.device)
                sample.rest = Groups(part, int(first))
        self.stats.refreshed(timer.stop(), sample.k)
        self.record(A, sample.scores, cfg)
        sample.token, sample.alloc_version = A.token, step.alloc_version
        self._sample = sample
        return sample

    def probe_error(self, A: CSR, dY: torch.Tensor, scales: Scales, backend, cfg) -> None:
        """Estimate the error of the sampled product at every budget for this ``dY (M, D)``
        (:func:`~dgl_rsc.sampling.error.error_curve`, ``cfg.probe_rows`` output rows), for the
        controller's next tune."""
        timer = Timer(dY.device)
        diag = A.diagonal() if cfg.diagonal == "exact" else None
        row_nnz = A.row_nnz() if diag is None else A.row_nnz() - diag[1]
        scores = backend.row_scores(self.norms(A, scales, diag is not None), dY)
        key = selection_key(scores, row_nnz, cfg.rule)
        # probe columns from a generator of their own, seeded by the probe's number: the
        # scale's draws stay as they were, and a resumed run draws the same columns
        gen = torch.Generator(device=dY.device).manual_seed(
            (self.seed * 1_000_003 + self.index) * 7_919 + self.probes
        )
        self.probes += 1
        self.curve = error_curve(A, dY, scales, key, row_nnz, cfg.probe_rows, gen,
                                 cfg.scale_mode)  # fmt: skip
        self.stats.timed(timer.stop())

    def partition(self, A: CSR, groups: int, generator: torch.Generator) -> Partition:
        """``A``'s partition of its rows into ``groups`` remainder groups: drawn (from
        ``generator``) for the first refresh of a matrix, kept for the next ones."""
        if self._partition is None or not self._partition.fits(A, groups):
            self._partition = Partition.draw(A, groups, generator)
        return self._partition

    def norms(self, A: CSR, scales: Scales, skip_diagonal: bool) -> torch.Tensor:
        """``(M,)`` :func:`~dgl_rsc.sampling.row_norms` of ``A`` under ``scales``, computed
        once per matrix and scales (a layer rebuilds its degree scales every forward with the
        same values: on the CPU they are recognized by a checksum of their values)."""
        if A.device.type != "cpu":
            return row_norms(A, scales, skip_diagonal)
        key = (A.token, skip_diagonal, bool(scales.row_divide),
               *(_checksum(t) for t in (scales.row, scales.col, scales.hint_col)))  # fmt: skip
        if self._norms is None or self._norms[0] != key:
            self._norms = (key, row_norms(A, scales, skip_diagonal))
        return self._norms[1]

    # -- running scores ---------------------------------------------------------------------
    def record(self, A: CSR, scores: torch.Tensor, config) -> None:
        """Fold fresh ``(M,)`` scores into the running average (restarted, with a new
        generation, when the matrix changes)."""
        scores = torch.nan_to_num(scores.detach(), nan=0.0, posinf=0.0)
        if self.ema is None or self.ema_token != A.token or self.ema.shape != scores.shape:
            self.ema = scores.clone()
            self.ema_token = A.token
            self._generations += 1
            self.generation = self._generations
            diag = A.diagonal() if config.diagonal == "exact" else None
            # the solver shares out the sampled (off-diagonal) non-zeros; a diagonal applied
            # exactly is a fixed cost of every step
            self.row_nnz = A.row_nnz() if diag is None else A.row_nnz() - diag[1]
            self.fixed_nnz = 0 if diag is None else int(diag[1].sum())
        else:
            self.ema.mul_(1 - config.ema).add_(scores, alpha=config.ema)

    def bind(self, A: CSR) -> None:
        """The matrix of this backward: after a checkpoint restore, adopt the first matrix
        of the saved shape; otherwise switch to its state."""
        if self.ema is not None and self.ema_token is None and self.ema.shape[0] == A.shape[0]:
            self.ema_token = A.token
            s = self._sample
            if s is not None and s.token is None and s.t_slice.shape == (A.shape[1], A.shape[0]):
                s.token = A.token
            p = self._partition
            if p is not None and p.token is None and p.labels.numel() == A.shape[0]:
                p.token = A.token
                p.labels = p.labels.to(A.device)
            if s is not None and s.rest and s.rest.partition.token is None:
                s.rest.partition.token = A.token  # an earlier version's groups
                s.rest.partition.labels = s.rest.partition.labels.to(A.device)
            return
        self.switch_to(A)

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
            "generations": self._generations,
            "width": self.stats.width,
            "sample": None,
            "generator": None if self._gen is None else self._gen.get_state(),
            "probes": self.probes,
            "partition": None if self._partition is None else self._partition.export(),
        }
        if s is not None:
            t = s.t_slice
            out["sample"] = {
                "indptr": t.indptr,
                "indices": t.indices,
                "values": t.values,
                "shape": list(t.shape),
                "alloc_version": s.alloc_version,
                "uses": s.uses,
                "k": s.k,
                "nnz": s.nnz,
                "factor": s.factor,
                "rest": None if s.rest is None else s.rest.export(),
            }
        return out

    def restore(self, d: dict) -> None:
        """Inverse of :meth:`export`; the state re-binds to the graph on first use."""
        self.ema = d["ema"]
        self.row_nnz = d["row_nnz"]
        self.fixed_nnz = int(d.get("fixed_nnz", 0))
        self.generation = int(d.get("generation", 0))
        self._generations = int(d.get("generations", self.generation))
        self._others = OrderedDict()
        self.stats.width = int(d["width"])
        self.ema_token = None
        self._sample = None
        self._gen, self._gen_state = None, d.get("generator")
        self.probes = int(d.get("probes", 0))
        part = d.get("partition")
        self._partition = None if part is None else Partition.restore(part)
        sd = d.get("sample")
        if sd is not None:
            t = CSR(sd["indptr"], sd["indices"], sd["values"], tuple(sd["shape"]), check=False)
            self._sample = Sample(None, int(sd.get("alloc_version", -1)), t, sd["k"], sd["nnz"],
                                  sd.get("factor"), uses=int(sd.get("uses", 0)))  # fmt: skip
            rest = sd.get("rest")
            if rest is not None:
                self._sample.rest = Groups.restore(rest, self._partition, int(sd["shape"][1]))

    def __repr__(self) -> str:
        rows = None if self.ema is None else self.ema.shape[0]
        return f"LayerState(index={self.index}, rows={rows}, cached={self._sample is not None})"
