"""One rank's share of an experiment: the partition, the local graph and the owned rows.

The partition is computed once per graph and settings and cached on disk
(:func:`~dgl_rsc.distributed.partition.load_or_partition`): rank 0 computes or loads it
first, the other ranks read the cache after a barrier (or compute the same deterministic
partition when no cache directory is given). Bad settings are refused before any training:
more partitions than nodes, a world size that differs from the partition count, and a
partition without training nodes.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional

import torch

from ..core.config import ConfigError
from .exchange import HaloExchange
from .halo import build_local
from .local_graph import LocalGraph
from .partition import load_or_partition
from .runtime import DistContext

__all__ = ["RankData", "rank_data", "make_exchange", "shared_partition", "owned_rows"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class RankData:
    """This rank's rows: the local graph and the owned nodes' features, labels and masks.

    Attributes:
        graph: the :class:`~dgl_rsc.distributed.local_graph.LocalGraph`.
        owned: ``(n_own,)`` global ids in local order.
        feat, label: the owned rows (``(n_own, F)``, ``(n_own,)`` or ``(n_own, C)``).
        masks: ``{"train", "val", "test"}`` over the owned rows.
        train_total: training nodes over all ranks.
        quality: the partition's quality (edge cut, halo sizes, balance), plain numbers.
        partition_file: the cache file, or ``None``.
    """

    graph: LocalGraph
    owned: torch.Tensor
    feat: torch.Tensor
    label: torch.Tensor
    masks: dict
    train_total: int
    quality: dict
    partition_file: Optional[str]


def rank_data(data, edges, ctx: DistContext, *, parts: int, method: str = "metis",
              seed: int = 0, cache_dir: Optional[str] = None, overlap: bool = True,
              forward_policy=None, backward_policy=None, budget=None) -> RankData:  # fmt: skip
    """Partition ``edges = (src, dst, N)`` of ``data`` (a :class:`~dgl_rsc.data.GraphData`)
    into ``parts`` and build this rank's :class:`RankData` (its exchange under ``budget``, a
    :class:`~dgl_rsc.distributed.budget_plan.CommBudget`, when given).

    Raises:
        ConfigError: ``parts`` differs from the world size or exceeds the node count, or a
            part has no training node (on every rank, naming the part).
    """
    src, dst, n = edges
    part, quality, path = shared_partition(data, edges, ctx, parts=parts, method=method,
                                           seed=seed, cache_dir=cache_dir)  # fmt: skip
    lp = build_local(src, dst, n, part, ctx.rank, parts)
    exchange = make_exchange(lp, ctx, forward_policy, backward_policy, budget)
    graph = LocalGraph(lp, ctx, exchange, overlap=overlap)
    log.info("rank %d: %d nodes owned (%d central), %d halo, %d local edges", ctx.rank,
             lp.n_own, lp.n_central, lp.n_halo, graph.num_edges())  # fmt: skip
    return owned_rows(data, graph, quality, path)


def make_exchange(plan, ctx: DistContext, forward_policy=None, backward_policy=None,
                  budget=None) -> HaloExchange:  # fmt: skip
    """The halo exchange of ``plan`` (a 1D :class:`~.halo.LocalPartition` or a 1.5D rank
    plan): the plain one, or under ``budget`` (a
    :class:`~dgl_rsc.distributed.budget_plan.CommBudget`) the budgeted one."""
    if budget is None:
        return HaloExchange(plan, ctx, forward_policy, backward_policy)
    from .budget_exchange import BudgetedExchange

    return BudgetedExchange(plan, ctx, budget, forward_policy, backward_policy)


def shared_partition(data, edges, ctx: DistContext, *, parts: int, method: str, seed: int,
                     cache_dir: Optional[str], blocks: Optional[int] = None) -> tuple:  # fmt: skip
    """``(part (N,), quality, cache file)``: the partition of ``edges`` into ``blocks``
    (default ``parts``) parts, computed or read by rank 0 first, then read (or computed
    alike) by the others.

    Raises:
        ConfigError: ``parts`` differs from the world size or exceeds the node count, or a
            part has no training node (on every rank, naming the part).
    """
    src, dst, n = edges
    if parts != ctx.world_size:
        raise ConfigError(
            f"distributed.partitions={parts} but {ctx.world_size} processes run; start one "
            "process per partition (dgl-rsc run --nproc N, or torchrun --nproc-per-node)."
        )
    if parts > n:
        raise ConfigError(
            f"distributed.partitions={parts} exceeds the graph's {n} nodes; use fewer."
        )
    blocks = parts if blocks is None else blocks
    result = None
    if ctx.is_main or cache_dir is None:
        result = _partition(src, dst, n, blocks, method, seed, cache_dir)
    ctx.barrier("waiting for rank 0 to partition the graph")
    if result is None:
        result = _partition(src, dst, n, blocks, method, seed, cache_dir)
    part = result[0]
    train_per_part = torch.bincount(part[data.train_mask], minlength=blocks)
    empty = torch.nonzero(train_per_part == 0).squeeze(1).tolist()
    if empty:
        raise ConfigError(
            f"partition(s) {empty} of {blocks} hold no training node ({method} partition); use "
            "fewer partitions or another distributed.method so every rank trains."
        )
    return result


def owned_rows(data, graph, quality: dict, path: Optional[str]) -> RankData:
    """The :class:`RankData` of ``graph`` (a local graph whose ``part.owned`` are the rows):
    the owned rows' features, labels and masks on the graph's device."""
    owned, dev = graph.part.owned, graph.device
    masks = {s: getattr(data, f"{s}_mask")[owned].to(dev) for s in ("train", "val", "test")}
    total = int(data.train_mask.sum())
    if data.task == "multilabel":
        total *= int(data.label.shape[1])
    return RankData(graph, owned, data.feat[owned].to(dev), data.label[owned].to(dev), masks,
                    total, quality, path)  # fmt: skip


def _partition(src, dst, n, parts, method, seed, cache_dir):
    try:
        return load_or_partition(src, dst, n, parts, method, seed, cache_dir)
    except (ValueError, ImportError) as exc:
        raise ConfigError(f"partitioning the graph failed: {exc}") from None
