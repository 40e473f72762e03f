"""Cluster-GCN (Chiang et al., KDD 2019) batches: METIS clusters, ``batch_size`` of them per
batch, drawn by the native engine as DGL's ``ClusterGCNSampler`` under its ``DataLoader``
draws them (see :mod:`.samplers` for how both engines agree).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from ..sparse.graph import check_edges
from .batch import SubgraphBatch, derive_seed
from .clusters import ClusterLayout, check_partition, cluster_layout
from .loader_base import SEED_MAX, Loader, OutCSR, dgl_engine, int_arg, pick_engine

__all__ = ["ClusterLoader", "ClusterLayout", "ENGINES"]


class NativeCluster:
    """Cluster-GCN batches of one epoch, drawn as DGL's ``DataLoader(shuffle=...)`` draws them:
    ``np.random.shuffle`` of the cluster ids, then ``batch_size`` clusters per batch."""

    def __init__(self, src, dst, num_nodes, layout, batch_size, shuffle, seed, layout_file):
        self.graph = OutCSR(src, dst, num_nodes)
        self.layout, self.batch_size, self.shuffle, self.seed = layout, batch_size, shuffle, seed

    def batches(self, stream: int, epoch: int) -> Iterator[SubgraphBatch]:
        order = np.arange(self.layout.num_parts, dtype=np.int64)
        if self.shuffle:
            np.random.RandomState(derive_seed(self.seed, stream, epoch)).shuffle(order)
        # (torch's DataLoader also draws one int64 per epoch: no torch draws follow here)
        for index, start in enumerate(range(0, order.size, self.batch_size)):
            nodes = self.layout.nodes(order[start : start + self.batch_size].tolist())
            yield self.graph.induced(nodes, epoch, index)


#: ``engine -> () -> class`` (the DGL one imports DGL on use)
ENGINES = {"native": lambda: NativeCluster, "dgl": dgl_engine("DGLCluster")}


class ClusterLoader(Loader):
    """Cluster-GCN (Chiang et al., KDD 2019): METIS clusters, ``batch_size`` of them per batch.

    Args:
        src, dst: ``(E,)`` integer edges ``src -> dst`` of the full graph.
        num_nodes: ``N``.
        num_parts: number of clusters ``P`` in ``[1, N]``.
        batch_size: clusters per batch, in ``[1, P]``; the last batch may hold fewer.
        seed: seeds METIS and every epoch's shuffle.
        engine: ``"native"`` or ``"dgl"`` (the same batches for the same seed).
        shuffle: draw a new grouping each epoch (Cluster-GCN); ``False`` keeps batch ``i``
            = clusters ``[i*batch_size, (i+1)*batch_size)``, so batches recur every epoch.
        partition: ``(N,)`` cluster of each node, instead of METIS.
        cache_dir: keep the clusters there (``cluster_gcn-<digest>.npz``, see :mod:`.clusters`;
            an entry that fails its checks is recomputed).

    Attributes:
        layout: the :class:`ClusterLayout`; layout_file: its file in ``cache_dir`` or ``None``.

    Example:
        >>> import torch
        >>> src = torch.arange(8); dst = (src + 1) % 8
        >>> loader = ClusterLoader(src, dst, 8, num_parts=4, batch_size=2,
        ...                        partition=torch.arange(8) // 2)
        >>> [b.nodes.tolist() for b in loader.epoch(0)]
        [[4, 5, 6, 7], [2, 3, 0, 1]]
    """

    def __init__(self, src, dst, num_nodes, num_parts, batch_size, seed=0, engine="native",
                 shuffle=True, partition=None, cache_dir=None):  # fmt: skip
        super().__init__()
        src, dst, n = check_edges(src, dst, num_nodes)
        self.num_parts = int_arg("num_parts", num_parts, 1, n, "Use at most one cluster per node.")
        self.batch_size = int_arg(
            "batch_size",
            batch_size,
            1,
            self.num_parts,
            "It counts clusters per batch: at most num_parts.",
        )
        self.seed = int_arg("seed", seed, 0, SEED_MAX)
        cls = pick_engine(engine, ENGINES)
        if partition is not None:
            partition = check_partition(partition, n, self.num_parts)
        self.layout, self.layout_file = cluster_layout(
            src, dst, n, self.num_parts, self.seed, partition, cache_dir
        )
        self._impl = cls(
            src, dst, n, self.layout, self.batch_size, shuffle, self.seed, self.layout_file
        )

    def __len__(self) -> int:
        return -(-self.num_parts // self.batch_size)
