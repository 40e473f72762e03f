"""What a rank says when a peer goes away (the heartbeat names the lost rank and its node),
the start-up checks that every rank runs the same config, data and partition, and the
partition's report (seconds, cache, METIS in a child process with its peak memory)."""

import datetime

import numpy as np
import pytest
import torch
import torch.distributed as dist

from dgl_rsc.core.config import ConfigError
from dgl_rsc.distributed.liveness import Heartbeat
from dgl_rsc.distributed.runtime import DistContext, DistributedError


def _ctx(rank=0, world=2, **kw):
    peers = [{"node": r, "host": f"h{r}", "pid": 100 + r} for r in range(world)]
    return DistContext(rank, world, torch.device("cpu"), datetime.timedelta(seconds=5),
                       peers=peers, **kw)  # fmt: skip


class _Broken:
    def add(self, key, value):
        raise RuntimeError("connection refused")


def test_a_rank_whose_heartbeat_stops_is_lost():
    store = dist.HashStore()
    # a window of 2.5 intervals: wide enough that a live thread beats in it on a loaded machine
    beats = [Heartbeat(store, r, 3, interval=0.2).start() for r in range(3)]
    beats[2].stop()
    try:
        assert beats[0].lost() == [2]
        assert beats[1].lost() == [2]
    finally:
        for b in beats:
            b.stop()
    assert Heartbeat(_Broken(), 0, 2, interval=0.01).lost() is None


def test_a_failed_exchange_names_the_lost_rank_its_node_and_host():
    class Lost:
        def __init__(self, answer):
            self.answer = answer

        def lost(self):
            return self.answer

    err = _ctx(heartbeat=Lost([1])).failure("the forward halo exchange", RuntimeError("reset"))
    assert isinstance(err, DistributedError)
    text = str(err)
    assert text.startswith("rank 0 (node 0, host h0, pid 100): the forward halo exchange")
    assert "lost rank 1 (node 1, host h1, pid 101): its heartbeat stopped" in text
    gone = str(_ctx(rank=1, heartbeat=Lost(None)).failure("an all-reduce", RuntimeError("x")))
    assert "node 0 (which hosts it, rank 0 (node 0, host h0, pid 100)) is gone" in gone
    assert "lost" not in str(_ctx(heartbeat=Lost([])).failure("a barrier", RuntimeError("t")))
    assert _ctx(world=4).nodes == 4 and DistContext(0, 2, None, None).nodes == 1


def _gather(monkeypatch, values):
    def fake(out, mine):
        out[:] = values

    monkeypatch.setattr(dist, "all_gather_object", fake)


def test_nodes_with_another_config_are_refused_naming_the_keys(monkeypatch):
    from dgl_rsc.launcher.dist_run import check_same_config, config_digest

    base = {"train": {"lr": 0.01, "threads": 2}, "dataset": {"path": "/a/cora.npz"}}
    other = {"train": {"lr": 0.05, "threads": 8}, "dataset": {"path": "/b/cora.npz"}}
    local = {"train": {"lr": 0.01, "threads": 8}, "dataset": {"path": "/b/cora.npz"}}

    def run(theirs):
        _gather(monkeypatch, [config_digest(base), config_digest(theirs)])
        check_same_config(base, _ctx())

    run(local)  # paths and threads may differ between machines
    with pytest.raises(ConfigError, match=r"rank 1 \(node 1, host h1, pid 101\) runs another "
                       r"config than rank 0 \(train.lr: 0.05 there, 0.01 on rank 0\)"):  # fmt: skip
        run(other)


def test_ranks_with_other_data_or_another_partition_are_refused(monkeypatch):
    from dgl_rsc.distributed.setup import check_same

    part = torch.tensor([0, 1, 1])
    _gather(monkeypatch, [("d0", "p0", {"a": 1}), ("d0", "p0", {"a": 2})])
    assert check_same(_ctx(), "d0", part, {"a": 1}) == [{"a": 1}, {"a": 2}]
    _gather(monkeypatch, [("d0", "p0", {}), ("d1", "p0", {})])
    with pytest.raises(ConfigError, match=r"rank 1 \(node 1.*loaded other data than rank 0"):
        check_same(_ctx(), "d0", part, {})
    _gather(monkeypatch, [("d0", "p0", {}), ("d0", "p1", {})])
    with pytest.raises(ConfigError, match="partitioned the graph differently.*partition_cache"):
        check_same(_ctx(), "d0", part, {})


def test_metis_in_a_child_process_computes_the_in_process_partition(monkeypatch, tmp_path):
    pytest.importorskip("pymetis")
    from dgl_rsc.data import load_dataset
    from dgl_rsc.distributed import metis_child
    from dgl_rsc.distributed.partition import load_or_partition

    data = load_dataset("synthetic", num_nodes=400, avg_degree=6.0, num_classes=3)
    e = (data.src, data.dst, 400)
    plain, _, _ = load_or_partition(*e, 4, "metis", 3)
    monkeypatch.setattr(metis_child, "CHILD_EDGES", 0)  # every graph goes to a child
    calls, report = [], {}
    part, quality, path = load_or_partition(*e, 4, "metis", 3, tmp_path, progress=lambda d, t:
                                            calls.append((d, t)), report=report)  # fmt: skip
    assert torch.equal(part, plain)
    assert calls[0] == (1, 3) and calls[-1] == (2, 3)
    assert report["cached"] is False and report["metis_peak_bytes"] > 1e6
    assert report["partition_s"] >= report["metis_s"] > 0 and report["quality_s"] >= 0
    again = {}
    load_or_partition(*e, 4, "metis", 3, tmp_path, report=again)
    assert again["cached"] is True and "metis_s" not in again


def test_a_failing_metis_child_raises_with_its_message(monkeypatch):
    pytest.importorskip("pymetis")
    from dgl_rsc.distributed import metis_child

    monkeypatch.setattr(metis_child, "_CHILD", "raise SystemExit('no METIS here')")
    with pytest.raises(RuntimeError, match="METIS in its child process failed.*no METIS here"):
        metis_child.metis_in_child(np.array([0, 1, 2]), np.array([1, 0]), 2, 0)
