"""The checks ``dgl-rsc run --nproc N`` makes in the parent process, before it writes anything
or starts a worker: every value a worker would reject is rejected here, once, with the key,
the value and what to do (exit 2), instead of N tracebacks after the workers started.

Checked: the environment (no rank variables left by another launcher), ``--nproc`` against
``distributed.partitions``, the device and the process-group backend, the partition cache
path, and the graph itself (loaded once here: it must exist and have at least one node and
one training node per partition).
"""

from __future__ import annotations

import logging
import os
from typing import Mapping, Optional

import torch

from ..core.config import ConfigError

__all__ = ["LAUNCHER_ENV", "check_environment", "check_nproc", "check_distributed"]

log = logging.getLogger(__name__)

#: variables torch's launcher (or SLURM/MPI wrappers exporting them) sets in each worker
LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GROUP_RANK")  # fmt: skip


def check_environment(nproc: int, env: Optional[Mapping[str, str]] = None) -> None:
    """Refuse ``--nproc`` when the environment already describes a distributed run: the
    workers would inherit it and join the wrong group (or none)."""
    env = os.environ if env is None else env
    found = [f"{k}={env[k]}" for k in LAUNCHER_ENV if k in env]
    if found:
        names = " ".join(f"-u {k}" for k in LAUNCHER_ENV if k in env)
        raise ConfigError(
            f"--nproc {nproc}: the environment already holds {', '.join(found)}, set by "
            "another launcher (torchrun, SLURM, a parent job). dgl-rsc starts its own "
            f"workers: unset them (env {names} dgl-rsc run ...), or drop --nproc and let "
            "that launcher start `dgl-rsc run` in each process."
        )


def check_nproc(nproc: int, partitions: Optional[int]) -> None:
    """``distributed.partitions`` (from the config or ``--set``), when given, must be
    ``--nproc``: one process trains one partition."""
    if partitions is not None and partitions != nproc:
        raise ConfigError(
            f"--nproc {nproc} but distributed.partitions={partitions}: one process trains one "
            f"partition. Use --nproc {partitions}, or set distributed.partitions={nproc} (or "
            "remove it: --nproc sets it)."
        )


def check_distributed(cfg, nproc: int, progress: bool = False) -> None:
    """The device, backend, partition cache and graph of a ``--nproc`` run (see the module
    docstring). Loads the dataset once, then lets it go (``progress``: shown on stderr when
    that takes more than a few seconds)."""
    from .outputs import check_location
    from .prepare import check_backend, resolve_device

    d = cfg.distributed
    device = resolve_device(cfg.train.device)
    if device.type == "cuda" and torch.cuda.device_count() < nproc:
        raise ConfigError(
            f"--nproc {nproc} with train.device={cfg.train.device!r} needs {nproc} GPUs (one "
            f"per process), but {torch.cuda.device_count()} are visible; use --nproc "
            f"{max(torch.cuda.device_count(), 1)} or --device cpu."
        )
    _check_backend_name(d.backend, device)
    check_backend(cfg, device)
    if d.partition_cache:
        check_location(d.partition_cache, "distributed.partition_cache")
    _check_graph(cfg, nproc, progress)


def _check_backend_name(backend: str, device: torch.device) -> None:
    import torch.distributed as dist

    if not dist.is_available():
        raise ConfigError("this torch build has no torch.distributed; --nproc cannot run here.")
    name = backend if backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    if name == "nccl" and device.type != "cuda":
        raise ConfigError(
            f"distributed.backend=nccl needs CUDA tensors, but train.device is {device.type}; "
            "use distributed.backend: gloo (or auto), or --device cuda on a machine with GPUs."
        )
    available = dist.is_nccl_available() if name == "nccl" else dist.is_gloo_available()
    if not available:
        raise ConfigError(
            f"distributed.backend={backend} ({name}) is not available in this torch build; "
            f"use distributed.backend: {'gloo' if name == 'nccl' else 'nccl'} or auto."
        )


def _check_graph(cfg, nproc: int, progress: bool = False) -> None:
    from ..base.progress import Phase
    from ..data import load_dataset

    params = {k: v for k, v in cfg.dataset.items() if k not in ("name", "root")}
    desc = f"setup: dataset {cfg.dataset['name']} (checked before the workers start)"
    try:
        with Phase(desc, enabled=progress) as phase:
            data = load_dataset(cfg.dataset["name"], root=cfg.dataset["root"],
                                progress=phase.update, **params)  # fmt: skip
    except (FileNotFoundError, ImportError, ValueError) as exc:
        raise ConfigError(f"dataset {cfg.dataset['name']!r} could not be loaded: {exc}") from None
    nodes, train = int(data.num_nodes), int(data.train_mask.sum())
    del data
    if nproc > nodes:
        raise ConfigError(
            f"distributed.partitions={nproc} (--nproc) exceeds the graph's {nodes} nodes; use "
            f"--nproc 1 to {nodes}."
        )
    if nproc > train:
        raise ConfigError(
            f"distributed.partitions={nproc} (--nproc) exceeds the graph's {train} training "
            f"nodes, so some rank would train on nothing; use --nproc {max(train, 1)} or fewer."
        )
