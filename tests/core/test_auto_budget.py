"""``budget: auto``, the error estimate behind it, and the guard of the approximate phase."""

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import dgl_rsc.nn as rnn
from dgl_rsc import RSCController
from dgl_rsc.core.config import ConfigError, RSCConfig
from dgl_rsc.core.guard import Guard
from dgl_rsc.core.slot import LayerSlot
from dgl_rsc.models import build_model
from dgl_rsc.sampling import sample_product
from dgl_rsc.sampling.error import ErrorCurve, fraction_for_error
from dgl_rsc.sparse.graph import Graph
from dgl_rsc.sparse.products import csr_t_mm

from ..conftest import SHARED_DATA, labelled_graph


class _Spy(LayerSlot):
    """Records, at every fresh sample, the measured error of the sampled rows' product next to
    the error the layer's curve (estimated on the same ``dY``) predicts for its non-zeros.

    The curve estimates what the sampled rows leave out: with ``remainder_groups`` (the
    default) that is the part the groups then estimate without bias, so the error measured is
    the one of the sampled rows' product alone, without this step's group."""

    __slots__ = ("log",)

    def backward_product(self, A, dY, scales=None):
        from dgl_rsc.sparse.products import NO_SCALES

        scales = NO_SCALES if scales is None else scales
        out = super().backward_product(A, dY, scales)
        s = self.state.sample
        if self.step.phase == "approx" and s is not None and s.uses == 1 and self.state.curve:
            exact = csr_t_mm(A, dY, scales)
            alone = sample_product(A, s, dY, scales) if s.rest else out
            measured = float((alone - exact).norm() / exact.norm())
            frac = float(s.nnz) / float(self.state.row_nnz.sum())
            self.log.append((self.state.index, frac, measured, self.state.curve.at(frac)))
        return out


class _SpyController(RSCController):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.log = []

    def slot(self, index):
        base = super().slot(index)
        spy = _Spy(base.state, base.step)
        spy.log = self.log
        return spy


def _graph(name):
    if name == "cora":
        path = os.path.join(SHARED_DATA, "cora.npz")
        if not os.path.exists(path):
            pytest.skip(f"{path} is absent (the shared data folder)")
        z = np.load(path)
        src, dst = torch.from_numpy(z["src"]), torch.from_numpy(z["dst"])
        feat, label = torch.from_numpy(z["feat"]), torch.from_numpy(z["label"])
        n = feat.shape[0]
        key = torch.unique(torch.cat([src * n + dst, dst * n + src]))
        src, dst = key // n, key % n
        keep = src != dst
        src, dst = src[keep], dst[keep]
        mask = torch.from_numpy(z["train_mask"])
    else:  # a small power-law graph like the quickstart's
        src, dst, feat, label, mask, _ = labelled_graph(n=1500, classes=10, feat_dim=32,
                                                        avg_degree=24.0, homophily=0.3)  # fmt: skip
        n = feat.shape[0]
    loops = torch.arange(n)
    return Graph(torch.cat([src, loops]), torch.cat([dst, loops]), n), feat, label, mask


def _train(g, feat, label, mask, ctl, steps, seed=0, hidden=32, layers=3):
    torch.manual_seed(seed)
    model = build_model("gcn", feat.shape[1], int(label.max()) + 1, engine="native",
                        hidden=hidden, layers=layers, dropout=0.5)  # fmt: skip
    rnn.attach(model, ctl)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(g, feat)[mask], label[mask])
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctl.step(loss.detach())
        losses.append(float(loss))
    return losses


@pytest.mark.parametrize("name", ["cora", "quickstart"])
def test_estimated_error_within_25_percent_of_measured(name):
    """Every step tunes and refreshes: each fresh sample's measured error is compared with
    the curve estimated from the same step's dY at the sample's own non-zero fraction."""
    g, feat, label, mask = _graph(name)
    ctl = _SpyController(budget="auto", target_error=0.4, cache_interval=1, tune_interval=1,
                         warmup_steps=1, probe_rows=512, guard=False,
                         min_width=0)  # every layer: the estimator is under test  # fmt: skip
    _train(g, feat, label, mask, ctl, steps=12)
    rows = [r for r in ctl.log if r[2] > 0.02]  # a near-exact sample has no relative scale
    assert len(rows) >= 15
    rel = [abs(est - meas) / meas for _, _, meas, est in rows]
    assert float(np.median(rel)) < 0.25, rows
    assert sum(r < 0.25 for r in rel) >= 0.8 * len(rel), rows


def test_auto_budget_meets_its_target_on_a_small_graph():
    g, feat, label, mask = _graph("quickstart")
    target = 0.3
    ctl = _SpyController(budget="auto", target_error=target, cache_interval=1, tune_interval=5,
                         probe_rows=512, total_steps=40)  # fmt: skip
    _train(g, feat, label, mask, ctl, steps=30)
    tunes = ctl.stats()["budgets"]
    assert len(tunes) >= 5 and all(t["target_error"] == target for t in tunes)
    for t in tunes:  # every layer's estimated error at its allocation is on the target
        assert all(e is None or e <= target + 0.02 for e in t["errors"]), t
    # the budgets adapt per layer: they are not all the same fraction
    assert len({round(f, 2) for t in tunes for f in t["fractions"]}) > 1
    measured = [m for _, _, m, _ in ctl.log]
    assert measured and float(np.median(measured)) <= target * 1.25
    # and they are really smaller than exact
    assert ctl.stats()["visited_fraction"] < 0.9


