"""Cluster-GCN and GraphSAINT loaders with two engines that yield the same batches.

``engine="dgl"`` runs DGL's ``ClusterGCNSampler`` / ``SAINTSampler`` under DGL's
``DataLoader`` (:mod:`.dgl_samplers`); ``engine="native"`` (here) makes the same random draws
with NumPy and torch, so that for a seed both yield the same :class:`.SubgraphBatch` es:

- Epoch ``e`` of a stream draws from ``s = derive_seed(seed, stream, e)``. DGL's
  ``DataLoader`` shuffles with NumPy's global ``RandomState`` (``np.random.shuffle``) and
  torch's ``DataLoader`` draws one int64 from torch's default generator when an epoch
  starts; GraphSAINT's node sampler (``torch.multinomial``) and its walk roots
  (``torch.randint``) then draw from that generator. The native engine makes these draws
  from ``RandomState(s)`` and ``torch.Generator().manual_seed(s)``; the DGL engine puts
  ``s``'s states into the global generators while DGL samples.
- DGL's edge sampler (``dgl.random.choice``) and its random walks draw from DGL's C++ RNG,
  which torch cannot replay: both engines seed those draws per batch with
  ``derive_seed(seed, stream, e, index)``, the native one from its own torch generator. In
  modes ``'edge'`` and ``'walk'`` the engines therefore agree in distribution (the same
  edge probabilities, the same walk roots), not batch for batch.
- Cluster-GCN: both engines use one partition (pymetis, or the one passed in), which the
  DGL engine puts into ``ClusterGCNSampler`` directly: no file is handed to DGL, which would
  unpickle it. The optional cache file (:mod:`.clusters`) is an npz read without pickle.
"""

from __future__ import annotations

import difflib
import functools
import itertools
import logging
from typing import Iterator, Optional

import numpy as np
import torch

from .. import _deps
from .batch import SaintNorms, SubgraphBatch, derive_seed, estimate_saint_norms
from .clusters import ClusterLayout, check_partition, cluster_layout, metis_clusters

__all__ = [
    "ClusterLoader",
    "SaintLoader",
    "ClusterLayout",
    "SAMPLERS",
    "ENGINES",
    "SAINT_MODES",
    "TRAIN",
    "PRESAMPLE",
    "metis_clusters",
    "build_loader",
]

log = logging.getLogger(__name__)

TRAIN, PRESAMPLE = 0, 1  # the seed streams of training epochs and of GraphSAINT's presampling
_MULTINOMIAL_MAX = 2**24  # torch.multinomial takes at most this many categories
_SEED_MAX = 2**31 - 1  # METIS and DGL take a C int


def _unknown(name: str, value, choices) -> ValueError:
    near = difflib.get_close_matches(str(value), list(choices), n=1)
    hint = f" Did you mean {near[0]!r}?" if near else ""
    return ValueError(f"unknown {name}={value!r}.{hint} Choose one of: {', '.join(choices)}.")


def _int_arg(name: str, value, lo: int, hi: Optional[int] = None, fix: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}.")
    if value < lo or (hi is not None and value > hi):
        bound = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"{name}={value} must be {bound}.{' ' + fix if fix else ''}")
    return int(value)


