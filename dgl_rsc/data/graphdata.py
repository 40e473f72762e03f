"""``GraphData``: the one object every dataset loader returns, and the edge-list cleaning the
loaders share.

The container is DGL-free: plain tensors plus a few strings. ``to_dgl()`` builds a
``DGLGraph`` on demand (DGL is imported there and only there, through :mod:`dgl_rsc.base._deps`).
Every loader's result passes the same checks (:meth:`GraphData.__post_init__`), so a graph
that cannot train correctly is refused with the reason before any training starts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from typing import Union

import torch

from ..base import _deps

__all__ = ["GraphData", "clean_edges", "TASKS", "METRICS"]

TASKS = ("multiclass", "multilabel", "binary")
METRICS = ("accuracy", "rocauc", "f1_micro")
_MASKS = ("train_mask", "val_mask", "test_mask")
log = logging.getLogger(__name__)


def clean_edges(
    src: torch.Tensor, dst: torch.Tensor, num_nodes: int, symmetrize: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop self-loops and duplicate edges, optionally adding every reverse edge.

    Args:
        src: ``(E,)`` integer source nodes.
        dst: ``(E,)`` integer destination nodes.
        num_nodes: ``N``; all ids must lie in ``[0, N)``.
        symmetrize: add ``v -> u`` for every ``u -> v`` (an undirected graph).

    Returns:
        ``(src, dst)``, ``(E',)`` int64 each, on the input's device, sorted by destination and
        then source (the order of a CSR by destination), without self-loops or duplicates.

    Example:
        >>> s, d = clean_edges(torch.tensor([0, 0, 1, 2]), torch.tensor([1, 1, 1, 0]), 3)
        >>> s.tolist(), d.tolist()
        ([1, 2, 0, 0], [0, 0, 1, 2])
    """
    key = _clean_keys(src, dst, num_nodes, symmetrize)
    n = max(int(num_nodes), 1)
    return key % n, torch.div(key, n, rounding_mode="floor")


def _clean_keys(src, dst, num_nodes: int, symmetrize: bool) -> torch.Tensor:
    """Sorted unique edge keys ``dst * N + src`` of :func:`clean_edges`."""
    src, dst = src.long().reshape(-1), dst.long().reshape(-1)
    if src.shape != dst.shape:
        raise ValueError(f"src and dst differ in length: {src.numel()} vs {dst.numel()}.")
    n = max(int(num_nodes), 1)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    key = dst * n + src  # destination-major, so the sorted keys are CSR-by-destination order
    if symmetrize:
        key = torch.cat([key, src * n + dst])
    return torch.unique(key, sorted=True)


