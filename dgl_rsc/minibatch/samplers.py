"""Cluster-GCN and GraphSAINT loaders with two engines that yield the same batches.

``engine="dgl"`` runs DGL's ``ClusterGCNSampler`` / ``SAINTSampler`` under DGL's
``DataLoader`` (:mod:`.dgl_samplers`); ``engine="native"`` (here) makes the same random draws
with NumPy and torch, so that for a seed both yield the same :class:`.SubgraphBatch` es:

- Epoch ``e`` of a stream draws from ``s = derive_seed(seed, stream, e)``. DGL's
  ``DataLoader`` shuffles with NumPy's global ``RandomState`` (``np.random.shuffle``) and
  torch's ``DataLoader`` draws one int64 from torch's default generator when an epoch
  starts; GraphSAINT's node sampler (``torch.multinomial``) and its walk roots
  (``torch.randint``) then draw from that generator. The native engine makes these draws
  from ``RandomState(s)`` and ``torch.Generator().manual_seed(s)``; the DGL engine puts
  ``s``'s states into the global generators while DGL samples.
- DGL's edge sampler (``dgl.random.choice``) and its random walks draw from DGL's C++ RNG,
  which torch cannot replay: both engines seed those draws per batch with
  ``derive_seed(seed, stream, e, index)``, the native one from its own torch generator. In
  modes ``'edge'`` and ``'walk'`` the engines therefore agree in distribution (the same
  edge probabilities, the same walk roots), not batch for batch.
- Cluster-GCN: both engines use one partition (pymetis, or the one passed in), which the
  DGL engine puts into ``ClusterGCNSampler`` directly: no file is handed to DGL, which would
  unpickle it. The optional cache file (:mod:`.clusters`) is an npz read without pickle.

The loaders live one per module (:mod:`.cluster_loader`, :mod:`.saint_loader`) over
:mod:`.loader_base`; this module is their registry.
"""

from __future__ import annotations

from ..base.names import unknown
from .cluster_loader import ENGINES as _CLUSTER_ENGINES
from .cluster_loader import ClusterLayout, ClusterLoader
from .clusters import metis_clusters
from .loader_base import PRESAMPLE, TRAIN
from .saint_loader import ENGINES as _SAINT_ENGINES
from .saint_loader import SAINT_MODES, SaintLoader

__all__ = [
    "ClusterLoader",
    "SaintLoader",
    "ClusterLayout",
    "SAMPLERS",
    "ENGINES",
    "SAINT_MODES",
    "TRAIN",
    "PRESAMPLE",
    "metis_clusters",
    "build_loader",
]

#: the engines every sampler has: ``"native"`` and ``"dgl"``
ENGINES = tuple(e for e in _CLUSTER_ENGINES if e in _SAINT_ENGINES)

#: ``name -> loader class``
SAMPLERS = {"cluster": ClusterLoader, "saint": SaintLoader}


def build_loader(name: str, **kwargs):
    """``SAMPLERS[name](**kwargs)``, with an error naming the nearest sampler."""
    if name not in SAMPLERS:
        raise unknown("sampler", name, SAMPLERS)
    return SAMPLERS[name](**kwargs)
