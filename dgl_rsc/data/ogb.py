"""OGB node-property-prediction graphs (ogbn-arxiv, ogbn-products, ogbn-proteins) through
OGB's own ``DglNodePropPredDataset`` and its official split, offline-safe.

OGB downloads (and asks on stdin) when its files are missing; here the files are checked
first and a ``FileNotFoundError`` says which ones to put where. The on-disk layout is OGB's:
``<root>/<name with '-' -> '_'>/`` holding ``RELEASE_v<version>.txt``, ``raw/*.csv.gz`` (or an
already processed ``processed/dgl_data_processed``) and ``split/<scheme>/{train,valid,test}
.csv.gz``, which is what unzipping OGB's archive and renaming its folder gives.

The split is read here, never by OGB: OGB's ``get_idx_split`` unpickles ``split_dict.pt``
with ``torch.load`` (no ``weights_only``), so a crafted file there would run code. The CSVs
are read when present; otherwise ``split_dict.pt`` is loaded with ``weights_only=True`` and
refused when it holds anything but tensors (nothing of it runs). OGB's other files are CSVs
and DGL's binary graph format, which hold no Python objects.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
from pathlib import Path
from typing import Optional, Union

import torch

from ..base import _deps
from .graphdata import GraphData, clean_edges

__all__ = ["OGB_DATASETS", "load_ogb", "ogb_files", "read_split", "evaluate"]

logger = logging.getLogger(__name__)

OGB_DATASETS = ("ogbn-arxiv", "ogbn-products", "ogbn-proteins")
_SPLITS = ("train", "valid", "test")


def _nodeproppred():
    """``ogb.nodeproppred``, or an ``ImportError`` that says how to install it."""
    module, reason = _deps._probe("ogb.nodeproppred")
    if module is None:
        raise ImportError(
            f"ogb is required for the OGB datasets but is not usable ({reason}). "
            "Install it with `pip install ogb>=1.3` (extra: dgl-rsc[ogb])."
        )
    return module


@functools.cache
def _meta(name: str) -> dict:
    """OGB's ``master.csv`` column of ``name`` (version, split scheme, files, url)."""
    import pandas as pd  # a dependency of ogb, present whenever ogb is

    master = Path(_nodeproppred().__file__).with_name("master.csv")
    return dict(pd.read_csv(master, index_col=0, keep_default_na=False)[name])


def _check_name(name: str) -> None:
    if name not in OGB_DATASETS:
        raise ValueError(f"{name!r} is not a supported OGB dataset; choose from {OGB_DATASETS}.")


def ogb_files(name: str, root: Union[str, os.PathLike]) -> tuple[Path, list[Path]]:
    """The dataset folder OGB will read and the files it still lacks there.

    Args:
        name: ``"ogbn-arxiv"``, ``"ogbn-products"`` or ``"ogbn-proteins"``.
        root: the ``root`` given to OGB.

    Returns:
        ``(folder, missing)``: ``missing`` is empty when OGB can load without downloading.
    """
    _check_name(name)
    meta = _meta(name)
    folder = Path(root).expanduser() / name.replace("-", "_")
    if Path(f"{folder}_dgl").exists():  # OGB prefers a folder from an older DGL download
        folder = Path(f"{folder}_dgl")
    required = [folder / f"RELEASE_v{meta['version']}.txt"]
    if not (folder / "processed" / "dgl_data_processed").exists():
        raw = folder / "raw"
        names = ["edge", "num-node-list", "num-edge-list", "node-label"]
        if meta["has_node_attr"] == "True":
            names.append("node-feat")
        if meta["has_edge_attr"] == "True":
            names.append("edge-feat")
        extras = meta["additional node files"]
        for extra in [] if extras == "None" else extras.split(","):
            if not (extra == "node_species" and (raw / "species.csv.gz").exists()):
                names.append(extra)  # OGB renames proteins' species.csv.gz itself
        required += [raw / f"{n}.csv.gz" for n in names]
    split = folder / "split" / meta["split"]
    if not (split / "split_dict.pt").exists():
        required += [split / f"{s}.csv.gz" for s in ("train", "valid", "test")]
    return folder, [p for p in required if not p.exists()]


