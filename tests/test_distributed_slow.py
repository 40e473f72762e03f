"""Slow distributed tests (``make test-dist``): 4 processes, real graphs, GCN and SAGE, faults
and resume. Each compares against a single process or checks a bounded failure."""

import json
import os
import time

import pytest
import torch

from .conftest import SHARED_DATA
from .test_distributed import ROOT, dgl_rsc, losses, torchrun, write_config

pytestmark = pytest.mark.slow

CORA = os.path.join(SHARED_DATA, "cora.npz")


def graphs():
    out = [pytest.param({"name": "synthetic", "num_nodes": 800, "avg_degree": 10.0,
                         "num_classes": 4, "feat_dim": 16, "seed": 2}, id="synthetic")]  # fmt: skip
    if os.path.exists(CORA):
        out.append(pytest.param({"name": "npz", "path": CORA, "normalize_features": True},
                                id="cora"))  # fmt: skip
    return out


@pytest.mark.parametrize("nproc", [2, 4])
@pytest.mark.parametrize("model", ["gcn", "sage"])
@pytest.mark.parametrize("dataset", graphs())
def test_distributed_equals_single_process(tmp_path, dataset, model, nproc):
    if dataset["name"] == "npz" and not os.path.exists(dataset["path"]):
        pytest.skip(f"{dataset['path']} is not here (the shared data folder)")
    cfg = write_config(tmp_path, dataset=dataset, model={"name": model},
                       train={"epochs": 5})  # fmt: skip
    one, many = tmp_path / "one", tmp_path / "many"
    assert dgl_rsc(cfg, "--out", str(one)).returncode == 0
    proc = dgl_rsc(cfg, "--out", str(many), "--nproc", str(nproc), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, _ = losses(one)
    b, _ = losses(many)
    for method in ("exact", "rsc"):  # RSC at budget 1.0 is exact
        torch.testing.assert_close(b[method], a[method], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("how", ["raise", "die"])
def test_a_failing_worker_stops_the_others_in_bounded_time(how):
    start = time.monotonic()
    proc = torchrun(2, str(ROOT / "tests" / "workers" / "worker_fault.py"), how, timeout=180)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0 and elapsed < 120
    text = proc.stdout + proc.stderr
    assert "rank: 1" in text or "local_rank: 1" in text  # the launcher names the rank
    if how == "raise":
        assert "rank 1 fails on purpose" in text


def test_resumed_distributed_run_equals_an_uninterrupted_one(tmp_path):
    cfg = write_config(tmp_path, rsc={"budget": 0.3}, train={"epochs": 8, "checkpoint_every": 2})
    crashed, clean = tmp_path / "crashed", tmp_path / "clean"
    script = str(ROOT / "tests" / "workers" / "worker_interrupt.py")
    args = ["run", cfg, "--out", str(crashed), "--no-progress", "--set",
            "distributed.partitions=2"]  # fmt: skip
    proc = torchrun(2, script, "rsc-seed0", "5", "--", *args, timeout=600)
    assert proc.returncode != 0  # interrupted
    assert (crashed / "checkpoints" / "rsc-seed0.rank0.pt").exists()
    assert (crashed / "checkpoints" / "rsc-seed0.rank1.pt").exists()
    assert not (crashed / "results.json").exists()
    proc = dgl_rsc(cfg, "--resume", str(crashed), "--nproc", "2", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = dgl_rsc(cfg, "--out", str(clean), "--nproc", "2", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a = json.loads((crashed / "results.json").read_text())["runs"]
    b = json.loads((clean / "results.json").read_text())["runs"]
    for ra, rb in zip(a, b):
        la = torch.tensor([h["loss"] for h in ra["history"]])
        lb = torch.tensor([h["loss"] for h in rb["history"]])
        torch.testing.assert_close(la, lb, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bits", [8, 4, 2, "adaptive"])
def test_quantized_halo_messages_train_and_send_fewer_bytes(tmp_path, bits):
    cfg = write_config(tmp_path, rsc={"budget": 0.3}, train={"epochs": 6})
    base, quant = tmp_path / "fp32", tmp_path / f"q{bits}"
    assert dgl_rsc(cfg, "--out", str(base), "--nproc", "2").returncode == 0
    proc = dgl_rsc(cfg, "--out", str(quant), "--nproc", "2", "--set",
                   f"distributed.forward_bits={bits}", "--set",
                   f"distributed.backward_bits={bits}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, a = losses(base)
    b_losses, b = losses(quant)
    assert all(bool(torch.isfinite(v).all()) for v in b_losses.values())

    def fwd(runs):
        return sum(r["forward_halo"]["sent"] for run in runs for h in run["history"]
                   for r in h["dist"]["bytes"])  # fmt: skip

    assert fwd(b) < 0.6 * fwd(a)
    report = b[0]["distributed"]["forward_bits"]
    assert report["histogram"] and report["error"] is not None and report["error"] < 1.0


def test_the_api_example_trains(tmp_path):
    """tools/dist_example.py (the README's distributed API walk-through) runs on 2 ranks:
    the approximate phase, then the switch to exact, and the loss goes down."""
    proc = torchrun(2, str(ROOT / "tools" / "dist_example.py"), "--epochs", "10",
                    "--nodes", "1200", "--partitions", str(tmp_path / "parts"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [x.split() for x in proc.stdout.splitlines() if x.startswith("epoch")]
    assert len(lines) == 10  # rank 0 alone prints
    loss = [float(x[3]) for x in lines]
    phases = [x[5] for x in lines]
    assert "approx" in phases and phases[-1] == "exact" and loss[-1] < loss[0]
    assert any(name.endswith(".npz") for name in os.listdir(tmp_path / "parts"))  # cached
