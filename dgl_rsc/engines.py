"""Engines: which convolutions run on which graph, and whether the DGL patch is active.

One vocabulary for :func:`dgl_rsc.models.build_model`, the launcher (``train.engine``) and
the benchmarks:

==========  ====================  ============  =================  =============
name        convolutions          graph         dgl_rsc.patch      approximates
==========  ====================  ============  =================  =============
``native``  ``dgl_rsc.nn``        ``Graph``     no                 yes
``dgl``     ``dgl_rsc.nn``        ``DGLGraph``  no                 yes
``patch``   ``dgl.nn`` (stock)    ``DGLGraph``  yes                yes
``stock``   ``dgl.nn`` (stock)    ``DGLGraph``  no                 no (baseline)
==========  ====================  ============  =================  =============
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from types import SimpleNamespace

from . import _deps

__all__ = ["Engine", "ENGINES", "get_engine", "conv_classes"]


@dataclasses.dataclass(frozen=True)
class Engine:
    """One engine.

    Attributes:
        name: the config name.
        convs: ``"rsc"`` (:mod:`dgl_rsc.nn`) or ``"dgl"`` (stock ``dgl.nn``).
        graph: ``"native"`` (:class:`dgl_rsc.graph.Graph`) or ``"dgl"`` (``DGLGraph``).
        patched: the model runs inside :func:`dgl_rsc.patch`.
        approximates: RSC can drive it (``False`` for the stock baseline).
        summary: one line for help texts.
    """

    name: str
    convs: str
    graph: str
    patched: bool
    approximates: bool
    summary: str

    @property
    def needs_dgl(self) -> bool:
        return self.convs == "dgl" or self.graph == "dgl"


ENGINES: dict[str, Engine] = {
    e.name: e
    for e in (
        Engine("native", "rsc", "native", False, True, "dgl_rsc layers on the DGL-free Graph"),
        Engine("dgl", "rsc", "dgl", False, True, "dgl_rsc layers on a DGLGraph"),
        Engine("patch", "dgl", "dgl", True, True, "stock dgl.nn layers inside dgl_rsc.patch"),
        Engine("stock", "dgl", "dgl", False, False, "stock dgl.nn layers, no dgl_rsc"),
    )
}


def get_engine(name: str) -> Engine:
    """The registered engine ``name``; a ``ValueError`` names the nearest known one."""
    if name not in ENGINES:
        near = difflib.get_close_matches(str(name), ENGINES, n=1)
        hint = f" Did you mean '{near[0]}'?" if near else ""
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {name!r}.{hint}")
    return ENGINES[name]


def conv_classes(engine: str) -> SimpleNamespace:
    """The ``GraphConv``, ``SAGEConv`` and ``GCN2Conv`` classes an engine builds models from."""
    e = get_engine(engine)
    if e.convs == "rsc":
        mod = importlib.import_module("dgl_rsc.nn")
    else:
        mod = _deps.require_dgl().nn.pytorch
    return SimpleNamespace(GraphConv=mod.GraphConv, SAGEConv=mod.SAGEConv, GCN2Conv=mod.GCN2Conv)
