"""Adaptive bit-widths (``dgl_rsc.distributed.bitwidth``): the variance model against the
codec, the solver against brute force, the alpha-beta calibration over gloo."""

from __future__ import annotations

import doctest
import itertools
import math

import numpy as np
import pytest
import torch
import torch.distributed as dist

from dgl_rsc.distributed import bitwidth as bw
from dgl_rsc.distributed import calibrate, quant

from .test_distributed import ROOT, torchrun


def random_instance(rng, max_groups=8, widths=(2, 4, 8), max_dest=3):
    """Groups of log-uniform sizes and spreads over 1-3 destinations (sometimes tied), and a
    ``lam`` that puts the optimum anywhere between all-narrow and all-wide."""
    g = int(rng.integers(1, max_groups + 1))
    p = int(rng.integers(1, max_dest + 1))
    dim = int(rng.choice([1, 7, 64, 256]))
    rows = tuple(int(r) for r in np.exp(rng.uniform(0, np.log(3000), g)).astype(int))
    dest = tuple(i % p for i in range(g)) if rng.random() < 0.3 else tuple(rng.integers(0, p, g))
    stats = bw.GroupStats(
        dim,
        rows,
        tuple(int(d) for d in dest),
        tuple(float(r * np.exp(rng.uniform(-4, 4))) for r in rows),
        tuple(float(r * dim * np.exp(rng.uniform(-2, 2))) for r in rows),
    )
    cost = bw.CostModel(float(np.exp(rng.uniform(np.log(1e-6), np.log(1e-4)))), 1e-9)
    nb, var = bw.tables(stats, widths)
    lam = float(cost.beta * nb.sum() / max(var.sum(), 1e-300) * np.exp(rng.uniform(-5, 5)))
    return stats, cost, lam


def brute_force(stats, cost, lam, widths, max_variance=None):
    """The exact optimum of ``beta * max_p bytes_p + lam * variance`` over all assignments."""
    nb, var = bw.tables(stats, widths)
    g = np.arange(len(stats.rows))
    combos = np.array(list(itertools.product(range(len(widths)), repeat=len(g))))
    per_dest = np.stack(
        [nb[g, combos][:, np.array(stats.dest) == p].sum(1) for p in range(max(stats.dest) + 1)], 1
    )
    v = var[g, combos].sum(1)
    f = cost.beta * per_dest.max(1) + lam * v
    if max_variance is not None:
        f = np.where(v <= max_variance, f, np.inf)
    return float(f.min())


# -- model --------------------------------------------------------------------------------------
def test_cost_model():
    m = bw.CostModel(alpha=2e-5, beta=1e-9)
    assert m.time(1e6) == pytest.approx(2e-5 + 1e-3)
    for bad in ({"alpha": -1.0, "beta": 0.0}, {"alpha": 0.0, "beta": math.nan}):
        with pytest.raises(ValueError, match="must be a finite number >= 0"):
            bw.CostModel(**bad)


def test_group_stats():
    x = torch.randn(9, 5, generator=torch.Generator().manual_seed(0))
    x[4, 1] = float("nan")  # left out of the statistics
    st = bw.group_stats(x, (2, 0, 7), (1, 0, 1))
    assert st.rows == (2, 0, 7) and st.dest == (1, 0, 1) and st.dim == 5
    r2 = quant.row_ranges(x).double().square()
    sq = torch.nan_to_num(x.double(), nan=0.0).square().sum(1)
    expect = [(0, 2), (2, 2), (2, 9)]
    assert st.range_sq == pytest.approx([float(r2[a:b].sum()) for a, b in expect])
    assert st.sq_norm == pytest.approx([float(sq[a:b].sum()) for a, b in expect])
    assert st.range_sq[1] == 0 and math.isfinite(st.range_sq[2])
    with pytest.raises(ValueError, match=r"must be \(sum\(group_rows\), D\)"):
        bw.group_stats(x, (2, 3), (0, 1))


@pytest.mark.parametrize("bits", (2, 4, 8, 16))
def test_variance_model_bounds_the_codec(bits):
    """The summed variance of the decoded entries of each group stays below the model (which
    is a bound), and for the quantized widths is not far below it."""
    g = torch.Generator().manual_seed(bits)
    x = torch.randn(12, 33, generator=g) * torch.rand(12, 1, generator=g) * 5
    x[3] += 100
    rows, n = (4, 5, 3), 3000
    st = bw.group_stats(x, rows, (0, 1, 0))
    y = quant.decode(quant.encode(x.repeat(n, 1), bits, generator=g), torch.float64)
    per_row = y.view(n, 12, 33).var(0).sum(1)
    measured = np.array([float(per_row[a : a + r].sum()) for a, r in zip((0, 4, 9), rows)])
    nb, model = bw.tables(st, (bits,))
    assert np.all(measured <= model[:, 0] * 1.05), (measured, model[:, 0])
    if bits != 16:  # uniform positions in a step give about 2/3 of the bound
        assert np.all(measured >= model[:, 0] * 0.5), (measured, model[:, 0])
    assert nb[:, 0].tolist() == [quant.payload_bytes(r, 33, bits) for r in rows]


