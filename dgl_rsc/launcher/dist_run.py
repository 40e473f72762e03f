"""The distributed side of a launcher run: joining the process group and building this rank's
share of the data, and the per-epoch traffic of every rank (bytes by message kind, exchange
seconds) recorded with the epoch."""

from __future__ import annotations

import os
import types
from typing import Optional

import torch

from ..core.config import ConfigError
from .outputs import PARTITION_CACHE

__all__ = [
    "join",
    "check_same_config",
    "config_digest",
    "NODE_LOCAL_KEYS",
    "prepare_rank",
    "policies_for",
    "budget_for",
    "start_run",
    "traffic_now",
    "epoch_traffic",
    "dist_summary",
    "run_bytes",
]


#: what a distributed run reads of the dataset after its rank's share is built
_DATA_INFO = ("task", "metric", "num_classes", "num_nodes", "name")


#: config keys that may differ between nodes (paths and threads of each machine); the rest
#: must be the same on every rank (:func:`check_same_config`)
NODE_LOCAL_KEYS = ("dataset.root", "dataset.path", "distributed.partition_cache",
                   "train.threads")  # fmt: skip


def join(cfg):
    """Join the process group torch's launcher described, and check that every rank runs
    the same config; returns the :class:`~dgl_rsc.distributed.runtime.DistContext`."""
    from ..distributed.runtime import init_from_env, launched_by_torchrun

    d = cfg.distributed
    if not launched_by_torchrun():
        raise ConfigError(
            "the config has a distributed section but this process was not started by "
            "torch's launcher: run `dgl-rsc run CONFIG --nproc N` (or torchrun ... -m dgl_rsc "
            "run CONFIG), or set distributed: null to train on one process."
        )
    ctx = init_from_env(d.backend, cfg.train.device, d.timeout_s)
    check_same_config(cfg.to_dict(), ctx)
    return ctx


