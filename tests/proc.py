"""Commands that a test starts, bounded in time, whose processes all end with the test.

A test that runs ``subprocess.run(cmd, timeout=...)`` kills only ``cmd`` on a timeout; the
workers it started (torchrun's ranks, the launcher's runs) keep its output pipes open, so the
``communicate()`` after the kill waits for them, and a hung worker keeps pytest from ever
exiting. Here each command runs in its own session (process group), and that whole group is
killed when the command times out, when the test fails or is interrupted (pytest-timeout
included), and after the command's own exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

import pytest

__all__ = ["group", "kill_group", "run"]


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL every process of ``proc``'s session (``proc`` itself included) and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)


@contextlib.contextmanager
def group(cmd, **popen_kwargs):
    """``Popen(cmd)`` in a new session, text pipes for stdout and stderr unless given; the
    session is killed when the block ends, however it ends."""
    popen_kwargs.setdefault("stdout", subprocess.PIPE)
    popen_kwargs.setdefault("stderr", subprocess.PIPE)
    proc = subprocess.Popen(cmd, text=True, start_new_session=True, **popen_kwargs)
    try:
        yield proc
    finally:
        kill_group(proc)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def run(cmd, *, timeout: float, check: bool = False, **popen_kwargs):
    """Run ``cmd`` to its end within ``timeout`` seconds: the test fails (with the tail of
    the output) on a timeout, and no process it started outlives it.

    Returns:
        A ``subprocess.CompletedProcess`` with ``stdout`` and ``stderr`` as text.
    """
    with group(cmd, **popen_kwargs) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            out, err = proc.communicate()
            pytest.fail(f"{' '.join(map(str, cmd))} ran past {timeout} s and was killed with "
                        f"its process group; stderr tail:\n{(err or '')[-3000:]}")  # fmt: skip
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done
