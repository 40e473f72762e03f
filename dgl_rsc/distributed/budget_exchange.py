"""``BudgetedExchange``: the halo exchange under ``distributed.comm_budget``.

Every training message group (direction, layer, peer) travels as the rank's
:class:`~.budget_plan.CommBudget` says: at a width, and with a row cap.

- Forward: a capped group sends ``k`` of its ``n`` boundary rows, uniformly, times ``n / k``,
  with their int32 positions in the same message (:mod:`.boundary`, :func:`~.exchange.pack_rows`).
  A header round tells each receiver the row count and width of what follows, on the steps
  whose plan may differ from the last one's (:meth:`~.budget_plan.CommBudget.replans`: the
  first exchange of each layer, and the steps after a re-allocation); between them the
  receivers keep the last header. The receiver's halo holds zeros for the rows left
  out, and :meth:`BudgetedExchange.forward_sample` hands the picked rows to the product's
  backward.
- Backward: the halo block's gradient (on the forward's picked rows only, times ``n / k``,
  when the forward was sampled) is cut to at most the cap's rows by the threshold sample of
  :mod:`.halo_sample` (scaled by ``1 / p``) and sent through the base exchange's two rounds.

Evaluation and control messages travel whole in fp32, as in :class:`~.exchange.HaloExchange`.
Every halo message is counted per layer and peer (``ByteCounter.add_peer``) and its bytes told
to the budget; on the budget's measuring steps the realized relative error of each exchange
(decoded message against the exact one) is recorded too.
"""

from __future__ import annotations

import dataclasses
import time

import torch
import torch.distributed as dist

from .boundary import ForwardSample, boundary_rows
from .budget_plan import CommBudget
from .codecs import codec_for
from .comm_budget import row_quant_variance
from .exchange import HaloExchange, pack_rows, unpack_rows
from .halo_sample import sample_halo_rows
from .runtime import wait_all

__all__ = ["BudgetedExchange"]


@dataclasses.dataclass
class _Handle:
    works: list
    peers: list
    recv: dict  # q -> (message, whether it starts with an index, rows, codec)
    keep: list
    width: int
    dtype: torch.dtype
    layer: int
    sample: ForwardSample = None


