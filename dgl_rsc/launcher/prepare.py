"""What an experiment does once, before any run trains: resolve the device, check that the
kernel backend and the engine's library can run, load the dataset, add self-loops where the
model wants them, and build the graph (a distributed run takes its rank's share). Also which
runs each seed has (:func:`methods`). Each phase's seconds go to ``Prepared.setup_s``; one that
runs past a few seconds shows its progress on stderr when ``progress`` is on
(:class:`~dgl_rsc.base.progress.Phase`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

import torch

from ..base import _deps
from ..base.progress import Phase
from ..core.config import ConfigError
from ..models.engines import get_engine
from .mb_schema import check_sizes
from .schema import RunConfig

__all__ = ["Prepared", "TrainingDiverged", "check_backend", "methods", "prepare", "resolve_device"]


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite; the message names the run and the epoch."""


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU; CUDA asked for but absent is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name!r} but CUDA is not available; use --device cpu.")
    return torch.device(name)


def check_backend(cfg: RunConfig, device: torch.device) -> None:
    """``rsc.backend`` can run on ``device`` (checked before any data are loaded)."""
    if cfg.rsc is None:
        return
    from ..backends import resolve

    try:
        resolve(cfg.rsc.backend, device)
    except (ImportError, ValueError) as exc:
        raise ConfigError(
            f"rsc.backend={cfg.rsc.backend!r} cannot run on {device}: {exc}"
        ) from None


@dataclasses.dataclass
class Prepared:
    """The data of an experiment on its device: ``feat (N, F)``, ``label (N,)``/``(N, C)``;
    ``graphs`` by kind (``"native"``, ``"dgl"``), built on first use; ``fingerprint`` is the
    data's sha256, ``source`` names where they came from. ``node_perm (N,)``: the node order
    (``train.node_order``) the data are in, ``node_perm[new] = old`` (``None``: the dataset's
    own); :meth:`in_original_order` and :meth:`predict` give per-node results in the
    dataset's order."""

    data: object
    edges: tuple
    feat: torch.Tensor
    label: torch.Tensor
    masks: dict
    device: torch.device
    fingerprint: str = ""
    source: str = ""
    graphs: dict = dataclasses.field(default_factory=dict)
    reducer: object = dataclasses.field(default_factory=lambda: _local_reducer())
    dist: object = None  # the DistContext of a distributed run
    partition: Optional[dict] = None  # its partition's quality and cache file
    allocator: str = "default"  # "kept": freed blocks kept for reuse (keep_freed_memory)
    node_perm: Optional[torch.Tensor] = None
    progress: bool = False  # show the setup phases that run past a few seconds (stderr)
    setup_s: dict = dataclasses.field(default_factory=dict)  # seconds of each setup phase
    int8_pick: Optional[dict] = None  # train.int8_pick's measurement (launcher.int8_pick)

    def in_original_order(self, x: torch.Tensor) -> torch.Tensor:
        """Per-node rows ``x (N, ...)`` of these data, in the dataset's node order."""
        from ..data.reorder import to_original

        return to_original(x, self.node_perm)

    def predict(self, model, kind: str = "native") -> torch.Tensor:
        """``model``'s outputs ``(N, C)`` on the graph of ``kind``, in eval mode and without
        gradients, in the dataset's node order (the model is left in eval mode)."""
        model.eval()
        with torch.no_grad():
            return self.in_original_order(model(self.graph(kind), self.feat))

    def graph(self, kind: str):
        """The message-passing graph of ``kind`` (self-loops added when the model wants them)."""
        if kind not in self.graphs:
            src, dst, n = self.edges
            if kind == "native":
                from ..sparse.graph import Graph

                self.graphs[kind] = Graph(src, dst, n).to(self.device)
            elif kind == "pyg":  # PyG's edge_index: row 0 sources, row 1 targets
                self.graphs[kind] = torch.stack([src.long(), dst.long()]).to(self.device)
            else:
                dgl = _deps.require_dgl()
                self.graphs[kind] = dgl.graph((src, dst), num_nodes=n).to(self.device)
        return self.graphs[kind]


def _local_reducer():
    from ..distributed.reduce import LocalReducer

    return LocalReducer()


def methods(cfg: RunConfig) -> tuple:
    """The runs of each seed: the config's methods, after ``stock`` when ``compare`` and
    ``train.stock_baseline`` are on and the stock library imports (the stock ``dgl.nn``
    model, or the stock ``torch_geometric.nn`` one for the PyG engines: a baseline the
    speedups are reported against)."""
    stock = cfg.train.stock_baseline and cfg.distributed is None
    family = get_engine(cfg.train.engine).family
    available = _deps.torch_geometric_available if family == "pyg" else _deps.dgl_available
    if cfg.compare and stock and available():
        return ("stock", *cfg.methods)
    return cfg.methods


