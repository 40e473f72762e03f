"""METIS on a large graph in a child process, so that the caller can show its progress.

pymetis holds the GIL for its whole call: in-process, nothing else of the caller runs (no
progress line, no heartbeat) for the minutes a large graph takes. Above :data:`CHILD_EDGES`
edges the launcher's partition runs ``pymetis.part_graph`` in a child Python (numpy and
pymetis only; the CSR arrays travel as ``.npy`` files in a private temporary folder, removed
afterwards), calls ``progress`` while it waits, and reads the child's peak resident memory
from the kernel (``wait4``). The child computes exactly what the in-process call computes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Callable, Optional

import numpy as np

__all__ = ["CHILD_EDGES", "metis_in_child"]

#: symmetrized edges above which the launcher runs METIS in a child (about a second of METIS)
CHILD_EDGES = 2_000_000

_CHILD = """
import sys, numpy as np, pymetis
folder, parts, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
xadj = np.load(folder + "/xadj.npy")
adjncy = np.load(folder + "/adjncy.npy")
res = pymetis.part_graph(parts, adjacency=pymetis.CSRAdjacency(xadj, adjncy),
                         options=pymetis.Options(seed=seed))
np.save(folder + "/part.npy", np.asarray(res.vertex_part, dtype=np.int64))
"""


def metis_in_child(xadj: np.ndarray, adjncy: np.ndarray, parts: int, seed: int,
                   progress: Optional[Callable[[], None]] = None,
                   tick: float = 1.0) -> tuple:  # fmt: skip
    """``(part (N,) int64 ndarray, child's peak resident bytes)`` of METIS on the CSR
    ``(xadj, adjncy)``; ``progress()`` is called every ``tick`` seconds while it runs.

    Raises:
        RuntimeError: the child failed (its last error line is in the message).
    """
    folder = tempfile.mkdtemp(prefix="dgl-rsc-metis-")
    try:
        np.save(os.path.join(folder, "xadj.npy"), np.ascontiguousarray(xadj, dtype=np.int64))
        np.save(os.path.join(folder, "adjncy.npy"), np.ascontiguousarray(adjncy, dtype=np.int64))
        err_path = os.path.join(folder, "stderr.txt")
        with open(err_path, "w", encoding="utf-8") as err:
            cmd = [sys.executable, "-c", _CHILD, folder, str(int(parts)), str(int(seed))]
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
            try:
                status, usage = _wait(proc, progress, tick)
            except BaseException:  # interrupted: the child must not outlive the caller
                proc.kill()
                os.waitpid(proc.pid, 0)
                proc.returncode = -9
                raise
        if status != 0:
            with open(err_path, encoding="utf-8", errors="replace") as f:
                lines = [x for x in f.read().splitlines() if x.strip()]
            raise RuntimeError(f"METIS in its child process failed (exit {status}): "
                               f"{lines[-1] if lines else 'no message'}")  # fmt: skip
        part = np.load(os.path.join(folder, "part.npy"), allow_pickle=False)
        return part, usage.ru_maxrss * 1024
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _wait(proc: subprocess.Popen, progress, tick: float) -> tuple:
    """Reap ``proc`` with ``wait4`` (its own resource usage), calling ``progress`` meanwhile;
    ``(exit status, rusage)``."""
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            code = os.waitstatus_to_exitcode(status)
            proc.returncode = code  # reaped here: Popen must not wait for it again
            return code, usage
        if progress is not None:
            progress()
        time.sleep(tick)
