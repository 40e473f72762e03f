"""Datasets: a registry of loaders that all return one :class:`GraphData`.

``load_dataset(name, root, device, **params)`` looks ``name`` up in :data:`DATASETS` and
checks ``params`` against the loader's signature. A loader's parameters other than ``root``
and ``device`` are the dataset's parameters (the launcher reads them the same way).

Example:
    >>> from dgl_rsc.data import load_dataset
    >>> d = load_dataset("synthetic", num_nodes=300, avg_degree=6.0, num_classes=3)
    >>> d.num_nodes, d.task, d.metric
    (300, 'multiclass', 'accuracy')
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable, Optional

from ..base.names import did_you_mean
from .dgl_datasets import load_dgl_dataset
from .graphdata import METRICS, TASKS, GraphData, clean_edges
from .metrics import evaluate
from .npz import load_npz
from .ogb import evaluate as ogb_evaluate
from .ogb import load_ogb
from .reorder import NODE_ORDERS, reorder, to_original
from .synthetic import synthetic_graph

__all__ = [
    "DATASETS",
    "METRICS",
    "NODE_ORDERS",
    "TASKS",
    "GraphData",
    "clean_edges",
    "evaluate",
    "load_dataset",
    "load_dgl_dataset",
    "load_npz",
    "load_ogb",
    "ogb_evaluate",
    "reorder",
    "synthetic_graph",
    "to_original",
]

_LOADER_ARGS = ("root", "device", "progress")

DATASETS: dict[str, Callable[..., GraphData]] = {
    "synthetic": synthetic_graph,
    "npz": load_npz,
    "ogbn-arxiv": functools.partial(load_ogb, "ogbn-arxiv"),
    "ogbn-products": functools.partial(load_ogb, "ogbn-products"),
    "ogbn-proteins": functools.partial(load_ogb, "ogbn-proteins"),
    "reddit": functools.partial(load_dgl_dataset, "reddit"),
    "yelp": functools.partial(load_dgl_dataset, "yelp"),
    "flickr": functools.partial(load_dgl_dataset, "flickr"),
}


def load_dataset(name: str, root: Optional[str] = None, device="cpu", progress=None,
                 **params) -> GraphData:  # fmt: skip
    """Load dataset ``name`` from :data:`DATASETS`.

    Args:
        name: a key of :data:`DATASETS`.
        root: where the dataset's files are (ignored by ``synthetic``; for ``npz`` the folder
            of a relative ``path``).
        device: where the returned tensors live (``synthetic`` is built there).
        progress: ``progress(done, total)``, called by the loaders that report their
            progress (``synthetic``); ``None``: silent.
        **params: the loader's own parameters, e.g. ``num_nodes`` for ``synthetic`` or
            ``path`` and ``split`` for ``npz``.

    Raises:
        ValueError: unknown ``name`` (with the nearest known one) or an unknown parameter
            (with the allowed ones).
        FileNotFoundError: the dataset's files are not on disk.
    """
    if name not in DATASETS:
        hint = did_you_mean(str(name), DATASETS)
        raise ValueError(f"unknown dataset {name!r}.{hint} Known: {', '.join(DATASETS)}.")
    loader = DATASETS[name]
    accepted = inspect.signature(loader).parameters
    allowed = [p for p in accepted if p not in _LOADER_ARGS]
    for key in params:
        if key not in allowed:
            hint = did_you_mean(key, allowed)
            raise ValueError(
                f"dataset {name!r} has no parameter {key!r}.{hint} Allowed: "
                f"{', '.join(allowed) or '(none)'}."
            )
    if "root" in accepted:
        params["root"] = root
    if progress is not None and "progress" in accepted:
        params["progress"] = progress
    return loader(device=device, **params)
