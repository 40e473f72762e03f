"""Cluster-GCN's clusters: METIS, their layout, and their cache file (no pickle).

A cache file ``cluster_gcn-<digest>.npz`` is a NumPy archive read with
``allow_pickle=False``: nothing in it can run code. It holds a format marker, the full key of
what determines the clusters (the edge list or the given partition, ``N``, ``P``, the METIS
seed), ``N`` and the layout's two arrays. An entry is used only when its marker and key match
and its layout is valid for the graph (``offsets`` rising from 0 to ``N``, ``node_ids`` a
permutation of ``0..N-1``); otherwise the clusters are recomputed. A file of ours that fails
(another key, a damaged or tampered layout, a file that is not an archive) is replaced, with
a logged warning; a readable archive without our marker is left untouched and not cached.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Optional

import numpy as np
import torch

from ..base.npz_cache import read_entry, write_entry

__all__ = ["ClusterLayout", "cluster_layout", "metis_clusters", "check_partition"]

log = logging.getLogger(__name__)

_FORMAT = "dgl_rsc.clusters/1"  # marks a file as ours; bump it when the layout changes


def metis_clusters(src, dst, num_nodes: int, num_parts: int, seed: int = 0) -> torch.Tensor:
    """``(N,)`` int64 METIS cluster of each node (pymetis on the symmetrized graph without
    self-loops, METIS seeded with ``seed``)."""
    from ..distributed.partition import metis_assignment

    return metis_assignment(src, dst, num_nodes, num_parts, seed, instead="pass partition=")


def check_partition(partition, n: int, num_parts: int) -> torch.Tensor:
    """A user's ``(N,)`` cluster vector as int64 on the CPU, ids in ``[0, num_parts)``."""
    from ..distributed.partition import part_vector

    return part_vector(partition, n, num_parts, "partition", "num_parts", hint="")[0]


class ClusterLayout:
    """Cluster ``c`` holds ``node_ids[offsets[c]:offsets[c + 1]]`` (``offsets (P+1,)``,
    ``node_ids (N,)``, int64), the arrays DGL's ``ClusterGCNSampler`` keeps."""

    def __init__(self, offsets: torch.Tensor, node_ids: torch.Tensor):
        self.offsets, self.node_ids = offsets, node_ids

    @classmethod
    def from_parts(cls, part: torch.Tensor, num_parts: int) -> ClusterLayout:
        offsets = torch.zeros(num_parts + 1, dtype=torch.int64)
        torch.cumsum(torch.bincount(part, minlength=num_parts), 0, out=offsets[1:])
        return cls(offsets, torch.argsort(part, stable=True))

    @property
    def num_parts(self) -> int:
        return self.offsets.numel() - 1

    def nodes(self, parts) -> torch.Tensor:
        """``(n_b,)`` the nodes of clusters ``parts``, cluster after cluster."""
        o = self.offsets.tolist()
        return torch.cat([self.node_ids[o[c] : o[c + 1]] for c in parts])

    def problem(self, num_parts: int, num_nodes: int) -> Optional[str]:
        """Why this layout cannot be the clusters of ``num_nodes`` nodes into ``num_parts``,
        or ``None`` when it can."""
        o, ids = self.offsets, self.node_ids
        if o.shape != (num_parts + 1,) or ids.shape != (num_nodes,):
            return (
                f"it holds {o.numel() - 1} clusters of {ids.numel()} nodes, not {num_parts} "
                f"of {num_nodes}"
            )
        if int(o[0]) != 0 or int(o[-1]) != num_nodes or bool((o[1:] < o[:-1]).any()):
            return f"its offsets do not rise from 0 to {num_nodes}"
        if int(ids.min()) < 0 or int(ids.max()) >= num_nodes:
            return f"its node ids leave [0, {num_nodes})"
        if not bool((torch.bincount(ids, minlength=num_nodes) == 1).all()):
            return "its node ids repeat a node (they must list every node once)"
        return None

    def save(self, path: str, key: str) -> None:
        """Write the layout with ``key`` as an npz cache entry (atomically)."""
        write_entry(path, _FORMAT, key, {"num_nodes": np.array(self.node_ids.numel()),
                                         "offsets": self.offsets.numpy(),
                                         "node_ids": self.node_ids.numpy()})  # fmt: skip

    @classmethod
    def read(cls, path: str, key: str, num_parts: int, num_nodes: int) -> tuple:
        """``("hit", layout)`` or ``(why not, None)``: ``missing``, ``foreign`` (an archive
        without our marker), ``stale`` (another key) or ``corrupt`` (unreadable, or a layout
        that fails :meth:`problem`, which is then logged)."""
        status, arrays = read_entry(path, _FORMAT, key, ("offsets", "node_ids"))
        if status != "hit":
            return status, None
        offsets, ids = arrays["offsets"], arrays["node_ids"]
        if not all(a.dtype.kind in "iu" and a.ndim == 1 for a in (offsets, ids)):
            return "corrupt", None
        layout = cls(torch.from_numpy(offsets.astype(np.int64)),
                     torch.from_numpy(ids.astype(np.int64)))  # fmt: skip
        why = layout.problem(num_parts, num_nodes)
        if why is not None:
            log.warning("Cluster-GCN cache %s: %s", path, why)
            return "corrupt", None
        return "hit", layout


def _cache_key(src, dst, n: int, num_parts: int, seed: int, partition) -> str:
    h = hashlib.sha256(_FORMAT.encode())
    h.update(json.dumps([n, num_parts, seed, partition is None]).encode())
    for t in (src, dst) if partition is None else (partition,):
        h.update(memoryview(t.contiguous().numpy()).cast("B"))
    return h.hexdigest()


def cluster_layout(src, dst, n, num_parts, seed, partition, cache_dir):
    """``(layout, path)``: the clusters (``partition``'s, or METIS's), and the cache file
    that holds them in ``cache_dir`` (reused when valid, see the module) or ``None``."""
    path = key = None
    if cache_dir is not None:
        key = _cache_key(src, dst, n, num_parts, seed, partition)
        path = os.path.join(os.fspath(cache_dir), f"cluster_gcn-{key[:24]}.npz")
        status, layout = ClusterLayout.read(path, key, num_parts, n)
        if status == "hit":
            log.info("Cluster-GCN: reusing the clusters in %s", path)
            return layout, path
        if status == "foreign":
            log.warning("%s is not a dgl_rsc cluster file; left untouched, not cached", path)
            path = None
        elif status != "missing":
            log.warning("Cluster-GCN cache %s is %s; recomputing it", path, status)
    if partition is None:
        partition = metis_clusters(src, dst, n, num_parts, seed)
    layout = ClusterLayout.from_parts(partition, num_parts)
    if path is not None:
        layout.save(path, key)
        log.info("Cluster-GCN: %d clusters of %d nodes written to %s", num_parts, n, path)
    return layout, path
