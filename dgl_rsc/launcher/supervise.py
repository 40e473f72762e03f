"""Errors of a ``--nproc`` run read like those of one process.

The parent starts torch's launcher with :data:`STATUS_ENV` naming a fresh folder. Each
worker (:func:`guard`) writes there what became of it, ``rank<R>.json`` with
``{"rank", "pid", "time", "kind", "message"}``, and a crash's traceback to ``rank<R>.log``;
it prints no error itself. ``kind`` is ``running`` (written at start: still there at the end
means killed), ``ok``, ``config`` (a ConfigError or an output that cannot be written: exit
2), ``diverged`` (exit 3), ``interrupted`` (exit 130), ``peer`` (a collective failed because
another rank went away) or ``crash``.

The parent relays the workers' stderr (their warnings) but keeps torch's launcher lines and
tracebacks in ``launcher.log`` of that folder (all of it with ``--verbose``), then names the
cause (:func:`verdict`): the first config error, else the first crash, else a rank that was
killed (its record still says ``running``) and that the launcher did not stop itself (the
launcher log names the processes it stopped after the first failure), else the first failed
exchange. The folder is removed after a run that succeeded and kept,
with its path in the message, after one that failed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Callable, Optional

__all__ = ["STATUS_ENV", "Outcome", "supervise", "verdict", "guard", "managed_worker"]

#: the folder a worker reports to (set by the parent ``dgl-rsc run --nproc``)
STATUS_ENV = "DGL_RSC_STATUS_DIR"
#: what torch's launcher itself logs (torch 2.2: "[time] torch.distributed...", newer:
#: "W1125 06:20:10.501000 pid torch/distributed/elastic/...", and the process group's own
#: "[rank1]:[E1125 06:41:30...] ProcessGroupGloo..."), and its OMP_NUM_THREADS banner
_LAUNCHER_LINE = re.compile(
    r"torch[./]distributed[./](elastic|run|launcher)|^(\[rank\d+\]:)?\[?[WEI]\d{4} \d\d:\d\d:\d\d"
    r"|^\*{10,}\s*$|^Setting OMP_NUM_THREADS"
)
_PEER_TEXT = ("connection closed", "connection reset", "broken pipe", "gloo", "nccl",
              "timed out", "timeout")  # fmt: skip


@dataclasses.dataclass
class Outcome:
    """What the parent tells the user: the exit code and one line (``None`` when 0)."""

    code: int
    message: Optional[str] = None
    rank: Optional[int] = None


# -- the worker's side ---------------------------------------------------------------------
def managed_worker() -> Optional[str]:
    """The status folder when this process is a worker of ``dgl-rsc run --nproc``."""
    folder = os.environ.get(STATUS_ENV)
    return folder if folder and "RANK" in os.environ and os.path.isdir(folder) else None


def _write(folder: str, rank: int, kind: str, message: str = "", tb: str = "") -> None:
    record = {"rank": rank, "pid": os.getpid(), "time": time.time(), "kind": kind,
              "message": message}  # fmt: skip
    if tb:
        with open(os.path.join(folder, f"rank{rank}.log"), "w", encoding="utf-8") as f:
            f.write(tb)
    tmp = os.path.join(folder, f".rank{rank}.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(tmp, os.path.join(folder, f"rank{rank}.json"))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def guard(folder: str, body: Callable[[], int], classify: Callable[[BaseException], str]) -> int:
    """Run ``body()`` in a managed worker and report its end to ``folder``.

    A ``running`` record is written first (a rank whose record still says so at the end was
    killed). ``classify(exc)`` names the kind of an exception (``config``, ``diverged``;
    anything else is a ``crash`` or, for a failed exchange, ``peer``). Returns the exit code
    (2 config, 3 diverged, 130 interrupted, 1 otherwise); nothing is printed. SIGTERM keeps
    its default action: a worker blocked in a collective could not run a Python handler,
    and the launcher would wait 30 s before killing it.
    """
    rank = int(os.environ["RANK"])
    _write(folder, rank, "running")
    try:
        code = body()
    except KeyboardInterrupt:
        _write(folder, rank, "interrupted", "interrupted")
        return 130
    except Exception as exc:  # every way a worker ends is reported, none printed
        kind = classify(exc)
        if kind not in ("config", "diverged"):
            text = str(exc).lower()
            peer = type(exc).__name__ == "DistributedError" or (
                isinstance(exc, RuntimeError) and any(t in text for t in _PEER_TEXT)
            )
            kind = "peer" if peer else "crash"
        message = _one_line(exc)
        if kind in ("crash", "peer"):
            message = f"{type(exc).__name__}: {message}"
        _write(folder, rank, kind, message, traceback.format_exc())
        return {"config": 2, "diverged": 3}.get(kind, 1)
    _write(folder, rank, {0: "ok", 130: "interrupted"}.get(code, "crash"), f"exit {code}")
    return code


# -- the parent's side ---------------------------------------------------------------------
def supervise(cmd: list, env_extra: dict, nproc: int, verbose: bool) -> tuple:
    """Run the launcher ``cmd`` and wait; returns ``(Outcome, status folder)``. The folder is
    removed when the run succeeded."""
    folder = tempfile.mkdtemp(prefix="dgl-rsc-workers-")
    env = {**os.environ, **env_extra, STATUS_ENV: folder}
    log_path = os.path.join(folder, "launcher.log")
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, env=env, stderr=None if verbose else subprocess.PIPE,
                                text=True, errors="replace")  # fmt: skip
        relay = None
        if not verbose:
            relay = threading.Thread(target=_relay, args=(proc.stderr, log), daemon=True)
            relay.start()
        try:
            code = proc.wait()
        except KeyboardInterrupt:  # the launcher got the same SIGINT and stops its workers
            try:
                code = proc.wait(timeout=60)
            except (KeyboardInterrupt, subprocess.TimeoutExpired):
                proc.terminate()
                code = proc.wait()
            code = 130 if code else code
        if relay is not None:
            relay.join(timeout=10)
    outcome = verdict(folder, nproc, code)
    if outcome.code == 0:
        shutil.rmtree(folder, ignore_errors=True)
    return outcome, folder


def _relay(stream, log) -> None:
    """Copy the workers' stderr to ``log``; pass on what is not torch's launcher talking
    (nothing from the first traceback on: those go to the log only)."""
    quiet = False
    for line in stream:
        log.write(line)
        log.flush()
        if line.startswith("Traceback (most recent call last)"):
            quiet = True
        if not quiet and not _LAUNCHER_LINE.search(line):
            sys.stderr.write(line)
            sys.stderr.flush()


def _records(folder: str) -> dict:
    out = {}
    for name in os.listdir(folder):
        m = re.fullmatch(r"rank(\d+)\.json", name)
        if m:
            try:
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    out[int(m.group(1))] = json.load(f)
            except (OSError, ValueError):
                pass  # a record torn by a kill counts as no record
    return out


def _launcher_facts(folder: str) -> tuple:
    """From torch's launcher log: the pids it stopped itself (bystanders of a failure),
    ``{rank: exit code}`` and ``{rank: pid}`` of the failures it reported."""
    try:
        with open(os.path.join(folder, "launcher.log"), encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return set(), {}, {}
    stopped = {int(p) for p in re.findall(r"Sending process (\d+) closing signal", text)}
    codes, pids = {}, {}
    for c, r, p in re.findall(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)",
                              text):  # fmt: skip
        codes[int(r)], pids[int(r)] = int(c), int(p)
    block = r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*exitcode\s*:\s*(-?\d+) \(pid: (\d+)\)"
    for r, c, p in re.findall(block, text):
        codes.setdefault(int(r), int(c))
        pids.setdefault(int(r), int(p))
    return stopped, codes, pids


def _how(code: Optional[int]) -> str:
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    if code is not None:
        return f"exited with {code} without a word"
    return "ended without a word (killed by a signal, or out of memory)"


def verdict(folder: str, nproc: int, code: int) -> Outcome:
    """The cause of the run's end from the workers' records (see the module docstring)."""
    recs = _records(folder)
    if code == 0 and all(recs.get(r, {}).get("kind") == "ok" for r in range(nproc)):
        return Outcome(0)

    def first(kind):
        found = sorted((r["time"], r["rank"]) for r in recs.values() if r["kind"] == kind)
        return recs[found[0][1]] if found else None

    for kind, exit_code in (("config", 2), ("diverged", 3)):
        rec = first(kind)
        if rec is not None:
            return Outcome(exit_code, rec["message"], rec["rank"])
    rec = first("crash")
    if rec is not None:
        log = os.path.join(folder, f"rank{rec['rank']}.log")
        return Outcome(1, f"rank {rec['rank']} crashed ({rec['message']}); this is a dgl-rsc "
                       f"bug, please report it with its traceback: {log}", rec["rank"])  # fmt: skip
    if code == 130 or first("interrupted") is not None:
        return Outcome(130, "interrupted")
    stopped, codes, pids = _launcher_facts(folder)
    silent = [r for r in range(nproc) if recs.get(r, {}).get("kind", "running") == "running"]
    # a silent rank the launcher did not stop itself died first; the others were stopped
    culprits = [r for r in silent if recs.get(r, {}).get("pid", pids.get(r)) not in stopped]
    culprits = culprits or [r for r in codes if r in silent] or silent
    log = os.path.join(folder, "launcher.log")
    if culprits:
        r = culprits[0]
        return Outcome(1, f"rank {r} {_how(codes.get(r))}; the launcher stopped the other "
                       f"ranks. Its log: {log}", r)  # fmt: skip
    rec = first("peer")
    if rec is not None:
        return Outcome(1, f"rank {rec['rank']}: {rec['message']}. Logs: {folder}", rec["rank"])
    return Outcome(code or 1, f"the launcher exited with {code}. Its log: {log}")
