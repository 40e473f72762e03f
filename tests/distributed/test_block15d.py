"""CAGNET's 1.5D across 4 processes (gloo; ``make test-dist``): with replication 2, the
product, a GCN step and whole training runs equal the 1D run and a single process (outputs,
losses and gradients, to float rounding); the bytes counted are those of the messages the plans
say travel."""

import json

import pytest
import torch

from dgl_rsc.data import load_dataset
from dgl_rsc.distributed.grid import ProcessGrid
from dgl_rsc.distributed.partition import partition_nodes
from dgl_rsc.distributed.plan15d import block_plans, planned_bytes
from dgl_rsc.sparse.csr import CSR

from .test_distributed import ROOT, dgl_rsc, losses, torchrun, write_config

pytestmark = pytest.mark.slow


def test_product_and_gcn_step_equal_1d_and_one_process(tmp_path):
    proc = torchrun(4, str(ROOT / "tests" / "workers" / "worker_15d.py"), str(tmp_path),
                    timeout=400)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(4)]
    data = load_dataset("synthetic", num_nodes=400, avg_degree=8.0, num_classes=4, feat_dim=12,
                        seed=3)  # fmt: skip
    n = data.num_nodes
    loops = torch.arange(n)
    src, dst = torch.cat([data.src, loops]), torch.cat([data.dst, loops])
    g = torch.Generator().manual_seed(0)
    x, gy = torch.randn(n, 5, generator=g), torch.randn(n, 5, generator=g)
    row, col = torch.rand(n, generator=g) + 0.5, torch.rand(n, generator=g) + 0.5
    A = CSR.from_coo(dst, src, None, (n, n)).to_dense() * row[:, None] * col[None, :]
    grid = ProcessGrid(4, 2)
    plans = block_plans(src, dst, n, partition_nodes(src, dst, n, 2, "metis", 0), grid)
    for r, got in enumerate(ranks):
        own = got["owned15"]
        assert torch.equal(own, plans[r].owned)
        for mode in ("exact", "full"):  # RSC at budget 1.0 is exact
            torch.testing.assert_close(got[mode]["y"], (A @ x)[own], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(got[mode]["grad"], (A.t() @ gy)[own], rtol=1e-5,
                                       atol=1e-5)  # fmt: skip
        counted = got["exact"]["bytes"]
        for kind, (sent, received) in planned_bytes(plans[r], grid, 5).items():
            assert (counted[kind]["sent"], counted[kind]["received"]) == (sent, received), kind
    for kind in ("forward_halo", "backward_halo", "replica_reduce", "replica_grad", "control"):
        assert sum(r["full"]["bytes"][kind]["sent"] for r in ranks) == sum(
            r["full"]["bytes"][kind]["received"] for r in ranks
        )
    one = ranks[0]["single"]
    for key, owned in (("gcn15", "owned15"), ("gcn1", "owned1")):
        for got in ranks:
            torch.testing.assert_close(got[key]["logits"], one["logits"][got[owned]], rtol=1e-5,
                                       atol=1e-6)  # fmt: skip
            assert got[key]["loss"] == pytest.approx(one["loss"], rel=1e-6)
            for name, grad in one["grads"].items():
                torch.testing.assert_close(got[key]["grads"][name], grad, rtol=1e-5, atol=1e-7)
    for r in (1, 3):  # a block's replicas hold the same bits
        for name, grad in ranks[r]["gcn15"]["grads"].items():
            assert torch.equal(grad, ranks[r - 1]["gcn15"]["grads"][name])
    q = [got["q8"] for got in ranks]
    for a, b in ((0, 1), (2, 3)):  # 8-bit replica sums: unbiased codes, the same on both
        assert torch.equal(q[a]["sum"], q[b]["sum"])
        exact = q[a]["part"] + q[b]["part"]
        assert float((q[a]["sum"] - exact).norm() / exact.norm()) < 0.03
        assert q[a]["sent"] < 0.35 * 4 * exact.numel()  # fp32: one tensor's bytes each way


def test_training_equals_1d_and_one_process_and_reports_bytes_by_algorithm(tmp_path):
    cfg = write_config(tmp_path, train={"epochs": 4})
    runs = {}
    for name, extra in (("one", ()), ("1d", ("--nproc", "4")),
                        ("15d", ("--nproc", "4", "--set", "distributed.algorithm=1.5d",
                                 "--set", "distributed.replication=2"))):  # fmt: skip
        proc = dgl_rsc(cfg, "--out", str(tmp_path / name), *extra, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = losses(tmp_path / name)
    for method in ("exact", "rsc"):  # RSC at budget 1.0 is exact
        for name in ("1d", "15d"):
            torch.testing.assert_close(runs[name][0][method], runs["one"][0][method], rtol=1e-5,
                                       atol=1e-6)  # fmt: skip
    for name, algorithm in (("1d", "1d"), ("15d", "1.5d")):
        record = runs[name][1][0]["distributed"]
        assert record["algorithm"] == algorithm
        assert record["replication"] == (2 if algorithm == "1.5d" else 1)
        total = record["bytes"]["total"]
        replicas = total["replica_reduce"] + total["replica_grad"] + total["eval_replica"]
        assert (replicas > 0) == (algorithm == "1.5d") and total["forward_halo"] > 0
        for epoch in runs[name][1][0]["history"]:
            per_rank = epoch["dist"]["bytes"]
            for kind in per_rank[0]:  # what one rank sends, another receives
                assert sum(r[kind]["sent"] for r in per_rank) == sum(
                    r[kind]["received"] for r in per_rank
                ), kind
    summary = json.loads((tmp_path / "15d" / "results.json").read_text())["runs"][0]
    assert summary["distributed"]["blocks"] == 2


def test_the_byte_budget_caps_each_replicas_halo_under_15d(tmp_path):
    cfg = write_config(tmp_path, distributed={"comm_budget": 0.3}, rsc={"budget": 0.3},
                       train={"epochs": 5})  # fmt: skip
    out = tmp_path / "out"
    proc = dgl_rsc(cfg, "--out", str(out), "--nproc", "4", "--set",
                   "distributed.algorithm=1.5d", "--set", "distributed.replication=2",
                   timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    for run in json.loads((out / "results.json").read_text())["runs"]:
        record = run["distributed"]
        assert record["algorithm"] == "1.5d" and record["replication"] == 2
        cb = record["comm_budget"]
        assert cb["steps"] == 5 and cb["sent_fraction_max"] <= 0.3 and not cb["over_budget"]
        sent = [sum(rk["forward_halo"]["sent"] + rk["backward_halo"]["sent"]
                    for rk in h["dist"]["bytes"]) for h in run["history"]]  # fmt: skip
        assert sum(sent) / 5 == pytest.approx(cb["sent_per_step"])
        assert record["bytes"]["total"]["replica_reduce"] > 0  # the replica sums still travel
        assert all(torch.isfinite(torch.tensor(h["loss"])) for h in run["history"])
