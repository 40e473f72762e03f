"""Measuring the alpha-beta cost model of :mod:`.bitwidth` over a process group: timed
ping-pongs of a few message sizes between rank 0 and every other rank, fitted by least
squares (``t(bytes) = alpha + beta * bytes``) and broadcast, so every rank uses one model."""

from __future__ import annotations

import logging
import time as _time
from datetime import timedelta
from typing import Sequence

import numpy as np
import torch
import torch.distributed as dist

from .bitwidth import CostModel

__all__ = ["calibrate"]

_log = logging.getLogger(__name__)


def _wait(work, timeout, what):
    try:
        ok = work.wait(timeout=timeout)
    except RuntimeError as exc:
        raise RuntimeError(f"calibrate: {what} failed or timed out after {timeout}: {exc}") from exc
    if ok is False:
        raise RuntimeError(f"calibrate: {what} timed out after {timeout}.")


_WARMUP = 3  # round trips per peer and size that are not timed (connection set-up, caches)


def _round_trips(buf, other, first, group, limit, what, repeats):
    """One-way times (half round trips) of ``repeats`` timed ping-pongs with global rank
    ``other``, after ``_WARMUP`` untimed ones; ``first`` sends first."""
    times = []
    for _ in range(_WARMUP + repeats):
        t0 = _time.perf_counter()
        for send in (True, False) if first else (False, True):
            _wait((dist.isend if send else dist.irecv)(buf, other, group=group), limit, what)
        if buf.is_cuda:
            torch.cuda.synchronize(buf.device)
        times.append((_time.perf_counter() - t0) / 2)
    return times[_WARMUP:]


def calibrate(
    group=None,
    sizes: Sequence[int] = (1 << 10, 1 << 16, 1 << 20, 1 << 22),
    repeats: int = 5,
    timeout: float = 60.0,
    device=None,
) -> CostModel:
    """Measure ``alpha`` and ``beta`` over the process group ``group`` (all ranks call it).

    Rank 0 ping-pongs ``repeats`` times (after 3 warm-ups) with every other rank for each
    message size in ``sizes`` (bytes); half the median round trip is the one-way time. A
    least-squares line through (bytes, seconds) gives ``alpha`` (intercept, clamped at 0) and
    ``beta`` (slope, clamped at 0); rank 0 broadcasts them, so every rank returns the same
    model. Tensors live on ``device`` (default: CUDA for NCCL, CPU otherwise). Every wait has
    ``timeout`` seconds and an error naming the ranks.
    """
    if not dist.is_initialized():
        raise RuntimeError("calibrate needs torch.distributed.init_process_group() first.")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if world < 2:
        raise ValueError(
            "calibrate needs at least 2 ranks; with one process pass "
            "CostModel(alpha, beta) directly."
        )
    if len(sizes) < 2 or len(set(sizes)) < 2 or min(sizes) < 1 or repeats < 1:
        raise ValueError(
            f"need >= 2 distinct positive sizes and repeats >= 1; got sizes="
            f"{tuple(sizes)}, repeats={repeats}."
        )
    if device is None:
        device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
    device, limit = torch.device(device), timedelta(seconds=timeout)
    glob = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
    points = []
    for peer in range(1, world):
        if rank not in (0, peer):
            continue
        other = peer if rank == 0 else 0
        for n in sizes:
            buf = torch.zeros(int(n), dtype=torch.uint8, device=device)
            what = f"ping-pong of {n} bytes between ranks {rank} and {other}"
            times = _round_trips(buf, glob(other), rank == 0, group, limit, what, repeats)
            points.append((float(n), float(np.median(times))))
    model = torch.zeros(2, dtype=torch.float64, device=device)
    if rank == 0:
        x, y = np.array(points).T
        beta = float(np.polyfit(x, y, 1)[0])
        alpha = float(np.mean(y) - beta * np.mean(x))
        if alpha < 0 or beta < 0:
            _log.warning(
                "calibrate: fit alpha=%g, beta=%g clamped at 0 (noisy timings)", alpha, beta
            )
        model[0], model[1] = max(alpha, 0.0), max(beta, 0.0)
    _wait(
        dist.broadcast(model, glob(0), group=group, async_op=True),
        limit,
        f"broadcast of the cost model to rank {rank}",
    )
    return CostModel(float(model[0]), float(model[1]))
