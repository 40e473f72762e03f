"""Mini-batch RSC through the launcher (train.mode cluster and saint): both engines train
alike, budget 1.0 equals exact mini-batch training, samples stay with their subgraph,
configuration errors are clear."""

import pytest
import torch

from dgl_rsc.core.config import ConfigError
from dgl_rsc.launcher.schema import resolve
from dgl_rsc.launcher.train import prepare, train_one
from dgl_rsc.launcher.yaml_io import apply_overrides

from ..conftest import requires_dgl

BASE = {
    "dataset": {"name": "synthetic", "num_nodes": 1200, "avg_degree": 8.0, "num_classes": 4,
                "feat_dim": 12, "seed": 3},
    "model": {"name": "gcn", "hidden": 16, "layers": 2, "dropout": 0.0},
    "train": {"epochs": 4, "lr": 0.02, "seeds": [0], "eval_every": 2, "device": "cpu",
              "stock_baseline": False, "mode": "cluster"},
    "minibatch": {"num_parts": 6, "batch_size": 2, "shuffle": False},
    "rsc": {"budget": 0.3, "cache_interval": 3, "warmup_steps": 1, "min_width": 0},
}  # fmt: skip


def run(sets=(), method="rsc"):
    cfg = resolve(apply_overrides(BASE, list(sets)))
    rec = train_one(cfg, prepare(cfg), method, seed=0, progress=False)
    return torch.tensor([h["loss"] for h in rec["history"]], dtype=torch.float64), rec


@requires_dgl
@pytest.mark.parametrize(
    "mode_sets",
    [[], ["train.mode=saint", "minibatch={sampler: node, budget: 400}"]],
    ids=["cluster", "saint-node"],
)
def test_native_and_dgl_engines_train_alike(one_thread, mode_sets):
    native, _ = run(mode_sets + ["train.engine=native"])
    dgl, _ = run(mode_sets + ["train.engine=dgl"])
    torch.testing.assert_close(native, dgl, rtol=1e-5, atol=1e-6)


def test_budget_one_equals_exact_minibatch_training(one_thread):
    full, _ = run(["rsc.budget=1.0"])
    exact, _ = run(method="exact")
    torch.testing.assert_close(full, exact, rtol=1e-5, atol=1e-6)


def test_fixed_cluster_batches_reuse_their_own_samples(one_thread):
    _, rec = run(["rsc.cache_interval=2"])
    st = rec["rsc_stats"]
    last = rec["history"][-1]
    assert last["batches"] == 3 and last["graph_hits"] > 0  # the same subgraphs came back
    assert st["subgraph_hits"] > 0 and st["cache_hits"] > 0
    assert st["visited_fraction"] < 1.0


def test_saint_batches_never_reuse_another_batchs_sample(one_thread):
    _, rec = run(["train.mode=saint", "minibatch={sampler: edge, budget: 600}",
                  "train.batches_per_epoch=3"])  # fmt: skip
    st = rec["rsc_stats"]
    # every batch is a new subgraph: no cached sample is ever served to it
    assert st["cache_hits"] == 0 and st["cache_misses"] > 0
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in rec["history"])


def test_switch_counts_optimizer_steps_across_batches():
    cfg = resolve(apply_overrides(BASE, ["train.epochs=10"]))
    assert cfg.rsc.total_steps == 10 * 3  # 6 clusters, 2 per batch: 3 steps an epoch


@pytest.mark.parametrize(
    "sets, fragment",
    [
        (["minibatch.batch_size=9"], "batch_size=9 exceeds minibatch.num_parts=6"),
        (["train.mode=full"], "train.mode is full"),
        (["train.batches_per_epoch=5"], "does not apply to cluster mode"),
        (["train.mode=saint", "minibatch={sampler: walk, budget: 5}"], "[roots, walk length]"),
        (["train.mode=saint", "minibatch={sampler: nodes}"], "Did you mean 'node'"),
        (["minibatch.sampler=node"], "minibatch.sampler is not used by train.mode=cluster"),
    ],
)
def test_configuration_errors(sets, fragment):
    with pytest.raises(ConfigError, match=None) as err:
        resolve(apply_overrides(BASE, sets))
    assert fragment in str(err.value)


@requires_dgl
@pytest.mark.parametrize("mode_sets", [[], ["train.mode=saint", "minibatch={budget: 400}"]],
                         ids=["cluster", "saint"])  # fmt: skip
def test_stock_baseline_trains_on_dgl_batches_like_exact(one_thread, mode_sets):
    """The stock dgl.nn baseline gets DGLGraph batches from the same loader as the other
    methods (it crashed on the package's own Graph): same batches, same losses as exact."""
    stock, rec = run(mode_sets, method="stock")
    exact, _ = run(mode_sets, method="exact")
    assert rec["history"][-1]["batches"] >= 1
    torch.testing.assert_close(stock, exact, rtol=1e-4, atol=1e-5)


def test_minibatch_steps_run_under_the_runs_amp_context(one_thread, monkeypatch, caplog):
    """Mini-batch steps use the same autocast/scaler path as full-graph steps; on CPU
    train.amp falls back to none with the full-graph warning, and the record says so."""
    from dgl_rsc.launcher import run_state

    entered = []
    real = run_state.RunState.autocast

    def spy(self):
        entered.append(self.amp)
        return real(self)

    monkeypatch.setattr(run_state.RunState, "autocast", spy)
    with caplog.at_level("WARNING"):
        _, rec = run(["train.amp=bf16", "train.epochs=1"])
    batches = rec["history"][0]["batches"]
    assert rec["amp"] == "none" and "train.amp=bf16 ignored" in caplog.text
    assert entered.count("none") >= batches >= 1  # every batch's forward, plus evaluation
