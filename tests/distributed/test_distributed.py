"""Distributed full-graph training on torch.distributed (gloo, 2 processes on this machine):
the product across ranks equals the single-process one, training equals single-process
training epoch by epoch, bad settings are refused before training, RSC cuts backward bytes.
Tests marked slow, and tests/distributed/test_distributed_slow.py (4 processes, real graphs, faults,
resume), run with ``make test-dist``."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from dgl_rsc.sparse.csr import CSR

from ..proc import run as run_cmd
from ..workers.halo_problem import halo_problem

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CI": "1"}


def torchrun(nproc: int, *args, timeout=240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", *args]  # fmt: skip
    return run_cmd(cmd, timeout=timeout, env=ENV)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["exact", "full", "sampled"])
def test_halo_product_equals_the_global_product(tmp_path, mode):
    proc = torchrun(2, str(ROOT / "tests" / "workers" / "worker_product.py"), str(tmp_path), mode)
    assert proc.returncode == 0, proc.stderr[-3000:]
    src, dst, n, x, gy, row = halo_problem(5)
    A = CSR.from_coo(dst, src, None, (n, n)).to_dense() * row[:, None]
    y_ref, g_ref = A @ x, A.t() @ gy
    y, grad = torch.zeros(n, 5), torch.zeros(n, 5)
    sent = []
    for r in range(2):
        part = torch.load(tmp_path / f"rank{r}.pt", weights_only=True)
        y[part["owned"]], grad[part["owned"]] = part["y"], part["grad"]
        sent.append(part["backward_sent"])
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)  # the forward is always exact
    if mode in ("exact", "full"):
        torch.testing.assert_close(grad, g_ref, rtol=1e-5, atol=1e-5)
    else:  # a sampled backward: some halo rows carry no gradient and are not sent
        assert not torch.allclose(grad, g_ref, rtol=1e-3, atol=1e-3)
        assert min(sent) >= 0


@pytest.mark.slow
def test_the_distributed_solve_is_the_single_process_solve_shared_by_rank(tmp_path):
    """The ranks gather their rows, solve the same global problem and each keeps its rows'
    share: together exactly what one process holding every row allocates."""
    sys.path.insert(0, str(ROOT / "tests" / "workers"))
    from solve_rows import fill_layers

    from dgl_rsc import RSCController

    proc = torchrun(2, str(ROOT / "tests" / "workers" / "worker_solve.py"), str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = RSCController(budget=0.2, guard=False, min_k=3)
    fill_layers(one, ranks=[0, 1])
    one.solve()
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    for r in ranks:
        assert r["k"] == one.last_allocation.k and r["nnz"] == one.last_allocation.nnz
    for layer in range(2):
        assert sum(r["mine"][layer] for r in ranks) == one.allocation[layer][0]
        assert all(r["mine"][layer] > 0 for r in ranks)


def write_config(tmp_path, **sections):
    cfg = {
        "dataset": {"name": "synthetic", "num_nodes": 500, "avg_degree": 8.0, "num_classes": 4,
                    "feat_dim": 12, "seed": 1},
        "model": {"name": "gcn", "hidden": 16, "layers": 2, "dropout": 0.5},
        # op by op: single-process runs draw dropout as the ranks do (with torch, the whole mask)
        "train": {"epochs": 5, "lr": 0.02, "seeds": [0], "threads": 1, "stock_baseline": False,
                  "fused_epilogue": False},
        # min_width 0: the products here (16 and 4 columns) would stay exact at the default
        "rsc": {"budget": 1.0, "cache_interval": 2, "tune_interval": 2, "warmup_steps": 1,
                "min_width": 0},
        "compare": True,
    }  # fmt: skip
    for key, value in sections.items():
        merge = isinstance(value, dict) and value.get("name") is None  # a new dataset replaces
        cfg[key] = {**cfg.get(key, {}), **value} if merge else value
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def dgl_rsc(*args, timeout=240):
    cmd = [sys.executable, "-m", "dgl_rsc", "run", *args, "--no-progress"]
    return run_cmd(cmd, timeout=timeout, env=ENV)


def losses(out):
    runs = json.loads((out / "results.json").read_text())["runs"]
    return {r["method"]: torch.tensor([h["loss"] for h in r["history"]]) for r in runs}, runs


@pytest.mark.slow
def test_two_process_training_equals_one_process(tmp_path):
    """Exact and RSC at budget 1.0 on 2 partitions: per-epoch losses equal to float32
    rounding to a single process (dropout included: every rank draws the whole graph's mask);
    bytes are counted per rank and message kind."""
    cfg = write_config(tmp_path)
    one, two = tmp_path / "one", tmp_path / "two"
    assert dgl_rsc(cfg, "--out", str(one)).returncode == 0
    proc = dgl_rsc(cfg, "--out", str(two), "--nproc", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, _ = losses(one)
    b, runs = losses(two)
    for method in ("exact", "rsc"):
        torch.testing.assert_close(b[method], a[method], rtol=1e-5, atol=1e-6)
    epoch = runs[0]["history"][-1]["dist"]["bytes"]
    assert len(epoch) == 2  # one record per rank
    for rank in epoch:
        assert rank["forward_halo"]["sent"] > 0 and rank["allreduce"]["sent"] > 0
    assert runs[0]["distributed"]["partition"]["quality"]["parts"] == 2


@pytest.mark.slow
def test_rsc_cuts_the_backward_halo_bytes(tmp_path):
    cfg = write_config(tmp_path, rsc={"budget": 0.1}, train={"epochs": 6})
    out = tmp_path / "out"
    proc = dgl_rsc(cfg, "--out", str(out), "--nproc", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, runs = losses(out)

    def backward_bytes(run):
        hist = [h for h in run["history"] if h["phase"] != "warmup"][1:]
        return sum(r["backward_halo"]["sent"] for h in hist for r in h["dist"]["bytes"])

    exact = next(r for r in runs if r["method"] == "exact")
    rsc = next(r for r in runs if r["method"] == "rsc")
    assert backward_bytes(rsc) < 0.6 * backward_bytes(exact)


def tiny_npz(tmp_path, n, train):
    import numpy as np

    path = tmp_path / f"tiny{n}.npz"
    src = np.arange(n)
    masks = {k: np.zeros(n, bool) for k in ("train_mask", "val_mask", "test_mask")}
    masks["train_mask"][train] = True
    masks["val_mask"][n - 2] = masks["test_mask"][n - 1] = True
    np.savez(path, src=src, dst=(src + 1) % n, feat=np.eye(n, 4, dtype=np.float32),
             label=np.arange(n) % 3, **masks)  # fmt: skip
    return str(path)


def test_more_partitions_than_nodes_is_refused():
    import datetime

    from dgl_rsc.core.config import ConfigError
    from dgl_rsc.data import load_dataset
    from dgl_rsc.distributed.runtime import DistContext
    from dgl_rsc.distributed.setup import rank_data

    data = load_dataset("synthetic", num_nodes=20, avg_degree=3.0, num_classes=2)
    ctx = DistContext(0, 32, torch.device("cpu"), datetime.timedelta(seconds=5))
    with pytest.raises(ConfigError, match="partitions=32 exceeds the graph's 20 nodes"):
        rank_data(data, (data.src, data.dst, 20), ctx, parts=32)
    with pytest.raises(ConfigError, match="partitions=4 but 32 processes run"):
        rank_data(data, (data.src, data.dst, 20), ctx, parts=4)


@pytest.mark.slow
def test_bad_partition_settings_are_refused_before_training(tmp_path):
    lonely = write_config(tmp_path, dataset={"name": "npz", "path": tiny_npz(tmp_path, 12, [0, 1])},
                          distributed={"method": "contiguous"})  # fmt: skip
    proc = dgl_rsc(lonely, "--out", str(tmp_path / "b"), "--nproc", "2")
    # a worker's ConfigError reaches the user once, as one line, exit 2, no traceback
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.count("partition(s) [1] of 2 hold no training node") == 1
    assert "Traceback" not in proc.stderr and "ChildFailedError" not in proc.stderr
    bad = write_config(tmp_path, distributed={"method": "metiss"})
    proc = dgl_rsc(bad, "--out", str(tmp_path / "c"), "--nproc", "2")
    assert proc.returncode == 2 and "Did you mean 'metis'" in proc.stderr
    bn = write_config(tmp_path, model={"batch_norm": True})
    proc = dgl_rsc(bn, "--out", str(tmp_path / "d"), "--nproc", "2")
    assert proc.returncode == 2 and "batch statistics would be per partition" in proc.stderr


def test_halo_bits_settings_are_validated():
    from dgl_rsc.core.config import ConfigError
    from dgl_rsc.launcher.schema import resolve

    def dist(**sec):
        raw = {
            "dataset": {"name": "synthetic"},
            "model": {"name": "gcn"},
            "distributed": {"partitions": 2, **sec},
        }
        return resolve(raw).distributed

    both = dist(halo_bits=8)
    assert (both.forward_bits, both.backward_bits) == (8, 8)
    mixed = dist(halo_bits=4, backward_bits="adaptive")
    assert (mixed.forward_bits, mixed.backward_bits) == (4, "adaptive")
    assert "halo_bits" not in mixed.to_dict()  # the resolved form names each direction
    for key, value in (("halo_bits", 3), ("forward_bits", True), ("backward_bits", "8bit")):
        with pytest.raises(ConfigError, match=f"distributed.{key}=.* is not one of 32, 16"):
            dist(**{key: value})
    with pytest.raises(ConfigError, match="adaptive_bits=.*non-empty list"):
        dist(adaptive_bits=[3])
    with pytest.raises(ConfigError, match="Did you mean 'halo_bits'"):
        dist(halo_bit=8)
