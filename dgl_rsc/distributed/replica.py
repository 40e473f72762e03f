"""The collectives of the 1.5D grid: sums inside a replica group, and the reduction of the
replicated model's gradients over a process column.

:class:`ReplicaGroup` sums one tensor over the ``c`` ranks of a row block in two rounds of
point-to-point messages that travel through the halo codecs (:mod:`.codecs`): the rows are cut
into ``c`` chunks, replica ``m`` gathers everyone's chunk ``m`` and adds them in replica order,
then sends the sum to the others. Every replica ends with the same bits (each chunk is summed
once, by one rank, and the owner keeps the decoded copy of what it sent), and each rank moves
about ``2 (c - 1) / c`` of the tensor each way, a ring all-reduce's volume
(:func:`~.plan15d.replica_bytes` is the exact count).

:class:`GridReducer` is the launcher's reducer on the grid: the loss and the metrics count each
block once (replica 0's), the parameter gradients (identical on a block's replicas) are summed
over one process column.
"""

from __future__ import annotations

import time
from typing import Optional

import torch
import torch.distributed as dist

from .codecs import BitPolicy, codec_for
from .grid import ProcessGrid
from .reduce import DistReducer
from .runtime import DistContext, DistributedError, wait_all

__all__ = ["ReplicaGroup", "ColumnGroup", "GridReducer"]

_TAG_BASE = 1 << 21  # above the halo exchange's tags (pairs differ anyway: same block only)


