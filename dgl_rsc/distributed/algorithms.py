"""The distributed algorithms a run chooses from (``distributed.algorithm``), one entry each:

- ``1d``: one row block per rank, the halo exchange (:mod:`.local_graph`);
- ``1.5d``: CAGNET's 1.5D with replication ``c`` (``distributed.replication``): ``P / c`` row
  blocks, each held by ``c`` ranks, halo messages inside a process column and sums over the
  replica group (:mod:`.grid`, :mod:`.plan15d`, :mod:`.block15d`, :mod:`.replica`).

:func:`build_rank` builds this rank's :class:`RankShare` (its :class:`~.setup.RankData`, the
reducer the launcher's loop calls, the grid for the run's record); :func:`check_options` refuses, in
the launcher's parent before any worker starts, what an algorithm cannot run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from typing import Callable, Optional

import torch

from ..core.config import ConfigError
from .block15d import BlockGraph
from .codecs import BitPolicy
from .grid import ProcessGrid, grid_problem
from .plan15d import rank_plan
from .reduce import DistReducer
from .replica import ColumnGroup, GridReducer
from .runtime import DistContext, DistributedError
from .setup import RankData, make_exchange, owned_rows, rank_data, shared_partition

__all__ = [
    "ALGORITHMS",
    "BLOCK_PARTITIONERS",
    "REPLICA_BITS",
    "RankShare",
    "build_rank",
    "check_options",
    "rank_data_15d",
]

log = logging.getLogger(__name__)

#: the partitioners whose parts 1.5D takes as row blocks: every rank must be able to compute
#: the same partition from the seed (a node that computes its own, as across machines without
#: a shared cache, must agree with the others: a block's replicas must hold the same rows)
BLOCK_PARTITIONERS = ("metis", "random", "contiguous")
#: widths of the replica groups' messages (a fixed width: every replica decodes the same sum)
REPLICA_BITS = (32, 16, 8, 4, 2)


def _agree(part: torch.Tensor, ctx: DistContext) -> None:
    """Every rank holds the same partition (a fingerprint compared over all ranks)."""
    digest = hashlib.sha256(part.numpy().tobytes()).digest()
    h = int.from_bytes(digest[:7], "little")
    t = torch.tensor([h, -h], dtype=torch.int64)
    ctx.all_reduce_(t, op="max")
    if int(t[0]) != h or int(t[1]) != -h:
        raise DistributedError(
            f"rank {ctx.rank}: the ranks hold different partitions of the graph, so a row "
            "block's replicas would disagree; share one distributed.partition_cache, or use "
            "a partitioner every rank computes alike (" + ", ".join(BLOCK_PARTITIONERS) + ")."
        )


def rank_data_15d(data, edges, ctx: DistContext, *, replication: int, parts: int,
                  method: str = "metis", seed: int = 0, cache_dir=None, overlap: bool = True,
                  forward_policy=None, backward_policy=None, replica_policy=None,
                  budget=None, progress=None) -> tuple:  # fmt: skip
    """This rank's 1.5D share: ``(RankData, GridReducer, ProcessGrid)``. ``edges = (src,
    dst, N)`` are cut into ``parts / replication`` row blocks by ``method``.

    Raises:
        ConfigError: as :func:`~.setup.rank_data`, or a replication the process count cannot
            take (:func:`~.grid.grid_problem`).
    """
    problem = grid_problem(ctx.world_size, replication)
    if problem:
        raise ConfigError(problem + ".")
    grid = ProcessGrid(ctx.world_size, replication)
    src, dst, n = edges
    part, quality, path, reports = shared_partition(
        data, edges, ctx, parts=parts, method=method, seed=seed, cache_dir=cache_dir,
        blocks=grid.blocks, progress=progress,
    )  # fmt: skip
    _agree(part, ctx)
    plan = rank_plan(src, dst, n, part, grid, ctx.rank)
    exchange = make_exchange(plan, ctx, forward_policy, backward_policy, budget)
    graph = BlockGraph(plan, ctx, grid, exchange, replica_policy, overlap)
    column = ColumnGroup(grid, ctx)  # a collective: every rank builds every column's group
    rd = owned_rows(data, graph, quality, path, reports)
    log.info("rank %d: block %d of %d (replica %d of %d), %d rows, %d halo, %d local edges",
             ctx.rank, grid.block_of(ctx.rank), grid.blocks, grid.replica_of(ctx.rank),
             replication, plan.n_own, plan.n_halo, plan.local_src.numel())  # fmt: skip
    return rd, GridReducer(ctx, rd.train_total, grid, column), grid


@dataclasses.dataclass
class RankShare:
    """What :func:`build_rank` gives a rank: its rows and graph (``data``), the ``reducer``
    of the training loop, and the algorithm and grid it runs, for the run's record."""

    data: RankData
    reducer: DistReducer
    algorithm: str
    grid: ProcessGrid
    rank: int
    replica_policy: Optional[BitPolicy] = None

    def summary(self) -> dict:
        """``{"algorithm", "blocks", "replication", "block", "replica", "replica_bits"}``."""
        bits = None if self.replica_policy is None else self.replica_policy.report()
        return {"algorithm": self.algorithm, **self.grid.describe(self.rank),
                "replica_bits": bits}  # fmt: skip

    def reset(self) -> None:
        """A new run: the replica messages' histogram and errors start afresh."""
        if self.replica_policy is not None:
            self.replica_policy.reset()


