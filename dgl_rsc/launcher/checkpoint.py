"""The output directory's manifest, and checkpoints of one training run. Every file is
written atomically (:mod:`dgl_rsc.base.atomic`).

Every file a run writes into its output directory is listed, before it is written, in the
directory's manifest ``.dgl-rsc-manifest.json``. ``--force`` removes only what the manifest
lists (and only names of the launcher's own outputs, inside the directory), so a user's files
and other runs are never touched.

A checkpoint holds the model, the optimizer, the AMP scaler, the RSC controller's state, the
RNG states (torch, CUDA, numpy, Python ``random``), the epoch and the metrics so far. It holds
tensors, numbers, strings and containers only, so it loads with
``torch.load(weights_only=True)``: the Python ``random`` state (a tuple of 625 ints) and
numpy's state are stored as int64 tensors. A file that needs more than that is refused
without running any of its code.
"""

from __future__ import annotations

import json
import os
import random
import re
from typing import Optional

import numpy as np
import torch

from ..base.atomic import TMP_PREFIX, OutputWriteError, atomic_write, atomic_write_text

__all__ = [
    "MANIFEST",
    "LOCK",
    "OutputWriteError",
    "atomic_write",
    "atomic_write_text",
    "claim",
    "manifest_files",
    "foreign_entries",
    "remove_owned",
    "remove_stale_temps",
    "rng_state",
    "set_rng_state",
    "save_checkpoint",
    "load_checkpoint",
]

MANIFEST = ".dgl-rsc-manifest.json"
LOCK = ".dgl-rsc-lock"  # the output directory's lock (dgl_rsc.launcher.lock)
#: the relative paths a manifest may list: the launcher's own outputs, nothing else
OUTPUTS = re.compile(
    r"(config\.yaml|run\.json|int8_pick\.json|results\.json|metrics\.csv|summary\.png|table\.txt"
    r"|runs/[\w.-]+\.json|checkpoints/[\w.-]+\.pt)"
)
_TEMP = re.compile(re.escape(TMP_PREFIX) + r"[0-9a-f]{16}-[\w.-]+")
_SUBDIRS = ("runs", "checkpoints")
_KEYS = ("format", "epoch", "model", "optimizer", "controller", "scaler", "rng", "extra")


# -- the manifest --------------------------------------------------------------------------
def manifest_files(out_dir: str) -> Optional[list]:
    """The relative paths listed in ``out_dir``'s manifest; ``None`` when it has none (or
    one that is not a dgl-rsc manifest)."""
    path = os.path.join(out_dir, MANIFEST)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    files = data.get("files") if isinstance(data, dict) and data.get("tool") == "dgl-rsc" else None
    if not isinstance(files, list):
        return None
    return [f for f in files if isinstance(f, str)]


def claim(out_dir: str, *paths: str) -> None:
    """List ``paths`` (inside ``out_dir``) in its manifest before they are written."""
    files = manifest_files(out_dir) or []
    rel = [os.path.relpath(p, out_dir).replace(os.sep, "/") for p in paths]
    new = [r for r in rel if r not in files]
    bad = [r for r in new if not OUTPUTS.fullmatch(r)]
    if bad:
        raise ValueError(f"{bad} are not names of dgl-rsc outputs; nothing was written.")
    if new or not os.path.exists(os.path.join(out_dir, MANIFEST)):
        _write_manifest(out_dir, files + new)


def _write_manifest(out_dir: str, files: list) -> None:
    text = json.dumps({"tool": "dgl-rsc", "format": 1, "files": files}, indent=1)
    atomic_write_text(os.path.join(out_dir, MANIFEST), text)


def _owned_path(out_dir: str, rel: str) -> Optional[str]:
    """The file ``rel`` names when it is one of our outputs, a regular file (not a link)
    and inside ``out_dir`` after resolving links; otherwise ``None``."""
    if not OUTPUTS.fullmatch(rel):
        return None
    path = os.path.join(out_dir, *rel.split("/"))
    root = os.path.realpath(out_dir)
    real = os.path.realpath(path)
    inside = os.path.commonpath([root, real]) == root
    return path if inside and os.path.isfile(path) and not os.path.islink(path) else None


def remove_owned(out_dir: str) -> list:
    """Remove the files ``out_dir``'s manifest lists (see :func:`_owned_path`), our stale
    temporary files and then-empty ``runs/``/``checkpoints/``, and empty the manifest;
    returns the removed paths."""
    removed = remove_stale_temps(out_dir)
    listed = manifest_files(out_dir)
    for rel in listed or []:
        path = _owned_path(out_dir, rel)
        if path is not None:
            os.remove(path)
            removed.append(path)
    if listed is not None:
        _write_manifest(out_dir, [])
    for sub in _SUBDIRS:
        path = os.path.join(out_dir, sub)
        if os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path):
            os.rmdir(path)
    return removed


def remove_stale_temps(out_dir: str) -> list:
    """Remove temporary files a killed write left in ``out_dir``, ``runs/`` and
    ``checkpoints/`` (names :func:`atomic_write` makes, regular files only)."""
    removed = []
    for folder in (out_dir, *(os.path.join(out_dir, s) for s in _SUBDIRS)):
        if not os.path.isdir(folder) or (os.path.islink(folder) and folder != out_dir):
            continue
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            if _TEMP.fullmatch(name) and os.path.isfile(path) and not os.path.islink(path):
                os.remove(path)
                removed.append(path)
    return removed


def foreign_entries(out_dir: str) -> list:
    """What ``out_dir`` holds that dgl-rsc did not write (relative paths, sorted); entries
    of ``runs/`` and ``checkpoints/`` are listed one by one."""
    owned = {r for r in manifest_files(out_dir) or [] if _owned_path(out_dir, r)}
    owned.update((MANIFEST, LOCK))
    out = []
    for name in sorted(os.listdir(out_dir)):
        path = os.path.join(out_dir, name)
        if name in _SUBDIRS and os.path.isdir(path) and not os.path.islink(path):
            out += [f"{name}/{n}" for n in sorted(os.listdir(path)) if f"{name}/{n}" not in owned]
        elif name not in owned and not _TEMP.fullmatch(name):
            out.append(name)
    return out


# -- checkpoints ---------------------------------------------------------------------------
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
    """Read a checkpoint written by :func:`save_checkpoint` (``weights_only=True``: a file
    that would run code is refused, and nothing of it runs); its tensors land on
    ``map_location`` (the RNG states are moved back to the CPU on use).

    Raises:
        ValueError: the file is empty, truncated, not a torch file, needs more than
            weights-only loading, or lacks a checkpoint's keys (the message says which).
    """
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises many types for damaged or foreign files
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        reason = f"{type(exc).__name__}: {first}" if first else f"{type(exc).__name__}, empty?"
        raise ValueError(f"checkpoint {path} cannot be read safely ({reason})") from None
    missing = [k for k in _KEYS if not isinstance(state, dict) or k not in state]
    if missing or state["format"] != 1:
        raise ValueError(
            f"checkpoint {path} is not a dgl-rsc checkpoint (format 1); it lacks "
            f"{', '.join(missing) or 'nothing but has format ' + repr(state['format'])}"
        )
    return state
