"""Mini-batch training epochs of the launcher (``train.mode: cluster | saint``).

An epoch is one optimizer step per batch of the run's loader (:mod:`dgl_rsc.minibatch`: the
DGL engine's or the native one, the same batches for a seed); RSC's controller steps with
each, so ``rsc.switch_at`` counts optimizer steps across batches. A batch's graph is kept by
its key, so a subgraph that comes back (Cluster-GCN with ``shuffle: false``) is the same
graph object, whose RSC state (scores, cached sample) the layer states find again; a batch
never sees another batch's sample, as samples are keyed by the graph's structure.

GraphSAINT's normalization (``minibatch.normalize``): the loss is ``sum node_norm[v] L_v`` over
the batch's training nodes, and every aggregation weights edge ``u -> v`` by ``edge_norm[e]``
on the full graph's normalized adjacency. The convolutions normalize by the degrees of the
graph they are given (the subgraph's), so the edge weight passed to them also undoes that:
``sqrt(d_out_sub(u) d_in_sub(v) / (d_out(u) d_in(v)))`` for GCN-type layers and
``d_in_sub(v) / d_in(v)`` for mean aggregation. Evaluation stays full-graph. The weights are
estimated from pre-sampled batches once per seed. The loader of a seed (with those weights,
its edges grouped by source, its clusters) is built once and shared by the methods of the run
(``prep.loaders``), METIS's clusters once per experiment (``prep.mb_partition``); each is a
setup phase, shown on stderr when it runs past a few seconds, its seconds in
``prep.setup_s`` (``results.json``: ``environment.setup_s``).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from typing import Optional

import torch
import torch.nn.functional as F

from ..base.progress import Phase
from ..core.config import ConfigError
from ..models.engines import get_engine

__all__ = ["BatchSource", "minibatch_epoch", "aggregation_kind"]


def aggregation_kind(model_cfg: dict) -> Optional[str]:
    """How the model normalizes its aggregation: ``"both"`` (GCN), ``"mean"`` (SAGE mean),
    or ``None`` when GraphSAINT's aggregation normalization does not apply to it."""
    name = model_cfg["name"]
    if name in ("gcn", "resgcn"):
        return "both"
    if name == "sage" and model_cfg.get("aggregator", "mean") == "mean":
        return "mean"
    return None


class BatchSource:
    """The batches of one run: its loader and the graphs of the batches seen.

    Args:
        cfg: the run's config (``train.mode``, ``minibatch``, ``train.engine``).
        prep: the experiment's full-graph data (edges with self-loops when the model wants).
        seed: the run's seed (batch order and SAINT draws).
        keep: batch graphs kept by key (the subgraph cache).
        graph_kind: the kind of graph the run's model takes (``"native"`` or ``"dgl"``, the
            run's engine's :attr:`~dgl_rsc.models.engines.Engine.graph`); default:
            ``train.engine``'s.
            The stock baseline passes ``"dgl"``: its ``dgl.nn`` layers need ``DGLGraph``
            batches, drawn by the same loader as the other methods' (the same batches).
    """

    def __init__(self, cfg, prep, seed: int, keep: int = 64, graph_kind: Optional[str] = None):
        mb, t = cfg.minibatch, cfg.train
        loader_kind = get_engine(t.engine).graph
        self.mode, self.kind = t.mode, graph_kind or loader_kind
        engine = "native" if loader_kind == "native" else "dgl"
        if t.mode == "saint":
            self.norm_kind = aggregation_kind(cfg.model) if mb.normalize else None
            if mb.normalize and self.norm_kind is None:
                raise ConfigError(
                    f"minibatch.normalize needs a model that aggregates with GCN's or a mean "
                    f"normalization (gcn, resgcn, sage mean), not {cfg.model['name']}; set "
                    "minibatch.normalize: false."
                )
        # one loader per seed, shared by the methods (the batches are a function of the seed
        # and the epoch alone): its structures (edges by source, clusters) are built once
        shared = prep.__dict__.setdefault("loaders", {})
        if seed not in shared:
            shared.clear()  # runs go seed by seed: the previous seed's loader is done
            shared[seed] = _loader(cfg, prep, seed, engine)
        self.loader = shared[seed]
        self.normalize = t.mode == "saint" and mb.normalize
        self.deg_in, self.deg_out = _degrees(prep)
        self.graphs: OrderedDict = OrderedDict()
        self.keep = max(int(keep), 1)
        self.graph_hits = self.graph_misses = 0

    def graph(self, batch, device):
        """The batch's graph, the same object each time the same subgraph comes back."""
        g = self.graphs.get(batch.key)
        if g is not None:
            self.graph_hits += 1
            self.graphs.move_to_end(batch.key)
            return g
        self.graph_misses += 1
        g = (batch.to_graph() if self.kind == "native" else batch.to_dgl()).to(device)
        self.graphs[batch.key] = g
        while len(self.graphs) > self.keep:
            self.graphs.popitem(last=False)
        return g

    def edge_weight(self, batch) -> Optional[torch.Tensor]:
        """GraphSAINT's aggregation weights of the batch's edges (``None`` without them)."""
        if not self.normalize or batch.edge_norm is None:
            return None
        gsrc, gdst = batch.nodes[batch.src], batch.nodes[batch.dst]
        m = batch.nodes.numel()
        sub_in = torch.bincount(batch.dst, minlength=m).clamp(min=1).float()[batch.dst]
        sub_out = torch.bincount(batch.src, minlength=m).clamp(min=1).float()[batch.src]
        if self.norm_kind == "mean":
            fix = sub_in / self.deg_in[gdst]
        else:
            fix = torch.sqrt(sub_out * sub_in / (self.deg_out[gsrc] * self.deg_in[gdst]))
        return batch.edge_norm.float() * fix


