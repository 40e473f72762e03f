"""The halo exchange's messages: an index travels with its rows in one message, and the byte
budget's forward header round runs only on the steps that may re-plan."""

import pytest
import torch

from dgl_rsc.distributed.budget_plan import CommBudget
from dgl_rsc.distributed.codecs import codec_for
from dgl_rsc.distributed.comm_budget import FRACTIONS
from dgl_rsc.distributed.exchange import pack_rows, unpack_rows

from .test_comm_budget import exchange_steps


@pytest.mark.parametrize("bits", [32, 16, 8, 4, 2])
@pytest.mark.parametrize("k", [1, 3, 17])
def test_a_packed_message_unpacks_to_its_index_and_rows(bits, k):
    """``pack_rows`` puts the int32 index before the codec's payload; the views
    ``unpack_rows`` returns decode to the rows the payload alone decodes to (every codec's
    parts stay aligned behind ``4 K`` bytes)."""
    g = torch.Generator().manual_seed(k)
    rows, index = torch.randn(k, 6, generator=g), torch.randperm(50, generator=g)[:k].int()
    codec = codec_for(bits, torch.Generator().manual_seed(0))
    payload = codec.encode(rows)
    msg = pack_rows(index, payload)
    assert msg.dtype == torch.uint8 and msg.numel() == 4 * k + payload.numel()
    idx, pay = unpack_rows(msg.clone(), k)
    assert torch.equal(idx, index)
    assert torch.equal(codec.decode(pay, k, 6, torch.float32),
                       codec.decode(payload, k, 6, torch.float32))  # fmt: skip


def test_the_plain_backward_sends_one_message_per_peer():
    """Backward: after the count round, each peer with rows gets one message (index and
    rows), each sending peer's message is received once: the messages counted per step are
    the peers sent to plus the peers received from."""
    from dgl_rsc.distributed.exchange import HaloExchange

    msgs = exchange_steps(3, HaloExchange, steps=2, kinds=("backward_halo",), field="messages")
    sent = exchange_steps(3, HaloExchange, steps=2, kinds=("backward_halo",))
    for (m, ex, _), (b, _, _) in zip(msgs, sent):
        for (count,), (nbytes,) in zip(m, b):
            assert 0 < nbytes  # rows went out (a tenth of the nodes carry the loss)
            assert count <= 2 * len(ex.peers)  # one each way per peer at most
            assert count >= 1


def test_the_forward_header_round_runs_only_when_the_plan_may_change():
    """Control bytes per step: the budgeted exchange's backward count round every step, as
    the plain exchange's, plus a forward header (two int64 per peer sent to) on the steps
    :meth:`CommBudget.replans` names: the first two and the one after each re-allocation
    (interval 3: steps 0, 1, 4 and 7)."""
    from dgl_rsc.distributed.budget_exchange import BudgetedExchange
    from dgl_rsc.distributed.exchange import HaloExchange

    steps = 8
    plain = exchange_steps(3, HaloExchange, steps=steps, kinds=("control",))
    budgeted = exchange_steps(3, lambda lp, ctx: BudgetedExchange(
        lp, ctx, CommBudget(0.2, rank=lp.rank, interval=3, boundary=FRACTIONS)),
        steps=steps, kinds=("control",))  # fmt: skip
    replans = [0, 1, 4, 7]
    for (base, _, lp), (got, ex, _) in zip(plain, budgeted):
        header = 16 * sum(1 for q in ex.peers if lp.send_idx[q].numel())
        assert header > 0
        for s in range(steps):
            assert got[s][0] - base[s][0] == (header if s in replans else 0), s


def test_the_budgeted_forward_equals_the_plain_one_at_a_full_budget():
    """Budget 1.0 sends every boundary row at 32 bits: the halo bytes equal the plain
    exchange's, step by step, also on the steps without a header round."""
    from dgl_rsc.distributed.budget_exchange import BudgetedExchange
    from dgl_rsc.distributed.exchange import HaloExchange

    plain = exchange_steps(3, HaloExchange, steps=5, kinds=("forward_halo",))
    full = exchange_steps(3, lambda lp, ctx: BudgetedExchange(
        lp, ctx, CommBudget(1.0, rank=lp.rank, interval=2)), steps=5,
        kinds=("forward_halo",))  # fmt: skip
    for (a, _, _), (b, _, _) in zip(plain, full):
        assert a == b


def test_a_plan_that_changes_between_header_rounds_is_caught(monkeypatch):
    """Were the forward plan to change on a step without a header round, the receivers
    would read the old sizes: the exchange refuses, naming the layer."""
    from dgl_rsc.distributed.budget_exchange import BudgetedExchange

    monkeypatch.setattr(CommBudget, "replans", lambda self: self.step <= 0)
    with pytest.raises(RuntimeError, match="forward plan of layer 0 changed between header"):
        exchange_steps(3, lambda lp, ctx: BudgetedExchange(
            lp, ctx, CommBudget(0.1, rank=lp.rank, interval=1, boundary=FRACTIONS)),
            steps=4, timeout=2.0)  # fmt: skip
