"""dgl_rsc.distributed.partition: methods, determinism, errors, quality numbers, disk cache."""

from __future__ import annotations

import doctest
import json
import logging
import os

import numpy as np
import pytest
import torch

from dgl_rsc.distributed import partition as pt
from dgl_rsc.distributed.partition import (
    PARTITIONERS,
    load_or_partition,
    partition_nodes,
    partition_quality,
)

from ..conftest import labelled_graph

METHODS = ["metis", "random", "contiguous"]


@pytest.fixture(scope="module")
def graph():
    src, dst, *_ = labelled_graph(n=600, classes=4, avg_degree=10.0, homophily=0.9, seed=3)
    return src, dst, 600


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("parts", [1, 3, 4])
def test_every_node_gets_a_part_and_no_part_is_empty(graph, method, parts):
    src, dst, n = graph
    part = partition_nodes(src, dst, n, parts, method, seed=0)
    assert part.dtype == torch.int64 and part.shape == (n,)
    sizes = torch.bincount(part, minlength=parts)
    assert sizes.numel() == parts and int(sizes.min()) > 0
    if method == "metis":
        assert int(sizes.max()) <= 1.1 * n / parts  # METIS' default imbalance is 3 %
    else:
        assert int(sizes.max() - sizes.min()) <= 1


@pytest.mark.parametrize("method", ["metis", "random"])
def test_same_seed_same_partition(graph, method):
    src, dst, n = graph
    a = partition_nodes(src, dst, n, 4, method, seed=7)
    assert torch.equal(a, partition_nodes(src, dst, n, 4, method, seed=7))
    if method == "random":
        assert not torch.equal(a, partition_nodes(src, dst, n, 4, method, seed=8))


def test_metis_cuts_far_fewer_edges_than_random(graph):
    src, dst, n = graph
    cut = {
        m: partition_quality(src, dst, n, partition_nodes(src, dst, n, 4, m))["edge_cut_fraction"]
        for m in ("metis", "random")
    }
    assert cut["random"] > 0.6 and cut["metis"] < 0.5 * cut["random"]


def test_metis_sees_the_symmetrized_simple_graph(graph):
    src, dst, n = graph
    one_way = src < dst  # each undirected edge once
    s, d = src[one_way], dst[one_way]
    messy_s = torch.cat([d, s, s[:50], torch.arange(20)])  # reversed, repeats, self-loops
    messy_d = torch.cat([s, d, d[:50], torch.arange(20)])
    a = partition_nodes(s, d, n, 3, "metis", seed=1)
    assert torch.equal(a, partition_nodes(messy_s, messy_d, n, 3, "metis", seed=1))


def test_contiguous_is_id_ranges():
    part = partition_nodes(torch.tensor([0]), torch.tensor([1]), 7, 3, "contiguous")
    assert part.tolist() == [0, 0, 0, 1, 1, 2, 2]


def test_errors_name_the_fix(graph, monkeypatch):
    src, dst, n = graph
    with pytest.raises(ValueError, match=r"parts=0 must be an integer in \[1, num_nodes=600\]"):
        partition_nodes(src, dst, n, 0)
    with pytest.raises(ValueError, match="parts=601"):
        partition_nodes(src, dst, n, 601)
    with pytest.raises(ValueError, match="Did you mean 'metis'"):
        partition_nodes(src, dst, n, 2, method="metsi")
    with pytest.raises(ValueError, match="seed=-1"):
        partition_nodes(src, dst, n, 2, seed=-1)
    with pytest.raises(ValueError, match=r"node ids must lie in \[0, num_nodes=10\)"):
        partition_nodes(src, dst, 10, 2)
    with pytest.raises(ValueError, match="src has 3 edges but dst has 2"):
        partition_nodes(torch.tensor([0, 1, 2]), torch.tensor([1, 2]), 3, 2)
    with pytest.raises(ValueError, match="src must be a 1-D integer tensor"):
        partition_nodes(torch.tensor([0.0]), torch.tensor([1]), 3, 2)
    # a real METIS run that leaves a part empty: 9 nodes, one edge, 9 parts
    with pytest.raises(ValueError, match=r"left part\(s\) \[.*\] of 9 empty.*fewer parts"):
        partition_nodes(torch.tensor([0]), torch.tensor([1]), 9, 9, "metis")
    monkeypatch.setattr(pt._deps, "_probe", lambda name: (None, "ModuleNotFoundError: no"))
    with pytest.raises(ImportError, match="`pip install pymetis`"):
        partition_nodes(src, dst, n, 2, "metis")


