"""GraphSAINT's pre-sampling, a setup phase that can take minutes on a large graph: it reports
its progress, runs once per seed for all the methods of a run (the same weights, so the same
training), and its time reaches the report."""

import json

import torch
import yaml

from dgl_rsc.launcher import cli
from dgl_rsc.launcher.schema import resolve
from dgl_rsc.launcher.train import prepare, train_one
from dgl_rsc.launcher.yaml_io import apply_overrides
from dgl_rsc.minibatch import loader_base, saint_loader
from dgl_rsc.minibatch.batch import PRESAMPLE_COVERAGE
from dgl_rsc.minibatch.samplers import SaintLoader

from .test_train import BASE

RING = (torch.arange(40), (torch.arange(40) + 1) % 40, 40)


def test_presampling_reports_its_progress_to_the_end():
    calls = []
    SaintLoader(*RING, "node", budget=8, batches_per_epoch=2,
                progress=lambda done, total: calls.append((done, total)))  # fmt: skip
    total = PRESAMPLE_COVERAGE * 40
    assert calls[-1] == (total, total) and all(t == total for _, t in calls)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls) and len(calls) > 1
    calls.clear()
    SaintLoader(*RING, "node", budget=8, batches_per_epoch=2, num_presample=7,
                progress=lambda done, total: calls.append((done, total)))  # fmt: skip
    assert calls == [(i, 7) for i in range(1, 8)]


def test_a_loader_given_the_weights_does_not_presample_again():
    first = SaintLoader(*RING, "node", budget=8, batches_per_epoch=2, seed=3)

    def fail(done, total):
        raise AssertionError("pre-sampled again")

    again = SaintLoader(*RING, "node", budget=8, batches_per_epoch=2, seed=3, progress=fail,
                        norms=first.norms)  # fmt: skip
    assert again.norms is first.norms
    fresh = SaintLoader(*RING, "node", budget=8, batches_per_epoch=2, seed=3)
    assert torch.equal(fresh.norms.node, first.norms.node)  # the same estimate


def test_the_methods_of_a_run_share_one_presampling_and_train_as_before(one_thread, monkeypatch):
    cfg = resolve(apply_overrides(BASE, ["train.mode=saint", "minibatch={budget: 400}"]))
    calls = []
    real = saint_loader.estimate_saint_norms

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(saint_loader, "estimate_saint_norms", counted)
    prep = prepare(cfg)
    exact = train_one(cfg, prep, "exact", seed=0, progress=False)
    exact_loader = prep.loaders[0]
    rsc = train_one(cfg, prep, "rsc", seed=0, progress=False)
    assert len(calls) == 1  # once for both methods of seed 0
    assert set(prep.setup_s) == {"dataset", "graph", "saint_presample_seed0"}
    assert prep.setup_s["saint_presample_seed0"] > 0
    assert exact_loader is prep.loaders[0] and len(prep.loaders) == 1  # one loader per seed
    alone = train_one(cfg, prepare(cfg), "rsc", seed=0, progress=False)  # its own estimate
    assert len(calls) == 2
    assert [h["loss"] for h in rsc["history"]] == [h["loss"] for h in alone["history"]]
    assert len(exact["history"]) == cfg.train.epochs


def test_a_launcher_run_presamples_once_before_its_warm_up(one_thread, monkeypatch, tmp_path):
    """Warm-up and timed runs of both methods share one loader: one pre-sampling, a phase of
    its own before the warm-up's (their seconds do not overlap in the report)."""
    sets = ["train.mode=saint", "minibatch={budget: 400}", "train.epochs=2",
            "train.warmup_epochs=1", "compare=true"]  # fmt: skip
    cfg = apply_overrides(BASE, sets)
    path = tmp_path / "saint.yaml"
    path.write_text(yaml.safe_dump(cfg))
    calls = []
    real = saint_loader.estimate_saint_norms
    monkeypatch.setattr(saint_loader, "estimate_saint_norms",
                        lambda *a, **k: calls.append(1) or real(*a, **k))  # fmt: skip
    assert cli.main(["run", str(path), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    setup = json.loads((tmp_path / "out" / "results.json").read_text())["environment"]["setup_s"]
    assert len(calls) == 1
    assert list(setup) == ["dataset", "graph", "saint_presample_seed0", "warm_up",
                           "kernel_compile"]  # fmt: skip


def test_induced_subgraphs_are_the_same_by_scan_and_by_gather(monkeypatch):
    """The edge-list scan that large batches take gives the gather's edges, bit for bit."""
    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, 300, (2, 4000), generator=gen)
    csr = loader_base.OutCSR(src, dst, 300)
    for size in (1, 30, 150, 300):
        nodes = torch.randperm(300, generator=gen)[:size]
        monkeypatch.setattr(loader_base, "DENSE_SHARE", 0)  # never scan
        gathered = csr.induced(nodes, 0, 0)
        monkeypatch.setattr(loader_base, "DENSE_SHARE", 10**9)  # always scan
        scanned = csr.induced(nodes, 0, 0)
        for key in ("eids", "src", "dst"):
            assert torch.equal(getattr(gathered, key), getattr(scanned, key))
        inside = (torch.isin(src, nodes) & torch.isin(dst, nodes)).nonzero().flatten()
        assert torch.equal(scanned.eids, inside)
    assert not csr._inside.any() and bool((csr._local == -1).all())  # left clean
