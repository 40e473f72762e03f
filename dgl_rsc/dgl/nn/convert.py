"""Swap DGL's convolutions for dgl_rsc's (parameters kept) and attach a controller.

:data:`TWINS` is the one table of which ``dgl.nn`` class has which drop-in twin; a twin is
built by its class method ``from_dgl(conv)`` (``None`` declines, e.g. ``SAGEConv`` "pool").
The conformance tests walk the same table.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping, Optional, Union

import torch
from torch import nn

from ...base import _deps
from ...core.config import RSCConfig, warn_never_exact
from ...core.controller import RSCController
from ._base import RSCLayer
from .chebconv import ChebConv
from .gcn2conv import GCN2Conv
from .graphconv import GraphConv
from .sageconv import SAGEConv

__all__ = ["TWINS", "twin", "convert", "attach", "exact", "rsc_layers"]

#: ``dgl.nn`` class name -> drop-in class (built from the DGL layer by ``from_dgl``).
TWINS: Mapping[str, type] = MappingProxyType(
    {
        "GraphConv": GraphConv,
        "SAGEConv": SAGEConv,
        "GCN2Conv": GCN2Conv,
        "ChebConv": ChebConv,
    }
)


def _dgl_class(module: nn.Module) -> Optional[str]:
    """The :data:`TWINS` key of ``module`` if it is exactly that ``dgl.nn`` class (a subclass
    may override ``forward``: it is left alone), else ``None``."""
    name = type(module).__name__
    if name not in TWINS or not type(module).__module__.startswith("dgl."):
        return None
    dglnn = _deps.require_dgl().nn.pytorch
    return name if type(module) is getattr(dglnn, name, None) else None


def twin(module: nn.Module) -> Optional[RSCLayer]:
    """The drop-in twin of the ``dgl.nn`` layer ``module``, or ``None`` if it has none.

    The twin takes over ``module``'s parameter and buffer objects (same values, dtype,
    device and ``requires_grad``; an optimizer built on them keeps working) and its
    train/eval mode. Building it leaves the global random state untouched.
    """
    name = _dgl_class(module)
    if name is None:
        return None
    with torch.random.fork_rng(devices=[]):
        new = TWINS[name].from_dgl(module)
    if new is None:
        return None
    new.load_state_dict(module.state_dict())  # checks that names and shapes agree
    for kind in ("parameters", "buffers"):
        for key, tensor in getattr(module, f"named_{kind}")(remove_duplicate=False):
            owner, _, attr = key.rpartition(".")
            setattr(new.get_submodule(owner), attr, tensor)
    new.train(module.training)
    return new


def convert(model: nn.Module) -> nn.Module:
    """Replace, in place, every ``dgl.nn`` layer of ``model`` that has a twin in
    :data:`TWINS` (``GraphConv``, ``SAGEConv`` mean/gcn, ``GCN2Conv``, ``ChebConv``) by
    that twin, which takes over its parameters (see :func:`twin`). Returns ``model``.
    Other modules (including ``SAGEConv`` with pool/lstm) are left untouched."""
    return swap_children(model, twin)


def swap_children(model: nn.Module, make_twin) -> nn.Module:
    """Replace, in place and recursively, every submodule ``m`` of ``model`` for which
    ``make_twin(m)`` returns a module by that module (the front ends' ``convert``)."""
    if make_twin(model) is not None:
        raise TypeError("convert() swaps submodules; wrap a lone conv in a model first.")
    for name, child in list(model.named_children()):
        new = make_twin(child)
        if new is not None:
            setattr(model, name, new)
        else:
            swap_children(child, make_twin)
    return model


def rsc_layers(model: nn.Module) -> list[RSCLayer]:
    """The RSC layers of ``model`` in ``model.modules()`` order."""
    return [m for m in model.modules() if isinstance(m, RSCLayer)]


def attach(
    model: nn.Module, config: Union[None, RSCConfig, RSCController] = None, **overrides
) -> RSCController:
    """Drive every RSC layer of ``model`` by one controller and return it; call
    ``rsc.step()`` once per optimizer step.

    Layers get consecutive controller slots in module order, ``rsc_products`` each (a
    ``GraphConv`` one, a ``ChebConv`` with ``k`` terms ``k - 1``). ``config``: an
    :class:`RSCConfig`, an existing :class:`RSCController` (then no ``overrides``) or
    ``None``; ``overrides``: :class:`RSCConfig` fields (``budget=0.1``, ...).
    """
    layers = rsc_layers(model)
    if not layers:
        raise ValueError(
            "model has no dgl_rsc layers; build it with dgl_rsc.nn convs or call "
            "dgl_rsc.nn.convert(model) first."
        )
    if isinstance(config, RSCController):
        if overrides:
            raise TypeError(
                "pass either an RSCController or RSCConfig fields, not both: "
                f"got the controller and {sorted(overrides)}."
            )
        ctl = config
    else:
        ctl = RSCController(config, **overrides)
    warn_never_exact(ctl.config, "dgl_rsc.nn.attach()")
    index = 0
    for layer in layers:
        layer.rsc_attach(ctl, index)
        index += layer.rsc_products
    return ctl


def exact(model: nn.Module) -> nn.Module:
    """Give every RSC layer of ``model`` the exact backward (the baseline of a comparison:
    same layers, same sparse engine, no sampling, no warning). :func:`attach` undoes it."""
    for layer in rsc_layers(model):
        layer.rsc_exact()
    return model
