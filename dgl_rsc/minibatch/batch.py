"""The batch both engines yield, the seeds each batch draws from, and GraphSAINT's
normalization estimated from pre-sampled batches.

A :class:`SubgraphBatch` is the node-induced subgraph of the full graph on ``nodes``; the
training loop gathers its features and labels with ``feat[batch.nodes]``.

GraphSAINT's normalization (Zeng et al., ICLR 2020, Sec. 3.2 and Appendix D). Let ``p_v`` be
the probability that node ``v`` is in a sampled subgraph and ``p_e`` that edge ``e = (u -> v)``
is (both ends in it). Then, with ``T`` the number of nodes the loss averages over,

- loss: ``sum_{v in batch} node_norm[v] * L_v`` with ``node_norm[v] = 1 / (T * p_v)``
  (the paper's ``1 / lambda_v``) has expectation ``(1 / T) sum_v L_v``;
- aggregation: ``sum_{u -> v in batch} edge_norm[e] * A[v, u] * x_u`` with
  ``edge_norm[e] = p_v / p_e = 1 / alpha_{u,v}`` (``v`` the destination) has expectation
  ``sum_u A[v, u] * x_u`` given that ``v`` is in the batch. ``A`` is the full graph's
  (normalized) adjacency: ``edge_norm`` multiplies its entries, not the subgraph's.

:func:`estimate_saint_norms` estimates ``p_v = C_v / K`` and ``p_e = C_e / K`` from ``K``
pre-sampled batches, ``C`` counting the batches that hold the node or edge. A count of zero
(never drawn in ``K`` batches) is read as one, which keeps every weight finite: ``node_norm``
at most ``K / T`` and ``1 <= edge_norm <= K``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
from typing import Callable, Iterable, Iterator, Optional, Protocol

import numpy as np
import torch

from ..sparse.graph import Graph

__all__ = [
    "SubgraphBatch",
    "SaintNorms",
    "PresampleSource",
    "derive_seed",
    "saint_norms",
    "count_inclusions",
    "estimate_saint_norms",
    "PRESAMPLE_COVERAGE",
]

#: without ``num_presample``, pre-sample until the batches hold this many nodes per graph
#: node in all (the rule of GraphSAINT's reference code)
PRESAMPLE_COVERAGE = 50


def derive_seed(seed: int, *path: int) -> int:
    """A seed in ``[0, 2**31)`` for ``(seed, *path)``, e.g. ``(seed, stream, epoch)``.

    Both engines seed the same draws from it, so a batch depends on ``(seed, epoch, index)``
    only, never on what ran before it. ``2**31`` bounds it because ``dgl.random.seed`` takes
    a C ``int``.

    Example:
        >>> derive_seed(0, 0, 1) == derive_seed(0, 0, 1) != derive_seed(0, 0, 2)
        True
    """
    state = np.random.SeedSequence([int(seed), *map(int, path)]).generate_state(1)
    return int(state[0]) & 0x7FFFFFFF


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class SubgraphBatch:
    """One sampled subgraph: the node-induced subgraph of the full graph on ``nodes``.

    Attributes:
        nodes: ``(n_b,)`` int64 global ids; local node ``i`` is ``nodes[i]``. Order: the
            sampler's (Cluster-GCN: the batch's clusters in drawn order, each cluster's
            nodes ascending; GraphSAINT: ascending), the same for both engines.
        src, dst: ``(E_b,)`` int64 local ids of the batch's edges.
        eids: ``(E_b,)`` int64 global edge ids, ascending: every edge of the full graph
            whose two ends are in ``nodes``.
        epoch, index: the epoch it was drawn in and its position there.
        node_norm: ``(n_b,)`` float32 loss weight of each node, or ``None``.
        edge_norm: ``(E_b,)`` float32 aggregation weight of each edge, or ``None``.

    Example:
        >>> b = SubgraphBatch(torch.tensor([4, 2]), torch.tensor([0]), torch.tensor([1]),
        ...                   torch.tensor([7]), epoch=0, index=0)
        >>> b.num_nodes, b.num_edges, b.to_graph().in_degrees().tolist(), len(b.key)
        (2, 1, [0, 1], 32)
    """

    nodes: torch.Tensor
    src: torch.Tensor
    dst: torch.Tensor
    eids: torch.Tensor
    epoch: int
    index: int
    node_norm: Optional[torch.Tensor] = None
    edge_norm: Optional[torch.Tensor] = None

    @property
    def num_nodes(self) -> int:
        return self.nodes.numel()

    @property
    def num_edges(self) -> int:
        return self.eids.numel()

    @functools.cached_property
    def key(self) -> str:
        """A digest of ``nodes`` in order: the same subgraph (same local numbering) has
        the same key in every epoch and in both engines, so per-subgraph state can be
        cached under it."""
        data = self.nodes.to("cpu", torch.int64).contiguous().numpy().tobytes()
        return hashlib.blake2b(data, digest_size=16).hexdigest()

    def to_graph(self) -> Graph:
        """The batch as a DGL-free :class:`dgl_rsc.Graph` on local ids."""
        return Graph(self.src, self.dst, self.num_nodes)

    def to_dgl(self):
        """The batch as a ``DGLGraph`` on local ids, with ``ndata[dgl.NID]`` and
        ``edata[dgl.EID]`` holding the global ids (as ``DGLGraph.subgraph`` sets them)."""
        from ..base import _deps

        dgl = _deps.require_dgl()
        g = dgl.graph((self.src, self.dst), num_nodes=self.num_nodes)
        g.ndata[dgl.NID] = self.nodes
        g.edata[dgl.EID] = self.eids
        return g

    def __repr__(self) -> str:
        return (
            f"SubgraphBatch(epoch={self.epoch}, index={self.index}, "
            f"num_nodes={self.num_nodes}, num_edges={self.num_edges}, "
            f"normalized={self.node_norm is not None})"
        )


@dataclasses.dataclass(frozen=True, eq=False)
class SaintNorms:
    """GraphSAINT weights of every node and edge of the full graph (see the module doc).

    Attributes:
        node: ``(N,)`` float32 ``1 / (T * p_v)``.
        edge: ``(E,)`` float32 ``p_dst / p_e``.
        num_presample: ``K``, the number of batches the probabilities were estimated from
            (0 when they were given exactly).
    """

    node: torch.Tensor
    edge: torch.Tensor
    num_presample: int

    def apply(self, batch: SubgraphBatch) -> SubgraphBatch:
        """``batch`` with its ``node_norm`` and ``edge_norm`` gathered from these weights."""
        return dataclasses.replace(
            batch, node_norm=self.node[batch.nodes], edge_norm=self.edge[batch.eids]
        )


def saint_norms(
    node_prob: torch.Tensor,
    edge_prob: torch.Tensor,
    dst: torch.Tensor,
    num_loss_nodes: Optional[int] = None,
    num_presample: int = 0,
) -> SaintNorms:
    """GraphSAINT's weights from inclusion probabilities.

    Args:
        node_prob: ``(N,)`` ``p_v > 0``.
        edge_prob: ``(E,)`` ``p_e > 0``, ``p_e <= p_dst``.
        dst: ``(E,)`` destination of each edge (the aggregating node).
        num_loss_nodes: ``T`` (default ``N``): pass the number of training nodes when the loss
            averages over those only.
        num_presample: recorded in the result.

    Example:
        >>> w = saint_norms(torch.tensor([0.5, 1.0]), torch.tensor([0.5]), torch.tensor([1]))
        >>> w.node.tolist(), w.edge.tolist()
        ([1.0, 0.5], [2.0])
    """
    node_prob, edge_prob = node_prob.double(), edge_prob.double()
    if node_prob.numel() and not bool((node_prob > 0).all() and (edge_prob > 0).all()):
        raise ValueError("node_prob and edge_prob must be positive: a weight is 1 / p.")
    t = node_prob.numel() if num_loss_nodes is None else int(num_loss_nodes)
    if t < 1:
        raise ValueError(f"num_loss_nodes={num_loss_nodes!r} must be at least 1.")
    node = 1.0 / (t * node_prob)
    edge = node_prob[dst.long()] / edge_prob
    return SaintNorms(node.float(), edge.float(), int(num_presample))


def count_inclusions(
    batches: Iterable[SubgraphBatch], num_nodes: int, num_edges: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(C_v (N,), C_e (E,), K)``: in how many of the ``K`` batches each node and each edge
    of the full graph appears."""
    node_count = torch.zeros(num_nodes, dtype=torch.int64)
    edge_count = torch.zeros(num_edges, dtype=torch.int64)
    k = 0
    for batch in batches:  # a batch holds a node or an edge once: O(n_b + E_b) per batch
        node_count[batch.nodes] += 1
        edge_count[batch.eids] += 1
        k += 1
    return node_count, edge_count, k


