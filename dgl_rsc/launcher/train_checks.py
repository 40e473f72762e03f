"""Checks of ``train`` options that depend on other sections: ``precision: int8``,
``compile``, ``node_order``, the PyG engines and ``stop``; each error says what to change."""

from __future__ import annotations

from ..base import _deps
from ..core.config import ConfigError

__all__ = [
    "STOPS", "check_precision", "check_compile", "check_node_order", "check_pyg", "check_stop",
    "default_switch_patience",
]  # fmt: skip

#: ``train.stop``: a fixed number of epochs, or until the validation metric plateaus
STOPS = ("fixed", "plateau")


def _fail(msg: str):
    raise ConfigError(msg)


def check_precision(train, dist) -> None:
    """``train.precision: int8`` runs dgl_rsc's own layers on one device, without AMP."""
    if train.precision != "int8":
        return
    if train.engine != "native":
        _fail(f"train.precision=int8 needs train.engine: native (dgl_rsc layers); got "
              f"train.engine={train.engine!r}.")  # fmt: skip
    if train.amp != "none":
        _fail(f"train.precision=int8 and train.amp={train.amp!r} both set the precision of the "
              "products; keep one (train.amp: none).")  # fmt: skip
    if dist is not None:
        _fail("train.precision=int8 is not supported in distributed training; use "
              "train.precision: fp32 with a distributed section.")  # fmt: skip


def check_compile(train, dist) -> None:
    """``train.compile: true`` compiles full-graph fp32 training of dgl_rsc's own layers on
    torch >= 2.4 (RSC's products as custom operators, :mod:`dgl_rsc.core.ops`)."""
    if not train.compile:
        return
    if _deps.TORCH_VERSION < (2, 4):
        major, minor = _deps.TORCH_VERSION
        _fail(f"train.compile=true needs torch >= 2.4 (torch.compile with torch.library custom "
              f"operators); this is torch {major}.{minor}. Set train.compile: false, or use "
              "an environment with a newer torch (make venv-modern).")  # fmt: skip
    if train.engine != "native":
        _fail(f"train.compile=true compiles dgl_rsc's own layers (train.engine: native); got "
              f"train.engine={train.engine!r}.")  # fmt: skip
    if train.precision != "fp32":
        _fail(f"train.compile=true runs fp32 products; got train.precision="
              f"{train.precision!r} (INT8 runs eagerly: set train.compile: false).")  # fmt: skip
    if train.mode != "full" or dist is not None:
        _fail("train.compile=true compiles full-graph training on one device; a mini-batch "
              "(train.mode) or distributed run recompiles per graph: set train.compile: "
              "false.")  # fmt: skip


def check_node_order(train, dist) -> None:
    """``train.node_order`` renumbers the nodes of a single-process run."""
    if train.node_order != "none" and dist is not None:
        _fail(f"train.node_order={train.node_order!r} renumbers the graph of a single-process "
              "run; a distributed run's partitioner (distributed.method) already groups each "
              "rank's nodes: set train.node_order: none.")  # fmt: skip


def default_switch_patience(patience: int) -> int:
    """RSC's plateau switch under ``train.stop: plateau`` when ``rsc.switch_patience`` is not
    set: a third of ``train.patience`` (at least 1; 0, off, when the patience is 1). The run's
    length is unknown in advance, so ``switch_at`` of the cap would come after most runs stop:
    the switch then fires on the first third of the stop's plateau, and the run trains at least
    the other two thirds exact before it stops."""
    return max(1, patience // 3) if patience >= 2 else 0


def check_stop(train, rsc) -> None:
    """``train.stop``: ``fixed`` trains ``train.epochs`` epochs; ``plateau`` stops a run once
    ``train.patience`` evaluations in a row (one every ``train.eval_every`` epochs) brought no
    validation metric above its best by more than ``train.min_delta`` (early stopping as
    Keras and PyG's examples know it, :class:`~dgl_rsc.core.plateau.Plateau`), with
    ``train.epochs`` as the cap. Every method (stock, exact, RSC) stops by the same rule; the
    report says per run whether it converged (stopped on its plateau; under ``fixed``: had
    plateaued by the end) or hit the cap. RSC's own plateau switch (``rsc.switch_patience``)
    must come before the run's stop."""
    if train.stop != "plateau" or rsc is None or not rsc.switch_patience:
        return
    if rsc.switch_patience >= train.patience:
        _fail(f"rsc.switch_patience={rsc.switch_patience} must be below train.patience="
              f"{train.patience} with train.stop: plateau: the run would stop on its plateau "
              "before RSC switches to the exact backward on it. Lower rsc.switch_patience or "
              "raise train.patience.")  # fmt: skip


def check_pyg(train, model: dict) -> None:
    """The PyG engines build gcn, sage (mean) and gcn2 for full-batch training."""
    where = f"train.engine={train.engine!r}"
    if train.mode != "full":
        _fail(f"{where} trains full-batch only, got train.mode={train.mode!r}; use "
              "train.mode: full or train.engine: native.")  # fmt: skip
    if model["name"] not in ("gcn", "sage", "gcn2"):
        _fail(f"{where} builds model gcn, sage or gcn2 from PyG's convs, got model.name="
              f"{model['name']!r}; use one of those or train.engine: native.")  # fmt: skip
    if model.get("aggregator", "mean") != "mean":
        _fail(f"{where} builds SAGE with PyG's mean SAGEConv, got model.aggregator="
              f"{model['aggregator']!r}; use aggregator: mean or engine native.")  # fmt: skip
