"""``GraphData``: the one object every dataset loader returns, and the edge-list cleaning the
loaders share.

The container is DGL-free: plain tensors plus a few strings. ``to_dgl()`` builds a
``DGLGraph`` on demand (DGL is imported there and only there, through :mod:`dgl_rsc._deps`).
"""

from __future__ import annotations

import dataclasses
from typing import Union

import torch

from .. import _deps

__all__ = ["GraphData", "clean_edges", "TASKS", "METRICS"]

TASKS = ("multiclass", "multilabel", "binary")
METRICS = ("accuracy", "rocauc", "f1_micro")
_MASKS = ("train_mask", "val_mask", "test_mask")


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

    Example:
        >>> n = 3
        >>> d = GraphData(torch.tensor([0, 1]), torch.tensor([1, 0]), n, torch.zeros(n, 2),
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
