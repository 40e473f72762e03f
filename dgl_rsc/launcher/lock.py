"""One writer per output directory: ``<out>/.dgl-rsc-lock``.

A run takes the lock before it writes anything into its output directory and keeps it until
it ends; a second run into the same directory is refused while the first lives. The lock is
an advisory ``flock`` on the file (the kernel drops it when the holder dies, however it
dies), and the file names the holder (``pid host start-time``) for the message. A lock file
whose holder is gone is taken over; one that names a live process on this host is respected
even without the ``flock`` (a holder on a file system without flock support). Releasing
empties the file; the file itself stays (removing it would let two runs lock two different
files of the same name).

``dgl-rsc run --nproc N`` holds the lock in the parent for the whole run; its workers know
from :data:`HELD_ENV` that it is held for them.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from typing import Optional

from ..core.config import ConfigError
from .checkpoint import LOCK, OutputWriteError

__all__ = ["LOCK", "HELD_ENV", "OutputLock", "held_for_me"]

#: set by ``dgl-rsc run --nproc`` in its workers' environment: the absolute output directory
#: whose lock the parent holds
HELD_ENV = "DGL_RSC_LOCK_HELD"


def held_for_me(out: str) -> bool:
    """``True`` when a parent ``dgl-rsc`` holds ``out``'s lock for this process."""
    held = os.environ.get(HELD_ENV)
    return bool(held) and os.path.abspath(held) == os.path.abspath(out)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class OutputLock:
    """The lock of output directory ``out`` (created when missing). Use as a context
    manager, or :meth:`acquire` / :meth:`release`.

    Raises:
        ConfigError: another live run holds it (the message names its pid and host).
    """

    def __init__(self, out: str):
        self.out = out
        self.path = os.path.join(out, LOCK)
        self._fd: Optional[int] = None

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        try:
            self._acquire()
        except OSError as exc:
            if isinstance(exc, OutputWriteError):
                raise
            raise OutputWriteError(self.path, exc) from None

    def _acquire(self) -> None:
        os.makedirs(self.out, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                self._refuse(self._holder())
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP):
                raise
            fd = os.open(self.path, os.O_RDWR)  # no flock here: the pid alone decides
        holder = self._holder(fd)
        if holder is not None and holder[0] != os.getpid():
            pid, host = holder[:2]
            if host == socket.gethostname() and _alive(pid):
                os.close(fd)
                self._refuse(holder)
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())
        os.write(fd, f"{os.getpid()} {socket.gethostname()} {stamp}\n".encode())
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        """Empty the lock file and drop the lock (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass  # the lock itself is dropped below whatever happened to the file
        finally:
            os.close(fd)

    def _holder(self, fd: Optional[int] = None) -> Optional[tuple]:
        """``(pid, host, start)`` the lock file names, or ``None`` (empty or unreadable)."""
        try:
            if fd is None:
                with open(self.path, encoding="utf-8", errors="replace") as f:
                    text = f.read(200)
            else:
                os.lseek(fd, 0, os.SEEK_SET)
                text = os.read(fd, 200).decode("utf-8", errors="replace")
        except OSError:
            return None
        words = text.split()
        if len(words) < 2 or not words[0].isdigit():
            return None
        return int(words[0]), words[1], words[2] if len(words) > 2 else "?"

    def _refuse(self, holder: Optional[tuple]) -> None:
        who = "another dgl-rsc run"
        if holder is not None:
            who += f" (pid {holder[0]} on {holder[1]}, started {holder[2]})"
        raise ConfigError(
            f"output directory '{self.out}' is in use by {who}: one run writes a directory at "
            f"a time. Wait for it to finish, stop it, or choose another --out. (Its lock is "
            f"{self.path}; it is released when that process ends.)"
        )
