"""Checkpoints of one training run and atomic file writes.

A checkpoint holds the model, the optimizer, the AMP scaler, the RSC controller's state, the
RNG states (torch, CUDA, numpy, Python ``random``), the epoch and the metrics so far. It holds
tensors, numbers, strings and containers only, so it loads with
``torch.load(weights_only=True)``: the Python ``random`` state (a tuple of 625 ints) and
numpy's state are stored as int64 tensors.
"""

from __future__ import annotations

import os
import random
import tempfile
from typing import Any, Callable, Optional

import numpy as np
import torch

__all__ = [
    "atomic_write",
    "atomic_write_text",
    "rng_state",
    "set_rng_state",
    "save_checkpoint",
    "load_checkpoint",
]


def atomic_write(path: str, write: Callable[[Any], None], mode: str = "wb") -> None:
    """Call ``write(file)`` on a temporary file next to ``path``, then rename it over
    ``path`` (``os.replace``): readers see the old file or the new one, never a torn one."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix="-" + os.path.basename(path), dir=folder)
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def atomic_write_text(path: str, text: str) -> None:
    """:func:`atomic_write` of a UTF-8 string."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def rng_state() -> dict:
    """Every RNG state the training loop draws from, as tensors and ints."""
    version, internal, gauss = random.getstate()
    # the global numpy RNG is what third-party code draws from: save it as it is
    kind, keys, pos, has_gauss, cached = np.random.get_state()  # noqa: NPY002
    state = {
        "torch": torch.get_rng_state(),
        "python": {
            "version": int(version),
            "internal": torch.tensor(internal, dtype=torch.int64),
            "gauss": gauss,  # None or float
        },
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Inverse of :func:`rng_state`."""
    torch.set_rng_state(state["torch"].cpu())
    py = state["python"]
    random.setstate(
        (py["version"], tuple(int(x) for x in py["internal"].cpu().tolist()), py["gauss"])
    )
    npy = state["numpy"]
    keys = npy["keys"].cpu().numpy().astype(np.uint32)
    np.random.set_state((npy["kind"], keys, npy["pos"], npy["has_gauss"], npy["cached"]))  # noqa: NPY002
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def save_checkpoint(
    path: str,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    controller=None,
    scaler: Optional[torch.cuda.amp.GradScaler] = None,
    epoch: int,
    extra: Optional[dict] = None,
) -> None:
    """Write the state after ``epoch`` epochs (atomically). ``extra``: metrics and the like,
    made of tensors, numbers, strings, lists and dicts only."""
    state = {
        "format": 1,
        "epoch": int(epoch),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "controller": None if controller is None else controller.state_dict(),
        "scaler": None if scaler is None else scaler.state_dict(),
        "rng": rng_state(),
        "extra": extra or {},
    }
    atomic_write(path, lambda f: torch.save(state, f))


def load_checkpoint(path: str, map_location="cpu") -> dict:
    """Read a checkpoint written by :func:`save_checkpoint` (``weights_only=True``); its
    tensors land on ``map_location`` (the RNG states are moved back to the CPU on use)."""
    return torch.load(path, map_location=map_location, weights_only=True)
