"""The launcher's configuration: a parsed YAML document in, one validated :class:`RunConfig`
out (:func:`resolve`; files and ``--set`` overrides are read in :mod:`.cli`).

A config has these sections::

    dataset: {name: synthetic, root: null, <loader parameters>}
    model:   {name: gcn, hidden: 256, layers: 3, dropout: 0.5, ...}
    train:   {epochs: 200, lr: 0.01, optimizer: adam, seeds: [0, 1], engine: native, ...}
    rsc:     {budget: 0.2, ...}     # RSCConfig keys; `rsc: null` trains exact only
    compare: true                   # exact and RSC runs with the same seeds
    distributed: {partitions: 4, ...}  # optional: one graph across processes (dist_schema)
    minibatch: {num_parts: 40, ...}    # with train.mode cluster or saint (mb_schema)
    report: {tta_tolerance: 0.003, tta_target: null}  # time to accuracy (report_schema)

Every error is a :class:`~dgl_rsc.ConfigError` naming the key path (``train.lr``), and an
unknown key lists the allowed keys and the nearest match. The allowed ``model`` keys are the
parameters of the chosen model's constructor, the ``dataset`` keys those of the chosen
loader. Relative paths (``dataset.root``; ``dataset.path`` when no root is given) are
resolved against the current working directory. PyYAML reads ``1e-3`` as a string (YAML 1.1
wants ``1.0e-3``); number fields accept such strings. NaN and infinities (``.nan``, ``.inf``,
``nan``) are refused wherever a number is expected.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
from typing import Any, Optional

from ..core.config import ConfigError, RSCConfig, unknown_key_message
from ..data.reorder import NODE_ORDERS
from ..int8.spec import DENSE as INT8_DENSE
from ..int8.spec import PRECISIONS, ROUNDINGS
from ..int8.spec import SAVED as INT8_SAVED
from ..int8.spec import SPARSE as INT8_SPARSE
from ..models.engines import ENGINES as _ENGINES
from ..models.paper import model_params
from .dist_schema import DistConfig, resolve_distributed
from .int8_pick import PICKS as INT8_PICKS
from .mb_schema import MODES, MiniBatchConfig, resolve_minibatch, steps_per_epoch
from .report_schema import ReportConfig, resolve_report
from .rules import Rule, _fail, _nearest, check_value
from .train_checks import (
    STOPS,
    check_compile,
    check_node_order,
    check_precision,
    check_pyg,
    check_stop,
    default_switch_patience,
)

__all__ = [
    "RunConfig",
    "TrainConfig",
    "Rule",
    "check_value",
    "ENGINES",
    "resolve",
    "dataset_params",
]

SECTIONS = ("dataset", "model", "train", "rsc", "compare", "distributed", "minibatch", "report")
#: the engines a config may train on (dgl_rsc.models.engines; ``stock`` is the comparison baseline)
ENGINES = tuple(e.name for e in _ENGINES.values() if e.approximates)
PATH_KEYS = ("root", "path")
LOADER_ARGS = ("root", "device", "name", "progress")
REQUIRED = "<required>"


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The ``train`` section (``seed: 3`` in a config means ``seeds: [3]``).

    ``engine``: ``native``, ``dgl``, ``patch``, ``pyg`` or ``pyg_patch``
    (:mod:`dgl_rsc.models.engines`). ``stock_baseline``: with ``compare``, also train the stock
    model without dgl_rsc (``dgl.nn``, or ``torch_geometric.nn`` for the PyG engines) where
    that library imports (speedups are reported against the faster of it and dgl_rsc's exact
    backward). ``warmup_epochs``: when a run compares methods, each method still to train first
    trains this many untimed epochs, unrecorded, so that the process's one-off costs (DGL's
    first call, Numba's start) fall in none of the timed runs; 0 turns it off.
    ``keep_freed_memory``: the run's process keeps freed large blocks for reuse
    (:func:`dgl_rsc.keep_freed_memory`, glibc only; reported as ``allocator``).
    ``fused_epilogue``: GCN/SAGE hidden layers add bias, apply ReLU and dropout in one pass
    each way (:mod:`dgl_rsc.models.fused`; dropout drawn by a hash, same distribution).
    ``node_order``: the node order the data are renumbered in once, at load
    (:data:`dgl_rsc.data.reorder.NODE_ORDERS`); outputs stay in the dataset's order.
    ``stop``, ``patience``, ``min_delta``: :func:`~.train_checks.check_stop` (early stopping).
    ``int8_pick``: with ``precision: int8``, ``speed`` trains INT8 only where its epoch
    measured faster than fp32's, ``always`` trains INT8 (:mod:`~.int8_pick`).
    """

    epochs: int = 200
    warmup_epochs: int = 5
    lr: float = 0.01
    optimizer: str = "adam"
    weight_decay: float = 0.0
    momentum: float = 0.0
    eval_every: int = 1
    seeds: tuple = (0,)
    amp: str = "none"
    checkpoint_every: int = 0
    device: str = "auto"
    engine: str = "native"
    threads: Optional[int] = None
    stock_baseline: bool = True
    mode: str = "full"
    batches_per_epoch: Optional[int] = None
    precision: str = "fp32"
    int8_rounding: str = "stochastic"
    int8_dense: str = "auto"
    int8_sparse: str = "auto"
    int8_saved: str = "int8"
    int8_pick: str = "speed"
    keep_freed_memory: bool = True
    compile: bool = False
    fused_epilogue: bool = True
    node_order: str = "none"
    stop: str = "fixed"
    patience: int = 50
    min_delta: float = 0.0


