"""The process group of a distributed run, its timeouts, and the byte counters.

Workers are started by torch's launcher (``torchrun`` / ``python -m torch.distributed.run``,
which ``dgl-rsc run --nproc N`` calls) and find each other through the environment it sets
(``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...). Every blocking wait has a timeout, and a
failed wait raises :class:`DistributedError` naming this rank, the peer, and the ranks and
nodes whose heartbeat stopped (:mod:`.liveness`); torch's launcher then stops the other
workers.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import socket
from collections import defaultdict
from typing import Optional

import torch
import torch.distributed as dist

from .liveness import Heartbeat, connect_store

__all__ = [
    "DistContext",
    "DistributedError",
    "ByteCounter",
    "MESSAGE_KINDS",
    "launched_by_torchrun",
    "init_from_env",
    "wait_all",
]

#: message kinds counted separately (bytes per rank)
MESSAGE_KINDS = (
    "forward_halo",
    "backward_halo",
    "allreduce",
    "eval_halo",
    "control",
    "replica_reduce",
    "replica_grad",
    "eval_replica",
)  # the last three: 1.5D's


class DistributedError(RuntimeError):
    """A collective or point-to-point exchange failed or timed out; names rank and peer."""


class ByteCounter:
    """Bytes this rank sent and received, by message kind (see :data:`MESSAGE_KINDS`).

    Example:
        >>> c = ByteCounter()
        >>> c.add("forward_halo", sent=400, received=300)
        >>> c.snapshot()["forward_halo"]
        {'sent': 400, 'received': 300, 'messages': 1}
    """

    def __init__(self):
        self._sent = defaultdict(int)
        self._received = defaultdict(int)
        self._messages = defaultdict(int)
        self._peers = defaultdict(lambda: [0, 0])  # (kind, layer, peer) -> [sent, received]

    def add(self, kind: str, sent: int = 0, received: int = 0, messages: int = 1) -> None:
        if kind not in MESSAGE_KINDS:
            raise ValueError(f"unknown message kind {kind!r}; known: {', '.join(MESSAGE_KINDS)}.")
        self._sent[kind] += int(sent)
        self._received[kind] += int(received)
        self._messages[kind] += int(messages)

    def add_peer(self, kind: str, layer, peer: int, sent: int = 0, received: int = 0) -> None:
        """Bytes of one message kind, layer and peer, on top of :meth:`add`'s totals (the
        byte budget reports them: :mod:`dgl_rsc.distributed.budget_plan`)."""
        if kind not in MESSAGE_KINDS:
            raise ValueError(f"unknown message kind {kind!r}; known: {', '.join(MESSAGE_KINDS)}.")
        acc = self._peers[(kind, layer, int(peer))]
        acc[0] += int(sent)
        acc[1] += int(received)

    def by_peer(self) -> dict:
        """``{(kind, layer, peer): (sent, received)}`` so far, of what :meth:`add_peer` got."""
        return {k: tuple(v) for k, v in self._peers.items()}

    def snapshot(self) -> dict:
        """``{kind: {"sent", "received", "messages"}}`` so far (plain ints)."""
        return {k: {"sent": self._sent[k], "received": self._received[k],
                    "messages": self._messages[k]} for k in MESSAGE_KINDS}  # fmt: skip

    @staticmethod
    def delta(after: dict, before: dict) -> dict:
        """``after - before`` of two snapshots."""
        return {k: {f: after[k][f] - before[k][f] for f in after[k]} for k in after}


@dataclasses.dataclass
class DistContext:
    """This worker's place in the run.

    Attributes:
        rank, world_size: as torch.distributed numbers them.
        device: where this rank's tensors live.
        timeout: the longest any wait may take.
        bytes: this rank's :class:`ByteCounter`.
    """

    rank: int
    world_size: int
    device: torch.device
    timeout: datetime.timedelta
    bytes: ByteCounter = dataclasses.field(default_factory=ByteCounter)
    local_rank: int = 0
    #: per rank ``{"node", "host", "pid"}`` (gathered when the group is joined)
    peers: list = dataclasses.field(default_factory=list)
    heartbeat: Optional[object] = None  # a .liveness.Heartbeat, when the store is reachable

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def nodes(self) -> int:
        """How many nodes (machines) the ranks run on."""
        return len({p["node"] for p in self.peers}) if self.peers else 1

    def where(self, rank: int) -> str:
        """``"rank 1 (node 1, host h, pid 123)"``, or ``"rank 1"`` before the peers are known."""
        if rank < len(self.peers):
            p = self.peers[rank]
            return f"rank {rank} (node {p['node']}, host {p['host']}, pid {p['pid']})"
        return f"rank {rank}"

    def failure(self, what: str, exc: BaseException) -> DistributedError:
        """The error of a failed exchange: ``what`` failed, and the ranks (with their nodes)
        whose heartbeat stopped, when any did."""
        lost = self.heartbeat.lost() if self.heartbeat is not None else []
        text = f"{self.where(self.rank)}: {what} failed: {' '.join(str(exc).split())}"
        if lost is None:
            text += ("; the rendezvous store cannot be reached: node 0 (which hosts it, "
                     f"{self.where(0)}) is gone")  # fmt: skip
        elif lost:
            names = ", ".join(self.where(r) for r in lost)
            text += f"; lost {names}: its heartbeat stopped (killed, or its node went down)"
        return DistributedError(text)

    def barrier(self, what: str) -> None:
        """A barrier that fails with the rank and ``what`` instead of hanging."""
        if self.world_size == 1:
            return
        try:
            dist.monitored_barrier(timeout=self.timeout) if _monitored() else dist.barrier()
        except RuntimeError as exc:
            raise self.failure(f"{what}: a barrier (a peer did not arrive within "
                               f"{self.timeout})", exc) from None  # fmt: skip

    def all_reduce_(self, t: torch.Tensor, kind: str = "control", op: str = "sum") -> torch.Tensor:
        """Sum (``op="max"``: the maximum of) ``t`` over ranks in place (counted as
        ``2 (P-1)/P`` of its bytes each way, what a ring all-reduce moves)."""
        if self.world_size > 1:
            try:
                dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
            except RuntimeError as exc:
                raise self.failure(f"all-reduce ({kind})", exc) from None
            wire = t.numel() * t.element_size() * 2 * (self.world_size - 1) // self.world_size
            self.bytes.add(kind, sent=wire, received=wire)
        return t


def _monitored() -> bool:
    return dist.get_backend() == "gloo"


def launched_by_torchrun() -> bool:
    """``True`` in a worker that torch's launcher started (its environment names a rank)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def init_from_env(backend: str = "auto", device: str = "cpu", timeout_s: float = 300.0):
    """Join the process group torch's launcher described in the environment.

    Args:
        backend: ``"auto"`` (NCCL for CUDA, gloo for CPU), ``"gloo"`` or ``"nccl"``.
        device: ``"cpu"``, ``"cuda"`` (this rank's local GPU, ``LOCAL_RANK``) or ``"auto"``.
        timeout_s: the longest any collective or exchange may wait.

    Returns:
        A :class:`DistContext`.
    """
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(dev)
    if backend == "auto":
        backend = "nccl" if dev.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timeout)
    ctx = DistContext(dist.get_rank(), dist.get_world_size(), dev, timeout,
                      local_rank=int(os.environ.get("LOCAL_RANK", 0)))  # fmt: skip
    me = {"node": int(os.environ.get("GROUP_RANK", 0)), "host": socket.gethostname(),
          "pid": os.getpid()}  # fmt: skip
    peers = [None] * ctx.world_size
    dist.all_gather_object(peers, me)
    ctx.peers = peers
    store = connect_store(min(timeout_s, 30.0))
    if store is not None and ctx.world_size > 1:
        interval = min(2.0, timeout_s / 10)
        ctx.heartbeat = Heartbeat(store, ctx.rank, ctx.world_size, interval).start()
    return ctx


def wait_all(works: list, ctx: DistContext, what: str, peers: Optional[list] = None) -> None:
    """Wait for point-to-point operations, each with the context's timeout."""
    for i, w in enumerate(works):
        try:
            w.wait(ctx.timeout)
        except RuntimeError as exc:
            peer = f" with {ctx.where(peers[i])}" if peers else ""
            raise ctx.failure(f"{what}{peer} (timeout {ctx.timeout})", exc) from None