class PresampleSource(Protocol):
    """What :func:`estimate_saint_norms` needs of a loader."""

    num_nodes: int
    dst: torch.Tensor  # (E,) global destination of each edge

    def presample(self) -> Iterator[SubgraphBatch]: ...


def _until_coverage(batches: Iterator[SubgraphBatch], nodes: int,
                    progress=None) -> Iterator[SubgraphBatch]:  # fmt: skip
    drawn = 0
    for batch in batches:
        yield batch
        drawn += batch.num_nodes
        if progress is not None:
            progress(min(drawn, nodes), nodes)
        if drawn >= nodes:
            return


def _reporting(batches: Iterator[SubgraphBatch], total: int, progress) -> Iterator[SubgraphBatch]:
    for i, batch in enumerate(batches, 1):
        yield batch
        progress(i, total)


def estimate_saint_norms(
    loader: PresampleSource,
    num_presample: Optional[int] = None,
    num_loss_nodes: Optional[int] = None,
    progress: Optional[Callable[[int, int], None]] = None,
) -> SaintNorms:
    """GraphSAINT's weights estimated from ``num_presample`` batches of ``loader.presample()``
    (a stream of its own: training epochs draw other batches).

    Args:
        loader: a :class:`~dgl_rsc.minibatch.samplers.SaintLoader` (either engine).
        num_presample: ``K``; default: as many batches as it takes to draw
            ``PRESAMPLE_COVERAGE * N`` nodes in all.
        num_loss_nodes: ``T``, see :func:`saint_norms`.
        progress: called as ``progress(done, total)`` after each batch: nodes drawn of the
            nodes to draw (default ``K``), or batches of ``K``.
    """
    n, dst = loader.num_nodes, loader.dst
    if num_presample is None:
        batches = _until_coverage(loader.presample(), PRESAMPLE_COVERAGE * n, progress)
    elif isinstance(num_presample, bool) or not isinstance(num_presample, int):
        raise ValueError(f"num_presample must be an integer or None, got {num_presample!r}.")
    elif num_presample < 1:
        raise ValueError(f"num_presample={num_presample} must be at least 1 (or None).")
    else:
        batches = itertools.islice(loader.presample(), num_presample)
        if progress is not None:
            batches = _reporting(batches, num_presample, progress)
    node_count, edge_count, k = count_inclusions(batches, n, dst.numel())
    node_prob = node_count.clamp(min=1).double() / k
    edge_prob = edge_count.clamp(min=1).double() / k
    return saint_norms(node_prob, edge_prob, dst, num_loss_nodes, k)
