"""``LayerState``: one approximated product's scores, allocation, cached sample and counters."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

from .backends import resolve
from .csr import CSR
from .products import NO_SCALES, Scales, csr_mm, csr_t_mm

if TYPE_CHECKING:
    from .controller import RSCController

__all__ = [
    "LayerState",
    "Sample",
    "apply_scale",
    "draw_sample",
    "mass_scale",
    "row_norms",
    "sample_product",
]

# Per-step counters stay on the device (no host sync per step) and are folded into plain
# numbers every this many approximated products, or when stats() is asked for.
_FOLD_EVERY = 256


@dataclass
class Sample:
    """A cached row sample: ``A[S, :]^T`` as a CSR of shape ``(N, M)`` plus bookkeeping.

    The slice keeps ``A``'s values (or none); the sampled product is
    ``factor * diag(c) A[S]^T diag(r) dY`` with ``A``'s scales applied at product time.
    """

    token: Optional[int]  # structure token of the A it was cut from
    epoch: tuple  # (cache epoch, allocation version)
    t_slice: CSR
    k: torch.Tensor  # 0-dim, rows kept
    nnz: torch.Tensor  # 0-dim, non-zeros kept
    factor: Optional[torch.Tensor] = None  # 0-dim scale of the sampled product, or None
    mask: Optional[torch.Tensor] = None  # (M,) bool, the kept rows


def row_norms(A: CSR, scales: Scales = NO_SCALES, skip_diagonal: bool = False) -> torch.Tensor:
    """``(M,)`` float32 ``||(diag(r) A diag(c))[i, :]||_2``: the rows of the normalized matrix
    (without their diagonal entry when ``skip_diagonal``)."""
    col = scales.score_col()
    diag = A.diagonal() if skip_diagonal else None
    if col is None and diag is None:
        base = A.row_norms()
    else:
        sq = None if A.values is None else A.values.detach().float().square()
        if diag is not None:
            off = (~diag[0]).float()
            sq = off if sq is None else sq * off
        c2 = torch.ones(A.shape[1], 1) if col is None else col.detach().float().square()
        base = csr_mm(A.with_values(sq), c2.reshape(-1, 1).to(A.device)).squeeze(1)
        base = base.clamp(min=0).sqrt()
    r = scales.row_factor()
    return base if r is None else base * r.detach().float().abs()


def draw_sample(
    A: CSR,
    dY: torch.Tensor,
    nnz_budget: int,
    rule: str,
    min_k: int,
    backend,
    rescale: str = "none",
    scales: Scales = NO_SCALES,
    diagonal: str = "sample",
) -> Sample:
    """Score rows, select them under ``nnz_budget`` and cut ``A[S, :]^T``.

    Args:
        A: ``(M, N)`` sparse matrix (scaled by ``scales`` in the product).
        dY: ``(M, D)`` output gradient.
        rescale: ``"mass"`` sets :func:`mass_scale` as the sample's factor; ``"ls"`` and
            ``"none"`` leave it unset (the least-squares factor needs the product: see
            :func:`apply_scale`).
        diagonal: ``"exact"`` keeps every diagonal (self-loop) entry in the slice, so its
            term is computed exactly, and samples rows of the off-diagonal part with what is
            left of the budget; ``"sample"`` treats it like any other entry.
    Returns:
        A :class:`Sample` (token and epoch unset) with ``scores (M,)`` as attribute ``scores``.
    """
    diag = A.diagonal() if diagonal == "exact" else None
    row_nnz = A.row_nnz() if diag is None else A.row_nnz() - diag[1]
    budget = int(nnz_budget) - (0 if diag is None else int(diag[1].sum()))
    scores = backend.row_scores(row_norms(A, scales, skip_diagonal=diag is not None), dY)
    from .backends.torch_ref import selection_key

    key = selection_key(scores, row_nnz, rule)
    mask, k = backend.select_rows(key, row_nnz, max(budget, 0), min_k)
    t_indptr, t_rows, perm = A.transposed()
    t_vals = None if A.values is None else A.values.detach()[perm]
    keep = None if diag is None else diag[2]
    s_indptr, s_idx, s_vals = backend.slice_transposed(t_indptr, t_rows, t_vals, mask, keep)
    factor = mass_scale(scores, mask) if rescale == "mass" else None
    t_slice = CSR(s_indptr, s_idx, s_vals, (A.shape[1], A.shape[0]), check=False)
    sample = Sample(None, (), t_slice, k, s_indptr[-1].long(), factor, mask)
    sample.scores = scores
    return sample


def sample_product(A: CSR, sample: Sample, dY: torch.Tensor, scales: Scales) -> torch.Tensor:
    """``(N, D)`` ``factor * diag(c) A[S]^T diag(r) dY``; the output comes from the pool of
    ``A``'s transposed structure, like the exact backward's."""
    ts = scales.transposed()
    row = ts.row
    if sample.factor is not None:
        f = sample.factor.to(dY.dtype if dY.is_floating_point() else torch.float32)
        row = f.expand(A.shape[1]) if row is None else row * f
    return csr_mm(sample.t_slice, dY, Scales(row, ts.col), pool=A.transpose_pool())


def apply_scale(
    A: CSR, sample: Sample, dY: torch.Tensor, scales: Scales, out: torch.Tensor, rescale: str,
    probe_rows: int, generator, diagonal: str = "sample",
) -> torch.Tensor:  # fmt: skip
    """After the first product with a fresh ``"ls"`` sample: estimate its least-squares factor
    from ``out (N, D)`` (:func:`dgl_rsc.scale.estimate_ls_scale`), store it in the sample for
    the steps that reuse it, and scale ``out`` in place. Other modes: ``out`` unchanged."""
    if rescale != "ls" or sample.factor is not None:
        return out
    from .scale import estimate_ls_scale

    c = estimate_ls_scale(A, dY, scales, out, sample.scores, sample.mask, probe_rows, generator,
                          skip_diagonal=diagonal == "exact")  # fmt: skip
    sample.factor = c
    return out.mul_(c.to(out.dtype))


def mass_scale(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """0-dim ``sum(scores) / sum(scores[mask])`` over finite scores; 1 when the kept mass is 0.

    Stays on the device (no host synchronization). With every useful row kept it is exactly 1.
    """
    finite = torch.nan_to_num(scores.float(), nan=0.0, posinf=0.0, neginf=0.0)
    total = finite.sum()
    kept = torch.where(mask, finite, torch.zeros_like(finite)).sum()
    return torch.where(kept > 0, total / kept.clamp(min=1e-30), torch.ones_like(total))


class LayerState:
    """State of layer ``index`` of a controller.

    Holds the running-average row scores, the non-zero budget the solver gave the layer,
    the cached sample and statistics. Cleared by :meth:`clear_cache`.
    """

    def __init__(self, controller: RSCController, index: int):
        self.controller = controller
        self.index = index
        self.ema: Optional[torch.Tensor] = None
        self.ema_token: Optional[int] = None
        self.row_nnz: Optional[torch.Tensor] = None
        self.fixed_nnz = 0
        self.width = 0
        self.nnz_budget: Optional[int] = None
        self._sample: Optional[Sample] = None
        self._gen: Optional[torch.Generator] = None
        self._gen_state: Optional[torch.Tensor] = None
        self.reset_stats()

    def reset_stats(self):
        self.hits = 0
        self.misses = 0
        self.approx_calls = 0
        self.exact_calls = 0
        self.nnz_visited = 0  # accumulated lazily from tensors
        self.nnz_exact = 0
        self._pending_nnz: list[torch.Tensor] = []
        self._timers: list = []
        self.select_seconds = 0.0
        self.last_k: Optional[torch.Tensor] = None
        self.last_rows = 0

    def clear_cache(self):
        """Drop the cached sample (the next approximate backward re-samples)."""
        self._sample = None

    def cache_bytes(self) -> int:
        return 0 if self._sample is None else self._sample.t_slice.nbytes()

    # -- the backward product ----------------------------------------------------------
    def backward_product(self, A: CSR, dY: torch.Tensor, scales: Scales = NO_SCALES):
        """``(N, D)`` approximation of ``A^T @ dY`` for ``A (M, N)``, ``dY (M, D)`` (with
        ``A``'s row and column scales)."""
        ctl = self.controller
        phase = ctl.phase()
        self._bind(A)
        self.width = dY.shape[1]
        self.last_rows = A.shape[0]
        self.nnz_exact += A.nnz
        if phase == "exact":
            self.exact_calls += 1
            self.nnz_visited += A.nnz
            return csr_t_mm(A, dY, scales)
        if phase == "warmup":
            self.exact_calls += 1
            self.nnz_visited += A.nnz
            cfg = ctl.config
            backend = resolve(cfg.backend, dY.device)
            skip = cfg.diagonal == "exact" and A.diagonal() is not None
            self._record(A, backend.row_scores(row_norms(A, scales, skip), dY))
            return csr_t_mm(A, dY, scales)
        self.approx_calls += 1
        epoch = (ctl.cache_epoch(), ctl.alloc_version)
        s = self._sample
        fresh = not (s is not None and s.token == A.token and s.epoch == epoch)
        if fresh:
            self.misses += 1
            s = self._refresh(A, dY, epoch, scales)
        else:
            self.hits += 1
        self._pending_nnz.append(s.nnz)
        if len(self._pending_nnz) >= _FOLD_EVERY:
            self._fold()  # bounded memory when stats() is never asked for
        out = sample_product(A, s, dY, scales)
        if fresh:
            cfg = ctl.config
            out = apply_scale(A, s, dY, scales, out, cfg.rescale, cfg.probe_rows,
                              self._generator(dY.device), cfg.diagonal)  # fmt: skip
            del s.scores  # only the refresh needs them
        return out

    def _generator(self, device: torch.device) -> torch.Generator:
        """This layer's generator for the scale's probe rows (seeded from the config's seed
        and the layer index; on ``device``)."""
        if self._gen is None or self._gen.device != torch.device(device):
            seed = self.controller.config.seed * 1_000_003 + self.index
            self._gen = torch.Generator(device=device).manual_seed(seed)
            if self._gen_state is not None and self._gen.device.type == "cpu":
                self._gen.set_state(self._gen_state)
            self._gen_state = None
        return self._gen

    def _bind(self, A: CSR):
        """After a checkpoint restore, adopt the first matrix of the saved shape."""
        if self.ema is not None and self.ema_token is None and self.ema.shape[0] == A.shape[0]:
            self.ema_token = A.token
        s = self._sample
        if s is not None and s.token is None and s.t_slice.shape == (A.shape[1], A.shape[0]):
            s.token = A.token

    def export(self) -> dict:
        """Tensors and numbers describing this layer (for checkpoints)."""
        s = self._sample
        out = {
            "ema": self.ema,
            "row_nnz": self.row_nnz,
            "fixed_nnz": self.fixed_nnz,
            "width": self.width,
            "nnz_budget": -1 if self.nnz_budget is None else self.nnz_budget,
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
        self.width = int(d["width"])
        self.nnz_budget = None if int(d["nnz_budget"]) < 0 else int(d["nnz_budget"])
        self.ema_token = None
        self._sample = None
        self._gen, self._gen_state = None, d.get("generator")
        sd = d.get("sample")
        if sd is not None:
            t = CSR(sd["indptr"], sd["indices"], sd["values"], tuple(sd["shape"]), check=False)
            epoch = tuple(int(e) for e in sd["epoch"])
            self._sample = Sample(None, epoch, t, sd["k"], sd["nnz"], sd.get("factor"))

    def _refresh(self, A: CSR, dY: torch.Tensor, epoch, scales: Scales) -> Sample:
        ctl = self.controller
        cfg = ctl.config
        backend = resolve(cfg.backend, dY.device)
        if self.nnz_budget is not None and self.ema_token == A.token:
            budget = self.nnz_budget + self.fixed_nnz
        else:
            budget = int(cfg.budget * A.nnz)
        timer = _Timer(dY.device)
        sample = draw_sample(
            A, dY, budget, cfg.rule, cfg.min_k, backend, cfg.rescale, scales, cfg.diagonal
        )
        self._timers.append(timer.stop())
        self._record(A, sample.scores)
        sample.token, sample.epoch = A.token, epoch
        self.last_k = sample.k
        self._sample = sample
        return sample

    def _record(self, A: CSR, scores: torch.Tensor):
        """Fold fresh scores into the running average (reset when the graph changes)."""
        scores = torch.nan_to_num(scores.detach(), nan=0.0, posinf=0.0)
        if self.ema is None or self.ema_token != A.token or self.ema.shape != scores.shape:
            self.ema = scores.clone()
            self.ema_token = A.token
            diag = A.diagonal() if self.controller.config.diagonal == "exact" else None
            # the solver shares out the sampled (off-diagonal) non-zeros; a diagonal applied
            # exactly is a fixed cost of every step
            self.row_nnz = A.row_nnz() if diag is None else A.row_nnz() - diag[1]
            self.fixed_nnz = 0 if diag is None else int(diag[1].sum())
            self.nnz_budget = None
        else:
            w = self.controller.config.ema
            self.ema.mul_(1 - w).add_(scores, alpha=w)

    # -- statistics --------------------------------------------------------------------
    def _fold(self) -> None:
        """Add the counters kept as device tensors / CUDA events into plain numbers."""
        if self._pending_nnz:
            self.nnz_visited += int(torch.stack(self._pending_nnz).sum())
            self._pending_nnz = []
        if self._timers:
            self.select_seconds += sum(t.seconds() for t in self._timers)
            self._timers = []

    def stats(self) -> dict:
        """Plain numbers (synchronizes with the device once)."""
        self._fold()
        return {
            "layer": self.index,
            "rows": self.last_rows,
            "k": None if self.last_k is None else int(self.last_k),
            "width": self.width,
            "nnz_budget": self.nnz_budget,
            "nnz_visited": self.nnz_visited,
            "nnz_exact": self.nnz_exact,
            "visited_fraction": self.nnz_visited / self.nnz_exact if self.nnz_exact else 1.0,
            "approx_calls": self.approx_calls,
            "exact_calls": self.exact_calls,
            "cache_hits": self.hits,
            "cache_misses": self.misses,
            "cache_bytes": self.cache_bytes(),
            "select_seconds": self.select_seconds,
        }


class _Timer:
    """Wall time of a region; on CUDA through events, read only when stats are asked for."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.end = torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self) -> _Timer:
        if self.cuda:
            self.end.record()
        else:
            self.elapsed = time.perf_counter() - self.t0
        return self

    def seconds(self) -> float:
        if self.cuda:
            self.end.synchronize()
            return self.start.elapsed_time(self.end) / 1000.0
        return self.elapsed
