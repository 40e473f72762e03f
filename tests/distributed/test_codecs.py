"""Bit-width policies of the halo exchange: fixed and adaptive widths, the reports."""

import torch

from dgl_rsc.distributed.bitwidth import CostModel
from dgl_rsc.distributed.codecs import BitPolicy, QuantCodec, codec_for
from dgl_rsc.distributed.exchange import RawCodec


def messages(seed=0, rows=(200, 50), d=16):
    g = torch.Generator().manual_seed(seed)
    return {q: torch.randn(r, d, generator=g) for q, r in enumerate(rows, start=1)}


def test_codecs_round_trip_and_sizes():
    x = torch.randn(37, 9)
    raw = codec_for(32)
    assert isinstance(raw, RawCodec) and raw.nbytes(37, 9) == 37 * 9 * 4
    assert torch.equal(raw.decode(raw.encode(x), 37, 9, torch.float32), x)
    q = codec_for(8, torch.Generator().manual_seed(0))
    assert isinstance(q, QuantCodec) and q.encode(x).numel() == q.nbytes(37, 9) < 37 * 9 * 4
    back = q.decode(q.encode(x), 37, 9, torch.float32)
    assert float((back - x).norm() / x.norm()) < 0.02


def test_fixed_policy_counts_rows_and_measures_its_error():
    pol = BitPolicy(4, interval=2, generator=torch.Generator().manual_seed(1))
    m = messages()
    for _ in range(3):
        assert pol.choose(("forward", 0), m) == {1: 4, 2: 4}
    rep = pol.report()
    assert rep["histogram"] == {"4": 3 * 250} and 0.05 < rep["error"] < 0.3
    pol.reset()
    assert pol.report()["histogram"] == {} and pol.report()["error"] is None


def test_adaptive_policy_trades_time_against_variance():
    m = messages()
    cheap_net = BitPolicy("adaptive", weight=1.0, cost=CostModel(1e-5, 1e-12))
    slow_net = BitPolicy("adaptive", weight=1.0, cost=CostModel(1e-6, 1e-7))
    fast = cheap_net.choose(("forward", 0), m)
    slow = slow_net.choose(("forward", 0), m)
    assert set(fast.values()) <= {2, 4, 8} and set(slow.values()) <= {2, 4, 8}
    # when bytes are expensive the widths can only shrink
    assert all(slow[q] <= fast[q] for q in m)
    quiet = BitPolicy("adaptive", weight=1e6, cost=CostModel(1e-6, 1e-7))
    assert set(quiet.choose(("forward", 0), m).values()) == {8}  # variance dominates


def test_adaptive_choice_is_kept_for_the_interval():
    pol = BitPolicy("adaptive", interval=3)
    first = pol.choose(("backward", 1), messages(0))
    for seed in (1, 2):  # other rows, same slot: the choice stays
        assert pol.choose(("backward", 1), messages(seed, rows=(200, 50))) == first
    assert pol.report()["histogram"] and pol.report()["error"] is not None
