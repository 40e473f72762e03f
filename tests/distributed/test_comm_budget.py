"""The byte budget: message sizes, the choice tables, the greedy allocator (against brute force),
the per-rank budget over steps, and the config keys (clear errors before any worker starts)."""

import itertools
import math

import numpy as np
import pytest
import torch

from dgl_rsc.distributed.bitwidth import _hull, _pareto
from dgl_rsc.distributed.budget_plan import CommBudget, combine_reports
from dgl_rsc.distributed.codecs import codec_for
from dgl_rsc.distributed.comm_budget import (
    FRACTIONS,
    Choice,
    GroupTable,
    allocate,
    backward_table,
    forward_table,
    message_bytes,
    reference_bytes,
)


def test_message_bytes_are_the_codec_sizes_plus_the_index():
    assert reference_bytes("forward", 100, 16) == 100 * 64
    assert reference_bytes("backward", 100, 16) == 100 * 68
    assert message_bytes("forward", 100, 100, 16, 32) == 6400  # whole: no index
    assert message_bytes("forward", 50, 100, 16, 32) == 50 * 64 + 50 * 4
    for b in (2, 4, 8, 16):
        rows = torch.randn(37, 16)
        payload = codec_for(b).encode(rows)
        assert message_bytes("backward", 37, 90, 16, b) == payload.numel() + 37 * 4
    assert message_bytes("backward", 0, 90, 16, 8) == 0


def test_forward_table_variance_matches_the_sampled_message():
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(60, 5, generator=g)
    t = forward_table(("forward", 0, 1), rows, (32,), (1.0, 0.25))
    assert [c.rows for c in t.choices] == [60, 15]
    assert t.variance[0] == 0.0
    energy = float(rows.double().square().sum())
    assert t.variance[1] == pytest.approx(3 * energy)  # (n / k - 1) * energy
    assert t.energy == pytest.approx(energy)


def test_backward_table_caps_rows_of_the_nonzero_ones():
    rows = torch.randn(200, 8, generator=torch.Generator().manual_seed(1))
    t = backward_table(("backward", 1, 0), rows, (32, 4), (1.0, 0.5, 0.001))
    assert sorted({c.rows for c in t.choices}) == [1, 100, 200]
    full32 = t.choices.index(Choice(32, 200))
    assert t.variance[full32] == 0.0 and t.nbytes[full32] == 200 * 36
    # fewer rows or fewer bits: more variance
    assert t.variance[t.choices.index(Choice(4, 200))] > 0
    assert t.variance[t.choices.index(Choice(32, 100))] > 0