def test_guard_switches_to_exact_when_the_approximation_is_useless():
    g, feat, label, mask = _graph("quickstart")
    ctl = RSCController(budget=0.0005, min_k=0, tune_interval=5, total_steps=200)
    _train(g, feat, label, mask, ctl, steps=40)
    actions = ctl.stats()["guard"]
    assert [a["action"] for a in actions] == ["raise", "exact"], actions
    assert all(a["signal"] == "error" for a in actions)
    assert ctl.phase() == "exact" and ctl.config.switch_step == 160
    assert ctl.stats()["cache_bytes"] == 0  # the guard's switch released the samples too

    # once exact, every product is exact
    def calls(kind):
        return sum(x[f"{kind}_calls"] for x in ctl.stats()["layers"])

    approx, exact = calls("approx"), calls("exact")
    _train(g, feat, label, mask, ctl, steps=2)
    assert calls("approx") == approx and calls("exact") > exact


@pytest.mark.parametrize("budget", [0.3, "auto"])
def test_guard_does_not_act_on_a_healthy_run(budget):
    g, feat, label, mask = _graph("quickstart")
    ctl = RSCController(budget=budget, tune_interval=5, total_steps=100)
    losses = _train(g, feat, label, mask, ctl, steps=45)
    assert losses[-1] < losses[0]
    assert ctl.stats()["guard"] == []
    assert ctl.phase() == "approx"


def test_guard_loss_signal():
    guard = Guard(window=5)
    assert guard.window == 10  # shorter windows read dropout noise as a trend
    for v in np.linspace(1.0, 0.4, 20):
        guard.observe(float(v))
    assert guard.decide(20, [0.5, 0.4], can_raise=True) == "none"
    for v in np.linspace(0.45, 1.0, 10):  # the loss climbs back
        guard.observe(float(v))
    assert guard.decide(30, [0.5], can_raise=True) == "raise"
    assert guard.actions[-1]["signal"] == "loss"
    for v in [0.5] * 10 + [0.9] * 10:
        guard.observe(v)
    assert guard.decide(50, [None], can_raise=True) == "exact"
    assert guard.exact_from == 50
    state = guard.state_dict()
    other = Guard(window=5)
    other.load_state_dict(state)
    assert other.actions == guard.actions and other.exact_from == 50
    guard.observe(float("nan"))  # non-finite losses are the training loop's business
    assert all(np.isfinite(guard.losses))


def test_fraction_for_error_reads_the_curve():
    curve = ErrorCurve(torch.tensor([0.0, 0.1, 0.5, 1.0], dtype=torch.float64),
                       torch.tensor([1.0, 0.6, 0.2, 0.0], dtype=torch.float64), 10)  # fmt: skip
    assert fraction_for_error(curve, 0.6) == pytest.approx(0.1)
    assert fraction_for_error(curve, 0.4) == pytest.approx(0.3)
    assert fraction_for_error(curve, 1.0) == 0.0
    assert curve.at(0.3) == pytest.approx(0.4)
    assert curve.at(2.0) == 0.0


def test_auto_config_values():
    cfg = RSCConfig.from_dict({"budget": "auto", "target_error": 0.2})
    assert cfg.auto and cfg.fraction == 0.5
    assert not RSCConfig(budget=0.2).auto and RSCConfig(budget=0.2).fraction == 0.2
    with pytest.raises(ConfigError, match="target_error"):
        RSCConfig(budget="auto", target_error=1.5)
    with pytest.raises(ConfigError, match="budget must be a number or 'auto'"):
        RSCConfig(budget="half")
    with pytest.raises(ConfigError, match="guard must be true or false"):
        RSCConfig(guard="yes")


def test_controller_state_round_trip_keeps_the_guard_and_budgets():
    g, feat, label, mask = _graph("quickstart")
    ctl = RSCController(budget=0.0005, min_k=0, tune_interval=5, total_steps=200)
    _train(g, feat, label, mask, ctl, steps=12)
    state = ctl.state_dict()
    again = RSCController(budget=0.0005, min_k=0, tune_interval=5, total_steps=200)
    again.load_state_dict(state)
    assert again.boost == ctl.boost == 2.0
    assert again.stats()["guard"] == ctl.stats()["guard"]
    assert again.budget_log == ctl.budget_log


def test_launcher_reports_auto_budgets_and_guard(tmp_path, capsys):
    """``rsc.budget: auto`` from YAML to results.json: the budgets chosen per layer over time
    and the guard's actions are recorded."""
    import json

    from dgl_rsc.launcher import cli

    from ..launcher.test_launcher import write_config

    path = write_config(tmp_path, rsc={"budget": "auto", "target_error": 0.35},
                        train={"epochs": 12})  # fmt: skip
    out = tmp_path / "out"
    assert cli.main(["run", path, "--out", str(out), "--no-progress"]) == 0
    runs = json.loads((out / "runs" / "rsc-seed0.json").read_text())
    stats = runs["rsc_stats"]
    assert stats["guard"] == []
    tunes = stats["budgets"]
    assert tunes and all(t["target_error"] == 0.35 for t in tunes)
    assert all(0.0 <= f <= 1.0 for t in tunes for f in t["fractions"])
    assert "budget: auto" in (out / "config.yaml").read_text()
