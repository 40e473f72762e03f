"""The report's intervals over seeds: the t-interval of a mean, the bootstrap interval of a
time ratio, and where the launcher's summary shows them."""

from __future__ import annotations

import doctest
import statistics

import pytest

from dgl_rsc.launcher import intervals
from dgl_rsc.launcher.intervals import bootstrap_ratio, ratio_interval, t_interval
from dgl_rsc.launcher.report import _tta_cells, summarize
from dgl_rsc.launcher.tta import time_to_accuracy

from .test_tta import _full_record, _record


def test_doctests_of_the_module_run():
    result = doctest.testmod(intervals)
    assert result.failed == 0 and result.attempted >= 3


def test_t_interval_is_the_t_quantile_times_the_standard_error():
    values = [0.2, -0.1, 0.5, 0.3]
    mean, half = t_interval(values)
    assert mean == pytest.approx(statistics.mean(values))
    assert half == pytest.approx(3.182 * statistics.stdev(values) / 2)
    assert t_interval([4.0]) == (4.0, None)
    with pytest.raises(ValueError, match="at least one value"):
        t_interval([])


def test_bootstrap_ratio_is_the_ratio_of_sums_inside_its_interval_and_repeatable():
    pairs = [(10.0, 8.0), (12.0, 11.0), (9.0, 6.0), (11.0, 10.5)]
    ratio, low, high = bootstrap_ratio(pairs)
    assert ratio == pytest.approx(42.0 / 35.5)
    assert min(e / r for e, r in pairs) <= low < ratio < high <= max(e / r for e, r in pairs)
    assert bootstrap_ratio(pairs) == (ratio, low, high)  # seeded: the same interval again
    assert ratio_interval(pairs[:1]) is None and ratio_interval(pairs) == [low, high]
    with pytest.raises(ValueError, match="positive"):
        bootstrap_ratio([(1.0, 0.0)])


def test_time_to_accuracy_gives_each_speedup_its_interval_over_seeds():
    recs = []
    for seed, (e_epochs, r_epochs) in enumerate([(4, 2), (4, 3), (5, 3)]):
        recs.append(_record("exact", seed, [0.1] * (e_epochs - 1) + [0.9]))
        recs.append(_record("rsc", seed, [0.1] * (r_epochs - 1) + [0.9]))
    rsc = time_to_accuracy(recs, tolerance=0.0)["methods"]["rsc"]
    assert rsc["vs_exact"] == pytest.approx(13 / 8)
    low, high = rsc["vs_exact_ci"]
    assert 4 / 3 <= low < 13 / 8 < high <= 2.0  # within the per-seed ratios
    one = time_to_accuracy(recs[:2], tolerance=0.0)["methods"]["rsc"]
    assert one["vs_exact"] == 2.0 and one["vs_exact_ci"] is None  # one seed: no interval


def test_summary_and_table_show_the_intervals():
    recs = [_full_record(m, [0.5, 0.9]) for m in ("exact", "rsc")]
    for seed in (1, 2):
        for m in ("exact", "rsc"):
            rec = _full_record(m, [0.5, 0.9 - 0.01 * seed * (m == "rsc")])
            rec["seed"] = seed
            recs.append(rec)
    s = summarize(recs)
    gaps = [0.0, -0.01, -0.02]
    assert s["rsc"]["test_delta"] == pytest.approx(statistics.mean(gaps))
    assert s["rsc"]["test_delta_ci"] == pytest.approx(t_interval(gaps)[1])
    assert s["exact"]["tta_speedup_ci"] == [1.0, 1.0]
    assert _tta_cells(s["exact"])[1] == "1.00x (1.00-1.00)"