TRAIN_RULES = {
    "epochs": Rule(int, 1),
    "warmup_epochs": Rule(int, 0),
    "lr": Rule(float, 0.0, lo_open=True),
    "optimizer": Rule(str, choices=("adam", "adamw", "sgd")),
    "weight_decay": Rule(float, 0.0),
    "momentum": Rule(float, 0.0, 1.0),
    "eval_every": Rule(int, 1),
    "seeds": Rule("seeds"),
    "amp": Rule(str, choices=("none", "bf16", "fp16")),
    "checkpoint_every": Rule(int, 0),
    "device": Rule("device"),
    "engine": Rule(str, choices=ENGINES),
    "threads": Rule(int, 1, optional=True),
    "stock_baseline": Rule(bool),
    "mode": Rule(str, choices=MODES),
    "batches_per_epoch": Rule(int, 1, optional=True),
    "precision": Rule(str, choices=PRECISIONS),
    "int8_rounding": Rule(str, choices=ROUNDINGS),
    "int8_dense": Rule(str, choices=INT8_DENSE),
    "int8_sparse": Rule(str, choices=INT8_SPARSE),
    "int8_saved": Rule(str, choices=INT8_SAVED),
    "int8_pick": Rule(str, choices=INT8_PICKS),
    "keep_freed_memory": Rule(bool),
    "compile": Rule(bool),
    "fused_epilogue": Rule(bool),
    "node_order": Rule(str, choices=tuple(NODE_ORDERS)),
    "stop": Rule(str, choices=STOPS),
    "patience": Rule(int, 1),
    "min_delta": Rule(float, 0.0, 1.0, hi_open=True),
}
MODEL_RULES = {
    "hidden": Rule(int, 1),
    "layers": Rule(int, 1),
    "dropout": Rule(float, 0.0, 1.0, hi_open=True),
    "input_dropout": Rule(float, 0.0, 1.0, hi_open=True),
    "alpha": Rule(float, 0.0, 1.0),
    "lambda_": Rule(float, 0.0, lo_open=True),
    "aggregator": Rule(str, choices=("mean", "gcn")),
    "ffn_multiplier": Rule(int, 1),
}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A validated launcher config. ``dataset``/``model`` are dicts with defaults filled."""

    dataset: dict
    model: dict
    train: TrainConfig
    rsc: Optional[RSCConfig]
    compare: bool
    distributed: Optional[DistConfig] = None
    minibatch: Optional[MiniBatchConfig] = None
    report: ReportConfig = dataclasses.field(default_factory=ReportConfig)

    @property
    def methods(self) -> tuple:
        """``("exact", "rsc")`` with ``compare``, else the one method the config trains."""
        if self.compare:
            return ("exact", "rsc")
        return ("rsc",) if self.rsc is not None else ("exact",)

    def to_dict(self) -> dict:
        """Plain dict (YAML/JSON-ready); :func:`resolve` of it gives this config again."""
        train = dataclasses.asdict(self.train)
        train["seeds"] = list(self.train.seeds)
        rsc = None if self.rsc is None else self.rsc.to_dict()
        dist = None if self.distributed is None else self.distributed.to_dict()
        mb = None if self.minibatch is None else self.minibatch.to_dict()
        return {"dataset": dict(self.dataset), "model": dict(self.model), "train": train,
                "rsc": rsc, "compare": self.compare, "distributed": dist,
                "minibatch": mb, "report": self.report.to_dict()}  # fmt: skip


def _section(raw: dict, name: str, allowed=None, where: str = "") -> dict:
    """A copy of section ``name`` (``{}`` when absent), keys checked against ``allowed``."""
    sec = raw.get(name)
    if sec is None:
        sec = {}
    if not isinstance(sec, dict):
        _fail(f"{name} must be a mapping of keys to values, got {type(sec).__name__} {sec!r}.")
    for key in sec if allowed is not None else ():
        if key not in allowed:
            _fail(unknown_key_message(str(key), allowed, where or name))
    return dict(sec)


def dataset_params(name: str) -> dict:
    """``{parameter: default}`` of dataset ``name``'s loader (``REQUIRED`` when it has none)."""
    registry = importlib.import_module("dgl_rsc.data").DATASETS
    if name not in registry:
        known = ", ".join(registry)
        _fail(f"dataset.name={name!r} is not a known dataset.{_nearest(name, registry)} "
              f"Known datasets: {known}.")  # fmt: skip
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {
        k: REQUIRED if p.default is inspect.Parameter.empty else p.default
        for k, p in inspect.signature(registry[name]).parameters.items()
        if p.kind in kinds and k not in LOADER_ARGS
    }


