"""Swap PyG's ``GCNConv``, ``SAGEConv`` (mean) and ``GCN2Conv`` for the drop-ins, in place.

:data:`TWINS` names which ``torch_geometric.nn`` class has a twin; the twin is a subclass of
PyG's class built with the same options; it takes over the old module's parameters, buffers
and train/eval mode (an optimizer built on the old parameters keeps working).
"""

from __future__ import annotations

import importlib
from types import MappingProxyType
from typing import Mapping, Optional

import torch
from torch import nn

from ..base import _deps
from ..dgl.nn.convert import attach as _attach
from ..dgl.nn.convert import rsc_layers, swap_children

__all__ = ["TWINS", "twin", "convert", "attach"]

#: ``torch_geometric.nn`` class name -> drop-in class name in :mod:`dgl_rsc.pyg.convs`.
TWINS: Mapping[str, str] = MappingProxyType(
    {"GCNConv": "GCNConv", "SAGEConv": "SAGEConv", "GCN2Conv": "GCN2Conv"}
)


def _pyg_name(module: nn.Module) -> Optional[str]:
    """The :data:`TWINS` key of ``module`` if it is exactly that PyG class (a subclass may
    override ``forward``: it is left alone), else ``None``."""
    name = type(module).__name__
    if name not in TWINS or not type(module).__module__.startswith("torch_geometric."):
        return None
    tg = _deps.require_torch_geometric()
    return name if type(module) is getattr(tg.nn, name, None) else None


def _options(name: str, m) -> tuple:
    """``(args, kwargs)`` that rebuild PyG conv ``m`` of class ``name`` with its options."""
    common = dict(aggr=m.aggr, flow=m.flow, node_dim=m.node_dim,
                  decomposed_layers=m.decomposed_layers)  # fmt: skip
    if name == "GCNConv":
        return (m.in_channels, m.out_channels), dict(
            improved=m.improved, cached=m.cached, add_self_loops=m.add_self_loops,
            normalize=m.normalize, bias=m.bias is not None, **common)  # fmt: skip
    if name == "SAGEConv":
        return (m.in_channels, m.out_channels), dict(
            normalize=m.normalize, root_weight=m.root_weight, project=m.project,
            bias=m.lin_l.bias is not None, **common)  # fmt: skip
    return (m.channels, m.alpha), dict(
        shared_weights=m.weight2 is None, cached=m.cached, add_self_loops=m.add_self_loops,
        normalize=m.normalize, **common)  # fmt: skip


def twin(module: nn.Module) -> Optional[nn.Module]:
    """The drop-in twin of the PyG conv ``module``, or ``None`` (another module, or a
    ``SAGEConv`` whose aggregation is not ``"mean"``).

    The twin is built with ``module``'s options (``GCN2Conv``'s ``beta`` included) and takes
    over its parameter and buffer objects (an optimizer built on them keeps working), its
    cached normalization and its train/eval mode; the global random state is untouched.
    """
    name = _pyg_name(module)
    if name is None or (name == "SAGEConv" and module.aggr != "mean"):
        return None
    cls = getattr(importlib.import_module(".convs", __package__), TWINS[name])
    args, kwargs = _options(name, module)
    with torch.random.fork_rng(devices=[]):
        new = cls(*args, **kwargs)
    if name == "GCN2Conv":
        new.beta = module.beta
    new.load_state_dict(module.state_dict())  # checks that names and shapes agree
    for kind in ("parameters", "buffers"):
        for key, tensor in getattr(module, f"named_{kind}")(remove_duplicate=False):
            owner, _, attr = key.rpartition(".")
            setattr(new.get_submodule(owner), attr, tensor)
    for attr in ("_cached_edge_index", "_cached_adj_t"):
        if hasattr(module, attr):
            setattr(new, attr, getattr(module, attr))
    new.train(module.training)
    return new


def convert(model: nn.Module) -> nn.Module:
    """Replace, in place, every PyG ``GCNConv``, ``SAGEConv`` (mean) and ``GCN2Conv`` of
    ``model`` by its :func:`twin` (weights kept). Returns ``model``; other modules
    (``SAGEConv`` with other aggregations included) are left untouched.

    Example (needs torch_geometric)::

        model = dgl_rsc.pyg.convert(model)
        rsc = dgl_rsc.pyg.attach(model, budget=0.1, total_steps=epochs)
    """
    return swap_children(model, twin)


def attach(model: nn.Module, config=None, **overrides):
    """Drive every RSC layer of ``model`` by one controller and return it (as
    :func:`dgl_rsc.nn.attach`: consecutive slots in module order); call ``rsc.step()`` once
    per optimizer step. ``config``: an :class:`~dgl_rsc.RSCConfig`, a controller or ``None``;
    ``overrides``: its fields (``budget=0.1``, ``total_steps=...``)."""
    if not rsc_layers(model):
        raise ValueError(
            "model has no dgl_rsc layers; build it with dgl_rsc.pyg convs or call "
            "dgl_rsc.pyg.convert(model) first (or use dgl_rsc.pyg.patch for a stock model)."
        )
    return _attach(model, config, **overrides)