def _build_1d(d, data, edges, ctx, **kw) -> RankShare:
    rd = rank_data(data, edges, ctx, method=d.method, seed=d.seed, overlap=d.overlap, **kw)
    return RankShare(rd, DistReducer(ctx, rd.train_total), "1d", ProcessGrid(ctx.world_size),
                     ctx.rank)  # fmt: skip


def _build_15d(d, data, edges, ctx, **kw) -> RankShare:
    gen = torch.Generator(device=ctx.device).manual_seed(d.seed * 7919 + 104729 + ctx.rank)
    policy = BitPolicy(d.replica_bits, generator=gen)
    rd, reducer, grid = rank_data_15d(data, edges, ctx, replication=d.replication,
                                      method=d.method, seed=d.seed, overlap=d.overlap,
                                      replica_policy=policy, **kw)  # fmt: skip
    return RankShare(rd, reducer, "1.5d", grid, ctx.rank, policy)


#: ``name -> build(d, data, edges, ctx, *, parts, cache_dir, forward_policy,
#: backward_policy, budget, progress) -> RankShare``
ALGORITHMS: dict[str, Callable[..., RankShare]] = {"1d": _build_1d, "1.5d": _build_15d}


def build_rank(d, data, edges, ctx: DistContext, **kw) -> RankShare:
    """This rank's :class:`RankShare` for the distributed section ``d`` (its
    ``algorithm``, ``replication``, ``method``, ``seed``, ``overlap``, ``replica_bits``);
    ``kw``: ``parts``, ``cache_dir``, ``forward_policy``, ``backward_policy``, ``budget``,
    ``progress``."""
    return ALGORITHMS[d.algorithm](d, data, edges, ctx, **kw)


def check_options(sec: dict) -> None:
    """Refuse what ``sec`` (the resolved ``distributed`` keys: ``algorithm``,
    ``replication``, ``partitions``, ``method``, ``replica_bits``) asks that its algorithm
    cannot run.

    Raises:
        ConfigError: one line naming the setting and the fix.
    """
    algo, c = sec.get("algorithm", "1d"), sec.get("replication", 1)
    if algo == "1d":
        if c != 1:
            raise ConfigError(f"distributed.replication={c} needs distributed.algorithm: 1.5d "
                              "(1d holds each row block on one process).")  # fmt: skip
        if sec.get("replica_bits", 32) != 32:
            raise ConfigError(
                "distributed.replica_bits sets the width of 1.5D's replica messages; set "
                "distributed.algorithm: 1.5d, or remove it."
            )
        return
    parts = sec.get("partitions")
    if parts is not None and grid_problem(parts, c):
        raise ConfigError(grid_problem(parts, c) + " (distributed.partitions / --nproc).")
    method = sec.get("method", "metis")
    if method not in BLOCK_PARTITIONERS:
        raise ConfigError(
            f"distributed.algorithm=1.5d cannot use distributed.method={method}: its partition "
            "is not reproducible from a seed, and every replica of a row block must hold the "
            f"same rows; use one of {', '.join(BLOCK_PARTITIONERS)}."
        )