def _resolve_dataset(raw: dict) -> dict:
    name = _section(raw, "dataset").get("name")
    if not isinstance(name, str):
        _fail(f"dataset.name must be a dataset name (a string), got {name!r}.")
    params = dataset_params(name)
    sec = _section(raw, "dataset", ["name", "root", *params])
    out = {"name": name, "root": sec.get("root")}
    for key, default in params.items():
        if default is REQUIRED and key not in sec:
            _fail(f"dataset.{key} is required for dataset '{name}'.")
        value = sec.get(key, default)
        if value is not None and default not in (None, REQUIRED):
            value = check_value(f"dataset.{key}", value, Rule(type(default)))
        out[key] = value
    for key in PATH_KEYS:  # a relative path is relative to root when root is given
        if out.get(key) is not None and (key == "root" or out["root"] is None):
            path = check_value(f"dataset.{key}", out[key], Rule(str))
            out[key] = os.path.abspath(os.path.expanduser(path))
    return out


def _resolve_model(raw: dict) -> dict:
    name = _section(raw, "model").get("name")
    try:
        params = model_params(name)
    except ConfigError as exc:
        raise ConfigError(f"model.name: {exc}") from None
    sec = _section(raw, "model", ["name", *params], f"model (model.name={name})")
    out = {"name": name}
    for key, default in params.items():
        rule = MODEL_RULES.get(key, Rule(type(default)))
        out[key] = check_value(f"model.{key}", sec.get(key, default), rule)
    return out


