"""Atomic file writes, for every file the package writes (outputs, checkpoints, caches).

A write goes to a temporary file next to the target (``.dgl-rsc-tmp-<16 hex>-<name>``, created
with mode ``0o666`` so that the umask applies, as for any new file), is flushed to disk and
renamed over the target: a reader sees the old file or the new one, never a torn one, and a
failed write leaves the target as it was.
"""

from __future__ import annotations

import errno
import os
import secrets
from typing import Any, Callable

__all__ = ["TMP_PREFIX", "OutputWriteError", "atomic_write", "atomic_write_text"]

TMP_PREFIX = ".dgl-rsc-tmp-"


def atomic_write(path: str, write: Callable[[Any], None], mode: str = "wb") -> None:
    """Call ``write(file)`` on a temporary file next to ``path``, then rename it over
    ``path`` (``os.replace``): readers see the old file or the new one, never a torn one.
    The new file's permissions follow the umask (``0o666 & ~umask``)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    while True:
        tmp = os.path.join(folder, f"{TMP_PREFIX}{secrets.token_hex(8)}-{os.path.basename(path)}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.remove(tmp)
        cause = _os_error(exc)
        if cause is not None:
            raise OutputWriteError(path, cause) from None
        raise


def _os_error(exc: BaseException):
    """The ``OSError`` behind a failed write, or ``None``: ``exc`` itself, or the error it
    was raised while handling (a serializer that turns the file's ENOSPC into its own error:
    ``torch.save`` raises a ``RuntimeError`` from the stream writer's failed write)."""
    seen = set()
    while exc is not None and id(exc) not in seen and not isinstance(exc, OutputWriteError):
        if isinstance(exc, OSError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


class OutputWriteError(OSError):
    """Writing an output failed (a full disk, a quota, an I/O error), also when the writer
    wrapped the ``OSError`` in its own exception; the target is as it was before (the
    temporary file is removed). The message is one line naming the path."""

    def __init__(self, path: str, cause: OSError):
        code = errno.errorcode.get(cause.errno, "") if cause.errno else ""
        reason = cause.strerror or str(cause) or type(cause).__name__
        super().__init__(
            cause.errno,
            f"cannot write {path}: {reason}{f' ({code})' if code else ''}; it was left as it "
            "was (no half-written file). Free space there or choose another --out, then run "
            "again (--resume continues from the last checkpoint).",
        )
        self.path = path

    def __str__(self) -> str:
        return self.strerror


def atomic_write_text(path: str, text: str) -> None:
    """:func:`atomic_write` of a UTF-8 string."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))