def _edges(src, dst, num_nodes) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Validated ``(src, dst, N)``: ``(E,)`` int64 CPU tensors with ids in ``[0, N)``."""
    src, dst = torch.as_tensor(src), torch.as_tensor(dst)
    for name, t in (("src", src), ("dst", dst)):
        if t.dim() != 1 or t.is_floating_point() or t.dtype == torch.bool:
            raise ValueError(
                f"{name} must be a 1-D integer tensor, got {t.dtype} {tuple(t.shape)}."
            )
    if src.numel() != dst.numel():
        raise ValueError(f"src has {src.numel()} entries but dst has {dst.numel()}; pass pairs.")
    n = _int_arg("num_nodes", num_nodes, 1)
    src, dst = src.to("cpu", torch.int64), dst.to("cpu", torch.int64)
    if src.numel() and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= n):
        raise ValueError(f"node ids must lie in [0, num_nodes={n}); raise num_nodes or fix ids.")
    return src, dst, n


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

    def induced(self, nodes: torch.Tensor, epoch: int, index: int) -> SubgraphBatch:
        """The subgraph induced by ``nodes (n_b,)`` (distinct ids), in ``O(n_b + out-degree
        of nodes)``; edges in ascending global id, as :class:`SubgraphBatch` promises."""
        local = self._local
        local[nodes] = torch.arange(nodes.numel())
        try:
            deg = self.out_deg[nodes]
            owner = torch.repeat_interleave(deg)  # batch position of each candidate edge
            first = self.indptr[nodes] - (torch.cumsum(deg, 0) - deg)
            cand = self.eids[first[owner] + torch.arange(owner.numel())]
            eids = torch.sort(cand[local[self.dst[cand]] >= 0]).values
            src, dst = local[self.src[eids]], local[self.dst[eids]]
        finally:
            local[nodes] = -1
        return SubgraphBatch(nodes, src, dst, eids, epoch, index)


# -- Cluster-GCN ---------------------------------------------------------------------------


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


# -- GraphSAINT ----------------------------------------------------------------------------


def _base_seed_draw(gen: torch.Generator) -> None:
    """The int64 that torch's ``DataLoader`` draws from the default generator per epoch."""
    torch.empty((), dtype=torch.int64).random_(generator=gen)


def _from_cdf(cdf: torch.Tensor, num: int, gen: torch.Generator) -> torch.Tensor:
    """``(num,)`` draws with replacement of ``i`` with probability ``~ cdf[i] - cdf[i-1]``
    (float64 ``cdf``, for any number of categories)."""
    u = torch.rand(num, dtype=torch.float64, generator=gen) * cdf[-1]
    return torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.numel() - 1)


class NativeSaint:
    """GraphSAINT batches (node sets drawn as DGL's ``SAINTSampler`` draws them, then induced).

    ``gen`` mirrors torch's default generator in a DGL run, ``aux`` (seeded per batch)
    stands in for DGL's C++ RNG.
    """

    def __init__(self, src, dst, num_nodes, mode, budget, batches_per_epoch, seed):
        self.graph = OutCSR(src, dst, num_nodes)
        self.draw = getattr(self, f"_draw_{mode}")
        self.budget, self.batches_per_epoch, self.seed = budget, batches_per_epoch, seed

    def batches(self, stream: int, epoch: int) -> Iterator[SubgraphBatch]:
        gen = torch.Generator().manual_seed(derive_seed(self.seed, stream, epoch))
        _base_seed_draw(gen)
        for index in range(self.batches_per_epoch):
            aux = torch.Generator().manual_seed(derive_seed(self.seed, stream, epoch, index))
            yield self.graph.induced(self.draw(gen, aux), epoch, index)

    @functools.cached_property
    def node_weights(self) -> torch.Tensor:
        """``(N,)`` float32 out-degree, at least 1 (DGL's node-sampler weights)."""
        return self.graph.out_deg.float().clamp(min=1)

    @functools.cached_property
    def edge_prob(self) -> torch.Tensor:
        """``(E,)`` float32 ``1/in_deg(dst) + 1/out_deg(src)``, normalized (DGL's, bit for bit)."""
        g = self.graph
        in_deg = torch.bincount(g.dst, minlength=g.num_nodes).float().clamp(min=1)
        prob = 1.0 / in_deg[g.dst] + 1.0 / g.out_deg.float().clamp(min=1)[g.src]
        return prob / prob.sum()

    @functools.cached_property
    def edge_cdf(self) -> torch.Tensor:
        return torch.cumsum(self.edge_prob.double(), 0)

    def _draw_node(self, gen, aux) -> torch.Tensor:
        w = self.node_weights
        if w.numel() > _MULTINOMIAL_MAX:  # DGL's torch.multinomial fails here; draw anyway
            return _from_cdf(torch.cumsum(w.double(), 0), self.budget, gen).unique()
        return torch.multinomial(w, self.budget, replacement=True, generator=gen).unique()

    def _draw_edge(self, gen, aux) -> torch.Tensor:
        e = _from_cdf(self.edge_cdf, self.budget, aux).unique()
        return torch.cat([self.graph.src[e], self.graph.dst[e]]).unique()

    def _draw_walk(self, gen, aux) -> torch.Tensor:
        num_roots, length = self.budget
        g = self.graph
        cur = torch.randint(0, g.num_nodes, (num_roots,), generator=gen)
        seen = [cur]
        for _ in range(length):  # a walk ends at a node without out-edges, as DGL's does
            cur = cur[g.out_deg[cur] > 0]
            if cur.numel() == 0:
                break
            step = torch.rand(cur.numel(), dtype=torch.float64, generator=aux)
            deg = g.out_deg[cur]
            off = (step * deg).long().minimum(deg - 1)
            cur = g.dst[g.eids[g.indptr[cur] + off]]
            seen.append(cur)
        return torch.cat(seen).unique()