def prepare(cfg: RunConfig, out_dir: Optional[str] = None, progress: bool = False) -> Prepared:
    """Load the dataset and the edge list the engines need (once per experiment); in a
    distributed run, this rank's share of them (``out_dir`` holds the partition cache).
    ``progress``: show the phases that run past a few seconds on stderr."""
    from ..data import load_dataset
    from ..models.paper import MODELS

    engine = cfg.train.engine
    if get_engine(engine).needs_dgl and not _deps.dgl_available():
        raise ConfigError(
            f"train.engine={engine!r} needs DGL, which is not importable here; "
            "use train.engine=native (dgl_rsc layers on a DGL-free graph)."
        )
    if get_engine(engine).needs_pyg and not _deps.torch_geometric_available():
        raise ConfigError(
            f"train.engine={engine!r} needs torch_geometric, which is not importable here; "
            "install it (`pip install torch-geometric==2.8.1`, torch>=2.3) or use "
            "train.engine=native."
        )
    device = resolve_device(cfg.train.device)
    check_backend(cfg, device)
    ctx = None
    if cfg.distributed is not None:  # every rank runs the same config: checked before the data
        from .dist_run import join

        ctx = join(cfg)
    allocator = "default"
    if cfg.train.keep_freed_memory:  # the launcher's own process: see keep_freed_memory
        from ..base.memory import keep_freed_memory

        allocator = "kept" if keep_freed_memory() else "default"
    params = {k: v for k, v in cfg.dataset.items() if k not in ("name", "root")}
    setup: dict = {}
    try:
        desc = f"setup: dataset {cfg.dataset['name']}"
        with Phase(desc, setup, "dataset", enabled=progress) as ph:
            data = load_dataset(cfg.dataset["name"], root=cfg.dataset["root"],
                                progress=ph.update, **params)  # fmt: skip
    except (FileNotFoundError, ImportError, ValueError) as exc:  # missing files, bad params
        raise ConfigError(f"dataset {cfg.dataset['name']!r} could not be loaded: {exc}") from None
    data, perm = _reorder(data, cfg.train.node_order, setup, progress)  # none: distributed
    src, dst, n = data.src, data.dst, int(data.num_nodes)
    if cfg.minibatch is not None:  # budgets and cluster counts against this graph
        check_sizes(cfg.train.mode, cfg.minibatch, n, int(src.numel()),
                    int(data.train_mask.sum()))  # fmt: skip
    if MODELS[cfg.model["name"]].SELF_LOOPS:
        loops = torch.arange(n, dtype=src.dtype)
        src, dst = torch.cat([src, loops]), torch.cat([dst, loops])
    masks = {s: getattr(data, f"{s}_mask").to(device) for s in ("train", "val", "test")}
    path, root = cfg.dataset.get("path"), cfg.dataset["root"]
    source = os.path.join(root, path) if path and root else path or root
    name = source or f"the {cfg.dataset['name']} graph"
    if cfg.distributed is not None:
        from .dist_run import prepare_rank

        with Phase("setup: partition and this rank's share", setup, "partition",
                   enabled=progress) as ph:  # fmt: skip
            prep = prepare_rank(cfg, data, (src, dst, n), name, out_dir, Prepared, ctx,
                                ph.update)  # fmt: skip
        prep.allocator, prep.progress, prep.setup_s = allocator, progress, setup
        return prep
    prep = Prepared(data, (src, dst, n), data.feat.to(device), data.label.to(device), masks,
                    device, data.fingerprint(), name, allocator=allocator, progress=progress,
                    setup_s=setup, node_perm=perm)  # fmt: skip
    with Phase("setup: graph", setup, "graph", enabled=progress):
        prep.graph(get_engine(engine).graph)  # built now: a bad graph fails before training
    return prep


def _reorder(data, method: str, setup: dict, progress: bool) -> tuple:
    """``(data in node order method, perm or None)`` (``train.node_order``), timed among the
    setup phases as ``node_order_<method>`` unless ``method`` is ``"none"``."""
    from ..data.reorder import reorder

    if method == "none":
        return reorder(data, method)
    with Phase(f"setup: node order {method}", setup, f"node_order_{method}", enabled=progress):
        return reorder(data, method)
