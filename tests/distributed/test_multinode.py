"""Training across machines, simulated on this one: two ``torchrun --nnodes 2`` launches
(node ranks 0 and 1, one rendezvous on 127.0.0.1, one process each) of ``python -m dgl_rsc
run CONFIG``, each with its own output folder and partition cache (as on two hosts without a
shared filesystem). They train together and equal ``--nproc 2`` on one node; a node whose
process dies is named by the other, which stops; nodes started with different configs are
refused. Slow (``make test-dist``): each test starts two launchers."""

import os
import signal
import socket
import sys
import time

import pytest
import torch

from ..conftest import SHARED_DATA
from ..proc import group as proc_group
from .test_distributed import ENV, dgl_rsc, losses, write_config

pytestmark = pytest.mark.slow

CORA = os.path.join(SHARED_DATA, "cora.npz")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_cmd(node: int, port: int, cfg: str, out, *extra) -> list:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank",
            str(node), "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port",
            str(port), "-m", "dgl_rsc", "run", cfg, "--out", str(out), "--no-progress",
            *extra]  # fmt: skip


def _cora_config(tmp_path, **train):
    if not os.path.exists(CORA):
        pytest.skip(f"{CORA} is not here (the shared data folder)")
    dataset = {"name": "npz", "path": CORA, "normalize_features": True}
    return write_config(tmp_path, dataset=dataset, train={"epochs": 4, **train},
                        distributed={"timeout_s": 60})  # fmt: skip


def _two_nodes(tmp_path, cfg, extra1=(), timeout=300) -> list:
    """Start both nodes, wait for both; ``[(returncode, stdout, stderr)]`` by node."""
    port = _free_port()
    outs = []
    with (
        proc_group(_node_cmd(0, port, cfg, tmp_path / "node0"), env=ENV) as a,
        proc_group(_node_cmd(1, port, cfg, tmp_path / "node1", *extra1), env=ENV) as b,
    ):
        for proc in (a, b):
            out, err = proc.communicate(timeout=timeout)
            outs.append((proc.returncode, out, err))
    return outs


def test_two_nodes_train_together_like_two_processes_on_one(tmp_path):
    cfg = _cora_config(tmp_path)
    (rc0, _, err0), (rc1, _, err1) = _two_nodes(tmp_path, cfg)
    assert rc0 == 0 and rc1 == 0, (err0[-2000:], err1[-2000:])
    # node 1 had no access to node 0's folder: it computed its partition, the same one
    assert any(p.suffix == ".npz" for p in (tmp_path / "node1" / "partitions").iterdir())
    assert not (tmp_path / "node1" / "results.json").exists()  # rank 0 writes the report
    one = tmp_path / "one"
    proc = dgl_rsc(cfg, "--out", str(one), "--nproc", "2", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, runs = losses(tmp_path / "node0")
    b, _ = losses(one)
    for method in ("exact", "rsc"):  # global dropout: the same run, epoch by epoch
        torch.testing.assert_close(a[method], b[method], rtol=1e-5, atol=1e-6)
    report = runs[0]["distributed"]["partition"]["report"]
    assert len(report) == 2 and not report[0]["cached"] and not report[1]["cached"]
    assert all(r["partition_s"] >= 0 and r["peak_rss_mb"] > 0 for r in report)


def test_nodes_started_with_different_configs_are_refused(tmp_path):
    cfg = _cora_config(tmp_path)
    outs = _two_nodes(tmp_path, cfg, extra1=("--set", "train.lr=0.05"), timeout=240)
    for rc, _, err in outs:
        assert rc != 0
        assert "rank 1 (node 1, host" in err and "runs another config than rank 0" in err
        assert "train.lr: 0.05 there, 0.02 on rank 0" in err
    assert not (tmp_path / "node0" / "results.json").exists()


def _worker_of(out) -> int:
    """The pid of the dgl_rsc worker writing to ``out`` (not its launcher)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if str(out).encode() in cmd and b"torch.distributed.run" not in cmd and b"-u" in cmd:
            return int(pid)
    return 0


def test_a_lost_node_stops_the_other_which_names_it(tmp_path):
    cfg = _cora_config(tmp_path, epochs=3000, checkpoint_every=1)
    port = _free_port()
    with (
        proc_group(_node_cmd(0, port, cfg, tmp_path / "node0"), env=ENV) as a,
        proc_group(_node_cmd(1, port, cfg, tmp_path / "node1"), env=ENV) as b,
    ):
        deadline = time.monotonic() + 240
        victim = 0
        while time.monotonic() < deadline:  # both nodes up and training
            victim = _worker_of(tmp_path / "node1")
            if victim and (tmp_path / "node0" / "checkpoints").is_dir():
                break
            assert a.poll() is None and b.poll() is None, a.communicate()[1][-3000:]
            time.sleep(0.2)
        assert victim, "node 1's worker never started"
        os.killpg(b.pid, signal.SIGKILL)  # node 1 goes down: its launcher and its worker
        os.kill(victim, signal.SIGKILL)
        start = time.monotonic()
        _, err = a.communicate(timeout=180)
        elapsed = time.monotonic() - start
    assert a.returncode != 0
    assert elapsed < 60  # timeout_s is 60: a dead peer is found at once, plus the probe
    line = next(x for x in err.splitlines() if x.startswith("python -m dgl_rsc run: error:"))
    assert "rank 0 (node 0" in line and "lost rank 1 (node 1, host" in line, line
    assert f"pid {victim})" in line