class ReplicaGroup:
    """The replica group of this rank's block.

    Args:
        grid: the :class:`~.grid.ProcessGrid`.
        ctx: the :class:`~.runtime.DistContext`.
        policy: a fixed-width :class:`~.codecs.BitPolicy` for the messages (default 32 bits:
            exact).
        timings: a dict whose ``"replica"`` entry :meth:`all_reduce` adds its seconds to
            (encoding, waiting, decoding); default a new one (:attr:`timings`).
    """

    def __init__(self, grid: ProcessGrid, ctx: DistContext, policy: Optional[BitPolicy] = None,
                 timings: Optional[dict] = None):  # fmt: skip
        self.grid, self.ctx = grid, ctx
        self.ranks = grid.replica_group(grid.block_of(ctx.rank))
        self.me = grid.replica_of(ctx.rank)
        self.policy = policy or BitPolicy(32)
        if not self.policy.fixed:
            raise ValueError("replica messages travel at a fixed width (32, 16, 8, 4 or 2 bits).")
        self.timings = {} if timings is None else timings
        self.timings.setdefault("replica", 0.0)
        self._tag = 0

    def _encode(self, rows: torch.Tensor, kind: str, peers: int) -> torch.Tensor:
        """``rows``' payload, sent to ``peers`` replicas (counted in the width histogram)."""
        self.policy.choose(("replica", kind), {m: rows for m in range(peers)})
        return codec_for(self.policy.spec, self.policy.generator).encode(rows)

    def _exchange(self, out: dict, n_in: dict, width: int, kind: str, what: str) -> dict:
        """Send payload ``out[m]`` to replica ``m`` and receive ``n_in[m]`` rows from replica
        ``m``; returns ``{m: decoded rows}`` and counts the payloads as ``kind``. Empty
        messages are not sent (both sides know the sizes)."""
        self._tag = (self._tag + 1) % (1 << 20)
        tag, dev = _TAG_BASE + self._tag, self.ctx.device
        codec = codec_for(self.policy.spec, self.policy.generator)
        works, peers, recv = [], [], {}
        for m, n in n_in.items():
            if n:
                recv[m] = torch.empty(codec.nbytes(n, width), dtype=torch.uint8, device=dev)
                works.append(dist.irecv(recv[m], src=self.ranks[m], tag=tag))
                peers.append(self.ranks[m])
        for m, payload in out.items():
            works.append(dist.isend(payload, dst=self.ranks[m], tag=tag))
            peers.append(self.ranks[m])
        wait_all(works, self.ctx, what, peers)
        self.ctx.bytes.add(kind, sent=sum(int(t.numel()) for t in out.values()),
                           received=sum(int(b.numel()) for b in recv.values()),
                           messages=len(works))  # fmt: skip
        return {m: codec.decode(recv[m], n, width, torch.float32) if n
                else torch.zeros(0, width, device=dev) for m, n in n_in.items()}  # fmt: skip

    def all_reduce(self, x: torch.Tensor, kind: str) -> torch.Tensor:
        """``(n, *F)`` sum of ``x (n, *F)`` over the replica group (``x`` itself when
        ``c = 1``), the same on every replica; counted as message kind ``kind``."""
        c = self.grid.replication
        if c == 1:
            return x
        t0 = time.perf_counter()
        flat = x.reshape(x.shape[0], -1)
        n, width, dtype = flat.shape[0], flat.shape[1], flat.dtype
        cut = [n * m // c for m in range(c + 1)]
        others = [m for m in range(c) if m != self.me]
        lo, hi = cut[self.me], cut[self.me + 1]
        out = {m: self._encode(flat[cut[m] : cut[m + 1]], kind, 1)
               for m in others if cut[m + 1] > cut[m]}  # fmt: skip
        chunks = self._exchange(out, {m: hi - lo for m in others}, width, kind,
                                "the replica group's reduce-scatter")  # fmt: skip
        total = None
        for m in range(c):  # replica order: the same sum whichever rank computes it
            part = flat[lo:hi].float() if m == self.me else chunks[m]
            total = part.clone() if total is None else total.add_(part)
        payload = self._encode(total, kind, c - 1)  # one draw, sent to every other replica
        if self.policy.spec != 32:  # keep what the others decode
            total = codec_for(self.policy.spec).decode(payload, hi - lo, width, torch.float32)
        sums = self._exchange({m: payload for m in others if hi > lo},
                              {m: cut[m + 1] - cut[m] for m in others}, width, kind,
                              "the replica group's all-gather")  # fmt: skip
        sums[self.me] = total
        out = torch.cat([sums[m] for m in range(c)]).to(dtype)
        self.timings["replica"] += time.perf_counter() - t0
        return out.reshape(x.shape)


class ColumnGroup:
    """This rank's process column as a ``torch.distributed`` group. Every rank must build it
    (all columns' groups are created, in order, on every rank)."""

    def __init__(self, grid: ProcessGrid, ctx: DistContext):
        self.grid, self.ctx = grid, ctx
        self.size = grid.blocks
        if grid.replication == 1:
            self.group = None  # the whole world
        else:
            groups = [dist.new_group(grid.column(k)) for k in range(grid.replication)]
            self.group = groups[grid.replica_of(ctx.rank)]

    def all_reduce_(self, t: torch.Tensor, kind: str = "allreduce") -> torch.Tensor:
        """Sum ``t`` over the column in place (counted as a ring all-reduce over it)."""
        if self.size > 1:
            try:
                dist.all_reduce(t, group=self.group)
            except RuntimeError as exc:
                raise DistributedError(f"rank {self.ctx.rank}: all-reduce over the process "
                                       f"column ({kind}) failed: {exc}") from None  # fmt: skip
            wire = t.numel() * t.element_size() * 2 * (self.size - 1) // self.size
            self.ctx.bytes.add(kind, sent=wire, received=wire)
        return t


class GridReducer(DistReducer):
    """:class:`~.reduce.DistReducer` on a 1.5D grid: replica 0 of each block carries the
    block's loss and metrics (the other replicas compute the same ones and add nothing), and
    the gradients are summed over the process column (each block once).

    Args:
        ctx, train_total: as for :class:`~.reduce.DistReducer`.
        grid: the :class:`~.grid.ProcessGrid`.
        column: this rank's :class:`ColumnGroup`.
    """

    def __init__(self, ctx: DistContext, train_total: int, grid: ProcessGrid, column: ColumnGroup):
        super().__init__(ctx, train_total)
        self.grid, self.column = grid, column
        self.counts = grid.replica_of(ctx.rank) == 0

    def value(self, loss: torch.Tensor) -> float:
        return super().value(loss if self.counts else torch.zeros_like(loss))

    def _grad_peers(self) -> int:
        return self.column.size

    def _sum_grads_(self, flat: torch.Tensor) -> None:
        """Sum the flat gradient over the process column: each block once."""
        self.column.all_reduce_(flat)

    def metrics(self, metric, logits, label, masks) -> dict:
        if not self.counts:
            masks = {s: torch.zeros_like(m) for s, m in masks.items()}
        return super().metrics(metric, logits, label, masks)
