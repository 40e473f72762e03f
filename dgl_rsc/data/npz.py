"""Graphs stored as one compressed numpy file (the format of ``shared/data``: Cora, CiteSeer,
tolokers).

Arrays: ``src``, ``dst`` (int edge list, possibly one direction per undirected edge and with
duplicates), ``feat (N, F)``, ``label (N,)`` int class ids, ``train_mask``, ``val_mask``,
``test_mask (N,)`` bool; optionally ``train_masks``, ``val_masks``, ``test_masks (S, N)``
holding ``S`` alternative splits.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch

from .graphdata import GraphData, clean_edges

__all__ = ["load_npz", "NPZ_ARRAYS"]

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
        ValueError: an array is missing or malformed, or ``split`` is out of range.
    """
    file = _resolve(path, root)
    if not file.is_file():
        raise FileNotFoundError(f"no dataset file at {file}; expected {_FORMAT}.")
    with np.load(file) as z:
        arrays = {k: z[k] for k in z.files}
    missing = [k for k in NPZ_ARRAYS if k not in arrays]
    if missing:
        raise ValueError(
            f"{file} lacks the array(s) {', '.join(missing)}; found "
            f"{', '.join(sorted(arrays))}; expected {_FORMAT}."
        )
    feat = torch.from_numpy(np.ascontiguousarray(arrays["feat"], dtype=np.float32))
    if feat.dim() != 2:
        raise ValueError(f"{file}: feat must be (N, F), got shape {tuple(feat.shape)}.")
    if normalize_features:
        total = feat.sum(1, keepdim=True)
        feat = feat / torch.where(total == 0, torch.ones_like(total), total)
    n = feat.shape[0]
    label = torch.from_numpy(np.asarray(arrays["label"]).astype(np.int64)).reshape(-1)
    masks = _masks(arrays, split, n, file)
    src = torch.from_numpy(np.asarray(arrays["src"]).astype(np.int64)).reshape(-1)
    dst = torch.from_numpy(np.asarray(arrays["dst"]).astype(np.int64)).reshape(-1)
    if src.numel() and int(torch.minimum(src.min(), dst.min())) < 0:
        raise ValueError(f"{file}: negative node ids in src/dst.")
    if src.numel() and int(torch.maximum(src.max(), dst.max())) >= n:
        raise ValueError(
            f"{file}: node ids reach {int(torch.maximum(src.max(), dst.max()))} "
            f"but feat has only N={n} rows."
        )
    src, dst = clean_edges(src, dst, n, symmetrize=True)
    num_classes = int(label.max()) + 1 if label.numel() else 0
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
        m = torch.from_numpy(np.asarray(m).astype(bool)).reshape(-1)
        if m.numel() != n:
            raise ValueError(f"{file}: the {name} mask has {m.numel()} entries, N={n}.")
        out.append(m)
    return out
