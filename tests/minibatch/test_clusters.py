"""Caches never execute what they read (issue 23, item 6): the Cluster-GCN cluster cache and
the distributed partition cache hold npz/JSON read without pickle, and an entry that passes
the key check but is tampered with (ids out of range, an empty part, a repeated node, a
quality that does not fit) is recomputed, never used."""

from __future__ import annotations

import json
import logging
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from dgl_rsc.distributed import partition as pt
from dgl_rsc.distributed.partition import load_or_partition
from dgl_rsc.minibatch import clusters
from dgl_rsc.minibatch.samplers import ClusterLoader

from ..conftest import labelled_graph, requires_dgl

N = 300


class Payload:
    """Unpickling this calls ``open(marker, "w")``: the marker file appears."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def graph():
    src, dst, *_ = labelled_graph(n=N, avg_degree=6.0, seed=4)
    return src, dst


def _fresh(graph, tmp_path, **kw):
    return ClusterLoader(*graph, N, 6, 2, seed=1, cache_dir=tmp_path, **kw)


def _rewrite(path, **changes):
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    np.savez(path, **{**arrays, **changes})


def test_payload_is_live(tmp_path):
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(Payload(probe)))
    assert probe.exists()  # so the marker's absence below means the payload never ran


@pytest.mark.parametrize("engine", ["native", pytest.param("dgl", marks=requires_dgl)])
def test_a_pickle_at_the_cache_name_is_never_unpickled(graph, tmp_path, engine, caplog):
    good = _fresh(graph, tmp_path)
    path = Path(good.layout_file)
    marker = tmp_path / "ran"
    path.write_bytes(pickle.dumps(Payload(marker)))
    with caplog.at_level(logging.WARNING):
        again = _fresh(graph, tmp_path, engine=engine)
    assert not marker.exists()
    assert "corrupt" in caplog.text
    assert torch.equal(again.layout.node_ids, good.layout.node_ids)
    assert [b.nodes.tolist() for b in again.epoch(0)] == [b.nodes.tolist() for b in good.epoch(0)]
    with np.load(path, allow_pickle=False) as z:  # replaced by a valid entry of ours
        assert z["node_ids"].tolist() == good.layout.node_ids.tolist()


@requires_dgl
def test_the_dgl_engine_reads_no_file(graph, tmp_path):
    """DGL's ClusterGCNSampler unpickles its cache_path: the DGL engine never gives it one,
    so a pickle at DGL's default name in the working folder is never read either."""
    import os

    marker = tmp_path / "ran"
    (tmp_path / "cluster_gcn.pkl").write_bytes(pickle.dumps(Payload(marker)))
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        dgl_loader = ClusterLoader(*graph, N, 6, 2, seed=1, engine="dgl")
        batches = list(dgl_loader.epoch(0))
    finally:
        os.chdir(cwd)
    native = ClusterLoader(*graph, N, 6, 2, seed=1)
    assert not marker.exists()
    assert [b.nodes.tolist() for b in batches] == [b.nodes.tolist() for b in native.epoch(0)]


def _tampered(n):
    ids = np.arange(n, dtype=np.int64)
    return {
        "wrong key": {"key": np.array("0" * 64)},
        "id out of range": {"node_ids": np.where(ids == 0, n + 5, ids)},
        "repeated node": {"node_ids": np.where(ids == 1, 0, ids)},
        "offsets past N": {"offsets": np.array([0, 50, 100, 150, 200, 250, n + 1])},
        "falling offsets": {"offsets": np.array([0, 60, 40, 150, 200, 250, n])},
        "wrong part count": {"offsets": np.array([0, 100, 200, n])},
        "float ids": {"node_ids": ids.astype(np.float64)},
    }


@pytest.mark.parametrize("case", list(_tampered(N)))
def test_a_tampered_entry_that_passes_the_name_is_recomputed(graph, tmp_path, case, caplog):
    good = _fresh(graph, tmp_path)
    _rewrite(good.layout_file, **_tampered(N)[case])
    with caplog.at_level(logging.WARNING):
        again = _fresh(graph, tmp_path)
    assert "recomputing" in caplog.text
    assert torch.equal(again.layout.offsets, good.layout.offsets)
    assert torch.equal(again.layout.node_ids, good.layout.node_ids)
    status, layout = clusters.ClusterLayout.read(again.layout_file, _key(again), 6, N)
    assert status == "hit" and torch.equal(layout.node_ids, good.layout.node_ids)


def _key(loader) -> str:
    with np.load(loader.layout_file, allow_pickle=False) as z:
        return str(z["key"])


def test_an_archive_that_is_not_ours_is_left_untouched(graph, tmp_path, caplog):
    good = _fresh(graph, tmp_path)
    np.savez(good.layout_file, something=np.arange(3))
    before = Path(good.layout_file).read_bytes()
    with caplog.at_level(logging.WARNING):
        again = _fresh(graph, tmp_path)
    assert "not a dgl_rsc cluster file" in caplog.text and again.layout_file is None
    assert Path(good.layout_file).read_bytes() == before
    assert torch.equal(again.layout.node_ids, good.layout.node_ids)


def test_a_given_partition_is_keyed_apart_from_metis(graph, tmp_path):
    metis = _fresh(graph, tmp_path)
    given = _fresh(graph, tmp_path, partition=torch.arange(N) % 6)
    assert given.layout_file != metis.layout_file
    assert torch.equal(given.layout.offsets, torch.arange(0, N + 1, N // 6))


# ---- the distributed partition cache ----------------------------------------------------


@pytest.mark.parametrize("case", ["empty part", "id out of range", "pickle payload"])
def test_a_tampered_partition_entry_is_recomputed(graph, tmp_path, case, caplog):
    src, dst = graph
    part, quality, path = load_or_partition(src, dst, N, 3, "random", 0, tmp_path)
    marker = tmp_path / "ran"
    if case == "empty part":
        _rewrite(path, part=np.where(part.numpy() == 2, 1, part.numpy()))
    elif case == "id out of range":
        _rewrite(path, part=np.where(np.arange(N) == 0, 7, part.numpy()))
    else:
        Path(path).write_bytes(pickle.dumps(Payload(marker)))
    with caplog.at_level(logging.WARNING, logger=pt.__name__):
        again, quality2, _ = load_or_partition(src, dst, N, 3, "random", 0, tmp_path)
    assert not marker.exists() and "corrupt" in caplog.text
    assert torch.equal(again, part) and quality2 == quality
    assert torch.bincount(again, minlength=3).min() > 0


@pytest.mark.parametrize("change", ["nodes", "keys", "type"])
def test_a_quality_record_that_does_not_fit_the_parts_is_rewritten(graph, tmp_path, change,
                                                                    caplog):  # fmt: skip
    src, dst = graph
    part, quality, path = load_or_partition(src, dst, N, 3, "random", 0, tmp_path)
    qpath = Path(path[: -len(".npz")] + ".json")
    record = json.loads(qpath.read_text())
    if change == "nodes":
        record["quality"]["nodes"] = [N, 0, 0]
    elif change == "keys":
        record["quality"] = {"parts": 3}
    else:
        record["quality"] = "no dict"
    qpath.write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING, logger=pt.__name__):
        _, quality2, _ = load_or_partition(src, dst, N, 3, "random", 0, tmp_path)
    assert "corrupt" in caplog.text and quality2 == quality
    assert json.loads(qpath.read_text())["quality"] == quality
