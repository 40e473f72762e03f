"""GraphSAINT (Zeng et al., ICLR 2020) batches: random node, edge or random-walk subgraphs,
drawn by the native engine as DGL's ``SAINTSampler`` under its ``DataLoader`` draws them
(see :mod:`.samplers` for how both engines agree).
"""

from __future__ import annotations

import functools
import itertools
from typing import Iterator, Optional

import torch

from ..base.names import unknown
from ..sparse.graph import check_edges
from .batch import SaintNorms, SubgraphBatch, derive_seed, estimate_saint_norms
from .loader_base import PRESAMPLE, SEED_MAX, Loader, OutCSR, dgl_engine, int_arg, pick_engine

__all__ = ["SaintLoader", "SAINT_MODES", "ENGINES"]

_MULTINOMIAL_MAX = 2**24  # torch.multinomial takes at most this many categories


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
            int_arg("budget[0] (num_roots)", budget[0], 1),
            int_arg("budget[1] (walk_length)", budget[1], 1),
        )
    what = "nodes drawn" if mode == "node" else "edges drawn"
    return int_arg("budget", budget, 1, fix=f"It is the number of {what} per batch.")


#: GraphSAINT modes and the meaning of ``budget`` in each (as DGL's ``SAINTSampler``)
SAINT_MODES = {
    "node": "int: nodes drawn with replacement, P(v) ~ out-degree (at least 1)",
    "edge": "int: edges drawn with replacement, P(u->v) ~ 1/in_deg(v) + 1/out_deg(u)",
    "walk": "(num_roots, walk_length): uniform roots, uniform out-neighbour steps",
}


#: ``engine -> () -> class`` (the DGL one imports DGL on use)
ENGINES = {"native": lambda: NativeSaint, "dgl": dgl_engine("DGLSaint")}


class SaintLoader(Loader):
    """GraphSAINT (Zeng et al., ICLR 2020): random node, edge or random-walk subgraphs.

    Args:
        src, dst, num_nodes: the full graph, as for :class:`ClusterLoader`.
        mode: a key of :data:`SAINT_MODES`; ``budget`` as described there.
        batches_per_epoch: batches in each epoch.
        seed: seeds every draw; engine: ``"native"`` or ``"dgl"``.
        normalize: estimate GraphSAINT's weights (:func:`.estimate_saint_norms`) from
            ``num_presample`` batches and attach them to every batch.
        num_presample, num_loss_nodes, progress: see :func:`.estimate_saint_norms`.
        norms: weights estimated before (the same graph, mode, budget and seed: the methods
            of one run share them), used instead of pre-sampling again.

    Attributes:
        norms: the :class:`.SaintNorms` attached to every batch, or ``None``.

    Example:
        >>> src = torch.arange(8); dst = (src + 1) % 8
        >>> loader = SaintLoader(src, dst, 8, "node", budget=3, batches_per_epoch=2,
        ...                      num_presample=20)
        >>> [b.num_nodes <= 3 and b.node_norm.shape == (b.num_nodes,) for b in loader.epoch(0)]
        [True, True]
    """

    def __init__(self, src, dst, num_nodes, mode, budget, batches_per_epoch, seed=0,
                 engine="native", normalize=True, num_presample=None,
                 num_loss_nodes=None, progress=None, norms=None):  # fmt: skip
        super().__init__()
        src, dst, n = check_edges(src, dst, num_nodes)
        if mode not in SAINT_MODES:
            raise unknown("mode", mode, SAINT_MODES)
        if mode == "edge" and src.numel() == 0:
            raise ValueError("mode='edge' draws edges but the graph has none; use mode='node'.")
        self.mode, self.budget = mode, _saint_budget(mode, budget)
        self.batches_per_epoch = int_arg("batches_per_epoch", batches_per_epoch, 1)
        self.seed = int_arg("seed", seed, 0, SEED_MAX)
        self.num_nodes, self.dst = n, dst
        cls = pick_engine(engine, ENGINES)
        self._impl = cls(src, dst, n, mode, self.budget, self.batches_per_epoch, self.seed)
        self.norms: Optional[SaintNorms] = None
        if normalize:
            self.norms = norms or estimate_saint_norms(self, num_presample, num_loss_nodes,
                                                       progress)  # fmt: skip

    def presample(self) -> Iterator[SubgraphBatch]:
        """An endless stream of batches, seeded apart from the training epochs."""
        for e in itertools.count():
            yield from self._impl.batches(PRESAMPLE, e)

    def epoch(self, epoch: int) -> Iterator[SubgraphBatch]:
        batches = super().epoch(epoch)
        return batches if self.norms is None else map(self.norms.apply, batches)

    def __len__(self) -> int:
        return self.batches_per_epoch
