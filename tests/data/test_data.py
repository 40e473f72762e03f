"""Tests of dgl_rsc.data: GraphData, the synthetic generator, the npz/OGB/DGL loaders (each
on a tiny dataset written in the library's real on-disk layout), the registry and metrics."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dgl_rsc.base import _deps
from dgl_rsc.data import (
    DATASETS,
    GraphData,
    clean_edges,
    evaluate,
    load_dataset,
    load_npz,
    synthetic_graph,
)
from dgl_rsc.data.dgl_datasets import dgl_files
from dgl_rsc.data.metrics import binary_rocauc, f1_micro, rocauc
from dgl_rsc.data.ogb import ogb_files

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


def edge_set(src, dst) -> set:
    return set(zip(src.tolist(), dst.tolist()))


def check_clean(d: GraphData) -> None:
    """Symmetric, no self-loops, no duplicates, ids in range, int64."""
    assert d.src.dtype == d.dst.dtype == torch.int64
    assert bool((d.src != d.dst).all())
    assert int(d.src.min()) >= 0 and int(d.dst.max()) < d.num_nodes
    edges = edge_set(d.src, d.dst)
    assert len(edges) == d.num_edges
    assert edges == {(v, u) for u, v in edges}


def toy(n=4, **kw) -> GraphData:
    args = dict(
        src=torch.tensor([0, 1, 1, 2]),
        dst=torch.tensor([1, 0, 2, 1]),
        num_nodes=n,
        feat=torch.randn(n, 3),
        label=torch.tensor([0, 1, 2, 1])[:n],
        train_mask=torch.tensor([True, True, False, False]),
        val_mask=torch.tensor([False, False, True, False]),
        test_mask=torch.tensor([False, False, False, True]),
        task="multiclass",
        metric="accuracy",
        num_classes=3,
        name="toy",
    )
    args.update(kw)
    return GraphData(**args)


# ---------------------------------------------------------------------------- GraphData


def test_clean_edges_by_hand():
    src, dst = clean_edges(torch.tensor([0, 0, 1, 2, 3]), torch.tensor([1, 1, 1, 0, 3]), 4)
    assert list(zip(src.tolist(), dst.tolist())) == [(1, 0), (2, 0), (0, 1), (0, 2)]
    src, dst = clean_edges(torch.tensor([0, 0, 2]), torch.tensor([1, 1, 0]), 3, symmetrize=False)
    assert list(zip(src.tolist(), dst.tolist())) == [(2, 0), (0, 1)]


def test_clean_edges_random_is_sorted_by_destination():
    g = torch.Generator().manual_seed(0)
    s, d = torch.randint(0, 50, (400,), generator=g), torch.randint(0, 50, (400,), generator=g)
    src, dst = clean_edges(s, d, 50)
    expected = {(u, v) for u, v in zip(s.tolist(), d.tolist()) if u != v}
    expected |= {(v, u) for u, v in expected}
    assert edge_set(src, dst) == expected and len(expected) == src.numel()
    key = dst * 50 + src
    assert bool((key[1:] > key[:-1]).all())


def test_graphdata_methods():
    d = toy()
    assert d.num_edges == 4 and d.num_features == 3
    assert d.in_degrees().tolist() == [1, 2, 1, 0]
    s = d.summary()
    assert (s["num_train"], s["num_val"], s["num_test"], s["num_nodes"]) == (2, 1, 1, 4)
    assert d.to("cpu") is d
    assert "toy" in repr(d) and "num_edges=4" in repr(d)


@pytest.mark.parametrize(
    "change, words",
    [
        pytest.param(dict(task="regression"), "task", id="task"),
        pytest.param(dict(metric="mse"), "metric", id="metric"),
        pytest.param(dict(label=torch.tensor([0.0, 1, 2, 1])), "label", id="label-dtype"),
        pytest.param(dict(feat=torch.randn(3, 3)), "feat", id="feat-rows"),
        pytest.param(dict(train_mask=torch.ones(4)), "train_mask", id="mask-dtype"),
        pytest.param(dict(src=torch.tensor([0, 1], dtype=torch.int32)), "src", id="src-dtype"),
        pytest.param(dict(task="multilabel"), "label", id="multilabel-needs-2d"),
    ],
)
def test_graphdata_validates(change, words):
    with pytest.raises(ValueError, match=words):
        toy(**change)


def test_graphdata_to_device(device):
    d = toy().to(device)
    assert d.device.type == device.type
    assert all(t.device.type == device.type for t in (d.src, d.dst, d.label, d.test_mask))


@pytest.mark.dgl
def test_graphdata_to_dgl():
    if not _deps.dgl_available():
        pytest.skip("dgl not available")
    d = toy()
    g = d.to_dgl()
    s, t = g.edges()
    assert g.num_nodes() == 4 and edge_set(s, t) == edge_set(d.src, d.dst)
    assert torch.equal(g.ndata["feat"], d.feat) and torch.equal(g.ndata["val_mask"], d.val_mask)


# ---------------------------------------------------------------------------- synthetic


def test_synthetic_invariants():
    d = synthetic_graph(
        num_nodes=2000, avg_degree=10.0, num_classes=5, feat_dim=7, train_frac=0.3, val_frac=0.2
    )
    check_clean(d)
    assert d.feat.shape == (2000, 7) and d.feat.dtype == torch.float32
    assert d.label.dtype == torch.int64 and int(d.label.max()) < 5 and d.num_classes == 5
    assert (d.task, d.metric, d.name) == ("multiclass", "accuracy", "synthetic")
    masks = torch.stack([d.train_mask, d.val_mask, d.test_mask]).long()
    assert bool((masks.sum(0) == 1).all())
    assert masks.sum(1).tolist() == [600, 400, 1000]
    assert abs(d.num_edges - 20_000) <= 0.015 * 20_000  # N * avg_degree, topped up


@pytest.mark.parametrize("n, avg_degree", [(3000, 30.0), (400, 100.0)], ids=["sparse", "dense"])
def test_synthetic_tops_up_duplicate_edges(n, avg_degree):
    d = synthetic_graph(num_nodes=n, avg_degree=avg_degree, power_law_exponent=2.1)
    check_clean(d)
    assert abs(d.num_edges - n * avg_degree) <= 0.015 * n * avg_degree


def test_merge_sorted_unique():
    from dgl_rsc.data.synthetic import _merge_sorted_unique

    g = torch.Generator().manual_seed(0)
    for size_a, size_b in [(0, 5), (5, 0), (30, 30), (40, 3)]:
        a = torch.unique(torch.randint(0, 60, (size_a,), generator=g))
        b = torch.unique(torch.randint(0, 60, (size_b,), generator=g))
        assert torch.equal(_merge_sorted_unique(a, b), torch.unique(torch.cat([a, b])))


def test_synthetic_is_deterministic():
    a, b = synthetic_graph(num_nodes=500, seed=3), synthetic_graph(num_nodes=500, seed=3)
    c = synthetic_graph(num_nodes=500, seed=4)
    for f in ("src", "dst", "feat", "label", "train_mask"):
        assert torch.equal(getattr(a, f), getattr(b, f))
    assert not torch.equal(a.label, c.label)


@pytest.mark.parametrize("h", [0.0, 0.5, 0.9])
def test_synthetic_homophily(h):
    d = synthetic_graph(num_nodes=4000, avg_degree=10.0, num_classes=4, homophily=h)
    same = float((d.label[d.src] == d.label[d.dst]).float().mean())
    expected = h + (1 - h) / 4  # the other class is drawn at random, possibly the same one
    assert abs(same - expected) < 0.05


def test_synthetic_power_law_degrees():
    heavy = synthetic_graph(num_nodes=20000, avg_degree=10.0, power_law_exponent=2.1)
    light = synthetic_graph(num_nodes=20000, avg_degree=10.0, power_law_exponent=4.0)
    ratio = [float(d.in_degrees().max()) / (d.num_edges / d.num_nodes) for d in (heavy, light)]
    assert ratio[0] > 100 and ratio[1] < 30  # hubs only under the heavy tail
    deg = heavy.in_degrees().sort(descending=True).values
    assert float(deg[:200].sum()) / float(deg.sum()) > 0.2  # top 1 % of nodes: > 20 % of edges


def _centroid_accuracy(x, d):
    c = torch.stack([x[d.train_mask & (d.label == k)].mean(0) for k in range(d.num_classes)])
    return float((torch.cdist(x[d.test_mask], c).argmin(1) == d.label[d.test_mask]).float().mean())


def test_synthetic_graph_beats_features_alone():
    """At the defaults the features alone are weak while 2-hop neighbourhood means separate
    the classes well (what lets a GCN beat an MLP)."""
    d = synthetic_graph(num_nodes=3000)
    deg = d.in_degrees().clamp(min=1).unsqueeze(1)
    hop = [d.feat]
    for _ in range(2):
        hop.append(torch.zeros_like(d.feat).index_add_(0, d.dst, hop[-1][d.src]) / deg)
    raw, two_hop = _centroid_accuracy(hop[0], d), _centroid_accuracy(hop[2], d)
    assert raw < 0.3 and two_hop > 0.85
    clean = synthetic_graph(num_nodes=3000, feature_noise=0.0)
    assert _centroid_accuracy(clean.feat, clean) == 1.0


@pytest.mark.parametrize(
    "bad",
    [
        dict(power_law_exponent=1.0),
        dict(homophily=1.5),
        dict(train_frac=0.9, val_frac=0.2),
        dict(num_nodes=1),
        dict(avg_degree=0.0),
    ],
    ids=["exponent", "homophily", "fractions", "nodes", "degree"],
)
def test_synthetic_rejects_bad_arguments(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        synthetic_graph(**bad)


def test_synthetic_on_device(device):
    d = synthetic_graph(num_nodes=800, avg_degree=6.0, device=device)
    assert all(t.device.type == device.type for t in (d.src, d.feat, d.label, d.val_mask))
    check_clean(d.to("cpu"))


# ---------------------------------------------------------------------------- npz


def _write_npz(path, with_splits=False, classes=3):
    n = 6
    arrays = dict(
        src=np.array([0, 1, 1, 2, 2, 5, 4]),
        dst=np.array([1, 0, 2, 2, 3, 4, 5]),
        feat=np.arange(n * 2, dtype=np.float32).reshape(n, 2),
        label=np.arange(n) % classes,
        train_mask=np.array([1, 1, 0, 0, 0, 0], bool),
        val_mask=np.array([0, 0, 1, 0, 0, 0], bool),
        test_mask=np.array([0, 0, 0, 1, 1, 1], bool),
    )
    if with_splits:
        for i, s in enumerate(("train", "val", "test")):
            rows = [np.arange(n) % 3 == i, np.arange(n) % 3 == (i + 1) % 3]
            arrays[f"{s}_masks"] = np.stack(rows)
    np.savez(path, **arrays)
    return arrays


def test_load_npz_cleans_and_names(tmp_path):
    _write_npz(tmp_path / "tiny.npz")
    d = load_npz(tmp_path / "tiny.npz")
    check_clean(d)
    assert edge_set(d.src, d.dst) == {
        (0, 1),
        (1, 0),
        (1, 2),
        (2, 1),
        (2, 3),
        (3, 2),
        (4, 5),
        (5, 4),
    }
    assert (d.name, d.task, d.metric, d.num_classes) == ("tiny", "multiclass", "accuracy", 3)
    assert d.val_mask.tolist() == [False, False, True, False, False, False]
    same = load_dataset("npz", root=str(tmp_path), path="tiny")
    assert torch.equal(same.src, d.src) and torch.equal(same.feat, d.feat)


def test_load_npz_normalize_features_divides_rows_by_their_sum(tmp_path):
    _write_npz(tmp_path / "tiny.npz")
    raw = load_npz(tmp_path / "tiny.npz")
    raw.feat[2] = 0.0  # an all-zero row stays zero
    np_file = dict(np.load(tmp_path / "tiny.npz"))
    np_file["feat"] = raw.feat.abs().numpy()
    np.savez(tmp_path / "pos.npz", **np_file)
    pos = load_npz(tmp_path / "pos.npz")
    norm = load_npz(tmp_path / "pos.npz", normalize_features=True)
    sums = norm.feat.sum(1)
    assert torch.allclose(sums[pos.feat.sum(1) > 0], torch.ones(5))
    assert torch.equal(norm.feat[2], torch.zeros_like(norm.feat[2]))
    torch.testing.assert_close(norm.feat[0], pos.feat[0] / pos.feat[0].sum())
    via_registry = load_dataset("npz", path=str(tmp_path / "pos.npz"), normalize_features=True)
    assert torch.equal(via_registry.feat, norm.feat)


def test_load_npz_binary_and_splits(tmp_path):
    _write_npz(tmp_path / "bin.npz", with_splits=True, classes=2)
    d0, d1 = load_npz(tmp_path / "bin.npz"), load_npz(tmp_path / "bin.npz", split=1)
    assert (d0.task, d0.metric, d0.num_classes) == ("binary", "rocauc", 2)
    assert d0.train_mask.tolist() == [True, False, False, True, False, False]
    assert d1.train_mask.tolist() == [False, True, False, False, True, False]
    with pytest.raises(ValueError, match="split=2"):
        load_npz(tmp_path / "bin.npz", split=2)


def test_load_npz_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nothere\.npz.*src, dst"):
        load_npz(tmp_path / "nothere.npz")
    np.savez(tmp_path / "partial.npz", src=np.zeros(1), dst=np.zeros(1), feat=np.zeros((1, 1)))
    with pytest.raises(ValueError, match="label, train_mask"):
        load_npz(tmp_path / "partial.npz")
    _write_npz(tmp_path / "one.npz")
    with pytest.raises(ValueError, match="holds one split"):
        load_npz(tmp_path / "one.npz", split=1)


@pytest.mark.parametrize(
    "name, nodes, edges, split",
    [
        ("cora", 2708, 10556, (140, 500, 1000)),
        ("citeseer", 3327, 9104, (120, 500, 1000)),
        ("tolokers", 11758, None, None),
    ],
)
def test_shared_data(name, nodes, edges, split):
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data not present")
    d = load_dataset("npz", root=str(SHARED_DATA), path=name)
    assert d.num_nodes == nodes and d.name == name
    assert bool((d.src != d.dst).all())
    if edges is not None:
        assert d.num_edges == edges
        s = d.summary()
        assert (s["num_train"], s["num_val"], s["num_test"]) == split
    else:  # tolokers: binary ROC-AUC, 10 splits
        assert (d.task, d.metric) == ("binary", "rocauc")
        other = load_npz(SHARED_DATA / "tolokers.npz", split=3)
        assert not torch.equal(d.train_mask, other.train_mask)


# ---------------------------------------------------------------------------- registry


def test_registry_names_and_errors():
    assert set(DATASETS) == {
        "synthetic",
        "npz",
        "ogbn-arxiv",
        "ogbn-products",
        "ogbn-proteins",
        "reddit",
        "yelp",
        "flickr",
    }
    with pytest.raises(ValueError, match="Did you mean 'ogbn-arxiv'.*Known: synthetic"):
        load_dataset("ogbn_arxiv")
    with pytest.raises(ValueError, match="no parameter 'nodes'.*Allowed: num_nodes, avg_degree"):
        load_dataset("synthetic", nodes=10)
    with pytest.raises(ValueError, match="no parameter 'split'.*Allowed: \\(none\\)"):
        load_dataset("reddit", split=1)


def test_registry_synthetic_passes_params():
    d = load_dataset("synthetic", root="/ignored", num_nodes=321, feat_dim=5, seed=1)
    assert d.num_nodes == 321 and d.feat.shape[1] == 5


# ---------------------------------------------------------------------------- metrics


def test_accuracy_and_masks():
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 3.0], [1.0, 0.0, 0.0]])
    label = torch.tensor([0, 2, 2, 1])
    assert evaluate("accuracy", logits, label) == 0.5
    assert evaluate("accuracy", logits, label, torch.tensor([True, False, True, False])) == 1.0
    assert evaluate("accuracy", logits, label, torch.tensor([1, 3])) == 0.0
    with pytest.raises(ValueError, match="unknown metric"):
        evaluate("auc", logits, label)
    with pytest.raises(ValueError, match="empty"):
        evaluate("accuracy", logits, label, torch.zeros(4, dtype=torch.bool))


def test_rocauc_by_hand():
    # positives score 0.9, 0.4; negatives 0.5, 0.4, 0.1: pairs won 1+1+1 + 0+0.5+1 = 4.5 of 6
    scores = torch.tensor([0.9, 0.4, 0.5, 0.4, 0.1])
    label = torch.tensor([1, 1, 0, 0, 0])
    assert binary_rocauc(scores, label) == pytest.approx(0.75)
    two_class = torch.stack([torch.zeros(5), scores], 1)
    assert evaluate("rocauc", two_class, label) == pytest.approx(0.75)
    assert evaluate("rocauc", scores.unsqueeze(1), label) == pytest.approx(0.75)
    # multilabel: task 0 as above, task 1 perfect, task 2 single-class (skipped)
    y = torch.stack([label, label, torch.ones(5, dtype=torch.long)], 1).float()
    s = torch.stack([scores, label.float(), scores], 1)
    assert rocauc(s, y) == pytest.approx((0.75 + 1.0) / 2)


def test_rocauc_matches_sklearn():
    sk = pytest.importorskip("sklearn.metrics")
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 2, (300, 4), generator=g)
    s = torch.randint(0, 20, (300, 4), generator=g).float()  # many ties
    expected = np.mean([sk.roc_auc_score(y[:, t].numpy(), s[:, t].numpy()) for t in range(4)])
    assert evaluate("rocauc", s, y.float()) == pytest.approx(expected, abs=1e-12)


def test_f1_micro_by_hand():
    logits = torch.tensor([[1.0, -1.0, 2.0], [-1.0, 1.0, -2.0]])
    label = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
    # TP = 2 ((0,0), (1,1)); FP = 1 ((0,2)); FN = 1 ((0,1)) -> 2*2 / (4 + 2)
    assert f1_micro(logits, label) == pytest.approx(4 / 6)
    assert evaluate("f1_micro", logits, label, torch.tensor([False, True])) == 1.0


# ---------------------------------------------------------------------------- OGB


def _csv_gz(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for row in np.atleast_2d(np.asarray(rows).T).T if np.ndim(rows) == 1 else rows:
            f.write(",".join(str(v) for v in np.atleast_1d(row)) + "\n")


def _write_ogb(root: Path, name: str, n=10, seed=0) -> dict:
    """A tiny dataset in OGB's layout (what its zip holds after renaming the folder)."""
    rng = np.random.default_rng(seed)
    folder = root / name.replace("-", "_")
    raw = folder / "raw"
    src = np.arange(n)
    dst = (src * 3 + 1) % n
    edges = np.stack([np.r_[src, 0], np.r_[dst, 0]], 1)  # a ring-like graph plus a self-loop
    _csv_gz(raw / "edge.csv.gz", edges)
    _csv_gz(raw / "num-node-list.csv.gz", [n])
    _csv_gz(raw / "num-edge-list.csv.gz", [len(edges)])
    out = {"edges": edges}
    if name == "ogbn-proteins":
        out["efeat"] = rng.random((len(edges), 8)).round(3) + 0.001  # floats, never integers
        out["label"] = rng.integers(0, 2, (n, 112))
        _csv_gz(raw / "edge-feat.csv.gz", out["efeat"])
        _csv_gz(raw / "node_species.csv.gz", np.full(n, 3702))
        scheme = "species"
    else:
        out["feat"] = rng.random((n, 4)).round(3) + 0.001
        classes = 40 if name == "ogbn-arxiv" else 47
        out["label"] = rng.integers(0, classes, (n, 1))
        _csv_gz(raw / "node-feat.csv.gz", out["feat"])
        if name == "ogbn-arxiv":
            _csv_gz(raw / "node_year.csv.gz", np.full(n, 2019))
        scheme = "time" if name == "ogbn-arxiv" else "sales_ranking"
    _csv_gz(raw / "node-label.csv.gz", out["label"])
    out["split"] = {"train": [0, 1, 2, 3, 4, 5], "valid": [6, 7], "test": [8, 9]}
    for key, idx in out["split"].items():
        _csv_gz(folder / "split" / scheme / f"{key}.csv.gz", idx)
    (folder / "RELEASE_v1.txt").write_text("tiny test copy\n")
    return out