def _saint_budget(mode: str, budget):
    if mode == "walk":
        if not isinstance(budget, (tuple, list)) or len(budget) != 2:
            raise ValueError(f"mode='walk' takes budget=(num_roots, walk_length), got {budget!r}.")
        return (
            _int_arg("budget[0] (num_roots)", budget[0], 1),
            _int_arg("budget[1] (walk_length)", budget[1], 1),
        )
    what = "nodes drawn" if mode == "node" else "edges drawn"
    return _int_arg("budget", budget, 1, fix=f"It is the number of {what} per batch.")


#: GraphSAINT modes and the meaning of ``budget`` in each (as DGL's ``SAINTSampler``)
SAINT_MODES = {
    "node": "int: nodes drawn with replacement, P(v) ~ out-degree (at least 1)",
    "edge": "int: edges drawn with replacement, P(u->v) ~ 1/in_deg(v) + 1/out_deg(u)",
    "walk": "(num_roots, walk_length): uniform roots, uniform out-neighbour steps",
}


# -- engines and loaders -------------------------------------------------------------------


def _native_engines() -> dict:
    return {"cluster": NativeCluster, "saint": NativeSaint}


def _dgl_engines() -> dict:
    _deps.require_dgl()
    from . import dgl_samplers

    return {"cluster": dgl_samplers.DGLCluster, "saint": dgl_samplers.DGLSaint}


#: ``engine -> () -> {"cluster": class, "saint": class}`` (the DGL one imports DGL on use)
ENGINES = {"native": _native_engines, "dgl": _dgl_engines}


def _engine(engine: str, kind: str):
    if engine not in ENGINES:
        raise _unknown("engine", engine, ENGINES)
    return ENGINES[engine]()[kind]


class _Loader:
    """What both loaders share: epochs as iterators, ``iter()`` going on to the next epoch."""

    def __init__(self):
        self._next_epoch = 0

    def epoch(self, epoch: int) -> Iterator[SubgraphBatch]:
        """The batches of ``epoch`` (a function of ``seed`` and ``epoch`` alone)."""
        return self._impl.batches(TRAIN, _int_arg("epoch", epoch, 0))

    def __iter__(self) -> Iterator[SubgraphBatch]:
        self._next_epoch += 1
        return self.epoch(self._next_epoch - 1)


