"""The plateau rule (early stopping) and the controller's switch to exact on it."""

import math

import pytest
import torch

from dgl_rsc import RSCController, spmm_matrix
from dgl_rsc.core.plateau import Plateau

from ..conftest import power_law_csr


def updates(rule: Plateau, values) -> list:
    return [rule.update(v) for v in values]


def test_a_flat_curve_stops_after_patience_and_a_rising_one_never():
    flat = Plateau(patience=3)
    assert updates(flat, [0.5, 0.5, 0.5, 0.5]) == [False, False, False, True]
    assert flat.best == 0.5 and flat.best_step == 1 and flat.fired_step == 4
    rising = Plateau(patience=3)
    assert not any(updates(rising, [0.1 + 0.01 * i for i in range(100)]))
    assert rising.best_step == 100 and rising.fired_step is None


def test_improvements_must_beat_min_delta_and_noise_does_not_reset_the_count():
    rule = Plateau(patience=2, min_delta=0.01)
    # +0.005 is within the margin: not an improvement; +0.02 is one
    assert updates(rule, [0.50, 0.505, 0.52, 0.515, 0.529]) == [False, False, False, False, True]
    assert rule.best == 0.52
    loss = Plateau(patience=2, mode="min")
    assert updates(loss, [1.0, 0.9, 0.95, 0.91]) == [False, False, False, True]


def test_non_finite_values_never_improve():
    rule = Plateau(patience=2)
    assert updates(rule, [math.nan, None, 0.3]) == [False, True, False]
    assert rule.best == 0.3 and updates(rule, [math.inf, -math.inf]) == [False, True]


def test_state_dict_continues_the_count():
    values = [0.1, 0.3, 0.2, 0.25, 0.3, 0.29, 0.1, 0.31, 0.3, 0.3]
    whole = Plateau(patience=3)
    want = updates(whole, values)
    first = Plateau(patience=3)
    updates(first, values[:5])
    resumed = Plateau(patience=3)
    resumed.load_state_dict(first.state_dict())
    assert want[5:] == updates(resumed, values[5:])
    assert resumed.state_dict() == whole.state_dict()


@pytest.mark.parametrize(
    "kwargs, fragment",
    [({"patience": 0}, "patience"), ({"patience": 2.5}, "patience"),
     ({"patience": 2, "min_delta": -0.1}, "min_delta"),
     ({"patience": 2, "mode": "up"}, "mode")],
)  # fmt: skip
def test_bad_arguments_name_the_argument(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        Plateau(**kwargs)


def train(rsc, A, steps, vals=None):
    """``steps`` optimizer steps of one product; ``vals[i]`` reported after step ``i``."""
    X = torch.randn(A.shape[1], 24, requires_grad=True)
    phases = []
    for i in range(steps):
        spmm_matrix(A, X, rsc).square().sum().backward()
        rsc.step()
        if vals is not None:
            rsc.observe_validation(vals[i])
        phases.append(rsc.phase())
    return phases


def test_the_switch_fires_on_a_validation_plateau_and_not_on_a_rising_curve():
    A = power_law_csr(400, 8.0, seed=3)
    flat = RSCController(budget=0.2, switch_patience=4, warmup_steps=2, total_steps=1000)
    vals = [0.5, 0.6, 0.7] + [0.69] * 20
    phases = train(flat, A, 12, vals)
    # phases[i]: the phase of step i + 1. The best is 0.7 (after step 3); four evaluations
    # without a better one: exact from step 7 on
    assert phases == ["warmup", "approx", "approx"] + ["approx"] * 3 + ["exact"] * 6
    switch = flat.stats()["switch"]
    assert switch["signal"] == "plateau" and switch["step"] == 7
    assert flat.layers[0].sample is None  # the cached sample was dropped at the switch
    calls = flat.stats()["layers"][0]
    assert calls["exact_calls"] == 2 + 5 and calls["approx_calls"] == 5  # steps 0-1, 7-11
    rising = RSCController(budget=0.2, switch_patience=4, warmup_steps=2, total_steps=1000)
    assert set(train(rising, A, 12, [0.1 + 0.01 * i for i in range(12)])[2:]) == {"approx"}
    assert rising.stats()["switch"] is None


def test_the_step_switch_still_fires_first_and_without_observations():
    A = power_law_csr(300, 6.0, seed=4)
    rsc = RSCController(budget=0.2, switch_patience=50, switch_at=0.5, total_steps=10)
    phases = train(rsc, A, 10, [0.5 + 0.01 * i for i in range(10)])
    assert phases[4:] == ["exact"] * 6 and rsc.stats()["switch"]["signal"] == "steps"
    off = RSCController(budget=0.2, switch_at=1.0, total_steps=10)  # switch_patience 0: off
    assert "exact" not in train(off, A, 8, [0.5] * 8)[2:]


def test_the_switch_state_resumes_with_the_controller(tmp_path):
    A = power_law_csr(300, 6.0, seed=5)
    vals = [0.5, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6]

    def make():
        return RSCController(budget=0.2, switch_patience=3, warmup_steps=1, total_steps=100)

    first = make()
    train(first, A, 4, vals)
    path = tmp_path / "rsc.pt"
    torch.save(first.state_dict(), path)
    resumed = make()
    resumed.load_state_dict(torch.load(path, weights_only=True))
    whole = make()
    assert train(whole, A, 8, vals)[4:] == train(resumed, A, 4, vals[4:])
    assert resumed.stats()["switch"] == whole.stats()["switch"]


def test_a_new_best_in_the_plateaus_exact_phase_approximates_again_and_is_resumed(tmp_path):
    A = power_law_csr(400, 8.0, seed=6)

    def make(returns=True):
        return RSCController(budget=0.2, switch_patience=3, warmup_steps=1, total_steps=1000,
                             switch_returns=returns)  # fmt: skip

    # phases[i]: after step i + 1. A rising curve that stalls: best 0.6 after step 2, three
    # evaluations without a better one: exact after step 5; a new best (0.65) after step 7
    # approximates again; a second stall of three: exact after step 10, to the end
    vals = [0.5, 0.6, 0.55, 0.58, 0.59, 0.6, 0.65, 0.64, 0.63, 0.6, 0.62, 0.6, 0.6]
    rsc = make()
    phases = train(rsc, A, 13, vals)
    assert phases == ["approx"] * 4 + ["exact"] * 2 + ["approx"] * 3 + ["exact"] * 4
    stats = rsc.stats()
    assert stats["switch"]["signal"] == "plateau" and stats["switch_returns"] == [7]
    first = make()
    train(first, A, 8, vals)
    torch.save(first.state_dict(), tmp_path / "rsc.pt")
    resumed = make()
    resumed.load_state_dict(torch.load(tmp_path / "rsc.pt", weights_only=True))
    assert train(resumed, A, 5, vals[8:]) == phases[8:]
    assert resumed.stats()["switch_returns"] == [7]
    for_good = make(returns=False)  # the default: the first plateau switches for good
    assert train(for_good, A, 13, vals) == ["approx"] * 4 + ["exact"] * 9
    assert for_good.stats()["switch_returns"] == []


def test_the_step_switch_is_for_good_whatever_the_validation_does():
    A = power_law_csr(300, 6.0, seed=7)
    rsc = RSCController(budget=0.2, switch_patience=2, switch_at=0.5, total_steps=12)
    vals = [0.5, 0.5, 0.5, 0.5, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.97, 0.99]
    phases = train(rsc, A, 12, vals)
    assert phases[5:] == ["exact"] * 7 and rsc.stats()["switch_returns"] == []
