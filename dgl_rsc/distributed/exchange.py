"""The halo exchange of one rank: boundary rows out in the forward, their gradients back.

Forward: rank ``r`` sends ``x_own[send_idx[q]]`` to every rank ``q`` that needs them and
receives its halo blocks (sizes known from the plan). :meth:`HaloExchange.start_forward`
posts the sends and receives and returns at once, so the caller aggregates the central rows
while the messages are in flight; :meth:`HaloExchange.finish_forward` waits and returns the
halo rows.

Backward: the gradient of the halo rows goes back to their owners, who add it to their own
rows. Only rows that are not all zero travel (an index and the rows, in one message: see
:func:`pack_rows`): with RSC's sampled backward, a halo row gets a gradient only when a kept
row touches it, so the budget shrinks the bytes sent. A first round tells each peer how many
rows follow.

The rows travel through a codec picked by a bit-width policy (:mod:`.codecs`: 32-bit rows as
they are, or the quantized codes of :mod:`dgl_rsc.distributed.quant`, fixed or adaptive).
Every message is counted in the context's :class:`~dgl_rsc.distributed.runtime.ByteCounter`.
"""

from __future__ import annotations

import time
from typing import Optional

import torch
import torch.distributed as dist

from .codecs import BitPolicy, Codec, RawCodec, codec_for
from .halo import LocalPartition
from .runtime import DistContext, wait_all

__all__ = ["Codec", "RawCodec", "HaloExchange", "pack_rows", "unpack_rows"]  # codecs: .codecs