@pytest.mark.dgl
@pytest.mark.parametrize("name", ["ogbn-arxiv", "ogbn-products"])
def test_ogb_node_feature_datasets(tmp_path, ogb_ready, name):
    truth = _write_ogb(tmp_path, name)
    d = load_dataset(name, root=str(tmp_path))
    check_clean(d)
    e = truth["edges"]
    expected = {(int(u), int(v)) for u, v in e if u != v}
    assert edge_set(d.src, d.dst) == expected | {(v, u) for u, v in expected}
    assert torch.allclose(d.feat, torch.tensor(truth["feat"], dtype=torch.float32))
    assert d.label.tolist() == truth["label"].reshape(-1).tolist()
    assert d.train_mask.nonzero().view(-1).tolist() == truth["split"]["train"]
    assert d.test_mask.nonzero().view(-1).tolist() == truth["split"]["test"]
    assert (d.task, d.metric, d.num_classes) == (
        "multiclass",
        "accuracy",
        40 if name == "ogbn-arxiv" else 47,
    )
    # second load: OGB's processed cache, the raw files are no longer needed
    for f in (tmp_path / name.replace("-", "_") / "raw").iterdir():
        f.unlink()
    again = load_dataset(name, root=str(tmp_path))
    assert torch.equal(again.src, d.src) and torch.equal(again.feat, d.feat)


