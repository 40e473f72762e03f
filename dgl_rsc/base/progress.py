"""Progress and seconds of the setup phases that can take a while (generating or loading a
large graph, partitioning it, GraphSAINT's pre-sampling, kernel compiles).

A library function that can take long reports only when asked: it takes a ``progress``
callback, called as ``progress(done, total)`` (``None``, the default, is silent). The
launcher passes the :meth:`Phase.update` of a :class:`Phase`, which times the phase, records
its seconds and, when the phase runs past :data:`SHOW_AFTER` seconds, shows it on stderr: a
bar in a terminal (as the launcher's epoch bars), plain lines elsewhere (a log, CI), and one
line with its seconds when it ends. A phase that ends sooner prints nothing.

Example:
    >>> times = {}
    >>> with Phase("tiny", times, "tiny", enabled=False) as phase:
    ...     phase.update(1, 2)
    >>> sorted(times)
    ['tiny']
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Optional

__all__ = ["SHOW_AFTER", "LINE_EVERY", "Phase", "clock"]

#: seconds a phase runs before it is shown (a shorter one prints nothing)
SHOW_AFTER = 2.0
#: seconds between two progress lines where there is no terminal to redraw a bar in
LINE_EVERY = 30.0
#: the clock phases are timed with (tests replace it)
clock = time.perf_counter


def _terminal(stream) -> bool:
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("CI")


class Phase:
    """Times one setup phase; shows it on ``stream`` once it has run ``show_after`` seconds.

    Args:
        desc: what the phase does, e.g. ``"synthetic graph"``.
        times: where its seconds go (``times[key]``), or ``None``.
        key: its key in ``times`` (default ``desc``).
        enabled: show it at all (``False``: only timed, as with ``--no-progress``).
        show_after: seconds before it is shown (default :data:`SHOW_AFTER`).
        stream: where it is shown (default ``sys.stderr``, read when the phase starts).

    Attributes:
        seconds: how long it ran (set when it ends).
        shown: whether it was shown.
    """

    def __init__(self, desc: str, times: Optional[dict] = None, key: Optional[str] = None,
                 *, enabled: bool = True, show_after: Optional[float] = None,
                 stream=None):  # fmt: skip
        self.desc, self.times, self.key = desc, times, key or desc
        self.enabled = enabled
        self.show_after = SHOW_AFTER if show_after is None else float(show_after)
        self.stream = stream
        self.seconds: Optional[float] = None
        self.shown = False
        self._done, self._total = 0, None
        self._bar, self._last_line = None, 0.0
        self._lock = threading.Lock()
        self._timer: Optional[threading.Timer] = None

    def __enter__(self) -> Phase:
        self.stream = self.stream or sys.stderr
        self.start = clock()
        if self.enabled and self.show_after > 0:  # an opaque phase is shown by the timer
            self._timer = threading.Timer(self.show_after, self._show)
            self._timer.daemon = True
            self._timer.start()
        return self

    def update(self, done: int, total: Optional[int] = None) -> None:
        """``done`` of ``total`` units so far (a ``progress(done, total)`` callback)."""
        self._done, self._total = done, total if total is not None else self._total
        if not self.enabled:
            return
        with self._lock:
            now = clock()
            if not self.shown:
                if now - self.start >= self.show_after:
                    self._show_locked()
                return
            if self._bar is None and self._total and _terminal(self.stream):
                self._open_bar()  # shown before its total was known
            if self._bar is not None:
                self._bar.update(done - self._bar.n)
            elif self._total and done < self._total and now - self._last_line >= LINE_EVERY:
                self._line(f"{self.desc}: {self._percent()} ({now - self.start:.0f} s)")
                self._last_line = now

    def __exit__(self, *exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.seconds = clock() - self.start
        if self.times is not None:
            self.times[self.key] = self.seconds
        if not self.enabled or exc[0] is not None:
            return
        with self._lock:
            if self._bar is not None:
                self._bar.close()
            if self.shown or self.seconds >= self.show_after:
                self._line(f"{self.desc}: done in {self.seconds:.1f} s")
            self.shown = True  # no late timer line after the end

    def _show(self) -> None:
        with self._lock:
            self._show_locked()

    def _show_locked(self) -> None:
        if self.shown:
            return
        self.shown, self._last_line = True, clock()
        if self._total and _terminal(self.stream):
            self._open_bar()
        elif self._total:
            self._line(f"{self.desc}: {self._percent()} ...")
        else:
            self._line(f"{self.desc} ...")

    def _open_bar(self) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=self._total, initial=self._done, desc=self.desc, file=self.stream,
                         leave=False, dynamic_ncols=True, mininterval=0.5)  # fmt: skip

    def _percent(self) -> str:
        return f"{100 * self._done / max(self._total or 1, 1):.0f}%"

    def _line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()