# -- solver -------------------------------------------------------------------------------------
def test_solver_within_one_percent_of_brute_force():
    """200 random instances (up to 8 groups x 3 widths, a third with a variance cap) and 60
    with all five widths: the solver's objective is within 1% of the exact optimum."""
    rng = np.random.default_rng(2024)
    gaps = []
    for i in range(260):
        widths = (2, 4, 8) if i < 200 else quant.BITS
        stats, cost, lam = random_instance(rng, 8 if i < 200 else 5, widths)
        cap = None
        if i % 3 == 0:
            _, var = bw.tables(stats, widths)
            lo, hi = var.min(1).sum(), var.max(1).sum()
            cap = float(lo + (hi - lo) * rng.uniform(0, 0.5))
        got = bw.solve(stats, cost, lam, widths, max_variance=cap)
        assert cap is None or got.variance <= cap
        assert set(got.bits) <= set(widths) and len(got.bits) == len(stats.rows)
        assert got == bw.evaluate(stats, got.bits, cost, lam)
        best = brute_force(stats, cost, lam, widths, cap)
        gaps.append((got.objective - cost.alpha - best) / best)  # alpha left out: stricter
    worst = max(gaps)
    print(f"solver vs brute force: worst gap {worst:.2e}, mean {np.mean(gaps):.2e}")
    assert worst <= 0.01
    assert min(gaps) > -1e-9  # never better than the optimum: the brute force is right


def test_solver_limits():
    rows = (5, 300, 40, 1, 77, 2000)
    stats = bw.GroupStats(64, rows, (0, 1, 1, 0, 2, 2), tuple(r * 3.0 for r in rows), rows)
    cost = bw.CostModel(1e-5, 1e-9)
    fastest = bw.evaluate(stats, (2,) * len(rows), cost, 0.0).time
    assert bw.solve(stats, cost, 0.0).time == fastest  # only time counts
    # destinations faster than the slowest one get wider widths for free (lam > 0)
    free = bw.solve(stats, cost, 1e-15)
    assert free.time == fastest and set(free.bits[:4]) == {8} and free.bits[5] == 2
    single = bw.GroupStats(64, rows, (0,) * len(rows), stats.range_sq, stats.sq_norm)
    assert set(bw.solve(single, cost, 0.0).bits) == {2}  # one destination: fewest bytes
    # with one feature per row 2, 4 and 8 bits take the same bytes: 8 bits costs nothing
    one = bw.GroupStats(1, rows, stats.dest, stats.range_sq, stats.sq_norm)
    assert set(bw.solve(one, cost, 1e-12).bits) == {8}
    assert set(bw.solve(stats, cost, 1e30).bits) == {8}  # only variance counts
    assert set(bw.solve(stats, cost, 1e30, allowed_bits=quant.BITS).bits) == {32}
    tight = bw.solve(stats, cost, 0.0, max_variance=float(bw.tables(stats, (8,))[1].sum()))
    assert set(tight.bits) == {8}
    with pytest.raises(ValueError, match="below the least variance"):
        bw.solve(stats, cost, 0.0, max_variance=0.5 * tight.variance)
    empty = bw.GroupStats(8, (), (), (), ())
    assert bw.solve(empty, cost, 1.0) == bw.Assignment((), 0.0, 0.0, 0.0)


def test_solver_errors():
    stats = bw.GroupStats(4, (10,), (0,), (1.0,), (1.0,))
    cost = bw.CostModel(0.0, 1e-9)
    with pytest.raises(ValueError, match="allowed_bits must be one of"):
        bw.solve(stats, cost, 1.0, allowed_bits=(2, 3))
    with pytest.raises(ValueError, match="non-empty set"):
        bw.solve(stats, cost, 1.0, allowed_bits=())
    with pytest.raises(ValueError, match="non-empty set"):
        bw.solve(stats, cost, 1.0, allowed_bits=(4, 4))
    with pytest.raises(ValueError, match="lam must be"):
        bw.solve(stats, cost, -1.0)
    with pytest.raises(ValueError, match="max_variance must be"):
        bw.solve(stats, cost, 1.0, max_variance=-2.0)
    with pytest.raises(TypeError, match="GroupStats"):
        bw.solve({"rows": (1,)}, cost, 1.0)
    with pytest.raises(ValueError, match="one entry per group"):
        bw.GroupStats(4, (10, 2), (0,), (1.0,), (1.0,))
    with pytest.raises(ValueError, match="bits has 2 entries"):
        bw.evaluate(stats, (2, 4), cost, 1.0)


def test_bit_histogram_and_doctests():
    assert bw.bit_histogram((16, 2, 16, 8), (1, 2, 3, 0)) == {2: 2, 8: 0, 16: 4}
    with pytest.raises(ValueError, match="bits has 1 entries but rows has 2"):
        bw.bit_histogram((2,), (1, 2))
    assert doctest.testmod(bw).failed == 0


# -- calibration --------------------------------------------------------------------------------
@pytest.mark.slow
def test_calibrate_over_gloo(tmp_path):
    proc = torchrun(2, str(ROOT / "tests" / "workers" / "worker_calibrate.py"), str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = ((tmp_path / f"rank{r}.txt").read_text() for r in range(2))
    assert r0 == r1, "the ranks returned different models"
    alpha, beta = map(float, r0.split())
    model = bw.CostModel(alpha, beta)
    assert alpha >= 0 and beta > 0  # 32 MB take longer than 1 KB
    assert model.time(1 << 25) > model.time(1 << 10)


def test_calibrate_needs_a_process_group():
    assert not dist.is_initialized()  # the calibration test runs its ranks in other processes
    with pytest.raises(RuntimeError, match="init_process_group"):
        calibrate.calibrate()