@pytest.mark.dgl
def test_ogb_proteins_edge_feature_means(tmp_path, ogb_ready):
    truth = _write_ogb(tmp_path, "ogbn-proteins")
    d = load_dataset("ogbn-proteins", root=str(tmp_path))
    check_clean(d)
    assert (d.task, d.metric, d.num_classes) == ("multilabel", "rocauc", 112)
    assert d.label.dtype == torch.float32 and d.label.tolist() == truth["label"].tolist()
    # OGB adds the inverse of every edge; node features: mean over incoming edges
    n, efeat = d.num_nodes, truth["efeat"]
    sums, cnt = np.zeros((n, 8)), np.zeros(n)
    for (u, v), f in zip(truth["edges"], efeat):
        for b in (v, u):
            sums[b] += f
            cnt[b] += 1
    assert torch.allclose(d.feat, torch.tensor(sums / cnt[:, None], dtype=torch.float32))


@pytest.mark.dgl
def test_ogb_missing_files_are_named(tmp_path, ogb_ready):
    with pytest.raises(FileNotFoundError, match=r"RELEASE_v1\.txt.*raw.node-feat\.csv\.gz"):
        load_dataset("ogbn-arxiv", root=str(tmp_path))
    _write_ogb(tmp_path, "ogbn-arxiv")
    (tmp_path / "ogbn_arxiv" / "split" / "time" / "valid.csv.gz").unlink()
    folder, missing = ogb_files("ogbn-arxiv", tmp_path)
    assert missing == [folder / "split" / "time" / "valid.csv.gz"]
    with pytest.raises(FileNotFoundError, match=r"valid\.csv\.gz.*arxiv\.zip"):
        load_dataset("ogbn-arxiv", root=str(tmp_path))