class BudgetedExchange(HaloExchange):
    """A :class:`~.exchange.HaloExchange` whose training messages follow ``budget`` (a
    :class:`~.budget_plan.CommBudget`); the other arguments are the base class's."""

    def __init__(self, part, ctx, budget: CommBudget, forward_policy=None, backward_policy=None):
        super().__init__(part, ctx, forward_policy, backward_policy)
        self.budget = budget
        self.generator = torch.Generator(device=ctx.device).manual_seed(
            budget.seed * 7919 + 104_729 * (part.rank + 1)
        )
        self._told: dict = {}  # layer -> {peer: (rows, bits)} this rank last sent in a header
        self._heard: dict = {}  # layer -> {peer: (rows, bits)} the last header received

    def _headers(self, layer: int, out: dict, n_in: dict, dev) -> dict:
        """``{peer: (rows, bits)}`` of the messages this rank receives at ``layer``: from a
        header round when the plan may have changed (every rank decides alike: the step and
        the layers seen), else the last one's. ``out[q] = (pick, vals, bits)``: what this
        rank sends; a plan that changes between header rounds is a bug, raised here."""
        heads = {q: (int(v.shape[0]), int(b)) for q, (_, v, b) in out.items()}
        if layer in self._heard and not self.budget.replans():
            if heads != self._told[layer]:
                raise RuntimeError(
                    f"rank {self.part.rank}: the forward plan of layer {layer} changed between "
                    f"header rounds ({self._told[layer]} -> {heads}); please report this."
                )
            return self._heard[layer]
        inbox = {q: torch.zeros(2, dtype=torch.int64, device=dev) for q in self.peers if n_in[q]}
        self._control(inbox, {q: torch.tensor(h, dtype=torch.int64, device=dev)
                              for q, h in heads.items()}, "the forward halo counts")  # fmt: skip
        self._told[layer] = heads
        self._heard[layer] = {q: tuple(int(v) for v in buf.tolist()) for q, buf in inbox.items()}
        return self._heard[layer]

    # -- forward --------------------------------------------------------------------------
    def start_forward(self, x_own: torch.Tensor, kind: str = "forward_halo"):
        if kind != "forward_halo":
            return super().start_forward(x_own, kind)
        t0 = time.perf_counter()
        layer = self._slot_of("forward")[1]
        if layer == 0:
            self.budget.begin_step()
        width, dev, gen = x_own.shape[1], x_own.device, self.forward_policy.generator
        out = {}
        for q in self.peers:
            n = int(self.send_idx[q].numel())
            if n:
                rows = x_own[self.send_idx[q]]
                ch = self.budget.plan("forward", layer, q, n, rows.detach())
                pick = boundary_rows(n, ch.rows, self.generator, dev) if ch.rows < n else None
                vals = rows if pick is None else rows[pick] * (n / ch.rows)
                out[q] = (pick, vals, ch.bits)
        n_in = {q: self.offsets[q + 1] - self.offsets[q] for q in self.peers}
        heard = self._headers(layer, out, n_in, dev)
        tag = self._next_tag()
        handle = _Handle([], [], {}, [], width, x_own.dtype, layer)
        received, err = 0, [0.0, 0.0, 0.0]
        for q in self.peers:
            if q in heard:
                k, b = heard[q]
                codec = codec_for(b, gen)
                index = 4 * k if k < n_in[q] else 0  # a sampled block: positions first
                buf = torch.empty(index + codec.nbytes(k, width), dtype=torch.uint8, device=dev)
                handle.recv[q] = (buf, index > 0, k, codec)
                handle.works.append(dist.irecv(buf, src=q, tag=tag))
                handle.peers.append(q)
                received += buf.numel()
            if q in out:
                pick, vals, b = out[q]
                payload = codec_for(b, gen).encode(vals.detach())
                msg = payload if pick is None else pack_rows(pick, payload)
                handle.works.append(dist.isend(msg, dst=q, tag=tag))
                handle.peers.append(q)
                handle.keep.append(msg)
                self._count("forward_halo", layer, q, msg.numel(), b, vals.shape[0])
                if self.budget.measuring:
                    exact = x_own[self.send_idx[q]]
                    var = (exact.shape[0] / vals.shape[0] - 1) * float(
                        exact.double().square().sum()
                    )
                    self._realized(err, exact, pick, payload, vals, b, var)
        self.ctx.bytes.add("forward_halo", sent=0, received=received,
                           messages=len(handle.works))  # fmt: skip
        if self.budget.measuring:
            self.budget.realized_error("forward", layer, *err)
        self.timings["forward_post"] += time.perf_counter() - t0
        return handle

    def finish_forward(self, handle) -> torch.Tensor:
        if not isinstance(handle, _Handle):
            return super().finish_forward(handle)
        t0 = time.perf_counter()
        wait_all(handle.works, self.ctx, "the forward halo exchange", handle.peers)
        self.timings["forward_wait"] += time.perf_counter() - t0
        sampled = any(indexed for _, indexed, _, _ in handle.recv.values())
        make = torch.zeros if sampled else torch.empty
        halo = make(self.part.n_halo, handle.width, dtype=handle.dtype, device=self.ctx.device)
        picked = {}
        for q, (buf, indexed, k, codec) in handle.recv.items():
            lo, hi = self.offsets[q], self.offsets[q + 1]
            idx, pay = unpack_rows(buf, k) if indexed else (None, buf)
            vals = codec.decode(pay, k, handle.width, handle.dtype)
            if idx is None:
                halo[lo:hi] = vals
            else:
                rows = idx.long()
                halo[lo + rows] = vals
                picked[q] = (rows, (hi - lo) / k)
        handle.sample = ForwardSample(handle.layer, picked)
        handle.works = handle.keep = []
        return halo

    def forward_sample(self, handle):
        return handle.sample if isinstance(handle, _Handle) else None

    # -- backward -------------------------------------------------------------------------
    def backward(self, g_halo: torch.Tensor, g_own: torch.Tensor, ticket=None,
                 reach=None) -> torch.Tensor:  # fmt: skip
        """The base class's backward, each peer's rows cut by the budget. The reference of a
        group is the rows the exact exchange sends: those ``reach()`` marks (the exact
        product's non-zero halo rows), or the whole block without ``reach``."""
        t0 = time.perf_counter()
        slot = self._slot_of("backward")[1]
        layer = ticket.layer if ticket is not None else -1 - slot
        reached = None if reach is None else reach()
        outgoing, bits, err = {}, {}, [0.0, 0.0, 0.0]
        for q in self.peers:
            lo, hi = self.offsets[q], self.offsets[q + 1]
            if hi <= lo:
                continue
            block = g_halo[lo:hi]
            cut = None if ticket is None else ticket.restrict(q, block)
            base, cand = (None, block) if cut is None else cut
            nz = torch.nonzero((cand != 0).any(dim=1)).squeeze(1)  # NaN != 0: a candidate
            rows = cand[nz]
            plan_rows = hi - lo if reached is None else int(reached[lo:hi].sum())
            ch = self.budget.plan("backward", layer, q, plan_rows, rows.detach())
            hs = sample_halo_rows(rows, ch.rows, self.generator)
            pos = nz[hs.rows] if base is None else base[nz[hs.rows]]
            outgoing[q], bits[q] = (pos.to(torch.int32), hs.values), ch.bits
            if self.budget.measuring:
                self._realized(err, rows, hs.rows, None, hs.values, ch.bits, hs.variance)
        if self.budget.measuring:
            self.budget.realized_error("backward", layer, *err)
        sent = self.send_back(outgoing, bits, g_own, self.backward_policy.generator, layer)
        for q, nbytes in sent.items():
            self.budget.sent(nbytes)
            self.backward_policy.histogram[int(bits[q])] += int(outgoing[q][0].numel())
        self.timings["backward"] += time.perf_counter() - t0
        return g_own

    # -- bookkeeping ----------------------------------------------------------------------
    def _count(self, kind: str, layer: int, q: int, nbytes: int, bits: int, rows: int) -> None:
        self.ctx.bytes.add(kind, sent=nbytes, messages=0)
        self.ctx.bytes.add_peer(kind, layer, q, sent=nbytes)
        self.budget.sent(nbytes)
        self.forward_policy.histogram[int(bits)] += int(rows)

    def _realized(self, acc: list, exact, pick, payload, vals, bits, sample_var) -> None:
        """Add one message's ``||decoded - exact||^2``, ``||exact||^2`` and its predicted
        squared error (the sample's variance ``sample_var`` plus the codec's modelled
        variance of the rows sent) to ``acc``."""
        codec = codec_for(bits, self.generator)
        if payload is None:
            payload = codec.encode(vals.detach())
        got = codec.decode(payload, vals.shape[0], vals.shape[1], torch.float32)
        exact = exact.detach().float()
        sent = exact if pick is None else exact[pick]
        total = float(exact.square().sum(dtype=torch.float64))
        # rows left out count whole: ||exact||^2 - ||exact[pick]||^2
        left = 0.0 if pick is None else total - float(sent.square().sum(dtype=torch.float64))
        acc[0] += float((got - sent).square().sum(dtype=torch.float64)) + max(left, 0.0)
        acc[1] += total
        acc[2] += sample_var + float(row_quant_variance(vals.detach(), [bits]).sum())
