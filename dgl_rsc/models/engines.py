"""Engines: which convolutions run on which graph, and whether the DGL patch is active.

One vocabulary for :func:`dgl_rsc.models.build_model`, the launcher (``train.engine``) and
the benchmarks:

=============  ===========================  ==============  ===========  ==============
name           convolutions                 graph           patched      approximates
=============  ===========================  ==============  ===========  ==============
``native``     ``dgl_rsc.nn``               ``Graph``       no           yes
``dgl``        ``dgl_rsc.nn``               ``DGLGraph``    no           yes
``patch``      ``dgl.nn`` (stock)           ``DGLGraph``    DGL patch    yes
``stock``      ``dgl.nn`` (stock)           ``DGLGraph``    no           no (baseline)
``pyg``        ``dgl_rsc.pyg``              ``edge_index``  no           yes
``pyg_patch``  ``torch_geometric.nn``       ``edge_index``  PyG patch    yes
``pyg_stock``  ``torch_geometric.nn``       ``edge_index``  no           no (baseline)
=============  ===========================  ==============  ===========  ==============

The ``pyg`` family builds the same models from PyG's convs through the adapters of
:mod:`dgl_rsc.pyg.models` (``GCNConv`` for ``GraphConv``, ``SAGEConv`` mean, ``GCN2Conv``);
its comparison baseline is ``pyg_stock`` (:attr:`Engine.baseline`).
"""

from __future__ import annotations

import dataclasses
import importlib
from types import SimpleNamespace

from ..base import _deps
from ..base.names import did_you_mean

__all__ = ["Engine", "ENGINES", "get_engine", "conv_classes"]


@dataclasses.dataclass(frozen=True)
class Engine:
    """One engine.

    Attributes:
        name: the config name.
        convs: ``"rsc"`` (:mod:`dgl_rsc.nn`), ``"dgl"`` (stock ``dgl.nn``), ``"pyg"``
            (:mod:`dgl_rsc.pyg`) or ``"pyg_stock"`` (stock ``torch_geometric.nn``).
        graph: ``"native"`` (:class:`dgl_rsc.Graph`), ``"dgl"`` (``DGLGraph``) or
            ``"pyg"`` (an ``edge_index (2, E)`` LongTensor).
        patched: the model runs inside its family's patch (:func:`dgl_rsc.patch` or
            :func:`dgl_rsc.pyg.patch`).
        approximates: RSC can drive it (``False`` for the stock baselines).
        summary: one line for help texts.
        family: ``"dgl"`` or ``"pyg"``: which stock library it is compared with.
    """

    name: str
    convs: str
    graph: str
    patched: bool
    approximates: bool
    summary: str
    family: str = "dgl"

    @property
    def needs_dgl(self) -> bool:
        return self.convs == "dgl" or self.graph == "dgl"

    @property
    def needs_pyg(self) -> bool:
        return self.family == "pyg"

    @property
    def baseline(self) -> str:
        """The stock engine a comparison reports this engine against."""
        return "pyg_stock" if self.family == "pyg" else "stock"


ENGINES: dict[str, Engine] = {
    e.name: e
    for e in (
        Engine("native", "rsc", "native", False, True, "dgl_rsc layers on the DGL-free Graph"),
        Engine("dgl", "rsc", "dgl", False, True, "dgl_rsc layers on a DGLGraph"),
        Engine("patch", "dgl", "dgl", True, True, "stock dgl.nn layers inside dgl_rsc.patch"),
        Engine("stock", "dgl", "dgl", False, False, "stock dgl.nn layers, no dgl_rsc"),
        Engine("pyg", "pyg", "pyg", False, True, "dgl_rsc.pyg layers on an edge_index", "pyg"),
        Engine(
            "pyg_patch",
            "pyg_stock",
            "pyg",
            True,
            True,
            "stock torch_geometric.nn layers inside dgl_rsc.pyg.patch",
            "pyg",
        ),  # fmt: skip
        Engine(
            "pyg_stock",
            "pyg_stock",
            "pyg",
            False,
            False,
            "stock torch_geometric.nn layers, no dgl_rsc",
            "pyg",
        ),  # fmt: skip
    )
}


def get_engine(name: str) -> Engine:
    """The registered engine ``name``; a ``ValueError`` names the nearest known one."""
    if name not in ENGINES:
        hint = did_you_mean(str(name), ENGINES)
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {name!r}.{hint}")
    return ENGINES[name]


def conv_classes(engine: str) -> SimpleNamespace:
    """The ``GraphConv``, ``SAGEConv`` and ``GCN2Conv`` classes an engine builds models from."""
    e = get_engine(engine)
    if e.convs == "rsc":
        mod = importlib.import_module("dgl_rsc.nn")
    elif e.family == "pyg":
        return importlib.import_module("dgl_rsc.pyg.models").adapters(stock=e.convs != "pyg")
    else:
        mod = _deps.require_dgl().nn.pytorch
    return SimpleNamespace(GraphConv=mod.GraphConv, SAGEConv=mod.SAGEConv, GCN2Conv=mod.GCN2Conv)
