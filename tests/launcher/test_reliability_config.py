"""Reliability of config validation (issue 12): non-finite numbers, duplicate YAML keys,
non-UTF-8 files and backends that cannot run, all refused before any data load or training."""

from __future__ import annotations

import math

import pytest
import yaml

from dgl_rsc import RSCConfig
from dgl_rsc.core.config import ConfigError
from dgl_rsc.launcher import cli
from dgl_rsc.launcher.cli import StrictLoader, apply_overrides, load_config, parse_yaml
from dgl_rsc.launcher.schema import resolve

from .test_launcher import TINY, write_config

pytestmark = pytest.mark.usefixtures("one_thread")
NON_FINITE = [math.nan, math.inf, -math.inf]


# -- case 3 / 13: NaN and infinities -----------------------------------------------------------
@pytest.mark.parametrize("value", NON_FINITE, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("key", ["budget", "ema", "switch_at", "cache_interval", "min_k", "seed"])
def test_rsc_config_rejects_non_finite(key, value):
    with pytest.raises(ConfigError, match=rf"RSCConfig\.{key}=.* is not a finite number"):
        RSCConfig(**{key: value})


def test_rsc_config_huge_integer_is_a_clear_error_not_an_overflow():
    with pytest.raises(ConfigError, match="RSCConfig.budget=.* is not a finite number"):
        RSCConfig(budget=10**400)  # beyond float's range
    assert RSCConfig(total_steps=10**30).total_steps == 10**30  # an int field stays exact


@pytest.mark.parametrize(
    "override",
    [
        "train.lr=.nan",
        "train.lr=nan",
        "train.lr=.inf",
        "train.weight_decay=.nan",
        "train.momentum=-.inf",
        "train.epochs=.inf",
        "train.seeds=[.nan]",
        "model.dropout=.nan",
        "model.hidden=.inf",
        "dataset.avg_degree=.nan",
        "dataset.homophily=.inf",
        "dataset.num_nodes=.nan",
        "rsc.budget=.nan",
        "rsc.budget=nan",
        "rsc.ema=.nan",
        "rsc.switch_at=.nan",
        "rsc.switch_at=-inf",
    ],
)
def test_every_section_rejects_non_finite_numbers(override):
    key = override.split("=")[0].replace("train.seeds", "train.seeds[0]")
    with pytest.raises(ConfigError) as err:
        resolve(apply_overrides(TINY, [override]))
    assert f"{key}=" in str(err.value) and "is not a finite number" in str(err.value)


def test_gcn2_parameters_reject_non_finite():
    raw = apply_overrides(TINY, ["model={name: gcn2, alpha: .nan}"])
    with pytest.raises(ConfigError, match="model.alpha=nan is not a finite number"):
        resolve(raw)


def test_huge_integers_are_clear_errors_not_overflow():
    with pytest.raises(ConfigError, match=r"train\.lr=9+ is not a finite number"):
        resolve(apply_overrides(TINY, ["train.lr=" + "9" * 400]))
    cfg = resolve(apply_overrides(TINY, ["train.epochs=" + "1" + "0" * 30]))
    assert cfg.train.epochs == 10**30


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("train.lr=.nan", "train.lr=nan is not a finite number"),
        ("train.weight_decay=.nan", "train.weight_decay=nan is not a finite number"),
        ("rsc.switch_at=.nan", "rsc.switch_at=nan is not a finite number"),
        ("model.dropout=.nan", "model.dropout=nan is not a finite number"),
        ("rsc.budget=.nan", "rsc.budget=nan is not a finite number"),
        ("train.lr=.inf", "train.lr=inf is not a finite number"),
    ],
)
def test_cli_rejects_non_finite_with_exit_2_and_writes_nothing(
    tmp_path, capsys, override, fragment
):
    path = write_config(tmp_path)
    out = tmp_path / "out"
    assert cli.main(["run", path, "--out", str(out), "--set", override]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err and err.count("\n") == 1
    assert not out.exists()


# -- case 6: duplicate keys ----------------------------------------------------------------------
def test_duplicate_key_names_the_key_and_both_lines(tmp_path, capsys):
    path = tmp_path / "dup.yaml"
    path.write_text(
        "dataset: {name: synthetic, num_nodes: 300}\n"
        "model: {name: gcn}\n"
        "train:\n"
        "  lr: 0.01\n"
        "  epochs: 2\n"
        "  lr: 0.5\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    assert "key 'lr' appears twice in one mapping (lines 4 and 6)" in str(err.value)
    assert cli.main(["show", str(path)]) == 2
    assert "'lr' appears twice" in capsys.readouterr().err


def test_duplicate_section_and_flow_mapping_and_set_value():
    with pytest.raises(ConfigError, match=r"key 'train' appears twice .*lines 1 and 2"):
        parse_yaml("train: {lr: 1}\ntrain: {lr: 2}\n", "cfg")
    with pytest.raises(ConfigError, match="key 'a' appears twice"):
        parse_yaml("x: {a: 1, a: 2}", "cfg")
    with pytest.raises(ConfigError, match=r"--set .*key 'lr' appears twice"):
        apply_overrides(TINY, ["train={lr: 0.1, lr: 0.2}"])


def test_strict_loader_keeps_safe_load_semantics():
    text = "base: &b {lr: 0.1, epochs: 3}\ntrain:\n  <<: *b\n  lr: 0.2\nwhen: 2024-01-01\n"
    # a merged key overridden by an explicit one is YAML's intent, not a duplicate
    assert yaml.load(text, Loader=StrictLoader) == yaml.safe_load(text)
    with pytest.raises(yaml.constructor.ConstructorError):  # no Python objects
        yaml.load("!!python/object/apply:os.getcwd []", Loader=StrictLoader)


# -- case 13: file encoding and backends ----------------------------------------------------------
def test_config_that_is_not_utf8_is_one_clear_error(tmp_path, capsys):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("dataset: {name: synthetic}\n# r\xe9sum\xe9\n".encode("latin-1"))
    assert cli.main(["show", str(path)]) == 2
    err = capsys.readouterr().err
    assert "is not UTF-8 text (byte 0xe9 at offset" in err and "Traceback" not in err
    bom = tmp_path / "bom.yaml"
    bom.write_bytes(b"\xef\xbb\xbf" + yaml.safe_dump(TINY).encode())
    assert load_config(str(bom)).train.epochs == 6  # a UTF-8 byte-order mark is fine


def test_config_path_that_is_a_directory(tmp_path, capsys):
    assert cli.main(["show", str(tmp_path)]) == 2
    assert "is not a file" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["numba", "cupy"])
def test_backend_that_cannot_run_is_refused_before_data_and_training(
    tmp_path, capsys, monkeypatch, backend
):
    from dgl_rsc.launcher import train

    def no_data(*args, **kwargs):
        raise AssertionError("the data were loaded before the backend was checked")

    monkeypatch.setattr("dgl_rsc.data.load_dataset", no_data)
    monkeypatch.setattr(train, "train_one", no_data)
    path = write_config(tmp_path, train={"device": "cpu"}, rsc={"backend": backend})
    out = tmp_path / "out"
    assert cli.main(["run", path, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"rsc.backend='{backend}' cannot run on cpu" in err and "Traceback" not in err
    assert not out.exists()
