"""The DGL engine: DGL 2.1's ``ClusterGCNSampler`` and ``SAINTSampler`` under DGL's
``DataLoader``, seeded so that they draw what the native engine draws (:mod:`.samplers`).

DGL draws from process-wide generators: NumPy's global ``RandomState`` (the ``DataLoader``'s
shuffle), torch's default generator (the ``DataLoader``'s per-epoch draw, the node sampler,
the walk roots) and DGL's C++ RNG (the edge sampler, the walks). The first two are swapped
in from the epoch's own states only while DGL samples (:class:`_GlobalRngs`): the caller's
states are restored after every batch, and a training loop that draws between batches
changes nothing here. DGL's RNG has no state to save: modes ``'edge'`` and ``'walk'`` call
``dgl.random.seed(derive_seed(seed, stream, epoch, index))`` before each batch, which
leaves DGL's RNG reseeded for the caller.

DGL samples in this process (``num_workers=0``); edges are put in ascending global id, the
order the native engine yields (DGL's ``subgraph`` orders them by its CSR).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import warnings
from typing import Callable, Iterator, Optional

import numpy as np
import torch

from ..base import _deps
from .batch import SubgraphBatch, derive_seed

__all__ = ["DGLCluster", "DGLSaint"]

# DGL warns at every epoch that CPU affinity is off; its fix (enable_cpu_affinity) needs
# worker processes, and this engine samples in the main process.
_AFFINITY_WARNING = "Dataloader CPU affinity opt is not enabled"


class _GlobalRngs:
    """An epoch's NumPy and torch RNG states, put into the global generators on demand."""

    def __init__(self, seed: int):
        self.numpy = np.random.RandomState(seed).get_state()
        self.torch = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def active(self):
        """Run the block on these states, keep what it drew, restore the caller's."""
        caller_numpy = np.random.get_state()  # noqa: NPY002 (DGL draws from the global one)
        caller_torch = torch.get_rng_state()
        np.random.set_state(self.numpy)  # noqa: NPY002
        torch.set_rng_state(self.torch)
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_AFFINITY_WARNING)
                yield
        finally:
            self.numpy = np.random.get_state()  # noqa: NPY002
            self.torch = torch.get_rng_state()
            np.random.set_state(caller_numpy)  # noqa: NPY002
            torch.set_rng_state(caller_torch)


def _as_batch(sg, epoch: int, index: int) -> SubgraphBatch:
    dgl = _deps.require_dgl()
    src, dst = sg.edges()
    eids = sg.edata[dgl.EID].long()
    order = torch.argsort(eids)
    nodes = sg.ndata[dgl.NID].long()
    return SubgraphBatch(nodes, src[order].long(), dst[order].long(), eids[order], epoch, index)


def _run(
    loader, rngs: _GlobalRngs, epoch: int, dgl_seed: Optional[Callable[[int], int]] = None
) -> Iterator[SubgraphBatch]:
    """The batches of one DGL ``DataLoader`` epoch; ``dgl_seed(index)`` reseeds DGL's RNG."""
    dgl = _deps.require_dgl()
    with rngs.active():
        it = iter(loader)  # the shuffle and torch's per-epoch draw happen here
    for index in itertools.count():
        if dgl_seed is not None:
            dgl.random.seed(dgl_seed(index))
        with rngs.active():
            sg = next(it, None)
        if sg is None:
            return
        yield _as_batch(sg, epoch, index)


class DGLCluster:
    """Cluster-GCN through ``dgl.dataloading.ClusterGCNSampler``, given our partition.

    DGL's constructor either runs METIS or unpickles a cache file; neither is wanted (our
    clusters, and no file that could run code), so the sampler is made without its
    constructor and given the layout's arrays, the two attributes its ``sample`` reads
    (DGL 2.1's ``partition_offset`` and ``partition_node_ids``)."""

    def __init__(self, src, dst, num_nodes, layout, batch_size, shuffle, seed, layout_file):
        dgl = _deps.require_dgl()
        self.graph = dgl.graph((src, dst), num_nodes=num_nodes)
        self.num_parts, self.batch_size, self.shuffle = layout.num_parts, batch_size, shuffle
        self.seed = seed
        self.sampler = _given_clusters(dgl, layout)

    def batches(self, stream: int, epoch: int) -> Iterator[SubgraphBatch]:
        dgl = _deps.require_dgl()
        loader = dgl.dataloading.DataLoader(  # a new one per epoch: DGL shuffles in place
            self.graph,
            torch.arange(self.num_parts),
            self.sampler,
            batch_size=self.batch_size,
            shuffle=self.shuffle,
            drop_last=False,
            num_workers=0,
        )
        return _run(loader, _GlobalRngs(derive_seed(self.seed, stream, epoch)), epoch)


def _given_clusters(dgl, layout):
    """A ``ClusterGCNSampler`` holding ``layout`` (no METIS run, no cache file read)."""
    cls = dgl.dataloading.ClusterGCNSampler
    sampler = cls.__new__(cls)
    dgl.dataloading.Sampler.__init__(sampler)
    sampler.partition_offset, sampler.partition_node_ids = layout.offsets, layout.node_ids
    sampler.prefetch_ndata, sampler.prefetch_edata, sampler.output_device = [], [], None
    return sampler


class DGLSaint:
    """GraphSAINT through ``dgl.dataloading.SAINTSampler`` (one subgraph per batch)."""

    def __init__(self, src, dst, num_nodes, mode, budget, batches_per_epoch, seed):
        dgl = _deps.require_dgl()
        self.graph = dgl.graph((src, dst), num_nodes=num_nodes)
        self.sampler = dgl.dataloading.SAINTSampler(mode, budget)
        self.batches_per_epoch, self.seed = batches_per_epoch, seed
        self.uses_dgl_rng = mode in ("edge", "walk")

    def batches(self, stream: int, epoch: int) -> Iterator[SubgraphBatch]:
        dgl = _deps.require_dgl()
        loader = dgl.dataloading.DataLoader(
            self.graph,
            torch.arange(self.batches_per_epoch),
            self.sampler,
            batch_size=1,
            shuffle=False,
            num_workers=0,
        )
        dgl_seed = functools.partial(derive_seed, self.seed, stream, epoch)
        dgl_seed = dgl_seed if self.uses_dgl_rng else None
        return _run(loader, _GlobalRngs(derive_seed(self.seed, stream, epoch)), epoch, dgl_seed)
