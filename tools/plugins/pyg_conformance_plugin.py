"""pytest plugin of tools/pyg_conformance.py: runs PyG's conv tests on dgl_rsc.pyg.

Loaded with ``-p pyg_conformance_plugin`` before PyG's test modules are imported. The mode
comes from ``DGL_RSC_PYG_MODE``:

- ``stock``: nothing changes (the reference run);
- ``swapped``: ``torch_geometric.nn.GCNConv``, ``SAGEConv`` and ``GCN2Conv`` (and their
  ``torch_geometric.nn.conv`` names) become the dgl_rsc.pyg drop-ins, each attached at
  construction to its own controller at budget 1.0 with no warm-up, so that every backward
  runs RSC's sampled path;
- ``patched``: every test runs inside ``dgl_rsc.pyg.patch(budget=1.0, warmup_steps=0)``.
"""

import os

import pytest
import torch_geometric.nn as tgnn
import torch_geometric.nn.conv as tgconv

import dgl_rsc.pyg as rp

MODE = os.environ.get("DGL_RSC_PYG_MODE", "stock")
RSC = dict(budget=1.0, warmup_steps=0)


class GCNConv(rp.GCNConv):
    # propagate_type: (x: Tensor, edge_weight: OptTensor)
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        rp.attach(self, **RSC)


class SAGEConv(rp.SAGEConv):
    # propagate_type: (x: OptPairTensor)
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        rp.attach(self, **RSC)


class GCN2Conv(rp.GCN2Conv):
    # propagate_type: (x: Tensor, edge_weight: OptTensor)
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        rp.attach(self, **RSC)


if MODE == "swapped":
    for cls in (GCNConv, SAGEConv, GCN2Conv):
        setattr(tgnn, cls.__name__, cls)
        setattr(tgconv, cls.__name__, cls)


@pytest.fixture(autouse=True)
def _rsc_patch():
    if MODE != "patched":
        yield
        return
    with rp.patch(**RSC):
        yield
