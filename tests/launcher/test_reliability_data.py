"""Reliability of the dataset loaders (issue 12): values that cannot train correctly are
refused at load time with the reason (or warned about), before any training starts."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from dgl_rsc.data import GraphData, load_npz, synthetic_graph
from dgl_rsc.launcher import cli

from .test_launcher import TINY, write_config

pytestmark = pytest.mark.usefixtures("one_thread")
N = 9


def arrays(**changes) -> dict:
    """A valid 9-node, 3-class graph in the npz format, with ``changes`` applied."""
    out = dict(
        src=np.array([0, 1, 2, 3, 4, 5, 6, 7]),
        dst=np.array([1, 2, 3, 4, 5, 6, 7, 8]),
        feat=np.arange(N * 2, dtype=np.float32).reshape(N, 2) + 1,
        label=np.arange(N) % 3,
        train_mask=np.arange(N) < 3,
        val_mask=(np.arange(N) >= 3) & (np.arange(N) < 6),
        test_mask=np.arange(N) >= 6,
    )
    out.update(changes)
    return out


def write(tmp_path, name="g.npz", **changes) -> str:
    path = tmp_path / name
    np.savez(path, **arrays(**changes))
    return str(path)


def npz_config(tmp_path, path: str, **sections) -> str:
    """A launcher config training on the npz file ``path``."""
    return write_config(tmp_path, {**TINY, "dataset": {"name": "npz", "path": path}}, **sections)


def test_the_valid_graph_loads(tmp_path):
    d = load_npz(write(tmp_path))
    assert (d.num_nodes, d.num_classes, d.task) == (N, 3, "multiclass")


# -- case 4: non-finite inputs -------------------------------------------------------------------
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 1e300], ids=["nan", "inf", "-inf", "big"])
def test_non_finite_features_are_refused_at_load(tmp_path, bad):
    feat = arrays()["feat"].astype(np.float64)
    feat[4, 1] = bad  # 1e300 does not fit float32: infinite after conversion
    with pytest.raises(
        ValueError,
        match=r"feat holds 1 NaN or infinite values \(the first at " r"node 4, column 1\)",
    ):
        load_npz(write(tmp_path, feat=feat))


def test_non_finite_features_exit_2_from_the_cli_before_training(tmp_path, capsys):
    feat = arrays()["feat"].copy()
    feat[0, 0] = np.nan
    path = write(tmp_path, feat=feat)
    cfg = npz_config(tmp_path, path, compare=False, rsc=None, train={"epochs": 2})
    out = tmp_path / "out"
    assert cli.main(["run", cfg, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "NaN or infinite values" in err and "Traceback" not in err and not out.exists()


# -- case 5: silent truncation and degenerate data ------------------------------------------------
def test_one_class_is_an_error(tmp_path):
    with pytest.raises(
        ValueError, match=r"every labelled node has class \[0\]; a classifier needs"
    ):
        load_npz(write(tmp_path, label=np.zeros(N, dtype=np.int64)))


def test_non_integer_float_labels_are_an_error(tmp_path):
    label = arrays()["label"].astype(np.float64)
    label[5] = 1.5
    with pytest.raises(ValueError, match=r"label must hold integers, but entry 5 is 1\.5"):
        load_npz(write(tmp_path, label=label))
    label[5] = np.nan
    with pytest.raises(ValueError, match="label must hold integers, but entry 5 is nan"):
        load_npz(write(tmp_path, label=label))


def test_integral_float_labels_and_ids_are_accepted(tmp_path):
    a = arrays()
    d = load_npz(
        write(
            tmp_path,
            label=a["label"].astype(np.float32),
            src=a["src"].astype(np.float64),
            dst=a["dst"].astype(np.float64),
        )
    )
    ref = load_npz(write(tmp_path, "ref.npz"))
    assert torch.equal(d.label, ref.label) and torch.equal(d.src, ref.src)


def test_non_integer_node_ids_are_an_error(tmp_path):
    src = arrays()["src"].astype(np.float64)
    src[2] = 2.7
    with pytest.raises(ValueError, match=r"src must hold integers, but entry 2 is 2\.7"):
        load_npz(write(tmp_path, src=src))
    with pytest.raises(ValueError, match="dst must hold integers, got dtype <U1"):
        load_npz(write(tmp_path, dst=np.array(list("abcdefgh"))))


def test_no_feature_columns_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"feat has no columns \(shape \(9, 0\)\)"):
        load_npz(write(tmp_path, feat=np.zeros((N, 0), np.float32)))


def test_all_zero_features_are_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="dgl_rsc.data.graphdata"):
        d = load_npz(write(tmp_path, feat=np.zeros((N, 3), np.float32)))
    assert d.num_features == 3
    assert any("every feature is 0" in r.getMessage() for r in caplog.records)
    caplog.clear()
    feat = arrays()["feat"].copy()
    feat[:, 1] = 0.0  # one zero column (Cora has one): not a warning
    with caplog.at_level(logging.WARNING, logger="dgl_rsc.data.graphdata"):
        load_npz(write(tmp_path, feat=feat))
    assert not caplog.records


def test_overlapping_masks_are_an_error(tmp_path):
    val = arrays()["val_mask"].copy()
    val[0] = val[1] = True  # nodes 0 and 1 are also training nodes
    with pytest.raises(ValueError, match="2 nodes are in both train_mask and val_mask; the splits"):
        load_npz(write(tmp_path, val_mask=val))


def test_mask_values_other_than_0_1_are_an_error(tmp_path):
    train = (arrays()["train_mask"]).astype(np.float64) * 0.5  # 0.5 was read as True
    with pytest.raises(ValueError, match="the train mask must hold booleans"):
        load_npz(write(tmp_path, train_mask=train))
    ok = load_npz(write(tmp_path, train_mask=arrays()["train_mask"].astype(np.int8)))
    assert int(ok.train_mask.sum()) == 3


# -- case 14: data errors that were raised only after training (or never) -------------------------
@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_empty_mask_is_an_error(tmp_path, split):
    empty = np.zeros(N, dtype=bool)
    with pytest.raises(ValueError, match=rf"{split}_mask selects no node"):
        load_npz(write(tmp_path, **{f"{split}_mask": empty}))


def test_empty_test_mask_exits_2_before_training(tmp_path, capsys, monkeypatch):
    from dgl_rsc.launcher import train

    def never(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(train, "train_one", never)
    path = write(tmp_path, test_mask=np.zeros(N, dtype=bool))
    cfg = npz_config(tmp_path, path)
    assert cli.main(["run", cfg, "--out", str(tmp_path / "out")]) == 2
    assert "test_mask selects no node" in capsys.readouterr().err


def test_negative_label_is_an_error(tmp_path):
    label = arrays()["label"].copy()
    label[7] = -1
    with pytest.raises(
        ValueError, match="label -1 of node 7 is negative; labels must be class ids"
    ):
        load_npz(write(tmp_path, label=label))
    data = arrays()
    with pytest.raises(ValueError, match=r"label -1 of node 7 is not a class id in \[0, 3\)"):
        GraphData(
            torch.from_numpy(data["src"]),
            torch.from_numpy(data["dst"]),
            N,
            torch.from_numpy(data["feat"]),
            torch.from_numpy(label),
            *(torch.from_numpy(data[f"{s}_mask"]) for s in ("train", "val", "test")),
            "multiclass",
            "accuracy",
            3,
            "toy",
        )


def test_huge_label_is_an_error_not_a_64gb_allocation(tmp_path):
    label = arrays()["label"].copy()
    label[3] = 10**9
    with pytest.raises(ValueError, match="the largest label is 1000000000 but there are only 9"):
        load_npz(write(tmp_path, label=label))


def test_gaps_in_class_ids_are_a_warning(tmp_path, caplog):
    label = arrays()["label"] * 2  # classes 0, 2, 4: ids 1 and 3 unused
    with caplog.at_level(logging.WARNING, logger="dgl_rsc.data.npz"):
        d = load_npz(write(tmp_path, label=label))
    assert d.num_classes == 5
    assert any("2 of the class ids 0..4 have no node" in r.getMessage() for r in caplog.records)


def test_truncated_npz_is_one_clear_error(tmp_path):
    path = write(tmp_path)
    data = open(path, "rb").read()
    for cut in (len(data) // 2, 10, 0):
        (tmp_path / "cut.npz").write_bytes(data[:cut])
        with pytest.raises(ValueError, match="cannot be read as an npz archive .* damaged, trunc"):
            load_npz(tmp_path / "cut.npz")


def test_npy_and_text_files_are_one_clear_error(tmp_path):
    np.save(tmp_path / "one.npy", np.zeros(3))
    (tmp_path / "one.npz").write_bytes((tmp_path / "one.npy").read_bytes())
    with pytest.raises(ValueError, match=r"holds a single array \(\.npy\)"):
        load_npz(tmp_path / "one.npz")
    (tmp_path / "text.npz").write_text("src,dst\n0,1\n")
    with pytest.raises(ValueError, match="cannot be read as an npz archive"):
        load_npz(tmp_path / "text.npz")


def test_graph_with_zero_nodes_is_an_error(tmp_path):
    empty = np.zeros(0, dtype=bool)
    path = write(
        tmp_path,
        src=np.zeros(0, np.int64),
        dst=np.zeros(0, np.int64),
        feat=np.zeros((0, 2), np.float32),
        label=np.zeros(0, np.int64),
        train_mask=empty,
        val_mask=empty,
        test_mask=empty,
    )
    with pytest.raises(ValueError, match="has no nodes; a graph needs at least one node"):
        load_npz(path)


# -- found beyond the list ------------------------------------------------------------------------
def test_rocauc_on_a_multiclass_graph_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="metric 'rocauc' needs a binary or multilabel task"):
        load_npz(write(tmp_path), metric="rocauc")


def test_binary_rocauc_split_with_one_class_is_an_error(tmp_path):
    label = (np.arange(N) % 2).astype(np.int64)
    label[6:] = 1  # the test split holds class 1 only: its ROC-AUC is undefined
    with pytest.raises(ValueError, match="test_mask holds one class only, so its ROC-AUC"):
        load_npz(write(tmp_path, label=label))


def test_edge_ids_out_of_range_are_refused_by_graphdata():
    d = synthetic_graph(num_nodes=50, avg_degree=4.0, num_classes=2, feat_dim=3)
    with pytest.raises(ValueError, match=r"dst holds node ids outside \[0, 50\)"):
        GraphData(
            d.src,
            d.dst + 1,
            50,
            d.feat,
            d.label,
            d.train_mask,
            d.val_mask,
            d.test_mask,
            "multiclass",
            "accuracy",
            2,
            "shifted",
        )


def test_fingerprint_changes_with_any_value():
    d = synthetic_graph(num_nodes=60, avg_degree=4.0, num_classes=3, feat_dim=4)
    same = synthetic_graph(num_nodes=60, avg_degree=4.0, num_classes=3, feat_dim=4)
    assert d.fingerprint() == same.fingerprint()
    same.feat[7, 2] += 1e-6
    assert d.fingerprint() != same.fingerprint()


def test_docstring_examples_of_the_changed_modules_run():
    import doctest

    from dgl_rsc.data import graphdata, npz, ogb

    for module in (graphdata, npz, ogb):
        assert doctest.testmod(module).failed == 0