def test_quality_on_a_hand_checked_graph():
    # parts: {0, 1, 2} -> 0, {3, 4} -> 1, {5} -> 2; cut edges: 3->2, 4->2, 3->1, 5->3, 0->5
    src = torch.tensor([0, 1, 1, 3, 4, 3, 4, 5, 0, 2, 3])
    dst = torch.tensor([1, 0, 2, 2, 2, 4, 3, 3, 5, 2, 1])
    q = partition_quality(src, dst, 6, torch.tensor([0, 0, 0, 1, 1, 2]))
    assert q["parts"] == 3 and q["num_nodes"] == 6 and q["num_edges"] == 11
    assert q["nodes"] == [3, 2, 1]
    assert q["edges"] == [7, 3, 1]
    assert q["edge_cut"] == 5 and q["edge_cut_fraction"] == pytest.approx(5 / 11)
    assert q["halo_nodes"] == [2, 1, 1]  # {3, 4}, {5}, {0}
    assert q["marginal"] == [2, 1, 1]  # {1, 2}, {3}, {5}
    assert q["central"] == [1, 1, 0]
    assert q["node_balance"] == pytest.approx(1.5)
    assert q["edge_balance"] == pytest.approx(7 / (11 / 3))
    json.dumps(q)  # plain numbers only
    empty = partition_quality(
        torch.tensor([0]), torch.tensor([1]), 4, torch.tensor([0, 0, 1, 2]), parts=4
    )
    assert empty["nodes"] == [2, 1, 1, 0] and empty["edge_cut"] == 0


def _counting(monkeypatch, method="random"):
    calls = []
    inner = PARTITIONERS[method]

    def wrapped(*args):
        calls.append(args[3])
        return inner(*args)

    monkeypatch.setitem(PARTITIONERS, method, wrapped)
    return calls


def test_cache_hit_skips_the_partitioner(graph, tmp_path, monkeypatch):
    src, dst, n = graph
    calls = _counting(monkeypatch)
    part, quality, path = load_or_partition(src, dst, n, 3, "random", 5, tmp_path)
    assert calls == [3] and os.path.basename(path).startswith("part-random-p3-s5-")
    again, quality2, path2 = load_or_partition(src, dst, n, 3, "random", 5, tmp_path)
    assert calls == [3] and path2 == path  # served from disk
    assert torch.equal(part, again) and quality2 == quality
    assert quality == partition_quality(src, dst, n, part)
    with np.load(path, allow_pickle=False) as z:  # no pickled objects inside
        assert z["part"].tolist() == part.tolist() and int(z["num_nodes"]) == n
    # another edge list, seed or method is another file
    _, _, other = load_or_partition(src[1:], dst[1:], n, 3, "random", 5, tmp_path)
    _, _, seeded = load_or_partition(src, dst, n, 3, "random", 6, tmp_path)
    assert len({path, other, seeded}) == 3 and calls == [3, 3, 3]


def test_corrupt_or_stale_cache_is_recomputed_with_a_warning(graph, tmp_path, caplog):
    src, dst, n = graph
    part, _, path = load_or_partition(src, dst, n, 2, "random", 0, tmp_path)
    with open(path, "wb") as f:
        f.write(b"not a zip file")
    with caplog.at_level(logging.WARNING, logger=pt.__name__):
        again, _, path2 = load_or_partition(src, dst, n, 2, "random", 0, tmp_path)
    assert "corrupt" in caplog.text and path2 == path and torch.equal(part, again)
    with np.load(path, allow_pickle=False) as z:  # rewritten in our format
        assert z["part"].tolist() == part.tolist()
    # ours, but for another graph (a key that does not match)
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    np.savez(path, **dict(arrays, key=np.array("0" * 64), part=np.zeros(n, dtype=np.int64)))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=pt.__name__):
        again, _, _ = load_or_partition(src, dst, n, 2, "random", 0, tmp_path)
    assert "stale" in caplog.text and torch.equal(part, again)
    # a quality file that does not parse is rewritten
    qpath = path[: -len(".npz")] + ".json"
    with open(qpath, "w") as f:
        f.write("{")
    _, quality, _ = load_or_partition(src, dst, n, 2, "random", 0, tmp_path)
    with open(qpath) as f:
        assert json.load(f)["quality"] == quality


def test_foreign_files_are_never_overwritten(graph, tmp_path, caplog):
    src, dst, n = graph
    _, _, path = load_or_partition(src, dst, n, 2, "random", 0, tmp_path)
    os.remove(path)
    np.savez(path, part=np.ones(n, dtype=np.int64))  # someone else's file at our name
    before = open(path, "rb").read()
    neighbour = tmp_path / "notes.txt"
    neighbour.write_text("keep me")
    with caplog.at_level(logging.WARNING, logger=pt.__name__):
        part, quality, where = load_or_partition(src, dst, n, 2, "random", 0, tmp_path)
    assert where is None and "not a dgl_rsc partition file" in caplog.text
    assert open(path, "rb").read() == before and neighbour.read_text() == "keep me"
    assert torch.equal(part, partition_nodes(src, dst, n, 2, "random", 0))  # still right


def test_cache_rejects_bad_arguments_before_touching_disk(graph, tmp_path):
    src, dst, n = graph
    with pytest.raises(ValueError, match="Did you mean 'random'"):
        load_or_partition(src, dst, n, 2, "randon", 0, tmp_path)
    assert list(tmp_path.iterdir()) == []
    part, quality, path = load_or_partition(src, dst, n, 2, "contiguous", 0, None)
    assert path is None and quality["nodes"] == [300, 300]


def test_docstring_examples_run():
    assert doctest.testmod(pt).failed == 0