def load_ogb(name: str, root: Optional[Union[str, os.PathLike]] = None, device="cpu") -> GraphData:
    """Load an OGB node-property-prediction graph with its official split.

    Edges are symmetrized (ogbn-arxiv is stored directed), de-duplicated and self-loops
    dropped. ogbn-proteins has no node features: each node gets the mean of its incoming
    edges' 8 features, as is standard; it is a 112-task multilabel ROC-AUC problem.

    Args:
        name: ``"ogbn-arxiv"``, ``"ogbn-products"`` or ``"ogbn-proteins"``.
        root: the folder holding OGB's dataset folders (``None``: OGB's default ``dataset``).
        device: where the returned tensors live.

    Raises:
        FileNotFoundError: the files are not on disk (the message lists them; nothing is
            downloaded).
        ImportError: ogb or DGL is not installed.
    """
    _check_name(name)
    root = Path("dataset" if root is None else root).expanduser()
    nodeproppred = _nodeproppred()
    _deps.require_dgl()
    folder, missing = ogb_files(name, root)
    if missing:
        meta = _meta(name)
        raise FileNotFoundError(
            f"{name} is not on disk and cannot be downloaded here; missing: "
            + ", ".join(str(p) for p in missing)
            + f". Download {meta['url']}, unzip it inside {root} and rename the folder "
            f"{meta['download_name']}/ it creates to {folder.name}/ (OGB's layout: "
            f"RELEASE_v{meta['version']}.txt, raw/*.csv.gz, split/{meta['split']}/*.csv.gz)."
        )
    try:
        with contextlib.redirect_stdout(io.StringIO()) as out:  # OGB prints its progress
            dataset = nodeproppred.DglNodePropPredDataset(name, root=str(root))
            graph, labels = dataset[0]
    except Exception as exc:  # pandas, DGL and OGB raise many types for damaged files
        raise ValueError(
            f"OGB could not read {name} from {folder} ({type(exc).__name__}: {exc}); the "
            "files are damaged or not OGB's: unzip the archive again."
        ) from None
    logger.info("ogb %s: %s", name, " | ".join(out.getvalue().split("\n")).strip(" |"))
    n = graph.num_nodes()
    split = read_split(folder / "split" / _meta(name)["split"], n)
    src, dst = graph.edges()
    if name == "ogbn-proteins":
        efeat = graph.edata["feat"].float()
        feat = torch.zeros(n, efeat.shape[1]).index_add_(0, dst, efeat)
        feat /= torch.bincount(dst, minlength=n).clamp_(min=1).unsqueeze(1)
        label, task, metric = labels.float(), "multilabel", "rocauc"
        num_classes = labels.shape[1]
    else:
        feat = graph.ndata["feat"].float()
        labels = labels.reshape(-1)
        if labels.is_floating_point():  # OGB stores labels as floats when one is NaN
            bad = ~torch.isfinite(labels) | (labels != labels.round())
            if bool(bad.any()):
                first = int(bad.nonzero()[0, 0])
                raise ValueError(
                    f"{name}: {int(bad.sum())} node labels are NaN or not whole numbers (the "
                    f"first at node {first}); OGB's node-label.csv.gz is damaged."
                )
        label, task, metric = labels.long(), "multiclass", "accuracy"
        num_classes = int(_meta(name)["num classes"])
    src, dst = clean_edges(src, dst, n, symmetrize=True)
    masks = []
    for key in _SPLITS:
        mask = torch.zeros(n, dtype=torch.bool)
        mask[split[key]] = True
        masks.append(mask)
    data = GraphData(
        src,
        dst,
        n,
        feat.contiguous(),
        label,
        *masks,
        task=task,
        metric=metric,
        num_classes=num_classes,
        name=name,
    )
    return data.to(device)


def read_split(folder: Path, n: int) -> dict:
    """``{"train", "valid", "test"}`` -> int64 node ids from ``folder``'s CSVs, or else from
    its ``split_dict.pt`` loaded with ``weights_only=True``; ids must lie in ``[0, n)``.

    Raises:
        ValueError: ``split_dict.pt`` is not a plain dict of id tensors (it is refused
            unpickled), or the ids are not integers in range.
    """
    csvs = [folder / f"{key}.csv.gz" for key in _SPLITS]
    if all(p.exists() for p in csvs):
        import pandas as pd  # a dependency of ogb, present whenever ogb is

        raw = {k: pd.read_csv(p, compression="gzip", header=None).values.T[0]
               for k, p in zip(_SPLITS, csvs)}  # fmt: skip
        split = {k: torch.from_numpy(v.copy()) for k, v in raw.items()}
        source = f"{folder}/{{{','.join(_SPLITS)}}}.csv.gz"
    else:
        source = str(folder / "split_dict.pt")
        try:
            split = torch.load(source, map_location="cpu", weights_only=True)
        except Exception as exc:  # the unpickler refused it, or the file is damaged
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            raise ValueError(
                f"{source} was refused: it is not a plain file of tensors ({type(exc).__name__}"
                f": {first}). Delete it and put the split's train/valid/test.csv.gz there."
            ) from None
    if not isinstance(split, dict) or not all(isinstance(split.get(k), torch.Tensor)
                                              for k in _SPLITS):  # fmt: skip
        raise ValueError(f"{source}: expected train, valid and test node-id tensors.")
    for key in _SPLITS:
        ids = split[key].reshape(-1)
        if ids.is_floating_point() and bool((ids != ids.round()).any()):
            raise ValueError(f"{source}: the {key} ids are not whole numbers.")
        ids = ids.long()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n):
            raise ValueError(f"{source}: the {key} ids leave [0, {n}).")
        split[key] = ids
    return split


def evaluate(name: str, y_true: torch.Tensor, y_pred: torch.Tensor) -> float:
    """Score predictions with OGB's official ``Evaluator``.

    Args:
        name: the OGB dataset.
        y_true: ``(N,)`` or ``(N, 1)`` class ids (arxiv, products) or ``(N, 112)`` 0/1
            (proteins).
        y_pred: class ids shaped like ``y_true``, or ``(N, C)`` logits (reduced by argmax) for
            the accuracy datasets; ``(N, 112)`` scores for proteins.

    Returns:
        OGB's ``acc`` or ``rocauc`` as a float.
    """
    _check_name(name)
    evaluator = _nodeproppred().Evaluator(name)
    if y_true.dim() == 1:
        y_true = y_true.unsqueeze(1)
    if evaluator.eval_metric == "acc" and y_pred.dim() == 2 and y_pred.shape[1] > 1:
        y_pred = y_pred.argmax(dim=1, keepdim=True)
    elif y_pred.dim() == 1:
        y_pred = y_pred.unsqueeze(1)
    result = evaluator.eval({"y_true": y_true, "y_pred": y_pred})
    return float(result[evaluator.eval_metric])
