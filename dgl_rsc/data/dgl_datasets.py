"""Reddit, Yelp and Flickr through DGL's own dataset classes, offline-safe.

DGL keeps each dataset in ``<raw_dir>/<name>_<first 8 hex digits of sha1(url)>/``: the files
of its zip archive and, after the first load, the processed ``dgl_graph.bin``. DGL downloads
when that folder is missing; here the files are checked first and a ``FileNotFoundError``
names them instead.

None of these files can run code: DGL reads the archives with ``numpy.load`` and
``scipy.sparse.load_npz`` (both without pickles), JSON, and its own binary graph format;
these three datasets keep no ``info.pkl``. A damaged file is a ``ValueError`` naming the
folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import logging
import os
from pathlib import Path
from typing import Optional, Union

from ..base import _deps
from .graphdata import GraphData, clean_edges

__all__ = ["DGL_DATASETS", "load_dgl_dataset", "dgl_files"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class _Spec:
    cls: str  # class name in dgl.data
    archive: str  # path of the zip under DGL's data URL
    files: tuple  # the archive's files, which DGL's process() reads
    task: str
    metric: str


_GRAPHSAINT_FILES = ("adj_full.npz", "feats.npy", "class_map.json", "role.json")
DGL_DATASETS = {
    "reddit": _Spec(
        "RedditDataset",
        "dataset/reddit.zip",
        ("reddit_data.npz", "reddit_graph.npz"),
        "multiclass",
        "accuracy",
    ),
    "yelp": _Spec("YelpDataset", "dataset/yelp.zip", _GRAPHSAINT_FILES, "multilabel", "f1_micro"),
    "flickr": _Spec(
        "FlickrDataset", "dataset/flickr.zip", _GRAPHSAINT_FILES, "multiclass", "accuracy"
    ),
}


def _spec(name: str) -> _Spec:
    if name not in DGL_DATASETS:
        raise ValueError(
            f"{name!r} is not a supported DGL dataset; choose from " f"{tuple(DGL_DATASETS)}."
        )
    return DGL_DATASETS[name]


def _url(spec: _Spec) -> str:
    dgl = _deps.require_dgl()
    return dgl.data.utils._get_dgl_url(spec.archive)  # honours $DGL_REPO as DGL does


def dgl_files(name: str, root: Union[str, os.PathLike]) -> tuple[Path, list[Path]]:
    """The folder DGL reads for ``name`` under ``raw_dir=root`` and the files it lacks.

    Returns:
        ``(folder, missing)``: ``missing`` is empty when DGL can load without downloading
        (all archive files present, or DGL's processed ``dgl_graph.bin``).
    """
    spec = _spec(name)
    suffix = hashlib.sha1(_url(spec).encode("utf-8")).hexdigest()[:8]
    folder = Path(root).expanduser() / f"{name}_{suffix}"  # DGLDataset.raw_path
    if (folder / "dgl_graph.bin").exists():
        return folder, []
    return folder, [folder / f for f in spec.files if not (folder / f).exists()]


def load_dgl_dataset(
    name: str, root: Optional[Union[str, os.PathLike]] = None, device="cpu"
) -> GraphData:
    """Load ``reddit``, ``yelp`` or ``flickr`` through ``dgl.data``.

    Edges are symmetrized, de-duplicated and self-loops dropped. Yelp is a 100-label
    multilabel task scored by micro-F1; Reddit (41 classes) and Flickr (7) are multiclass.

    Args:
        name: ``"reddit"``, ``"yelp"`` or ``"flickr"``.
        root: DGL's ``raw_dir`` (``None``: DGL's download folder, ``$DGL_DOWNLOAD_DIR`` or
            ``~/.dgl``).
        device: where the returned tensors live.

    Raises:
        FileNotFoundError: the files are not on disk (nothing is downloaded).
        ImportError: DGL is not installed.
    """
    spec = _spec(name)
    dgl = _deps.require_dgl()
    root = Path(dgl.data.utils.get_download_dir() if root is None else root).expanduser()
    folder, missing = dgl_files(name, root)
    if missing:
        raise FileNotFoundError(
            f"{name} is not on disk and cannot be downloaded here; missing: "
            + ", ".join(str(p) for p in missing)
            + f". Download {_url(spec)} and extract its files directly into {folder}/ "
            "(what DGL does when online)."
        )
    try:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            dataset = getattr(dgl.data, spec.cls)(raw_dir=str(root), verbose=False)
            graph = dataset[0]
    except Exception as exc:  # numpy, scipy and DGL raise many types for damaged files
        raise ValueError(
            f"DGL could not read {name} from {folder} ({type(exc).__name__}: {exc}); the "
            f"files are damaged or not DGL's: extract {_url(spec)} there again."
        ) from None
    if out.getvalue():
        logger.info("dgl %s: %s", name, out.getvalue().strip())
    n = graph.num_nodes()
    src, dst = clean_edges(*graph.edges(), n, symmetrize=True)
    label = graph.ndata["label"]
    if spec.task == "multilabel":
        label, num_classes = label.float(), label.shape[1]
    else:
        label, num_classes = label.long().reshape(-1), int(dataset.num_classes)
    masks = [graph.ndata[f"{s}_mask"].bool() for s in ("train", "val", "test")]
    feat = graph.ndata["feat"].float().contiguous()
    data = GraphData(
        src,
        dst,
        n,
        feat,
        label,
        *masks,
        task=spec.task,
        metric=spec.metric,
        num_classes=num_classes,
        name=name,
    )
    return data.to(device)
