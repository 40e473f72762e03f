"""Which ranks are still alive when an exchange fails: a heartbeat in the rendezvous store.

A failed collective says only that *a* connection broke (``Connection closed by peer
[10.0.0.7]:41236``) or that a wait timed out. So that the error can name the rank and the
node that went away, each rank's :class:`Heartbeat` adds one to its counter in the store
torch's launcher set up (``MASTER_ADDR:MASTER_PORT``) every ``interval`` seconds from a
background thread (a rank blocked in a collective keeps beating: the wait releases the GIL).
:meth:`Heartbeat.lost` reads every counter twice, ``2.5 interval`` apart: the ranks whose
counter did not move are lost. Where the store itself cannot be reached, the rank that hosts
it (the rendezvous on node 0) is gone.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from typing import Optional

__all__ = ["Heartbeat", "connect_store"]


def connect_store(timeout_s: float = 10.0):
    """A client of the launcher's store (``MASTER_ADDR``, ``MASTER_PORT``), or ``None``."""
    import torch.distributed as dist

    try:
        return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                             is_master=False,
                             timeout=datetime.timedelta(seconds=timeout_s))  # fmt: skip
    except (KeyError, ValueError, RuntimeError):
        return None


class Heartbeat:
    """This rank's beat, and the others' (see the module docstring).

    Args:
        store: a ``torch.distributed.Store`` (``add`` is all that is used).
        rank, world_size: this rank and the number of ranks.
        interval: seconds between two beats.
        prefix: the keys' prefix (one per launch: the launcher's restart count is in it).

    Example:
        >>> import torch.distributed as dist
        >>> store = dist.HashStore()
        >>> beats = [Heartbeat(store, r, 2, interval=0.02).start() for r in range(2)]
        >>> beats[1].stop()
        >>> beats[0].lost()
        [1]
        >>> beats[0].stop()
    """

    def __init__(self, store, rank: int, world_size: int, interval: float = 2.0,
                 prefix: Optional[str] = None):  # fmt: skip
        self.store, self.rank, self.world_size = store, int(rank), int(world_size)
        self.interval = float(interval)
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.prefix = prefix or f"dgl_rsc/beat/{restart}"
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _key(self, rank: int) -> str:
        return f"{self.prefix}/{rank}"

    def _beat(self) -> None:
        while not self._stop.is_set():
            try:
                self.store.add(self._key(self.rank), 1)
            except Exception:  # the store is gone: nobody can be told any more
                return
            self._stop.wait(self.interval)

    def start(self) -> Heartbeat:
        self._thread = threading.Thread(target=self._beat, name="dgl_rsc-heartbeat",
                                        daemon=True)  # fmt: skip
        self._thread.start()
        return self

    def stop(self) -> None:
        """No beat follows once this returns (the beating thread is joined)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=max(1.0, 2 * self.interval))

    def _counts(self) -> list:
        return [int(self.store.add(self._key(r), 0)) for r in range(self.world_size)]

    def lost(self) -> Optional[list]:
        """The ranks whose heartbeat stopped (ascending; this rank is never among them), or
        ``None`` where the store cannot be reached."""
        try:
            before = self._counts()
            time.sleep(2.5 * self.interval)
            after = self._counts()
        except Exception:
            return None
        return [r for r in range(self.world_size)
                if r != self.rank and after[r] <= before[r]]  # fmt: skip
