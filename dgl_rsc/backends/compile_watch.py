"""Seconds spent compiling kernels: Numba's JIT (its ``numba:compile`` events, which fire on a
real compile, not on a load from Numba's disk cache: the CPU kernels use ``cache=True``, so
they compile on a machine's first run only) and CuPy's modules (:func:`compiling`, around
``cupy.RawModule``'s compile; CuPy keeps its own disk cache).

Nothing is watched unless a :class:`CompileWatch` is entered (the launcher enters one for an
experiment); then a compile that runs past ``show_after`` seconds in all is announced once,
``compiling CPU kernels (first run only) ...``, through ``report``.

Example:
    >>> with CompileWatch() as watch:
    ...     with compiling("CUDA"):
    ...         pass
    >>> sorted(watch.seconds)
    ['CUDA']
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Optional

from ..base import _deps, progress

__all__ = ["CompileWatch", "compiling"]

#: the watches entered now (the launcher's, one at a time in practice)
_WATCHES: list = []


@contextlib.contextmanager
def compiling(kind: str):
    """Count the ``with`` block as a compile of ``kind`` (``"CPU"``, ``"CUDA"``) in every
    entered :class:`CompileWatch`; nothing when none is."""
    watches = list(_WATCHES)
    for w in watches:
        w.begin(kind)
    try:
        yield
    finally:
        for w in watches:
            w.end(kind)


class CompileWatch:
    """While entered: the seconds spent compiling kernels, by kind (``seconds``).

    Args:
        report: called with one line of text to show (``None``: silent).
        show_after: seconds of compiling after which it is announced (default 1).
    """

    def __init__(self, report: Optional[Callable[[str], None]] = None, show_after: float = 1.0):
        self.report, self.show_after = report, float(show_after)
        self.seconds: dict = {}
        self.announced = False
        self._depth, self._kind, self._start = 0, None, 0.0
        self._said = 0.0  # seconds already reported by :meth:`flush`
        self._lock = threading.RLock()
        self._timer: Optional[threading.Timer] = None
        self._listener = None

    def __enter__(self) -> CompileWatch:
        _WATCHES.append(self)
        if _deps.numba_available():
            self._listener = _numba_listener(self)
        return self

    def __exit__(self, *exc) -> None:
        if self._listener is not None:
            from numba.core import event

            event.unregister("numba:compile", self._listener)
            self._listener = None
        _WATCHES.remove(self)
        if self._timer is not None:
            self._timer.cancel()

    @property
    def total(self) -> float:
        """Seconds compiled so far, all kinds."""
        return sum(self.seconds.values())

    def begin(self, kind: str) -> None:
        with self._lock:
            self._depth += 1
            if self._depth > 1:  # a kernel compiled inside another's compile
                return
            self._kind, self._start = kind, progress.clock()
            if self.report is not None and not self.announced:
                wait = max(self.show_after - self.total, 0.0)
                self._timer = threading.Timer(wait, self._announce)
                self._timer.daemon = True
                self._timer.start()

    def end(self, kind: str) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth > 0:
                return
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            kind = self._kind or kind
            self.seconds[kind] = self.seconds.get(kind, 0.0) + progress.clock() - self._start
            if self.total >= self.show_after:
                self._announce()

    def _announce(self) -> None:
        with self._lock:
            if self.announced or self.report is None:
                return
            self.announced = True
            self.report(f"compiling {self._kind or 'CPU'} kernels (first run only) ...")

    def flush(self) -> None:
        """Report the seconds compiled since the last flush, when they were announced."""
        with self._lock:
            if self.report is not None and self.announced and self.total > self._said:
                kinds = ", ".join(f"{k} {s:.1f} s" for k, s in sorted(self.seconds.items()))
                self.report(f"compiled kernels: done in {self.total:.1f} s ({kinds})")
                self._said = self.total


def _numba_listener(watch: CompileWatch):
    """A Numba event listener feeding ``watch`` (registered until the watch exits)."""
    from numba.core import event

    class _Listener(event.Listener):
        def on_start(self, ev):
            watch.begin(_kind(ev.data))

        def on_end(self, ev):
            watch.end(_kind(ev.data))

    listener = _Listener()
    event.register("numba:compile", listener)
    return listener


def _kind(data) -> str:
    dispatcher = (data or {}).get("dispatcher")
    return "CUDA" if "cuda" in type(dispatcher).__module__ else "CPU"
