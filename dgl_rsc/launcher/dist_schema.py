"""The ``distributed`` section of a launcher config.

::

    distributed:
      partitions: 4          # = the number of processes (dgl-rsc run --nproc 4)
      algorithm: 1d          # 1d (a row block per process) or 1.5d (CAGNET, replicated)
      replication: 1         # 1.5d: c processes hold each of partitions / c row blocks
      replica_bits: 32       # 1.5d: width of the replica groups' sums (32, 16, 8, 4, 2)
      method: metis          # metis (default), random, contiguous (or metis-dgl with DGL)
      seed: 0                # the partitioner's seed
      backend: auto          # auto: NCCL for CUDA, gloo for CPU
      overlap: true          # aggregate central rows while the halo is in flight
      dropout: global        # global: the masks of one process (exact); local: per rank
      timeout_s: 300         # the longest any exchange or collective may wait
      partition_cache: null  # where partitions are cached (default: <out>/partitions)
      halo_bits: 32          # both directions at once (forward_bits/backward_bits win)
      forward_bits: 32       # halo messages forward: 32 (fp32), 16, 8, 4, 2 or adaptive
      backward_bits: 32      # ... and their gradients backward
      adaptive_interval: 10  # adaptive: steps a choice of widths is kept
      adaptive_weight: 1.0   # adaptive: weight of relative variance against relative time
      adaptive_bits: [2, 4, 8]  # adaptive: the widths to choose from
      calibrate: false       # adaptive: measure the alpha-beta cost model at start-up
      cost_alpha: null       # or give it: seconds per message ...
      cost_beta: null        # ... and seconds per byte (default 5e-5 s, 1e-9 s/byte)
      comm_budget: 1.0       # halo bytes per step over the exact fp32 1D exchange's, in (0, 1]:
                             # below 1, the widths and the backward halo sample are allocated
                             # per layer, direction and peer (dgl_rsc.distributed.comm_budget)
      boundary_sample: false # forward boundary sampling (BNS-GCN): true lets the budget pick
                             # the rate, a number in (0, 1] fixes it

``distributed: null`` (the default) trains on one process.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..core.config import ConfigError, unknown_key_message

__all__ = ["DistConfig", "resolve_distributed", "BITS"]

#: what a halo message may travel as (bits per value; "adaptive": chosen per message group)
BITS = (32, 16, 8, 4, 2, "adaptive")
_BACKENDS = ("auto", "gloo", "nccl")
#: the longest wait a run may set (a week): torch's timers overflow far beyond it
MAX_TIMEOUT_S = 7 * 24 * 3600.0


def _is_width(value, widths) -> bool:
    """``value`` is one of ``widths`` as the same type (``8.0`` and ``True`` are not widths)."""
    if isinstance(value, str):
        return value in widths
    return type(value) is int and value in widths


@dataclasses.dataclass(frozen=True)
class DistConfig:
    """A validated ``distributed`` section (see the module docstring)."""

    partitions: Optional[int] = None
    algorithm: str = "1d"
    replication: int = 1
    replica_bits: int = 32
    method: str = "metis"
    seed: int = 0
    backend: str = "auto"
    overlap: bool = True
    dropout: str = "global"
    timeout_s: float = 300.0
    partition_cache: Optional[str] = None
    forward_bits: object = 32
    backward_bits: object = 32
    adaptive_interval: int = 10
    adaptive_weight: float = 1.0
    adaptive_bits: tuple = (2, 4, 8)
    calibrate: bool = False
    cost_alpha: Optional[float] = None
    cost_beta: Optional[float] = None
    comm_budget: float = 1.0
    boundary_sample: object = False

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["adaptive_bits"] = list(self.adaptive_bits)
        return out


def resolve_distributed(raw, check_value, Rule, model: dict) -> Optional[DistConfig]:
    """Validate ``raw["distributed"]`` (``None`` when absent or null).

    ``check_value`` and ``Rule`` are the launcher schema's (passed in: no import cycle).
    """
    sec = raw.get("distributed")
    if sec is None:
        return None
    if not isinstance(sec, dict):
        raise ConfigError(f"distributed must be a mapping of keys to values, got {sec!r}.")
    from ..distributed.algorithms import ALGORITHMS, REPLICA_BITS, check_options
    from ..distributed.dropout import DROPOUT_MODES
    from ..distributed.partition import PARTITIONERS

    allowed = [f.name for f in dataclasses.fields(DistConfig)] + ["halo_bits"]
    for key in sec:
        if key not in allowed:
            raise ConfigError(unknown_key_message(str(key), allowed, "distributed"))
    rules = {
        "partitions": Rule(int, 1, optional=True),
        "algorithm": Rule(str, choices=tuple(ALGORITHMS)),
        "replication": Rule(int, 1),
        "method": Rule(str, choices=tuple(PARTITIONERS)),
        "seed": Rule(int, 0),
        "backend": Rule(str, choices=_BACKENDS),
        "overlap": Rule(bool),
        "dropout": Rule(str, choices=DROPOUT_MODES),
        "timeout_s": Rule(float, 0.0, MAX_TIMEOUT_S, lo_open=True),
        "partition_cache": Rule(str, optional=True),
        "adaptive_interval": Rule(int, 1),
        "adaptive_weight": Rule(float, 0.0, 1e6),
        "calibrate": Rule(bool),
        "cost_alpha": Rule(float, 0.0, 60.0, optional=True),  # seconds per message
        "cost_beta": Rule(float, 0.0, 1.0, optional=True),  # seconds per byte
    }
    out = {k: check_value(f"distributed.{k}", v, rules[k]) for k, v in sec.items() if k in rules}
    out.update(_budget_keys(sec, check_value, Rule))
    for key in ("halo_bits", "forward_bits", "backward_bits"):
        if key in sec:
            value = sec[key]
            if not _is_width(value, BITS):
                opts = ", ".join(map(str, BITS))
                raise ConfigError(
                    f"distributed.{key}={value!r} is not one of {opts} (a bit width is an "
                    "integer, or the word adaptive)."
                )
            out[key] = value
    if "replica_bits" in sec:
        if not _is_width(sec["replica_bits"], REPLICA_BITS):
            raise ConfigError(
                f"distributed.replica_bits={sec['replica_bits']!r} is not one of "
                f"{', '.join(map(str, REPLICA_BITS))} (a fixed width: replica sums are not "
                "adaptive yet)."
            )
        out["replica_bits"] = sec["replica_bits"]
    check_options(out)
    halo = out.pop("halo_bits", None)
    if halo is not None:  # the shorthand fills the directions not given on their own
        out.setdefault("forward_bits", halo)
        out.setdefault("backward_bits", halo)
    if "adaptive_bits" in sec:
        widths = sec["adaptive_bits"]
        if (
            not isinstance(widths, (list, tuple))
            or not widths
            or not all(_is_width(b, (2, 4, 8, 16, 32)) for b in widths)
        ):
            raise ConfigError(
                f"distributed.adaptive_bits={widths!r} must be a non-empty list of widths "
                "from 2, 4, 8, 16, 32."
            )
        out["adaptive_bits"] = tuple(int(b) for b in widths)
    if out.get("comm_budget", 1.0) < 1.0:  # the budget picks the widths not given
        for key in ("forward_bits", "backward_bits"):
            out.setdefault(key, "adaptive")
    if model.get("batch_norm"):
        raise ConfigError(
            "model.batch_norm=true cannot train distributed: the batch statistics would be "
            "per partition. Use batch_norm: false (or a model with layer normalization)."
        )
    return DistConfig(**out)


def _budget_keys(sec: dict, check_value, Rule) -> dict:
    """``comm_budget`` in (0, 1] and ``boundary_sample`` (false, true, or a rate in (0, 1];
    ``true`` needs a budget below 1 to choose the rate under)."""
    out = {}
    if "comm_budget" in sec:
        try:
            out["comm_budget"] = check_value("distributed.comm_budget", sec["comm_budget"],
                                             Rule(float, 0.0, 1.0, lo_open=True))  # fmt: skip
        except ConfigError as exc:
            raise ConfigError(f"{exc} It is the fraction of the exact fp32 halo bytes a "
                              "training step may send (1.0: no budget).") from None  # fmt: skip
    if "boundary_sample" in sec:
        value = sec["boundary_sample"]
        if not isinstance(value, bool):
            try:
                value = check_value("distributed.boundary_sample", value,
                                    Rule(float, 0.0, 1.0, lo_open=True))  # fmt: skip
            except ConfigError as exc:
                raise ConfigError(f"{exc} (or true to let distributed.comm_budget pick the "
                                  "rate, false for no forward sample)") from None  # fmt: skip
            value = False if value == 1.0 else value
        if value is True and out.get("comm_budget", 1.0) >= 1.0:
            raise ConfigError(
                "distributed.boundary_sample=true lets distributed.comm_budget choose the "
                "forward sampling rate, but comm_budget is 1.0 (no budget): set comm_budget "
                "below 1 (e.g. 0.2), or give a fixed rate (e.g. boundary_sample: 0.5)."
            )
        out["boundary_sample"] = value
    return out