@dataclasses.dataclass(repr=False, eq=False)
class GraphData:
    """A node-classification graph: directed edge list, features, labels and split masks.

    Messages flow ``src -> dst``. Loaders return undirected graphs with both directions
    stored, no duplicate edges and no self-loops; a model that wants self-loops adds them.

    Attributes:
        src: ``(E,)`` int64 source node of each edge.
        dst: ``(E,)`` int64 destination node of each edge.
        num_nodes: ``N``.
        feat: ``(N, F)`` float32 node features.
        label: ``(N,)`` int64 class ids (``multiclass``, ``binary``) or ``(N, C)`` float32 0/1
            targets (``multilabel``).
        train_mask, val_mask, test_mask: ``(N,)`` bool.
        task: ``"multiclass"``, ``"multilabel"`` or ``"binary"``.
        metric: ``"accuracy"``, ``"rocauc"`` or ``"f1_micro"`` (see :mod:`.metrics`).
        num_classes: the model's output width: classes (``multiclass``; 2 for ``binary``) or
            tasks (``multilabel``).
        name: the dataset's name.

    Besides dtypes and shapes, construction checks the values (``ValueError`` naming the
    problem): at least one node; edge ids in ``[0, N)``; at least one feature column and
    only finite features; class ids in ``[0, num_classes)`` (multilabel: 0/1 targets) and
    at least two classes among the labelled nodes; non-empty, disjoint masks; ROC-AUC only
    for binary or multilabel tasks, with both classes in every mask of a binary task.
    Features that are all zero are logged as a warning.

    Example:
        >>> n = 3
        >>> d = GraphData(torch.tensor([0, 1]), torch.tensor([1, 0]), n, torch.ones(n, 2),
        ...               torch.tensor([0, 1, 1]), torch.tensor([True, False, False]),
        ...               torch.tensor([False, True, False]), torch.tensor([False, False, True]),
        ...               "multiclass", "accuracy", 2, "toy")
        >>> d.num_edges, d.in_degrees().tolist(), d.summary()["num_train"]
        (2, [1, 1, 0], 1)
    """

    src: torch.Tensor
    dst: torch.Tensor
    num_nodes: int
    feat: torch.Tensor
    label: torch.Tensor
    train_mask: torch.Tensor
    val_mask: torch.Tensor
    test_mask: torch.Tensor
    task: str
    metric: str
    num_classes: int
    name: str

    def __post_init__(self):
        self.num_nodes, self.num_classes = int(self.num_nodes), int(self.num_classes)
        n = self.num_nodes
        if self.task not in TASKS:
            raise ValueError(f"task={self.task!r}; expected one of {TASKS}.")
        if self.metric not in METRICS:
            raise ValueError(f"metric={self.metric!r}; expected one of {METRICS}.")
        for attr in ("src", "dst"):
            t = getattr(self, attr)
            if t.dim() != 1 or t.dtype != torch.int64:
                raise ValueError(f"{attr} must be a 1-D int64 tensor, got {t.dtype} {_shape(t)}.")
        if self.src.numel() != self.dst.numel():
            raise ValueError(f"src has {self.src.numel()} edges, dst {self.dst.numel()}.")
        if self.feat.dim() != 2 or self.feat.shape[0] != n or self.feat.dtype != torch.float32:
            raise ValueError(
                f"feat must be float32 (N={n}, F), got {self.feat.dtype} " f"{_shape(self.feat)}."
            )
        want = (n, self.num_classes) if self.task == "multilabel" else (n,)
        dtype = torch.float32 if self.task == "multilabel" else torch.int64
        if tuple(self.label.shape) != want or self.label.dtype != dtype:
            raise ValueError(
                f"a {self.task} label must be {dtype} {want}, got "
                f"{self.label.dtype} {_shape(self.label)}."
            )
        for attr in _MASKS:
            t = getattr(self, attr)
            if tuple(t.shape) != (n,) or t.dtype != torch.bool:
                raise ValueError(f"{attr} must be bool ({n},), got {t.dtype} {_shape(t)}.")
        self._check_values()

    def _check_values(self) -> None:
        """The value checks listed in the class docstring."""
        n, where = self.num_nodes, f"dataset {self.name!r}"
        if n < 1:
            raise ValueError(f"{where} has no nodes; a graph needs at least one node.")
        for attr in ("src", "dst"):
            t = getattr(self, attr)
            if t.numel() and (int(t.min()) < 0 or int(t.max()) >= n):
                raise ValueError(f"{where}: {attr} holds node ids outside [0, {n}) "
                                 f"(min {int(t.min())}, max {int(t.max())}).")  # fmt: skip
        _check_features(self.feat, where)
        masks = {a: getattr(self, a) for a in _MASKS}
        for attr, m in masks.items():
            if not bool(m.any()):
                raise ValueError(f"{where}: {attr} selects no node; training, model selection "
                                 "and the test metric each need at least one node.")  # fmt: skip
        for i, a in enumerate(_MASKS):
            for b in _MASKS[i + 1 :]:
                both = int((masks[a] & masks[b]).sum())
                if both:
                    raise ValueError(f"{where}: {both} nodes are in both {a} and {b}; the "
                                     "splits must be disjoint.")  # fmt: skip
        self._check_labels(masks, where)

    def _check_labels(self, masks: dict, where: str) -> None:
        c, label = self.num_classes, self.label
        if self.task == "multilabel":
            if not bool(((label == 0) | (label == 1)).all()):
                raise ValueError(f"{where}: multilabel targets must be 0 or 1.")
            return
        if self.metric == "rocauc" and self.task != "binary":
            raise ValueError(f"{where}: metric 'rocauc' needs a binary or multilabel task; "
                             f"this one has {c} classes: use 'accuracy'.")  # fmt: skip
        bad = (label < 0) | (label >= c)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ValueError(f"{where}: label {int(label[i])} of node {i} is not a class id "
                             f"in [0, {c}); labels must be class ids 0..{c - 1}.")  # fmt: skip
        labelled = masks["train_mask"] | masks["val_mask"] | masks["test_mask"]
        present = torch.unique(label[labelled])
        if present.numel() < 2:
            raise ValueError(f"{where}: every labelled node has class {present.tolist()}; a "
                             "classifier needs at least two classes to learn.")  # fmt: skip
        for attr, m in masks.items() if self.metric == "rocauc" else ():
            if torch.unique(label[m]).numel() < 2:
                raise ValueError(f"{where}: {attr} holds one class only, so its ROC-AUC is "
                                 "undefined; every split needs both classes.")  # fmt: skip

    def fingerprint(self) -> str:
        """sha256 (hex) of the tensors and settings: the same data give the same hash
        (checkpoints store it, so that a resume on changed data is refused).

        >>> d = GraphData(torch.tensor([0, 1]), torch.tensor([1, 0]), 3, torch.ones(3, 2),
        ...               torch.tensor([0, 1, 1]), torch.tensor([True, False, False]),
        ...               torch.tensor([False, True, False]), torch.tensor([False, False, True]),
        ...               "multiclass", "accuracy", 2, "toy")
        >>> len(d.fingerprint()), d.fingerprint() == d.to("cpu").fingerprint()
        (64, True)
        """
        h = hashlib.sha256()
        meta = [self.num_nodes, self.num_classes, self.task, self.metric]
        h.update(json.dumps(meta).encode("utf-8"))
        for t in (self.src, self.dst, self.feat, self.label, *(getattr(self, a) for a in _MASKS)):
            t = t.detach().cpu().contiguous()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().data if t.numel() else b"")
        return h.hexdigest()

    @property
    def num_edges(self) -> int:
        """``E``, the number of directed edges."""
        return int(self.src.numel())

    @property
    def num_features(self) -> int:
        """``F``, the node feature width."""
        return int(self.feat.shape[1])

    @property
    def device(self) -> torch.device:
        """The device the tensors live on."""
        return self.feat.device

    def to(self, device: Union[str, torch.device]) -> GraphData:
        """A copy with every tensor on ``device`` (``self`` when already there)."""
        device = torch.device(device)
        if self.device == device:
            return self
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return dataclasses.replace(self, **moved)

    def in_degrees(self) -> torch.Tensor:
        """``(N,)`` int64 number of edges into each node."""
        return torch.bincount(self.dst, minlength=self.num_nodes)

    def summary(self) -> dict:
        """Counts and settings as plain Python values (for logs and result tables)."""
        return {
            "name": self.name,
            "num_nodes": self.num_nodes,
            "num_edges": self.num_edges,
            "num_features": self.num_features,
            "num_classes": self.num_classes,
            "task": self.task,
            "metric": self.metric,
            "num_train": int(self.train_mask.sum()),
            "num_val": int(self.val_mask.sum()),
            "num_test": int(self.test_mask.sum()),
        }

    def to_dgl(self):
        """A ``DGLGraph`` with these edges and ``ndata`` ``feat``, ``label`` and the masks.

        Raises:
            ImportError: DGL is not installed or does not load with this torch.
        """
        dgl = _deps.require_dgl()
        g = dgl.graph((self.src, self.dst), num_nodes=self.num_nodes)
        g.ndata["feat"], g.ndata["label"] = self.feat, self.label
        for attr in _MASKS:
            g.ndata[attr] = getattr(self, attr)
        return g

    def __repr__(self) -> str:
        items = ", ".join(f"{k}={v}" for k, v in self.summary().items() if k != "name")
        return f"GraphData({self.name!r}, {items})"


def _shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def _check_features(feat: torch.Tensor, where: str) -> None:
    """At least one column, finite values; all-zero features are worth a warning."""
    if feat.shape[1] == 0:
        raise ValueError(f"{where}: feat has no columns (shape {_shape(feat)}); give each "
                         "node at least one feature (a constant 1 will do).")  # fmt: skip
    bad = ~torch.isfinite(feat)
    if bool(bad.any()):
        node, col = (int(v) for v in bad.nonzero()[0])
        raise ValueError(
            f"{where}: feat holds {int(bad.sum())} NaN or infinite values (the first at node "
            f"{node}, column {col}); clean them (e.g. numpy.nan_to_num) before training."
        )
    zero = ~(feat != 0).any(0)
    if bool(zero.all()):
        log.warning("%s: every feature is 0, so the model sees nothing of the nodes", where)
    elif bool(zero.any()):
        log.info("%s: %d of %d feature columns are all zero", where, int(zero.sum()),
                 feat.shape[1])  # fmt: skip