class ClusterLoader(_Loader):
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
        >>> src = torch.arange(8); dst = (src + 1) % 8
        >>> loader = ClusterLoader(src, dst, 8, num_parts=4, batch_size=2,
        ...                        partition=torch.arange(8) // 2)
        >>> [b.nodes.tolist() for b in loader.epoch(0)]
        [[4, 5, 6, 7], [2, 3, 0, 1]]
    """

    def __init__(
        self,
        src,
        dst,
        num_nodes,
        num_parts,
        batch_size,
        seed=0,
        engine="native",
        shuffle=True,
        partition=None,
        cache_dir=None,
    ):
        super().__init__()
        src, dst, n = _edges(src, dst, num_nodes)
        self.num_parts = _int_arg("num_parts", num_parts, 1, n, "Use at most one cluster per node.")
        self.batch_size = _int_arg(
            "batch_size",
            batch_size,
            1,
            self.num_parts,
            "It counts clusters per batch: at most num_parts.",
        )
        self.seed = _int_arg("seed", seed, 0, _SEED_MAX)
        cls = _engine(engine, "cluster")
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


class SaintLoader(_Loader):
    """GraphSAINT (Zeng et al., ICLR 2020): random node, edge or random-walk subgraphs.

    Args:
        src, dst, num_nodes: the full graph, as for :class:`ClusterLoader`.
        mode: a key of :data:`SAINT_MODES`; ``budget`` as described there.
        batches_per_epoch: batches in each epoch.
        seed: seeds every draw; engine: ``"native"`` or ``"dgl"``.
        normalize: estimate GraphSAINT's weights (:func:`.estimate_saint_norms`) from
            ``num_presample`` batches and attach them to every batch.
        num_presample, num_loss_nodes: see :func:`.estimate_saint_norms`.

    Attributes:
        norms: the :class:`.SaintNorms` attached to every batch, or ``None``.

    Example:
        >>> src = torch.arange(8); dst = (src + 1) % 8
        >>> loader = SaintLoader(src, dst, 8, "node", budget=3, batches_per_epoch=2,
        ...                      num_presample=20)
        >>> [b.num_nodes <= 3 and b.node_norm.shape == (b.num_nodes,) for b in loader.epoch(0)]
        [True, True]
    """

    def __init__(
        self,
        src,
        dst,
        num_nodes,
        mode,
        budget,
        batches_per_epoch,
        seed=0,
        engine="native",
        normalize=True,
        num_presample=None,
        num_loss_nodes=None,
    ):
        super().__init__()
        src, dst, n = _edges(src, dst, num_nodes)
        if mode not in SAINT_MODES:
            raise _unknown("mode", mode, SAINT_MODES)
        if mode == "edge" and src.numel() == 0:
            raise ValueError("mode='edge' draws edges but the graph has none; use mode='node'.")
        self.mode, self.budget = mode, _saint_budget(mode, budget)
        self.batches_per_epoch = _int_arg("batches_per_epoch", batches_per_epoch, 1)
        self.seed = _int_arg("seed", seed, 0, _SEED_MAX)
        self.num_nodes, self.dst = n, dst
        cls = _engine(engine, "saint")
        self._impl = cls(src, dst, n, mode, self.budget, self.batches_per_epoch, self.seed)
        self.norms: Optional[SaintNorms] = None
        if normalize:
            self.norms = estimate_saint_norms(self, num_presample, num_loss_nodes)

    def presample(self) -> Iterator[SubgraphBatch]:
        """An endless stream of batches, seeded apart from the training epochs."""
        for e in itertools.count():
            yield from self._impl.batches(PRESAMPLE, e)

    def epoch(self, epoch: int) -> Iterator[SubgraphBatch]:
        batches = super().epoch(epoch)
        return batches if self.norms is None else map(self.norms.apply, batches)

    def __len__(self) -> int:
        return self.batches_per_epoch


#: ``name -> loader class``
SAMPLERS = {"cluster": ClusterLoader, "saint": SaintLoader}


def build_loader(name: str, **kwargs):
    """``SAMPLERS[name](**kwargs)``, with an error naming the nearest sampler."""
    if name not in SAMPLERS:
        raise _unknown("sampler", name, SAMPLERS)
    return SAMPLERS[name](**kwargs)
