"""``dgl-rsc run CONFIG --nproc N``: start N workers through torch's own launcher.

The parent checks the config and the output directory (nothing is written), then runs
``python -m torch.distributed.run --standalone --nproc-per-node N -m dgl_rsc run ...`` with
the same arguments (the output directory made explicit, ``distributed.partitions=N``). The
workers find each other through the environment the launcher sets; when one of them fails,
the launcher stops the others and reports the rank and its exit code. Across machines, start
the same worker command under ``torchrun --nnodes ... --nproc-per-node ...`` on each.
"""

from __future__ import annotations

import subprocess
import sys

__all__ = ["worker_argv", "worker_command", "spawn"]


def worker_argv(argv: list, nproc: int, out: str) -> list:
    """The workers' arguments: ``argv`` without ``--nproc``, with ``--out`` made explicit
    (unless resuming) and the partition count set."""
    words, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            words.append(a)
    if (
        "--resume" not in words
        and "--out" not in words
        and not any(w.startswith("--out=") for w in words)
    ):
        words += ["--out", out]
    return words + ["--set", f"distributed.partitions={nproc}"]


def worker_command(argv: list, nproc: int, out: str) -> list:
    """The launcher command that starts the workers."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={nproc}"]  # fmt: skip
    return [*launcher, "-m", "dgl_rsc", *worker_argv(argv, nproc, out)]


def spawn(cmd: list) -> int:
    """Run the workers and return the launcher's exit code (0 when every worker succeeded)."""
    try:
        return subprocess.run(cmd).returncode
    except KeyboardInterrupt:
        return 130
