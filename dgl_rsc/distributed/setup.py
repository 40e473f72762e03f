"""One rank's share of an experiment: the partition, the local graph and the owned rows.

The partition is computed once per graph and settings and cached on disk
(:func:`~dgl_rsc.distributed.partition.load_or_partition`, keyed by a hash of the edge list
and the partitioner's settings): rank 0 computes or loads it first; on other nodes the first
rank (``LOCAL_RANK`` 0) then reads it (a shared cache folder) or computes the same
deterministic partition; the other ranks read their node's cache. Every rank then checks that
all ranks hold the same data and the same partition (their SHA-256), so nodes whose METIS or
data differ are refused instead of training on inconsistent halos. Each rank's partition
report (seconds, whether it came from the cache, peak memory) is gathered for the run's
report. Bad settings are refused before any training: more partitions than nodes, a world
size that differs from the partition count, and a partition without training nodes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from typing import Optional

import torch
import torch.distributed as dist

from ..base.memory import peak_rss_bytes
from ..core.config import ConfigError
from .exchange import HaloExchange
from .halo import build_local
from .local_graph import LocalGraph
from .partition import load_or_partition
from .runtime import DistContext

__all__ = [
    "RankData",
    "rank_data",
    "make_exchange",
    "shared_partition",
    "owned_rows",
    "partition_report",
    "check_same",
]

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
        partition_report: per rank, how its partition was had (:func:`partition_report`).
    """

    graph: LocalGraph
    owned: torch.Tensor
    feat: torch.Tensor
    label: torch.Tensor
    masks: dict
    train_total: int
    quality: dict
    partition_file: Optional[str]
    partition_report: list = dataclasses.field(default_factory=list)


def rank_data(data, edges, ctx: DistContext, *, parts: int, method: str = "metis",
              seed: int = 0, cache_dir: Optional[str] = None, overlap: bool = True,
              forward_policy=None, backward_policy=None, budget=None,
              progress=None) -> RankData:  # fmt: skip
    """Partition ``edges = (src, dst, N)`` of ``data`` (a :class:`~dgl_rsc.data.GraphData`)
    into ``parts`` and build this rank's :class:`RankData` (its exchange under ``budget``, a
    :class:`~dgl_rsc.distributed.budget_plan.CommBudget`, when given).

    ``progress(done, total)`` is called while METIS runs (:func:`partition_report`).

    Raises:
        ConfigError: as :func:`shared_partition`.
    """
    src, dst, n = edges
    part, quality, path, reports = shared_partition(
        data, edges, ctx, parts=parts, method=method, seed=seed, cache_dir=cache_dir,
        progress=progress,
    )  # fmt: skip
    lp = build_local(src, dst, n, part, ctx.rank, parts)
    exchange = make_exchange(lp, ctx, forward_policy, backward_policy, budget)
    graph = LocalGraph(lp, ctx, exchange, overlap=overlap)
    log.info("rank %d: %d nodes owned (%d central), %d halo, %d local edges", ctx.rank,
             lp.n_own, lp.n_central, lp.n_halo, graph.num_edges())  # fmt: skip
    return owned_rows(data, graph, quality, path, reports)


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
                     cache_dir: Optional[str], blocks: Optional[int] = None,
                     progress=None) -> tuple:  # fmt: skip
    """``(part (N,), quality, cache file, reports)``: the partition of ``edges`` into
    ``blocks`` (default ``parts``) parts, computed or loaded by rank 0 first, then by each
    other node's first rank (a shared cache, or the same deterministic partition), then read
    by the rest; ``reports``: every rank's :func:`partition_report`, gathered after
    :func:`check_same`.

    Raises:
        ConfigError: ``parts`` differs from the world size or exceeds the node count, a
            part has no training node (on every rank, naming the part), or the ranks hold
            different data or partitions (naming the rank and its node).
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
    args = (src, dst, n, blocks, method, seed, cache_dir, progress)
    result = None
    if ctx.is_main or cache_dir is None:
        result = partition_report(*args)
    ctx.barrier("waiting for rank 0 to partition the graph")
    if ctx.nodes > 1:  # each other node's first rank: a shared cache, or its own partition
        if result is None and ctx.local_rank == 0:
            result = partition_report(*args)
        ctx.barrier("waiting for each node's first rank to partition the graph")
    if result is None:
        result = partition_report(*args)
    part, quality, path, report = result
    reports = check_same(ctx, data.fingerprint(), part, report)
    train_per_part = torch.bincount(part[data.train_mask], minlength=blocks)
    empty = torch.nonzero(train_per_part == 0).squeeze(1).tolist()
    if empty:
        raise ConfigError(
            f"partition(s) {empty} of {blocks} hold no training node ({method} partition); use "
            "fewer partitions or another distributed.method so every rank trains."
        )
    return part, quality, path, reports


def owned_rows(data, graph, quality: dict, path: Optional[str], reports=()) -> RankData:
    """The :class:`RankData` of ``graph`` (a local graph whose ``part.owned`` are the rows):
    the owned rows' features, labels and masks on the graph's device."""
    owned, dev = graph.part.owned, graph.device
    masks = {s: getattr(data, f"{s}_mask")[owned].to(dev) for s in ("train", "val", "test")}
    total = int(data.train_mask.sum())
    if data.task == "multilabel":
        total *= int(data.label.shape[1])
    return RankData(graph, owned, data.feat[owned].to(dev), data.label[owned].to(dev), masks,
                    total, quality, path, list(reports))  # fmt: skip


def partition_report(src, dst, n, parts, method, seed, cache_dir, progress=None) -> tuple:
    """``(part, quality, cache path, report)``: :func:`load_or_partition` with its report
    (``cached``, ``partition_s``, ``quality_s``, METIS's ``metis_s`` and, where it ran in a
    child process, ``metis_peak_mb``) and this process's peak resident memory once it is
    done (``peak_rss_mb``, which includes loading the graph)."""
    report: dict = {}
    try:
        part, quality, path = load_or_partition(src, dst, n, parts, method, seed, cache_dir,
                                                progress=progress, report=report)  # fmt: skip
    except (ValueError, ImportError, RuntimeError) as exc:
        raise ConfigError(f"partitioning the graph failed: {exc}") from None
    child = report.pop("metis_peak_bytes", None)
    report["metis_peak_mb"] = None if child is None else child / 1e6
    report["peak_rss_mb"] = peak_rss_bytes() / 1e6
    return part, quality, path, report


def check_same(ctx: DistContext, data_sha: str, part: torch.Tensor, report: dict) -> list:
    """Every rank's partition report, after checking that all ranks hold the data and the
    partition rank 0 holds (a ``ConfigError`` naming the first rank that differs)."""
    mine = (data_sha, hashlib.sha256(part.numpy().tobytes()).hexdigest(), report)
    if ctx.world_size == 1:
        return [report]
    every = [None] * ctx.world_size
    dist.all_gather_object(every, mine)
    for r, (d, p, _) in enumerate(every):
        if d != every[0][0]:
            raise ConfigError(
                f"{ctx.where(r)} loaded other data than rank 0 (sha256 {d[:12]} against "
                f"{every[0][0][:12]}); give every node the same dataset files."
            )
        if p != every[0][1]:
            raise ConfigError(
                f"{ctx.where(r)} partitioned the graph differently from rank 0 (another "
                "METIS build or version?); put distributed.partition_cache on a filesystem "
                "every node reads, so that all ranks load rank 0's partition."
            )
    return [e[2] for e in every]
