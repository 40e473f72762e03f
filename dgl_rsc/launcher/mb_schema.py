"""``train.mode`` and the ``minibatch`` section of a launcher config.

::

    train:
      mode: cluster          # full (default), cluster (Cluster-GCN) or saint (GraphSAINT)
      batches_per_epoch: 20  # saint: batches per epoch (cluster: num_parts / batch_size)
    minibatch:
      num_parts: 40          # cluster: METIS clusters
      batch_size: 4          # cluster: clusters per batch
      shuffle: true          # cluster: new cluster groups every epoch (false: fixed batches)
      sampler: node          # saint: node, edge or walk
      budget: 3000           # saint: nodes, edges, or [roots, walk length]
      normalize: true        # saint: GraphSAINT's loss and aggregation normalization
      num_presample: null    # saint: batches drawn to estimate it (null: GraphSAINT's rule)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from ..core.config import ConfigError, unknown_key_message

__all__ = [
    "MiniBatchConfig",
    "MODES",
    "MODE_KEYS",
    "resolve_minibatch",
    "check_sizes",
    "steps_per_epoch",
]

MODES = ("full", "cluster", "saint")
_SAMPLERS = ("node", "edge", "walk")
#: the smallest useful GraphSAINT batch (expected nodes), unless the graph is smaller
MIN_BATCH_NODES = 16
#: the longest random walk the walk sampler accepts
MAX_WALK_LENGTH = 1000
#: the minibatch keys each mode reads (a key of the other mode is an error, not ignored)
MODE_KEYS = {
    "cluster": ("num_parts", "batch_size", "shuffle"),
    "saint": ("sampler", "budget", "normalize", "num_presample"),
}


@dataclasses.dataclass(frozen=True)
class MiniBatchConfig:
    """A validated ``minibatch`` section (see the module docstring)."""

    num_parts: int = 40
    batch_size: int = 4
    shuffle: bool = True
    sampler: str = "node"
    budget: object = 3000
    normalize: bool = True
    num_presample: Optional[int] = None
    mode: Optional[str] = None  # train.mode (set by resolve_minibatch; not a key of the section)

    def to_dict(self) -> dict:
        """The section as a config holds it: the keys its mode reads (all without a mode)."""
        out = dataclasses.asdict(self)
        mode = out.pop("mode")
        if isinstance(self.budget, tuple):
            out["budget"] = list(self.budget)
        if mode in MODE_KEYS:
            out = {k: v for k, v in out.items() if k in MODE_KEYS[mode]}
        return out


def resolve_minibatch(raw, mode: str, check_value, Rule) -> Optional[MiniBatchConfig]:
    """Validate ``raw["minibatch"]`` for ``train.mode`` (``None`` for full-graph training)."""
    sec = raw.get("minibatch")
    if mode == "full":
        if sec:
            raise ConfigError(
                "a minibatch section is given but train.mode is full; set train.mode to "
                "cluster or saint, or remove the section."
            )
        return None
    sec = {} if sec is None else sec
    if not isinstance(sec, dict):
        raise ConfigError(f"minibatch must be a mapping of keys to values, got {sec!r}.")
    allowed = [f.name for f in dataclasses.fields(MiniBatchConfig) if f.name != "mode"]
    for key in sec:
        if key not in allowed:
            raise ConfigError(unknown_key_message(str(key), allowed, "minibatch"))
    unused = [k for k in sec if k not in MODE_KEYS[mode]]
    if unused:
        raise ConfigError(
            f"minibatch.{unused[0]} is not used by train.mode={mode} (it reads "
            f"{', '.join(MODE_KEYS[mode])}); remove it or choose the mode that uses it."
        )
    rules = {
        "num_parts": Rule(int, 1),
        "batch_size": Rule(int, 1),
        "shuffle": Rule(bool),
        "sampler": Rule(str, choices=_SAMPLERS),
        "normalize": Rule(bool),
        "num_presample": Rule(int, 1, optional=True),
    }
    out = {k: check_value(f"minibatch.{k}", v, rules[k]) for k, v in sec.items() if k in rules}
    cfg = MiniBatchConfig(**out, mode=mode)
    if mode == "cluster" and cfg.batch_size > cfg.num_parts:
        raise ConfigError(
            f"minibatch.batch_size={cfg.batch_size} exceeds minibatch.num_parts="
            f"{cfg.num_parts}: a batch groups clusters; use batch_size <= num_parts."
        )
    if "budget" in sec:
        budget = sec["budget"]
        if cfg.sampler == "walk":
            ok = isinstance(budget, (list, tuple)) and len(budget) == 2
            ok = ok and all(isinstance(b, int) and not isinstance(b, bool) and b >= 1
                            for b in budget)  # fmt: skip
            if not ok:
                raise ConfigError(
                    f"minibatch.budget={budget!r}: the walk sampler takes [roots, walk length] "
                    "(two positive integers)."
                )
            budget = tuple(int(b) for b in budget)
        else:
            budget = check_value("minibatch.budget", budget, Rule(int, 1))
        cfg = dataclasses.replace(cfg, budget=budget)
    elif cfg.sampler == "walk":
        cfg = dataclasses.replace(cfg, budget=(1000, 3))
    return cfg


def steps_per_epoch(mode: str, mb: Optional[MiniBatchConfig], batches_per_epoch) -> int:
    """Optimizer steps in one epoch: 1 (full graph), the batches of Cluster-GCN or SAINT."""
    if mode == "full":
        return 1
    if mode == "cluster":
        return math.ceil(mb.num_parts / mb.batch_size)
    return int(batches_per_epoch or 20)


def check_sizes(mode: str, mb: MiniBatchConfig, nodes: int, edges: int, train: int) -> None:
    """Refuse sizes that do not fit the graph (checked once the data are loaded, before
    anything is sampled): more clusters than nodes, and GraphSAINT budgets whose expected
    batch holds fewer than ``min(MIN_BATCH_NODES, nodes)`` nodes or no training node, or
    more than the graph has (``budget`` nodes <= ``nodes``, edges <= ``edges``, roots <=
    ``nodes``, walk length <= :data:`MAX_WALK_LENGTH`).

    Args:
        nodes, edges: the graph's node and edge counts (edges without added self-loops).
        train: the number of training nodes.
    """
    if mode == "cluster":
        if mb.num_parts > nodes:
            raise ConfigError(
                f"minibatch.num_parts={mb.num_parts} exceeds the graph's {nodes} nodes; use "
                f"1 to {nodes} clusters."
            )
        return
    if mode != "saint":
        return
    # the fewest nodes a batch must hold on average to carry one training node
    low = min(nodes, max(MIN_BATCH_NODES, math.ceil(nodes / max(train, 1))))
    if mb.sampler == "walk":
        roots, length = mb.budget
        if length > MAX_WALK_LENGTH:
            raise ConfigError(
                f"minibatch.budget={list(mb.budget)}: a walk length of {length} is past "
                f"{MAX_WALK_LENGTH}; GraphSAINT walks are a few steps (2 to 4)."
            )
        expected, unit = roots * (length + 1), "roots x (length + 1)"
        ok_hi, hi_text = roots <= nodes, f"roots <= {nodes} (the graph's nodes)"
        shown = list(mb.budget)
    else:
        per = 1 if mb.sampler == "node" else 2  # an edge brings up to two nodes
        expected = mb.budget * per
        unit = "the node budget" if per == 1 else "two per sampled edge"
        top = nodes if mb.sampler == "node" else edges
        ok_hi, hi_text = mb.budget <= top, f"{top} (the graph's {mb.sampler}s)"
        shown = mb.budget
    if not ok_hi:
        raise ConfigError(
            f"minibatch.budget={shown} is larger than the graph: use at most {hi_text} "
            f"(train.mode=saint, sampler {mb.sampler})."
        )
    if expected < low:
        need = {"node": low, "edge": math.ceil(low / 2)}.get(mb.sampler)
        fix = (f"use a budget of at least {need} {mb.sampler}s" if need is not None else
               f"use roots x (walk length + 1) >= {low}")  # fmt: skip
        raise ConfigError(
            f"minibatch.budget={shown} is too small to train on: a batch would hold about "
            f"{expected} nodes ({unit}); the smallest useful batch here is {low} nodes (at "
            f"least {MIN_BATCH_NODES}, and enough to expect one of the {train} training nodes "
            f"among the graph's {nodes}); {fix}."
        )