def random_tables(rng, groups):
    tables = []
    for g in range(groups):
        c = rng.integers(2, 5)
        nb = np.sort(rng.uniform(10, 100, c))[::-1].copy()
        var = np.sort(rng.uniform(0, 5, c))
        var[0] = 0.0
        choices = [Choice(32, int(i)) for i in range(c)]
        tables.append(GroupTable(("backward" if g % 2 else "forward", g // 2, g), choices, nb,
                                 var, float(rng.uniform(1, 3))))  # fmt: skip
    return tables


def objective(tables, picks):
    energy = {}
    for t in tables:
        energy[t.key[:2]] = energy.get(t.key[:2], 0.0) + t.energy
    return sum(t.variance[c] / energy[t.key[:2]] for t, c in zip(tables, picks))


def test_the_greedy_allocation_fits_and_is_near_the_optimum():
    """Brute force over all choices: the greedy fits the budget and loses at most one step
    of the hull walk (the greedy bound of the multiple-choice knapsack's LP relaxation)."""
    rng = np.random.default_rng(0)
    for _ in range(60):
        tables = random_tables(rng, int(rng.integers(2, 5)))
        most = sum(t.nbytes.max() for t in tables)
        least = sum(t.nbytes.min() for t in tables)
        budget = float(rng.uniform(least, most))
        picks, fits = allocate(tables, budget)
        assert fits and sum(t.nbytes[c] for t, c in zip(tables, picks)) <= budget + 1e-9
        best = min(objective(tables, p) for p in itertools.product(*[range(len(t.choices))
                                                                     for t in tables])
                   if sum(t.nbytes[c] for t, c in zip(tables, p)) <= budget)  # fmt: skip
        energy = {}
        for t in tables:
            energy[t.key[:2]] = energy.get(t.key[:2], 0.0) + t.energy
        step = 0.0  # the largest error increase of one hull step
        for t in tables:
            e = t.variance / energy[t.key[:2]]
            hull = _hull(t.nbytes, e, _pareto(t.nbytes, e))
            step = max([step] + [e[a] - e[b] for a, b in zip(hull, hull[1:])])
        assert objective(tables, picks) <= best + step + 1e-12


def test_allocation_at_the_extremes():
    tables = random_tables(np.random.default_rng(1), 4)
    picks, fits = allocate(tables, 1e12)
    assert fits and all(t.variance[c] == t.variance.min() for t, c in zip(tables, picks))
    picks, fits = allocate(tables, 1.0)
    assert not fits and all(t.nbytes[c] == t.nbytes.min() for t, c in zip(tables, picks))


def run_steps(budget, steps, layers=2, peers=(1, 2), seed=0):
    """Drive a CommBudget as an exchange does: per step a forward and a backward group per
    layer and peer (a backward group's reference and non-zero rows change from step to step,
    as the rows the product reaches do); returns the planned and reference bytes of every
    step."""
    g = torch.Generator().manual_seed(seed)
    planned = []
    for _ in range(steps):
        budget.begin_step()
        used = ref = 0
        for direction in ("forward", "backward"):
            for layer in range(layers):
                for p in peers:
                    n = 40 + 10 * p  # backward: n of the reference's rows are non-zero,
                    if direction == "backward":  # both changing from step to step
                        n -= int(torch.randint(0, 20, (1,), generator=g))
                    plan_rows = n + int(torch.randint(0, 8, (1,), generator=g)) * (
                        direction == "backward"
                    )
                    rows = torch.randn(n, 24, generator=g) * torch.rand(n, 1, generator=g) ** 3
                    ch = budget.plan(direction, layer, p, plan_rows, rows)
                    nbytes = message_bytes(direction, min(ch.rows, n), plan_rows, 24, ch.bits)
                    used += nbytes
                    ref += reference_bytes(direction, plan_rows, 24)
                    budget.sent(nbytes)
        planned.append((used, ref))
    return planned


@pytest.mark.parametrize("fraction", [0.08, 0.2, 0.6])
def test_every_step_keeps_to_the_budget_from_the_first(fraction):
    budget = CommBudget(fraction, interval=3, rank=0)
    steps = run_steps(budget, 12)
    for used, ref in steps:
        assert used <= fraction * ref
    assert budget.solves and budget.alloc
    rep = budget.report({})
    assert (
        rep["steps"] == 12
        and max(s / r for s, r in zip(rep["sent_per_step"], rep["reference_per_step"])) <= fraction
    )
    last = rep["last_solve"]
    assert last["planned_bytes"] <= last["budget_bytes"]
    assert set(last["slots"]) == {"forward/0", "forward/1", "backward/0", "backward/1"}
    assert all(0 <= s["error"] < math.inf for s in last["slots"].values())
    both = combine_reports([rep, rep])
    assert both["sent_fraction_max"] <= fraction and both["steps"] == 12
    # a smaller budget sends fewer backward rows or narrower widths
    assert budget.stats()[-1]["planned_bytes"] <= budget.stats()[-1]["budget_bytes"]


def test_a_budget_below_the_narrowest_widths_needs_the_boundary_sample(caplog):
    """2-bit rows of 24 values cost 10 of fp32's 96 bytes: at 3% only the forward boundary
    sample fits; without it the cheapest choices go out and the report says so."""
    from dgl_rsc.distributed.comm_budget import FRACTIONS

    plain = CommBudget(0.03, interval=2, rank=0)
    run_steps(plain, 3)
    assert plain.over_budget and "narrowest widths and fewest rows allowed" in caplog.text
    sampled = CommBudget(0.03, boundary=FRACTIONS, interval=2, rank=0)
    for used, ref in run_steps(sampled, 3):
        assert used <= 0.03 * ref
    assert not sampled.over_budget
    fwd = [p for s, v in sampled.solves[-1]["slots"].items() if s.startswith("forward")
           for p in v["peers"].values()]  # fmt: skip
    assert any(p["row_fraction"] < 1 for p in fwd)


def test_a_larger_budget_lowers_the_estimated_error():
    errs = []
    for f in (0.05, 0.2, 0.6):
        b = CommBudget(f, interval=2, rank=0)
        run_steps(b, 3)
        errs.append(sum(b.solves[-1]["slots"][s]["error"] for s in b.solves[-1]["slots"]))
    assert errs[0] > errs[1] > errs[2]


def dist_section(**sec):
    from dgl_rsc.launcher.schema import resolve

    raw = {"dataset": {"name": "synthetic"}, "model": {"name": "gcn"},
           "distributed": {"partitions": 2, **sec}}  # fmt: skip
    return resolve(raw).distributed


def test_the_budget_keys_are_validated():
    from dgl_rsc.core.config import ConfigError

    d = dist_section(comm_budget=0.2)
    assert (d.comm_budget, d.forward_bits, d.backward_bits) == (0.2, "adaptive", "adaptive")
    pinned = dist_section(comm_budget=0.2, forward_bits=8)
    assert (pinned.forward_bits, pinned.backward_bits) == (8, "adaptive")
    assert dist_section().comm_budget == 1.0 and dist_section().forward_bits == 32
    for bad in (0, 1.5, -0.1, "lots", True):
        with pytest.raises(ConfigError, match="distributed.comm_budget"):
            dist_section(comm_budget=bad)
    assert dist_section(comm_budget=0.3, boundary_sample=True).boundary_sample is True
    assert dist_section(boundary_sample=0.5).boundary_sample == 0.5
    assert dist_section(boundary_sample=1.0).boundary_sample is False
    with pytest.raises(ConfigError, match="boundary_sample=true lets distributed.comm_budget"):
        dist_section(boundary_sample=True)
    for bad in (0.0, 2, "half"):
        with pytest.raises(ConfigError, match="distributed.boundary_sample"):
            dist_section(comm_budget=0.2, boundary_sample=bad)


def test_the_launcher_builds_a_budget_only_where_one_applies():
    from dgl_rsc.launcher.dist_run import budget_for

    assert budget_for(dist_section(), 0) is None
    b = budget_for(dist_section(comm_budget=0.2, backward_bits=8), 1)
    assert b.widths == {"forward": (32, 8, 4, 2), "backward": (8,)} and b.boundary == (1.0,)
    fixed = budget_for(dist_section(boundary_sample=0.5), 0)
    assert fixed.fraction == 1.0 and fixed.boundary == (0.5,) and fixed.widths["forward"] == (32,)
    auto = budget_for(dist_section(comm_budget=0.1, boundary_sample=True), 0)
    assert len(auto.boundary) > 1


@pytest.mark.heavy
def test_the_codec_variance_model_is_the_codecs_variance():
    """At 2/4/8 bits the modelled variance is the codec's expected one (measured over draws),
    under bitwidth's bound D/4 (range / (2^b - 1))^2, and 0 for ReLU zeros at offset 0."""
    from dgl_rsc.distributed import quant
    from dgl_rsc.distributed.comm_budget import row_quant_variance

    g = torch.Generator().manual_seed(0)
    x = torch.relu(torch.randn(120, 32, generator=g))
    x[:5] *= 1000
    zeros = torch.zeros(3, 32)
    assert float(row_quant_variance(zeros, [2, 4, 8]).abs().max()) == 0.0
    for b in (2, 4, 8):
        pred = row_quant_variance(x, [b])[0]
        bound = 32 / 4 * quant.row_ranges(x).double().square() / ((1 << b) - 1) ** 2
        assert bool((pred <= bound * 1.05).all())  # the bf16 step may exceed range/(2^b-1)
        codec = codec_for(b, g)
        got = torch.zeros(120, dtype=torch.float64)
        for _ in range(150):
            y = codec.decode(codec.encode(x), 120, 32, torch.float32)
            got += (y - x).double().square().sum(1)
        assert float(got.sum() / 150) == pytest.approx(float(pred.sum()), rel=0.05)


def test_a_bad_budget_stops_the_launcher_before_any_worker(tmp_path):
    from .test_distributed import dgl_rsc, write_config

    for sec, message in (
        ({"comm_budget": 1.5}, "distributed.comm_budget=1.5 is out of range"),
        ({"boundary_sample": True}, "boundary_sample=true lets distributed.comm_budget"),
    ):
        cfg = write_config(tmp_path, distributed=sec)
        proc = dgl_rsc(cfg, "--out", str(tmp_path / "out"), "--nproc", "2")
        assert proc.returncode == 2 and message in proc.stderr
        assert "Traceback" not in proc.stderr
        assert "starting 2 workers" not in proc.stdout + proc.stderr


def exchange_steps(P, make_exchange, steps=4, layers=1, D=8,
                   kinds=("forward_halo", "backward_halo"), field="sent",
                   timeout=30.0):  # fmt: skip
    """``steps`` training steps of a ``layers``-deep chain of aggregations (ReLU and a
    linear map between them, loss on a tenth of the nodes: most gradient rows are zero) on a
    random graph of ``P`` ranks simulated in one process (:class:`.loopback.Loopback`); per
    rank, the ``field`` (bytes ``sent``, ``messages``) of each of ``kinds`` per step, the
    exchange it ran on and its local partition. ``timeout``: seconds a receive waits (a
    rank that raised leaves its peers waiting that long)."""
    import datetime

    from dgl_rsc.distributed.halo import all_local
    from dgl_rsc.distributed.local_graph import LocalGraph
    from dgl_rsc.distributed.partition import partition_nodes
    from dgl_rsc.distributed.runtime import DistContext

    from .loopback import Loopback

    g = torch.Generator().manual_seed(0)
    n = 300
    src, dst = torch.randint(0, n, (2, 1500), generator=g)
    plans = all_local(src, dst, n, partition_nodes(src, dst, n, P, "metis", 0), P)
    x, target = torch.randn(n, D, generator=g), torch.randn(n, D, generator=g)
    w = torch.randn(D, D, generator=g)
    trained = [torch.rand(n, generator=g) < 0.1 for _ in range(steps)]  # a new mask a step

    def rank(r):
        lp = plans[r]
        ctx = DistContext(r, P, torch.device("cpu"), datetime.timedelta(seconds=30))
        ex = make_exchange(lp, ctx)
        graph, sent = LocalGraph(lp, ctx, ex), []
        for s in range(steps):
            before = ctx.bytes.snapshot()
            h = graph.rsc_aggregate(x[lp.owned].clone().requires_grad_(), None, lambda A: None)
            for _ in range(layers - 1):
                h = graph.rsc_aggregate(torch.relu(h) @ w, None, lambda A: None)
            mask = trained[s][lp.owned]
            ((h - target[lp.owned]).square().sum(1) * mask).sum().backward()
            after = ctx.bytes.snapshot()
            sent.append([after[k][field] - before[k][field] for k in kinds])
        return sent, ex, lp

    with Loopback(timeout) as net:
        return net.run(P, rank)


@pytest.mark.parametrize("kw", [dict(fraction=1.0), dict(fraction=0.3),
                                dict(fraction=0.2, boundary=FRACTIONS)])  # fmt: skip
def test_the_reference_is_what_the_plain_exchange_sends(kw):
    """Per rank and step, the budget's reference is the halo bytes (forward and backward)
    that the plain fp32 :class:`~.exchange.HaloExchange` sends for the same inputs: every
    boundary row forward, and backward only the halo rows with a non-zero gradient (here
    a fraction of the blocks: the loss is on a tenth of the nodes), with their index."""
    from dgl_rsc.distributed.budget_exchange import BudgetedExchange
    from dgl_rsc.distributed.exchange import HaloExchange

    plain = exchange_steps(3, HaloExchange)
    budgeted = exchange_steps(3, lambda lp, ctx: BudgetedExchange(
        lp, ctx, CommBudget(rank=lp.rank, interval=2, **kw)))  # fmt: skip
    for (sent, _, lp), (got, ex, _) in zip(plain, budgeted):
        rep = ex.budget.report(ex.ctx.bytes.by_peer())
        assert rep["reference_per_step"] == [f + b for f, b in sent]
        assert all(0 < b < lp.n_halo * (4 * 8 + 4) for _, b in sent)  # not whole blocks
        # and what the budget sent keeps to it, step by step
        assert [f + b for f, b in got] == rep["sent_per_step"]
        assert all(s <= kw["fraction"] * r for s, r in zip(rep["sent_per_step"],
                                                           rep["reference_per_step"]))  # fmt: skip


@pytest.mark.parametrize("fraction", [1.0, 0.1])
def test_below_a_sampled_backward_the_reference_counts_the_rows_reached(fraction):
    """Two aggregations: the lower one's reference counts the halo rows its gradient
    reaches. Where the upper backward was sampled (from the second step, when the budget's
    row caps come from the last measurement), fewer of the lower gradient's rows are
    non-zero than in the exact run: the reference is at most the plain exchange's bytes (the
    budget spends less than it could, never more), and equal at the first step of a budget
    of 1.0 (every row at 32 bits)."""
    from dgl_rsc.distributed.budget_exchange import BudgetedExchange
    from dgl_rsc.distributed.exchange import HaloExchange

    plain = exchange_steps(3, HaloExchange, layers=2)
    budgeted = exchange_steps(3, lambda lp, ctx: BudgetedExchange(
        lp, ctx, CommBudget(fraction, rank=lp.rank, interval=2)), layers=2)  # fmt: skip
    for (sent, _, _), (_, ex, _) in zip(plain, budgeted):
        ref, exact = ex.budget.report({})["reference_per_step"], [f + b for f, b in sent]
        assert all(r <= e for r, e in zip(ref, exact))
        assert ref[0] == exact[0] or fraction < 1.0