def _resolve_train(raw: dict) -> TrainConfig:
    sec = _section(raw, "train", ["seed", *TRAIN_RULES])
    if "seed" in sec:
        if "seeds" in sec:
            _fail("train.seed and train.seeds are both set; keep one (seeds: [0, 1, 2]).")
        sec["seeds"] = [sec.pop("seed")]
    return TrainConfig(**{k: check_value(f"train.{k}", v, TRAIN_RULES[k]) for k, v in sec.items()})


def _resolve_rsc(raw: dict, steps_total: int, train: TrainConfig) -> Optional[RSCConfig]:
    if raw.get("rsc") is None:
        return None
    sec = _section(raw, "rsc")
    if train.stop == "plateau" and "switch_patience" not in sec:
        sec["switch_patience"] = default_switch_patience(train.patience)
    steps = sec.get("total_steps")
    if steps is not None and steps != steps_total:
        _fail(
            f"rsc.total_steps={steps!r} differs from the run's {steps_total} optimizer steps; "
            "the launcher sets it from train.epochs (times the batches per epoch in mini-batch "
            "training): remove rsc.total_steps."
        )
    sec["total_steps"] = steps_total
    for key, value in sec.items():
        if key == "budget" and value == "auto":
            continue  # the per-layer budget from rsc.target_error
        if isinstance(value, str) and key in ("budget", "switch_at", "ema", "target_error"):
            sec[key] = check_value(f"rsc.{key}", value, Rule(float))
    try:
        return RSCConfig.from_dict(sec, where="rsc")
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("RSCConfig.", "rsc.")) from None


def resolve(raw: Any) -> RunConfig:
    """Validate a parsed YAML document and fill in every default."""
    if not isinstance(raw, dict):
        _fail(f"a config must be a mapping with sections {', '.join(SECTIONS)}; got {raw!r}.")
    for key in raw:
        if key not in SECTIONS:
            _fail(unknown_key_message(str(key), SECTIONS, "the config (top level)"))
    for name in ("dataset", "model"):
        if raw.get(name) is None:
            _fail(f"the config needs a '{name}' section with at least '{name}.name'.")
    train = _resolve_train(raw)
    mb = resolve_minibatch(raw, train.mode, check_value, Rule)
    if train.mode == "saint" and train.batches_per_epoch is None:
        train = dataclasses.replace(train, batches_per_epoch=20)
    if train.mode == "cluster" and train.batches_per_epoch is not None:
        _fail("train.batches_per_epoch does not apply to cluster mode (num_parts / batch_size "
              "batches per epoch); remove it or use train.mode: saint.")  # fmt: skip
    steps = train.epochs * steps_per_epoch(train.mode, mb, train.batches_per_epoch)
    rsc = _resolve_rsc(raw, steps, train)
    compare = check_value("compare", raw.get("compare", False), Rule(bool))
    if compare and rsc is None:
        _fail("compare: true needs an rsc section (the RSC side of the comparison).")
    model = _resolve_model(raw)
    dist = resolve_distributed(raw, check_value, Rule, model)
    if dist is not None and train.engine != "native":
        _fail(f"train.engine={train.engine!r} cannot train distributed: use train.engine: native "
              "(dgl_rsc layers on each rank's local graph).")  # fmt: skip
    if _ENGINES[train.engine].needs_pyg:
        check_pyg(train, model)
    if dist is not None and train.mode != "full":
        _fail("mini-batch training (train.mode: cluster or saint) is not distributed; use one "
              "or the other.")  # fmt: skip
    check_precision(train, dist)
    check_compile(train, dist)
    check_node_order(train, dist)
    check_stop(train, rsc)
    report = resolve_report(raw, check_value, Rule)
    return RunConfig(_resolve_dataset(raw), model, train, rsc, compare, dist, mb, report)
