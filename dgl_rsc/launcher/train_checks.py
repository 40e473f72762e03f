"""Checks of ``train`` options that depend on other sections: ``precision: int8``,
``compile`` and ``node_order``; each error says what to change."""

from __future__ import annotations

from ..base import _deps
from ..core.config import ConfigError

__all__ = ["check_precision", "check_compile", "check_node_order"]


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