@pytest.mark.dgl
def test_ogb_evaluator_agrees(ogb_ready):
    from dgl_rsc.data import ogb_evaluate

    g = torch.Generator().manual_seed(0)
    logits, y = torch.randn(50, 40, generator=g), torch.randint(0, 40, (50,), generator=g)
    assert ogb_evaluate("ogbn-arxiv", y, logits) == pytest.approx(evaluate("accuracy", logits, y))
    s, t = torch.randn(60, 112, generator=g), torch.randint(0, 2, (60, 112), generator=g)
    assert ogb_evaluate("ogbn-proteins", t, s) == pytest.approx(evaluate("rocauc", s, t.float()))


# ---------------------------------------------------------------------------- DGL datasets


def _write_dgl(root: Path, name: str, n=12, seed=0) -> dict:
    """A tiny dataset in the files of DGL's zip, placed where DGL looks for them."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    folder, _ = dgl_files(name, root)
    folder.mkdir(parents=True)
    u = np.r_[np.arange(n), 3]
    v = np.r_[(np.arange(n) + 1) % n, 3]  # a cycle plus a self-loop
    adj = sp.coo_matrix((np.ones(len(u)), (u, v)), shape=(n, n))
    feat = np.c_[np.arange(n), rng.random((n, 3))].astype(np.float32)  # column 0: node id
    role = {"tr": list(range(6)), "va": [6, 7, 8], "te": [9, 10, 11]}
    if name == "reddit":
        label = rng.integers(0, 41, n)
        node_types = np.repeat([1, 2, 3], [6, 3, 3])
        sp.save_npz(folder / "reddit_graph.npz", adj)
        np.savez(folder / "reddit_data.npz", feature=feat, label=label, node_types=node_types)
    else:
        label = rng.integers(0, 2, (n, 100)) if name == "yelp" else rng.integers(0, 7, n)
        sp.save_npz(folder / "adj_full.npz", adj.tocsr())
        np.save(folder / "feats.npy", feat)
        (folder / "class_map.json").write_text(
            json.dumps({str(i): label[i].tolist() for i in range(n)})
        )
        (folder / "role.json").write_text(json.dumps(role))
    return {"edges": set(zip(u.tolist(), v.tolist())), "label": label, "role": role}


@pytest.mark.dgl
@pytest.mark.parametrize("name", ["reddit", "flickr", "yelp"])
def test_dgl_datasets(tmp_path, name):
    if not _deps.dgl_available():
        pytest.skip("dgl not available")
    truth = _write_dgl(tmp_path, name)
    d = load_dataset(name, root=str(tmp_path))
    check_clean(d)
    orig = d.feat[:, 0].long()  # DGL may renumber nodes (Reddit: RCMK order); map back
    got = {(int(orig[a]), int(orig[b])) for a, b in zip(d.src.tolist(), d.dst.tolist())}
    expected = {(a, b) for a, b in truth["edges"] if a != b}
    assert got == expected | {(b, a) for a, b in expected}
    assert torch.equal(d.label, torch.as_tensor(truth["label"])[orig].to(d.label.dtype))
    assert sorted(orig[d.val_mask].tolist()) == truth["role"]["va"]
    if name == "yelp":
        assert (d.task, d.metric, d.num_classes) == ("multilabel", "f1_micro", 100)
        assert d.label.dtype == torch.float32
    else:
        assert (d.task, d.metric, d.num_classes) == (
            "multiclass",
            "accuracy",
            41 if name == "reddit" else 7,
        )
    assert (dgl_files(name, tmp_path)[0] / "dgl_graph.bin").exists()  # DGL cached it


@pytest.mark.dgl
def test_dgl_missing_files_are_named(tmp_path):
    if not _deps.dgl_available():
        pytest.skip("dgl not available")
    with pytest.raises(FileNotFoundError, match=r"reddit_data\.npz.*reddit_graph\.npz"):
        load_dataset("reddit", root=str(tmp_path))
    assert not any(tmp_path.iterdir())  # nothing was downloaded or created
