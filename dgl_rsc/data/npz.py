"""Graphs stored as one compressed numpy file (the format of ``shared/data``: Cora, CiteSeer,
tolokers).

Arrays: ``src``, ``dst`` (int edge list, possibly one direction per undirected edge and with
duplicates), ``feat (N, F)``, ``label (N,)`` int class ids, ``train_mask``, ``val_mask``,
``test_mask (N,)`` bool; optionally ``train_masks``, ``val_masks``, ``test_masks (S, N)``
holding ``S`` alternative splits.

The file is read with ``allow_pickle=False``: an array stored as pickled Python objects is
refused, and none of its code runs. Integer arrays may be stored as floats when every value
is a whole number (``3.0``); ``1.5`` as a class or node id is an error, as is a mask value
other than 0/1, a NaN or infinite feature, or more classes than nodes.
"""

from __future__ import annotations

import logging
import os
import zipfile
import zlib
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch

from .graphdata import GraphData, clean_edges

__all__ = ["load_npz", "NPZ_ARRAYS"]

log = logging.getLogger(__name__)

NPZ_ARRAYS = ("src", "dst", "feat", "label", "train_mask", "val_mask", "test_mask")
_FORMAT = (
    "a numpy .npz file with arrays src, dst (E,) int, feat (N, F) float, label (N,) int, "
    "train_mask, val_mask, test_mask (N,) bool, and optionally train_masks, val_masks, "
    "test_masks (S, N) bool"
)


def load_npz(
    path: Union[str, os.PathLike],
    split: int = 0,
    metric: Optional[str] = None,
    root: Optional[Union[str, os.PathLike]] = None,
    normalize_features: bool = False,
    device: Union[str, torch.device] = "cpu",
) -> GraphData:
    """Load a node-classification graph from an ``.npz`` file.

    Edges are symmetrized, de-duplicated and self-loops dropped. A graph with exactly two
    classes is a ``"binary"`` task scored by ROC-AUC (tolokers); otherwise ``"multiclass"``
    scored by accuracy.

    Args:
        path: the file; a relative path is taken relative to ``root`` when ``root`` is given,
            and ``.npz`` is appended when the name has no suffix.
        split: which of the ``S`` stored splits to use (row ``split`` of ``train_masks`` etc.)
            when the file holds them; otherwise only ``0`` (the ``*_mask`` arrays) is valid.
        metric: override the metric (``"accuracy"`` or ``"rocauc"``); ``None`` picks it as
            above.
        root: directory for a relative ``path``.
        normalize_features: divide each node's features by their sum (rows that sum to 0
            stay 0), as DGL's citation datasets and Kipf and Welling's GCN preprocessing do
            for the bag-of-words features of Cora and CiteSeer.
        device: where the returned tensors live.

    Returns:
        A :class:`GraphData` named after the file's stem (``"cora"``).

    Raises:
        FileNotFoundError: no such file (the message names the path and the format).
        ValueError: the file is not a readable npz (damaged, truncated, pickled objects),
            an array is missing or malformed, the values cannot train (see
            :class:`GraphData`), or ``split`` is out of range.
    """
    file = _resolve(path, root)
    if not file.is_file():
        raise FileNotFoundError(f"no dataset file at {file}; expected {_FORMAT}.")
    arrays = _read(file)
    missing = [k for k in NPZ_ARRAYS if k not in arrays]
    if missing:
        raise ValueError(
            f"{file} lacks the array(s) {', '.join(missing)}; found "
            f"{', '.join(sorted(arrays))}; expected {_FORMAT}."
        )
    if arrays["feat"].dtype.kind not in "biuf":
        raise ValueError(f"{file}: feat must hold numbers, got dtype {arrays['feat'].dtype}.")
    with np.errstate(over="ignore"):  # a float64 beyond float32's range: caught as infinite
        feat = torch.from_numpy(np.ascontiguousarray(arrays["feat"], dtype=np.float32))
    if feat.dim() != 2:
        raise ValueError(f"{file}: feat must be (N, F), got shape {tuple(feat.shape)}.")
    n = feat.shape[0]
    if normalize_features and bool(torch.isfinite(feat).all()):
        total = feat.sum(1, keepdim=True)
        feat = feat / torch.where(total == 0, torch.ones_like(total), total)
    label = _integers(arrays["label"], "label", file)
    masks = _masks(arrays, split, n, file)
    src, dst = _integers(arrays["src"], "src", file), _integers(arrays["dst"], "dst", file)
    if src.numel() and int(torch.minimum(src.min(), dst.min())) < 0:
        raise ValueError(f"{file}: negative node ids in src/dst.")
    if src.numel() and int(torch.maximum(src.max(), dst.max())) >= n:
        raise ValueError(
            f"{file}: node ids reach {int(torch.maximum(src.max(), dst.max()))} "
            f"but feat has only N={n} rows."
        )
    src, dst = clean_edges(src, dst, n, symmetrize=True)
    num_classes = _num_classes(label, n, file)
    binary = num_classes == 2
    if metric is None:
        metric = "rocauc" if binary else "accuracy"
    elif metric not in ("accuracy", "rocauc"):
        raise ValueError(f"metric={metric!r}; an npz graph takes 'accuracy' or 'rocauc'.")
    data = GraphData(
        src,
        dst,
        n,
        feat,
        label,
        *masks,
        task="binary" if binary else "multiclass",
        metric=metric,
        num_classes=num_classes,
        name=file.stem,
    )
    return data.to(device)