def _loader(cfg, prep, seed: int, engine: str):
    """The run's loader for ``seed``: METIS's clusters once per experiment, GraphSAINT's
    weights once per seed, each a setup phase (``prep.setup_s``, progress on stderr)."""
    from ..minibatch.samplers import ClusterLoader, SaintLoader

    mb, t = cfg.minibatch, cfg.train
    src, dst, n = prep.edges
    if t.mode == "cluster":
        part = getattr(prep, "mb_partition", None)
        desc = "setup: METIS clusters" if part is None else f"setup: loader, seed {seed}"
        key = "cluster_partition" if part is None else f"loader_seed{seed}"
        with Phase(desc, prep.setup_s, key, enabled=prep.progress):
            loader = ClusterLoader(src, dst, n, mb.num_parts, mb.batch_size, seed=seed,
                                   engine=engine, shuffle=mb.shuffle, partition=part)  # fmt: skip
        if part is None:  # METIS once per experiment; later seeds reuse the clusters
            prep.mb_partition = _partition_of(loader.layout, n)
        return loader
    key = f"saint_presample_seed{seed}" if mb.normalize else f"loader_seed{seed}"
    what = "GraphSAINT weights" if mb.normalize else "loader"
    with Phase(f"setup: {what}, seed {seed}", prep.setup_s, key,
               enabled=prep.progress) as phase:  # fmt: skip
        return SaintLoader(src, dst, n, mb.sampler, mb.budget, t.batches_per_epoch, seed=seed,
                           engine=engine, normalize=mb.normalize,
                           num_presample=mb.num_presample,
                           num_loss_nodes=int(prep.masks["train"].sum()),
                           progress=phase.update)  # fmt: skip


def _degrees(prep) -> tuple:
    """``(N,)`` in- and out-degrees of the full graph (at least 1), once per experiment."""
    if "degrees" not in prep.__dict__:
        src, dst, n = prep.edges
        prep.degrees = tuple(torch.bincount(e, minlength=n).clamp(min=1).float()
                             for e in (dst, src))  # fmt: skip
    return prep.degrees


def _partition_of(layout, n: int) -> torch.Tensor:
    """``(N,)`` cluster id of each node of a :class:`~dgl_rsc.minibatch.samplers.ClusterLayout`."""
    sizes = layout.offsets[1:] - layout.offsets[:-1]
    part = torch.empty(n, dtype=torch.long)
    part[layout.node_ids.long()] = torch.repeat_interleave(torch.arange(sizes.numel()), sizes)
    return part


def minibatch_epoch(run, prep, source: BatchSource, epoch: int) -> dict:
    """One epoch of optimizer steps, one per batch; times summed over the batches (seconds),
    ``loss`` the mean of the batches' losses."""
    dev, task = prep.device, prep.data.task
    out = {"loss": 0.0, "epoch_s": 0.0, "forward_s": 0.0, "backward_s": 0.0, "step_s": 0.0,
           "minor_faults": 0}  # fmt: skip
    steps = nodes = 0
    for batch in source.loader.epoch(epoch - 1):
        t0 = time.perf_counter()  # the batch's graph and features count as its forward
        graph = source.graph(batch, dev)
        idx = batch.nodes.to(dev)
        mask = prep.masks["train"][idx]
        if not bool(mask.any()):
            continue  # no training node in this batch: no loss, no step
        ew = source.edge_weight(batch)
        feat = prep.feat[idx]
        kw = {} if ew is None else {"edge_weight": ew}

        def forward_loss(graph=graph, feat=feat, kw=kw, idx=idx, mask=mask, batch=batch):
            logits = run.model(graph, feat, **kw)
            return _batch_loss(task, logits[mask].float(), prep.label[idx][mask], batch, mask,
                               source)  # fmt: skip

        # the same step as full-graph training; a batch's loss is too noisy for the guard
        step = run.train_step(forward_loss, prep.reducer, dev, feed_guard=False, start=t0)
        if not math.isfinite(step["loss"]):
            return {**out, "loss": step["loss"]}
        for k in ("forward_s", "backward_s", "step_s", "epoch_s", "loss", "minor_faults"):
            out[k] += step[k]
        steps += 1
        nodes += idx.numel()
    out["loss"] /= max(steps, 1)
    out.update(batches=steps, batch_nodes=nodes / max(steps, 1),
               graph_hits=source.graph_hits, graph_misses=source.graph_misses)  # fmt: skip
    return out


def _batch_loss(task, logits, label, batch, mask, source) -> torch.Tensor:
    if source.normalize and batch.node_norm is not None:
        w = batch.node_norm.to(logits.device)[mask.cpu() if not mask.is_cuda else mask]
        if task == "multilabel":
            per = F.binary_cross_entropy_with_logits(
                logits, label.to(logits.dtype), reduction="none"
            ).mean(1)
        else:
            per = F.cross_entropy(logits, label, reduction="none")
        return (w.to(per.dtype) * per).sum()
    if task == "multilabel":
        return F.binary_cross_entropy_with_logits(logits, label.to(logits.dtype))
    return F.cross_entropy(logits, label)
