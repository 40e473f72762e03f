"""What the Cluster-GCN and GraphSAINT loaders share: argument checks, the full graph's
edges by source (:class:`OutCSR`), the seed streams, the engine lookup and the loader base.
"""

from __future__ import annotations

from typing import Callable, Iterator, Optional

import numpy as np
import torch

from ..base import _deps
from ..base.names import unknown
from .batch import SubgraphBatch

__all__ = ["TRAIN", "PRESAMPLE", "OutCSR", "Loader", "dgl_engine", "int_arg", "pick_engine"]

TRAIN, PRESAMPLE = 0, 1  # the seed streams of training epochs and of GraphSAINT's presampling
SEED_MAX = 2**31 - 1  # METIS and DGL take a C int


def int_arg(name: str, value, lo: int, hi: Optional[int] = None, fix: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}.")
    if value < lo or (hi is not None and value > hi):
        bound = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"{name}={value} must be {bound}.{' ' + fix if fix else ''}")
    return int(value)


#: :meth:`OutCSR.induced` scans the whole edge list once the nodes' out-edges are at least
#: ``1 / DENSE_SHARE`` of it (a scan costs about as much as gathering and sorting that share)
DENSE_SHARE = 8


class OutCSR:
    """The full graph's edges grouped by source, and induced subgraphs of it.

    Args:
        src, dst: ``(E,)`` int64 global edges (edge ``i`` is ``src[i] -> dst[i]``).
        num_nodes: ``N``.
    """

    def __init__(self, src: torch.Tensor, dst: torch.Tensor, num_nodes: int):
        self.src, self.dst, self.num_nodes = src, dst, num_nodes
        self.eids = torch.argsort(src, stable=True)  # edge ids grouped by source
        self.out_deg = torch.bincount(src, minlength=num_nodes)
        self.indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
        torch.cumsum(self.out_deg, 0, out=self.indptr[1:])
        self._local = torch.full((num_nodes,), -1, dtype=torch.int64)  # -1 between calls
        self._inside = torch.zeros(num_nodes, dtype=torch.bool)  # False between calls

    def induced(self, nodes: torch.Tensor, epoch: int, index: int) -> SubgraphBatch:
        """The subgraph induced by ``nodes (n_b,)`` (distinct ids), in ``O(n_b + out-degree
        of nodes)``, or ``O(E)`` with two cheap passes over the edge list when the nodes' edges
        are a large share of it (large batches of high-degree nodes: GraphSAINT's pre-sampling
        on a power-law graph); the same edges either way, in ascending global id, as
        :class:`SubgraphBatch` promises."""
        local = self._local
        local[nodes] = torch.arange(nodes.numel())
        try:
            deg = self.out_deg[nodes]
            if int(deg.sum()) * DENSE_SHARE >= self.src.numel():
                inside = self._inside
                inside[nodes] = True
                keep = inside.index_select(0, self.src) & inside.index_select(0, self.dst)
                eids = keep.nonzero().flatten()
            else:
                owner = torch.repeat_interleave(deg)  # batch position of each candidate edge
                first = self.indptr[nodes] - (torch.cumsum(deg, 0) - deg)
                cand = self.eids[first[owner] + torch.arange(owner.numel())]
                eids = torch.sort(cand[local[self.dst[cand]] >= 0]).values
            src, dst = local[self.src[eids]], local[self.dst[eids]]
        finally:
            local[nodes] = -1
            self._inside[nodes] = False
        return SubgraphBatch(nodes, src, dst, eids, epoch, index)


def dgl_engine(cls_name: str) -> Callable[[], type]:
    """The ``"dgl"`` entry of an engine table: the class ``cls_name`` of :mod:`.dgl_samplers`,
    imported (with DGL) on use."""

    def load() -> type:
        _deps.require_dgl()
        from . import dgl_samplers

        return getattr(dgl_samplers, cls_name)

    return load


def pick_engine(engine: str, engines: dict[str, Callable[[], type]]) -> type:
    """The class of ``engine`` in ``engines`` (``name -> () -> class``; a DGL engine imports
    DGL on use), or a ``ValueError`` naming the nearest engine."""
    if engine not in engines:
        raise unknown("engine", engine, engines)
    return engines[engine]()


class Loader:
    """What both loaders share: epochs as iterators, ``iter()`` going on to the next epoch."""

    def __init__(self):
        self._next_epoch = 0

    def epoch(self, epoch: int) -> Iterator[SubgraphBatch]:
        """The batches of ``epoch`` (a function of ``seed`` and ``epoch`` alone)."""
        return self._impl.batches(TRAIN, int_arg("epoch", epoch, 0))

    def __iter__(self) -> Iterator[SubgraphBatch]:
        self._next_epoch += 1
        return self.epoch(self._next_epoch - 1)
