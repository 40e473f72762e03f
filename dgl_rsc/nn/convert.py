"""Swap DGL's convolutions for dgl_rsc's (weights kept) and attach a controller."""

from __future__ import annotations

from typing import Optional, Union

from torch import nn

from .. import _deps
from ..config import RSCConfig
from ..controller import RSCController
from ._base import RSCLayer
from .gcn2conv import GCN2Conv
from .graphconv import GraphConv
from .sageconv import SAGEConv

__all__ = ["convert", "attach", "exact", "rsc_layers"]


def _from_dgl(module: nn.Module) -> Optional[nn.Module]:
    """The dgl_rsc twin of a DGL conv with the same weights, or ``None``."""
    dglnn = _deps.require_dgl().nn.pytorch
    if isinstance(module, dglnn.GraphConv):
        new = GraphConv(
            module._in_feats,
            module._out_feats,
            norm=module._norm,
            weight=module.weight is not None,
            bias=module.bias is not None,
            activation=module._activation,
            allow_zero_in_degree=module._allow_zero_in_degree,
        )
    elif isinstance(module, dglnn.SAGEConv) and module._aggre_type in ("mean", "gcn"):
        new = SAGEConv(
            (module._in_src_feats, module._in_dst_feats),
            module._out_feats,
            module._aggre_type,
            feat_drop=module.feat_drop.p,
            bias=getattr(module, "bias", None) is not None
            or getattr(getattr(module, "fc_self", None), "bias", None) is not None,
            norm=module.norm,
            activation=module.activation,
        )
    elif isinstance(module, dglnn.GCN2Conv):
        new = GCN2Conv(
            module._in_feats,
            layer=1,
            alpha=module.alpha,
            project_initial_features=module._project_initial_features,
            allow_zero_in_degree=module._allow_zero_in_degree,
            bias=module._bias,
            activation=module._activation,
        )
        new.beta = module.beta
    else:
        return None
    new.load_state_dict(module.state_dict())
    new.train(module.training)
    param = next(module.parameters(), None)
    return new.to(param.device) if param is not None else new


def convert(model: nn.Module) -> nn.Module:
    """Replace, in place, every ``dgl.nn`` ``GraphConv``, ``SAGEConv`` (mean/gcn) and
    ``GCN2Conv`` of ``model`` by its dgl_rsc twin, carrying the weights over. Returns
    ``model``. Other modules (including ``SAGEConv`` with pool/lstm) are left untouched."""
    if _from_dgl(model) is not None:
        raise TypeError("convert() swaps submodules; wrap a lone conv in a model first.")
    for name, child in list(model.named_children()):
        new = _from_dgl(child)
        if new is not None:
            setattr(model, name, new)
        else:
            convert(child)
    return model


def rsc_layers(model: nn.Module) -> list[RSCLayer]:
    """The RSC layers of ``model`` in ``model.modules()`` order."""
    return [m for m in model.modules() if isinstance(m, RSCLayer)]


def attach(
    model: nn.Module, config: Union[None, RSCConfig, RSCController] = None, **overrides
) -> RSCController:
    """Drive every RSC layer of ``model`` by one controller (layer ``i`` is the ``i``-th
    layer in module order) and return it; call ``rsc.step()`` once per optimizer step."""
    layers = rsc_layers(model)
    if not layers:
        raise ValueError(
            "model has no dgl_rsc layers; build it with dgl_rsc.nn convs or call "
            "dgl_rsc.nn.convert(model) first."
        )
    ctl = config if isinstance(config, RSCController) else RSCController(config, **overrides)
    for i, layer in enumerate(layers):
        layer.rsc_attach(ctl, i)
    return ctl


def exact(model: nn.Module) -> nn.Module:
    """Give every RSC layer of ``model`` the exact backward (the baseline of a comparison:
    same layers, same sparse engine, no sampling). :func:`attach` undoes it."""
    for layer in rsc_layers(model):
        layer.rsc_exact()
    return model