def _read(file: Path) -> dict:
    """Every array of the npz ``file`` (no pickles); a damaged file is a ``ValueError``."""
    try:
        archive = np.load(file, allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise ValueError("it holds a single array (.npy), not named arrays")
        with archive:
            return {k: archive[k] for k in archive.files}
    except (ValueError, OSError, EOFError, zlib.error, zipfile.BadZipFile) as exc:
        raise ValueError(
            f"{file} cannot be read as an npz archive ({type(exc).__name__}: {exc}); it is "
            f"damaged, truncated or of another format: re-create it as {_FORMAT}."
        ) from None


def _integers(arr: np.ndarray, name: str, file: Path) -> torch.Tensor:
    """``arr`` as a 1-D int64 tensor; whole-number floats are accepted, others refused."""
    arr = np.asarray(arr).reshape(-1)
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            value = arr[i].item()  # a Python float: NumPy 2 writes np.float64(...) otherwise
            raise ValueError(f"{file}: {name} must hold integers, but entry {i} is {value!r}; "
                             f"store whole numbers (ids, class ids) in {name}.")  # fmt: skip
    elif arr.dtype.kind not in "biu":
        raise ValueError(f"{file}: {name} must hold integers, got dtype {arr.dtype}.")
    if arr.size and (arr.max() > np.iinfo(np.int64).max or arr.min() < np.iinfo(np.int64).min):
        raise ValueError(f"{file}: {name} holds values beyond the int64 range.")
    return torch.from_numpy(arr.astype(np.int64))


def _num_classes(label: torch.Tensor, n: int, file: Path) -> int:
    """``max(label) + 1``, refusing more classes than nodes (ids far from 0..C-1)."""
    if not label.numel():
        return 0
    if int(label.min()) < 0:
        i = int((label < 0).nonzero()[0, 0])
        raise ValueError(f"{file}: label {int(label[i])} of node {i} is negative; labels "
                         "must be class ids 0..C-1.")  # fmt: skip
    classes = int(label.max()) + 1
    if classes > n:
        raise ValueError(
            f"{file}: the largest label is {classes - 1} but there are only {n} nodes, so the "
            f"labels are not class ids 0..C-1; renumber them (numpy.unique(label, "
            "return_inverse=True) gives such ids)."
        )
    unused = classes - int(torch.unique(label).numel())
    if unused:
        log.warning("%s: %d of the class ids 0..%d have no node", file, unused, classes - 1)
    return classes


def _resolve(path, root) -> Path:
    file = Path(path).expanduser()
    if not file.is_absolute() and root is not None:
        file = Path(root).expanduser() / file
    if file.suffix == "":
        file = file.with_suffix(".npz")
    return file


def _masks(arrays: dict, split: int, n: int, file: Path) -> list:
    stacked = all(f"{s}_masks" in arrays for s in ("train", "val", "test"))
    if stacked:
        count = int(np.asarray(arrays["train_masks"]).shape[0])
        if not 0 <= split < count:
            raise ValueError(f"split={split} but {file} holds {count} splits (0..{count - 1}).")
        picked = [np.asarray(arrays[f"{s}_masks"])[split] for s in ("train", "val", "test")]
    elif split != 0:
        raise ValueError(
            f"split={split} but {file} holds one split (no train_masks array); " "use split=0."
        )
    else:
        picked = [arrays[f"{s}_mask"] for s in ("train", "val", "test")]
    out = []
    for name, m in zip(("train", "val", "test"), picked):
        m = np.asarray(m).reshape(-1)
        if m.dtype != bool and not (m.dtype.kind in "biuf" and np.isin(m, (0, 1)).all()):
            raise ValueError(f"{file}: the {name} mask must hold booleans (or 0/1), got "
                             f"{m.dtype} values such as {m[~np.isin(m, (0, 1))][:3]}.")  # fmt: skip
        if m.size != n:
            raise ValueError(f"{file}: the {name} mask has {m.size} entries, N={n}.")
        out.append(torch.from_numpy(m.astype(bool)))
    return out
