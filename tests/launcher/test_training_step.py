"""One training step for every mode: full-graph and mini-batch (Cluster-GCN, GraphSAINT) runs,
on every engine, with and without ``train.amp``, all go through
:class:`~dgl_rsc.launcher.run_state.RunState` (autocast, backward, optimizer step, then
``rsc.step()``), once per optimizer step. On the CPU ``train.amp`` falls back to none with a
warning and the record says so; a combination that cannot run is refused before training."""

import pytest
import torch

from dgl_rsc.core.config import ConfigError
from dgl_rsc.launcher import run_state
from dgl_rsc.launcher.schema import resolve
from dgl_rsc.launcher.train import prepare, train_one
from dgl_rsc.launcher.yaml_io import apply_overrides

BASE = {
    "dataset": {"name": "synthetic", "num_nodes": 600, "avg_degree": 6.0, "num_classes": 3,
                "feat_dim": 8, "seed": 5},
    "model": {"name": "gcn", "hidden": 8, "layers": 2, "dropout": 0.0},
    "train": {"epochs": 2, "lr": 0.02, "seeds": [0], "eval_every": 1, "device": "cpu",
              "stock_baseline": False},
    "rsc": {"budget": 0.3, "cache_interval": 2, "warmup_steps": 1},
}  # fmt: skip
MODES = {
    "full": [],
    "cluster": ["train.mode=cluster", "minibatch={num_parts: 4, batch_size: 2}"],
    "saint": ["train.mode=saint", "minibatch={sampler: node, budget: 300}"],
}
ENGINES = [
    pytest.param("native", id="native"),
    pytest.param("dgl", id="dgl", marks=pytest.mark.dgl),
    pytest.param("pyg", id="pyg", marks=pytest.mark.pyg),
]


@pytest.fixture
def calls(monkeypatch):
    """Counts of the shared step's parts, by name."""
    seen = {"autocast": 0, "backward": 0, "step": 0}
    for name in seen:
        real = getattr(run_state.RunState, name)

        def spy(self, *args, _real=real, _name=name, **kwargs):
            seen[_name] += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(run_state.RunState, name, spy)
    return seen


@pytest.mark.parametrize("amp", ["none", "bf16"])
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("mode", list(MODES))
def test_every_mode_trains_through_the_one_step(one_thread, calls, caplog, mode, engine, amp):
    sets = [*MODES[mode], f"train.engine={engine}", f"train.amp={amp}"]
    if engine == "pyg" and mode != "full":
        with pytest.raises(ConfigError, match="mini-batch|train.mode"):
            prepare(resolve(apply_overrides(BASE, sets)))
        return
    cfg = resolve(apply_overrides(BASE, sets))
    with caplog.at_level("WARNING"):
        rec = train_one(cfg, prepare(cfg), "rsc", seed=0, progress=False)
    steps = sum(h.get("batches", 1) for h in rec["history"])
    assert steps >= 2 and calls["backward"] == calls["step"] == steps
    assert calls["autocast"] >= steps  # every training forward (evaluation adds more)
    stats = rec["rsc_stats"]  # rsc.step() once per optimizer step, none inferred
    assert stats["step"] == steps and stats["implicit_steps"] == 0
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in rec["history"])
    assert rec["amp"] == "none"  # the CPU has no autocast here
    assert (f"train.amp={amp} ignored" in caplog.text) == (amp != "none")


@pytest.mark.parametrize("keep", [True, False])
def test_a_run_reports_its_allocator_faults_memory_and_reused_aggregation(one_thread, keep,
                                                                          monkeypatch):  # fmt: skip
    from dgl_rsc.base import memory

    applied = []
    monkeypatch.setattr(memory, "keep_freed_memory", lambda: applied.append(1) or True)
    cfg = resolve(apply_overrides(BASE, [f"train.keep_freed_memory={str(keep).lower()}",
                                         "train.epochs=3"]))  # fmt: skip
    rec = train_one(cfg, prepare(cfg), "exact", seed=0, progress=False)
    assert applied == ([1] if keep else [])  # the launcher's own call, only when configured
    assert rec["allocator"] == ("kept" if keep else "default")
    assert all(h["minor_faults"] >= 0 for h in rec["history"]) and rec["peak_rss_mb"] > 0
    # the first layer's input (the dataset's features) is aggregated once, then reused:
    # built at the second step, reused at the third and in every evaluation
    assert rec["rsc_stats"]["cached_input_aggregation"]["builds"] == 1
    assert rec["rsc_stats"]["cached_input_aggregation"]["hits"] >= 2
