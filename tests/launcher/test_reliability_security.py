"""No file the launcher or the loaders read can run code (issue 12, case 2): every pickle
below would create a marker file when unpickled; each test first shows that the payload is
live (a plain unpickle creates its marker), then that the loader refuses or ignores the file
and that its marker does not exist."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from dgl_rsc.base import _deps
from dgl_rsc.data import load_dataset, load_npz
from dgl_rsc.data.ogb import read_split
from dgl_rsc.launcher import cli
from dgl_rsc.launcher.checkpoint import load_checkpoint

from ..data.test_data import _write_dgl, _write_ogb
from .test_launcher import TINY, write_config
from .test_reliability_data import arrays

pytestmark = pytest.mark.usefixtures("one_thread")


class Payload:
    """Unpickling this calls ``open(marker, "w")``: the marker file appears."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def live(tmp_path) -> None:
    """The payload does run code under a plain unpickle (so its absence below means
    something)."""
    probe = tmp_path / "probe-marker"
    pickle.loads(pickle.dumps(Payload(probe)))
    assert probe.exists()


# -- OGB's split_dict.pt -------------------------------------------------------------------------
@pytest.mark.dgl
def test_ogb_crafted_split_dict_next_to_the_csvs_is_never_unpickled(tmp_path, ogb_ready):
    live(tmp_path)
    truth = _write_ogb(tmp_path, "ogbn-arxiv")
    marker = tmp_path / "ogb-marker"
    split = tmp_path / "ogbn_arxiv" / "split" / "time"
    torch.save({"train": Payload(marker)}, split / "split_dict.pt")
    d = load_dataset("ogbn-arxiv", root=str(tmp_path))
    assert not marker.exists()
    assert d.train_mask.nonzero().view(-1).tolist() == truth["split"]["train"]  # from the CSVs


@pytest.mark.dgl
def test_ogb_crafted_split_dict_alone_is_refused(tmp_path, ogb_ready, capsys):
    live(tmp_path)
    _write_ogb(tmp_path, "ogbn-arxiv")
    marker = tmp_path / "ogb-marker"
    split = tmp_path / "ogbn_arxiv" / "split" / "time"
    for key in ("train", "valid", "test"):
        (split / f"{key}.csv.gz").unlink()
    torch.save({"train": Payload(marker)}, split / "split_dict.pt")
    with pytest.raises(ValueError, match=r"split_dict\.pt was refused: it is not a plain file"):
        load_dataset("ogbn-arxiv", root=str(tmp_path))
    assert not marker.exists()
    cfg = write_config(tmp_path, {**TINY, "dataset": {"name": "ogbn-arxiv", "root": str(tmp_path)}})
    assert cli.main(["run", cfg, "--out", str(tmp_path / "out")]) == 2
    assert "split_dict.pt was refused" in capsys.readouterr().err
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_a_plain_split_dict_of_tensors_is_accepted(tmp_path):
    ids = {"train": torch.tensor([0, 1, 2]), "valid": torch.tensor([3]), "test": torch.tensor([4])}
    torch.save(ids, tmp_path / "split_dict.pt")
    split = read_split(tmp_path, 5)
    assert all(torch.equal(split[k], ids[k]) for k in ids)
    with pytest.raises(ValueError, match=r"the test ids leave \[0, 4\)"):
        read_split(tmp_path, 4)


# -- npz files -----------------------------------------------------------------------------------
def test_npz_with_a_pickled_object_array_is_refused_unpickled(tmp_path):
    live(tmp_path)
    marker = tmp_path / "npz-marker"
    np.savez(tmp_path / "evil.npz", **arrays(label=np.array([Payload(marker)], dtype=object)))
    with pytest.raises(ValueError, match=r"cannot be read as an npz archive .*allow_pickle=False"):
        load_npz(tmp_path / "evil.npz")
    assert not marker.exists()


def test_a_pickle_named_npz_is_refused_unpickled(tmp_path):
    marker = tmp_path / "pkl-marker"
    (tmp_path / "evil.npz").write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(ValueError, match="cannot be read as an npz archive"):
        load_npz(tmp_path / "evil.npz")
    assert not marker.exists()


@pytest.mark.dgl
def test_dgl_dataset_with_a_pickled_array_or_info_pkl_runs_no_code(tmp_path):
    if not _deps.dgl_available():
        pytest.skip("dgl not available")
    live(tmp_path)
    marker = tmp_path / "dgl-marker"
    truth = _write_dgl(tmp_path, "reddit")
    folder = next(tmp_path.glob("reddit_*"))
    (folder / "info.pkl").write_bytes(pickle.dumps({"x": Payload(marker)}))  # DGL ignores it
    data = dict(np.load(folder / "reddit_data.npz"))
    d = load_dataset("reddit", root=str(tmp_path))
    assert d.num_nodes == len(truth["label"]) and not marker.exists()
    for cached in folder.glob("dgl_graph.bin"):
        cached.unlink()
    data["label"] = np.array([Payload(marker)], dtype=object)
    np.savez(folder / "reddit_data.npz", **data)
    with pytest.raises(ValueError, match=r"DGL could not read reddit from .*allow_pickle=False"):
        load_dataset("reddit", root=str(tmp_path))
    assert not marker.exists()


# -- checkpoints and configs ---------------------------------------------------------------------
def test_a_crafted_checkpoint_is_refused_unpickled(tmp_path, capsys):
    live(tmp_path)
    marker = tmp_path / "ckpt-marker"
    path = tmp_path / "evil.pt"
    torch.save({"format": 1, "model": Payload(marker)}, path)
    with pytest.raises(ValueError, match="cannot be read safely .*Weights only load failed"):
        load_checkpoint(str(path))
    assert not marker.exists()
    # through --resume: one line, exit 2, nothing trained, nothing ran
    cfg = write_config(tmp_path, train={"epochs": 2, "checkpoint_every": 1})
    out = tmp_path / "out"
    assert cli.main(["run", cfg, "--out", str(out), "--no-progress"]) == 0
    (out / "runs" / "rsc-seed0.json").unlink()
    (out / "checkpoints" / "rsc-seed0.pt").write_bytes(path.read_bytes())
    capsys.readouterr()
    assert cli.main(["run", cfg, "--resume", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "cannot be read safely" in err and "Traceback" not in err and not marker.exists()


def test_yaml_python_tags_are_refused(tmp_path, capsys):
    marker = tmp_path / "yaml-marker"
    path = tmp_path / "evil.yaml"
    path.write_text(f"dataset: !!python/object/apply:builtins.open ['{marker}', 'w']\n")
    assert cli.main(["show", str(path)]) == 2
    assert "is not valid YAML" in capsys.readouterr().err and not marker.exists()