def _flat(tree: dict, head: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        key = f"{head}{k}"
        out.update(_flat(v, key + ".") if isinstance(v, dict) else {key: v})
    return out


def config_digest(config: dict) -> tuple:
    """``(sha256, flat config)`` of a resolved config without :data:`NODE_LOCAL_KEYS`."""
    import hashlib
    import json

    flat = {k: v for k, v in _flat(config).items() if k not in NODE_LOCAL_KEYS}
    text = json.dumps(flat, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest(), flat


def check_same_config(config: dict, ctx) -> None:
    """A ``ConfigError`` on every rank when a rank's resolved config differs from rank 0's
    (keys of :data:`NODE_LOCAL_KEYS` aside), naming the rank, its node and the keys."""
    import torch.distributed as dist

    every = [None] * ctx.world_size
    dist.all_gather_object(every, config_digest(config))
    for r, (digest, theirs) in enumerate(every):
        if digest != every[0][0]:
            base = every[0][1]
            keys = sorted(k for k in set(base) | set(theirs) if base.get(k) != theirs.get(k))
            diff = "; ".join(
                f"{k}: {theirs.get(k)!r} there, {base.get(k)!r} on rank 0" for k in keys[:5]
            )
            raise ConfigError(
                f"{ctx.where(r)} runs another config than rank 0 ({diff}); start every node "
                "with the same CONFIG and --set values."
            )


def prepare_rank(cfg, data, edges, name: str, out_dir: Optional[str], prepared_cls, ctx=None,
                 progress=None):  # fmt: skip
    """This rank's share of the experiment (the process group is joined here unless ``ctx``
    is given); ``progress(done, total)`` follows a long partition."""
    from ..distributed.algorithms import build_rank

    d = cfg.distributed
    ctx = ctx or join(cfg)
    parts = d.partitions or ctx.world_size
    default = os.path.join(out_dir, PARTITION_CACHE) if out_dir else None
    cache = d.partition_cache or default
    fwd, bwd = policies_for(d, ctx)
    share = build_rank(d, data, edges, ctx, parts=parts, cache_dir=cache,  # 1d or 1.5d
                       forward_policy=fwd, backward_policy=bwd,
                       budget=budget_for(d, ctx.rank), progress=progress)  # fmt: skip
    rd = share.data
    partition = {"quality": rd.quality, "file": rd.partition_file, "method": d.method,
                 "report": rd.partition_report}  # fmt: skip
    # the rank keeps its share only: the whole graph's features and edges (on the 200k preset
    # about 0.75 GB in every rank) are let go, with what the run still reads of the dataset
    info = types.SimpleNamespace(**{k: getattr(data, k) for k in _DATA_INFO})
    none = torch.empty(0, dtype=torch.int64)
    prep = prepared_cls(info, (none, none, edges[2]), rd.feat, rd.label, rd.masks, ctx.device,
                    data.fingerprint(), name, {"native": rd.graph}, share.reducer, ctx,
                    partition)  # fmt: skip
    prep.owned, prep.share = rd.owned, share
    return prep


def policies_for(d, ctx) -> tuple:
    """The forward and backward :class:`~dgl_rsc.distributed.codecs.BitPolicy` of the
    distributed section (the cost model measured over the group when asked)."""
    from ..distributed.bitwidth import CostModel
    from ..distributed.codecs import DEFAULT_COST, BitPolicy

    cost = DEFAULT_COST
    if d.cost_alpha is not None or d.cost_beta is not None:
        alpha = DEFAULT_COST.alpha if d.cost_alpha is None else d.cost_alpha  # 0 is a value
        beta = DEFAULT_COST.beta if d.cost_beta is None else d.cost_beta
        cost = CostModel(alpha, beta)
    elif "adaptive" in (d.forward_bits, d.backward_bits) and d.calibrate:
        from ..distributed.calibrate import calibrate

        cost = calibrate(timeout=d.timeout_s)
    gen = torch.Generator(device=ctx.device).manual_seed(d.seed * 7919 + ctx.rank)
    kw = dict(interval=d.adaptive_interval, weight=d.adaptive_weight,
              allowed=tuple(d.adaptive_bits), cost=cost, generator=gen)  # fmt: skip
    return BitPolicy(d.forward_bits, **kw), BitPolicy(d.backward_bits, **kw)


def budget_for(d, rank: int):
    """The rank's :class:`~dgl_rsc.distributed.budget_plan.CommBudget` for the section ``d``,
    or ``None`` where nothing is budgeted or sampled (``comm_budget`` 1.0, no fixed boundary
    rate): a width given for a direction is its only one, ``adaptive`` lets the budget pick
    among 32 bits and ``adaptive_bits``."""
    fixed_rate = not isinstance(d.boundary_sample, bool)
    if d.comm_budget >= 1.0 and not fixed_rate:
        return None
    from ..distributed.budget_plan import CommBudget
    from ..distributed.comm_budget import FRACTIONS

    def widths(spec):
        if spec != "adaptive":
            return (spec,)
        return tuple(sorted({32, *d.adaptive_bits}, reverse=True))

    rates = {False: (1.0,), True: FRACTIONS}.get(d.boundary_sample, (d.boundary_sample,))
    return CommBudget(d.comm_budget, widths(d.forward_bits), widths(d.backward_bits), rates,
                      interval=d.adaptive_interval, seed=d.seed, rank=rank)  # fmt: skip


def start_run(prep) -> None:
    """A new run on the same local graph: its bit-width choices, byte budget and reports
    start afresh."""
    if prep.dist is not None:
        ex = prep.graph("native").exchange
        ex.forward_policy.reset()
        ex.backward_policy.reset()
        if ex.budget is not None:
            ex.budget.reset(prep.dist.bytes.by_peer())
        prep.share.reset()


def traffic_now(prep):
    """This rank's byte counters and exchange timings so far, with the process's CPU
    seconds (``process_cpu``: what the rank computed and copied, waits excluded); ``None``
    on one process."""
    if prep.dist is None:
        return None
    import time

    timings = dict(prep.graph("native").exchange.timings)
    timings["process_cpu"] = time.process_time()
    return prep.dist.bytes.snapshot(), timings


def epoch_traffic(prep, before) -> dict:
    """Every rank's bytes by message kind and exchange seconds over the epoch just done:
    ``{"bytes": [per rank {kind: {sent, received, messages}}], "timings": [per rank]}``."""
    from ..distributed.controller import gather_rows
    from ..distributed.runtime import MESSAGE_KINDS, ByteCounter

    counts, times = traffic_now(prep)
    delta = ByteCounter.delta(counts, before[0])
    names = sorted(times)
    row = [float(delta[k][f]) for k in MESSAGE_KINDS for f in ("sent", "received", "messages")]
    row += [times[n] - before[1][n] for n in names]
    rows, _ = gather_rows(torch.tensor([row], dtype=torch.float64), prep.dist)
    per_rank_bytes, per_rank_times = [], []
    for r in rows.tolist():
        it = iter(r)
        per_rank_bytes.append({k: {f: int(next(it)) for f in ("sent", "received", "messages")}
                               for k in MESSAGE_KINDS})  # fmt: skip
        per_rank_times.append({n: next(it) for n in names})
    return {"bytes": per_rank_bytes, "timings": per_rank_times}


def dist_summary(prep, history: Optional[list] = None) -> Optional[dict]:
    """The run's distributed record: world, partition, bit widths, the algorithm and its
    grid, and the bytes by message kind over ``history`` (:func:`run_bytes`)."""
    if prep.dist is None:
        return None
    ex = prep.graph("native").exchange
    out = {"world_size": prep.dist.world_size, "partition": prep.partition,
           "forward_bits": ex.forward_policy.report(),
           "backward_bits": ex.backward_policy.report(),
           **prep.share.summary(), "bytes": run_bytes(history)}  # fmt: skip
    if ex.budget is not None:  # every rank's, gathered (all ranks call this)
        import torch.distributed as dist

        from ..distributed.budget_plan import combine_reports

        reports = [None] * prep.dist.world_size
        dist.all_gather_object(reports, ex.budget.report(prep.dist.bytes.by_peer()))
        out["comm_budget"] = combine_reports(reports)
    return out


def run_bytes(history: Optional[list]) -> Optional[dict]:
    """Bytes sent by message kind over a run's epochs (``history``, each with its ``dist``
    record): ``{"total": {kind: all ranks, all epochs}, "per_rank_epoch": [per rank {kind:
    mean per epoch}]}``, or ``None`` without history."""
    epochs = [h["dist"]["bytes"] for h in history or () if h.get("dist")]
    if not epochs:
        return None
    kinds = list(epochs[0][0])
    ranks = range(len(epochs[0]))
    per_rank = [{k: sum(e[r][k]["sent"] for e in epochs) / len(epochs) for k in kinds}
                for r in ranks]  # fmt: skip
    total = {k: sum(e[r][k]["sent"] for e in epochs for r in ranks) for k in kinds}
    return {"total": total, "per_rank_epoch": per_rank}