class HaloExchange:
    """The exchanges of one rank for one local graph.

    Args:
        part: the rank's :class:`~dgl_rsc.distributed.halo.LocalPartition`.
        ctx: the :class:`~dgl_rsc.distributed.runtime.DistContext`.
        forward_policy, backward_policy: the widths messages travel at
            (:class:`~dgl_rsc.distributed.codecs.BitPolicy`; default 32 bits). Evaluation
            messages always travel in 32 bits.

    Attributes:
        timings: seconds per phase: ``forward_post`` (encoding and posting the halo
            messages), ``forward_central`` (the central rows' product: while the halo is in
            flight when overlapping, before it is sent otherwise), ``forward_wait`` (waiting
            for the halo that is still missing), ``forward_marginal`` (the marginal rows'
            product), ``backward`` (the gradient exchange).
        budget: the byte budget the exchange keeps to (``None``: everything travels; see
            :class:`~.budget_exchange.BudgetedExchange`).
    """

    budget = None

    def __init__(self, part: LocalPartition, ctx: DistContext, forward_policy=None,
                 backward_policy=None):  # fmt: skip
        self.part, self.ctx = part, ctx
        self.forward_policy = forward_policy or BitPolicy(32)
        self.backward_policy = backward_policy or BitPolicy(32)
        self._direction, self._slot = "backward", 0
        dev = ctx.device
        self.send_idx = [t.to(dev) for t in part.send_idx]
        self.offsets = part.halo_offsets.tolist()
        self.peers = [q for q in range(part.num_parts) if q != part.rank]
        self.timings = {
            "forward_post": 0.0,
            "forward_wait": 0.0,
            "forward_central": 0.0,
            "forward_marginal": 0.0,
            "backward": 0.0,
        }
        self._tag = 0

    def _slot_of(self, direction: str):
        """The message slot: the n-th exchange of a training step in its direction."""
        if direction != self._direction:
            self._direction, self._slot = direction, 0
        self._slot += 1
        return (direction, self._slot - 1)

    def _next_tag(self) -> int:
        self._tag = (self._tag + 1) % (1 << 20)
        return self._tag

    # -- forward --------------------------------------------------------------------------------
    def start_forward(self, x_own: torch.Tensor, kind: str = "forward_halo"):
        """Post this rank's boundary rows and the receives of its halo; returns a handle.

        Training messages travel at the forward policy's widths (adaptive widths are told to
        the receivers first); evaluation messages (``kind="eval_halo"``) in 32 bits."""
        t0 = time.perf_counter()
        width, dev = x_own.shape[1], x_own.device
        out_rows = {q: x_own[self.send_idx[q]] for q in self.peers if self.send_idx[q].numel()}
        n_in = {q: self.offsets[q + 1] - self.offsets[q] for q in self.peers}
        policy = self.forward_policy if kind == "forward_halo" else None
        if policy is None:
            bits = {q: 32 for q in out_rows}
            bits_in = {q: 32 for q in n_in}
        else:
            bits = policy.choose(self._slot_of("forward"), out_rows)
            bits_in = ({q: policy.spec for q in n_in} if policy.fixed
                       else self._tell_bits(bits, [q for q in n_in if n_in[q]]))  # fmt: skip
        gen = None if policy is None else policy.generator
        tag = self._next_tag()
        works, peers, recv, keep = [], [], {}, []
        sent = received = 0
        for q in self.peers:
            if n_in[q]:
                codec = codec_for(bits_in[q], gen)
                buf = torch.empty(codec.nbytes(n_in[q], width), dtype=torch.uint8, device=dev)
                works.append(dist.irecv(buf, src=q, tag=tag))
                peers.append(q)
                recv[q] = (buf, n_in[q], codec)
                received += buf.numel()
            if q in out_rows:
                payload = codec_for(bits[q], gen).encode(out_rows[q])
                works.append(dist.isend(payload, dst=q, tag=tag))
                peers.append(q)
                keep.append(payload)
                sent += payload.numel()
        self.ctx.bytes.add(kind, sent=sent, received=received, messages=len(works))
        self.timings["forward_post"] += time.perf_counter() - t0
        return works, peers, recv, keep, width, x_own.dtype

    def _control(self, inbox: dict, outbox: dict, what: str) -> None:
        """One round of small int64 messages: ``inbox[q]`` (a buffer) is filled by rank
        ``q``, ``outbox[q]`` is sent to rank ``q``; waits for all, counts them as control."""
        tag = self._next_tag()
        works, peers = [], []
        for q, buf in inbox.items():
            works.append(dist.irecv(buf, src=q, tag=tag))
            peers.append(q)
        for q, t in outbox.items():
            works.append(dist.isend(t, dst=q, tag=tag))
            peers.append(q)
        wait_all(works, self.ctx, what, peers)
        self.ctx.bytes.add("control", sent=sum(8 * t.numel() for t in outbox.values()),
                           received=sum(8 * b.numel() for b in inbox.values()),
                           messages=len(works))  # fmt: skip

    def _tell_bits(self, bits: dict, senders: list) -> dict:
        """Send each destination the width of its message; returns the senders' widths."""
        dev = self.ctx.device
        inbox = {q: torch.zeros(1, dtype=torch.int64, device=dev) for q in senders}
        outbox = {q: torch.tensor([int(b)], dtype=torch.int64, device=dev)
                  for q, b in bits.items()}  # fmt: skip
        self._control(inbox, outbox, "telling the forward bit widths")
        return {q: int(buf) for q, buf in inbox.items()}

    def finish_forward(self, handle) -> torch.Tensor:
        """Wait for the halo rows; ``(n_halo, D)`` in the local halo order."""
        works, peers, recv, _, width, dtype = handle
        t0 = time.perf_counter()
        wait_all(works, self.ctx, "the forward halo exchange", peers)
        self.timings["forward_wait"] += time.perf_counter() - t0
        halo = torch.empty(self.part.n_halo, width, dtype=dtype, device=self.ctx.device)
        for q, (buf, n_in, codec) in recv.items():
            lo = self.offsets[q]
            halo[lo : lo + n_in] = codec.decode(buf, n_in, width, dtype)
        return halo

    # -- backward -------------------------------------------------------------------------------
    def backward(self, g_halo: torch.Tensor, g_own: torch.Tensor, ticket=None,
                 reach=None) -> torch.Tensor:  # fmt: skip
        """Send the halo rows' gradient ``(n_halo, D)`` to their owners and add what the
        others send back to ``g_own (n_own, D)`` (in place); rows that are all zero stay
        home. A first round tells each owner how many rows follow and at which width.
        ``ticket``: what :meth:`forward_sample` returned for this product's forward;
        ``reach``: a callable giving the ``(n_halo,)`` rows the exact product reaches (both
        unused here: see :class:`~.budget_exchange.BudgetedExchange`). Returns ``g_own``."""
        t0 = time.perf_counter()
        policy = self.backward_policy
        outgoing = {}
        for q in self.peers:
            lo, hi = self.offsets[q], self.offsets[q + 1]
            if hi > lo:
                block = g_halo[lo:hi]
                rows = torch.nonzero((block != 0).any(dim=1)).squeeze(1)  # NaN != 0: sent
                outgoing[q] = (rows.to(torch.int32), block[rows])
        bits = policy.choose(self._slot_of("backward"), {q: v for q, (_, v) in outgoing.items()})
        self.send_back(outgoing, bits, g_own, policy.generator)
        self.timings["backward"] += time.perf_counter() - t0
        return g_own

    def send_back(self, outgoing: dict, bits: dict, g_own: torch.Tensor, generator=None,
                  layer=None) -> dict:  # fmt: skip
        """The backward's two rounds (the counts, then one message per peer: the index and
        the payload, :func:`pack_rows`): ``outgoing[q] = (rows (K,) int32 positions in q's
        halo block, values (K, D))`` go to rank ``q`` at ``bits[q]``; what the others send
        is added to ``g_own`` at their rows. Counted as ``backward_halo`` (per peer under
        ``layer`` when given). Returns the bytes sent to each peer."""
        dev, width = g_own.device, g_own.shape[1]
        # round 1: how many rows each peer sends, and at which width
        heads = {q: torch.zeros(2, dtype=torch.int64, device=dev)
                 for q in self.peers if self.send_idx[q].numel()}  # fmt: skip
        self._control(heads, {
            q: torch.tensor([rows.numel(), int(bits[q])], dtype=torch.int64, device=dev)
            for q, (rows, _) in outgoing.items()
        }, "the backward halo counts")  # fmt: skip
        # round 2: the rows, an index and the payload in one message per peer
        tag2 = self._next_tag()
        works, peers, recv, keep, sent = [], [], {}, [], {}
        received = 0
        for q, buf in heads.items():
            n, b = (int(v) for v in buf.tolist())
            if n:
                codec = codec_for(b, generator)
                msg = torch.empty(4 * n + codec.nbytes(n, width), dtype=torch.uint8, device=dev)
                works.append(dist.irecv(msg, src=q, tag=tag2))
                peers.append(q)
                recv[q] = (msg, n, codec)
                received += msg.numel()
        for q, (rows, vals) in outgoing.items():
            if rows.numel():
                msg = pack_rows(rows, codec_for(bits[q], generator).encode(vals))
                keep.append(msg)
                works.append(dist.isend(msg, dst=q, tag=tag2))
                peers.append(q)
                sent[q] = msg.numel()
        wait_all(works, self.ctx, "the backward halo exchange", peers)
        self.ctx.bytes.add("backward_halo", sent=sum(sent.values()), received=received,
                           messages=len(works))  # fmt: skip
        if layer is not None:
            for q, nbytes in sent.items():
                self.ctx.bytes.add_peer("backward_halo", layer, q, sent=nbytes)
        for q, (msg, n, codec) in recv.items():
            idx, pay = unpack_rows(msg, n)
            rows = self.send_idx[q][idx.long()]
            g_own.index_add_(0, rows, codec.decode(pay, n, width, g_own.dtype))
        return sent

    def forward_sample(self, handle):
        """What the backward of the forward ``handle`` needs to know of it (``None`` here:
        every halo row arrived; see :class:`~.budget_exchange.BudgetedExchange`)."""
        return None

    def exchange_once(self, x_own: torch.Tensor, kind: str) -> torch.Tensor:
        """Forward exchange without overlap: ``(n_halo, D)`` halo rows."""
        return self.finish_forward(self.start_forward(x_own, kind))


def pack_rows(index: torch.Tensor, payload: torch.Tensor) -> torch.Tensor:
    """One message of ``4 K + B`` bytes: the ``(K,)`` int32 ``index`` followed by the
    ``(B,)`` uint8 ``payload`` (a codec's encoded rows; every codec's parts start at offsets
    that stay aligned after ``4 K`` bytes). Sending them together halves the messages."""
    return torch.cat([index.to(torch.int32).contiguous().view(torch.uint8), payload.reshape(-1)])


def unpack_rows(message: torch.Tensor, k: int) -> tuple:
    """``(index (K,) int32, payload (B,) uint8)``: views of a :func:`pack_rows` message."""
    return message[: 4 * k].view(torch.int32), message[4 * k :]


def local_rows(x_own: torch.Tensor, halo: torch.Tensor, out: Optional[torch.Tensor] = None):
    """``(n_own + n_halo, D)``: the owned rows followed by the halo rows."""
    return torch.cat([x_own, halo], out=out)
