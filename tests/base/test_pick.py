"""Measured choices (``dgl_rsc.base.pick``): candidates timed by an injected fake timer, the
fastest kept; never a timed assertion."""

import pytest

from dgl_rsc.base.pick import Registry, fingerprint


def fake(times: dict):
    """A timer giving each candidate its time from ``times`` (a list: one per call)."""
    left = {k: list(v) if isinstance(v, list) else None for k, v in times.items()}

    def timer(name, fn):
        t = left[name].pop(0) if left[name] is not None else times[name]
        return fn(), t

    return timer


def test_run_measures_every_candidate_twice_then_runs_the_fastest_alone():
    calls = {"a": 0, "b": 0}

    def cand(name):
        def fn():
            calls[name] += 1
            return name

        return fn

    reg = Registry(timer=fake({"a": [1.0, 3.0], "b": [2.0, 1.0]}))
    outs = [reg.run("k", (1,), {"a": cand("a"), "b": cand("b")}, keep="a") for _ in range(5)]
    assert outs == ["a", "a", "b", "b", "b"]  # keep's result while measuring
    assert calls == {"a": 2, "b": 5} and reg.trials("k", (1,)) == 2
    assert reg.chosen("k", (1,)) == "b"  # the last round decides (the first warms up)
    assert reg.chosen("k", (2,)) is None  # another key: not measured yet
    [row] = reg.summary("k")
    assert row["chosen"] == "b" and row["ms"] == {"a": 3000.0, "b": 1000.0}


def test_decide_times_probes_on_the_first_call_only():
    probed = []
    reg = Registry(timer=fake({"fp32": 1.0, "int8": 5.0}))
    probes = {"fp32": lambda: probed.append("fp32"), "int8": lambda: probed.append("int8")}
    assert reg.decide("dense", (8, 8, 8), probes) == "fp32"
    assert reg.decide("dense", (8, 8, 8), probes) == "fp32"
    assert probed == ["fp32", "int8", "fp32", "int8"]  # two rounds, once


def test_forced_and_single_candidates_skip_the_measurement():
    reg = Registry(timer=lambda n, f: pytest.fail("nothing is timed"))
    reg.forced["k"] = "b"
    assert reg.run("k", (), {"a": lambda: 1, "b": lambda: 2}) == 2
    assert reg.decide("k", (), {"a": None, "b": None}) == "b"
    assert reg.run("other", (), {"only": lambda: 3}) == 3
    reg.forced["k"] = "c"
    with pytest.raises(ValueError, match="'c' for k is not one of a, b"):
        reg.run("k", (), {"a": lambda: 1, "b": lambda: 2})


def test_fingerprint_buckets_large_sizes_only_when_asked():
    assert fingerprint(5000, 17, "float32") == (5000, 17, "float32")
    assert fingerprint(5000, 17, exact=False) == (8192, 17)
    assert fingerprint(True, 3) == ("True", 3)
