"""Every rank of a halo exchange in one process: ``torch.distributed``'s ``isend``/``irecv``
between threads (one thread a rank), for single-process tests of the real exchanges.
"""

from __future__ import annotations

import collections
import threading

import torch.distributed as dist

__all__ = ["Loopback"]


class _Work:
    def __init__(self, done=None):
        self._done = done

    def wait(self, timeout=None):
        if self._done is not None:
            self._done(timeout)
        return True


class Loopback:
    """A mailbox per ``(source, destination, tag)``; messages of one key arrive in the order
    they were sent (as gloo matches them). While entered, ``dist.isend`` and ``dist.irecv``
    go through it; :meth:`run` runs ``fn(rank)`` on ``world`` threads and returns the
    results by rank (re-raising the first failure)."""

    def __init__(self, timeout: float = 30.0):
        self.timeout = timeout
        self.box: dict = collections.defaultdict(collections.deque)
        self.cv = threading.Condition()
        self.local = threading.local()

    def __enter__(self):
        self._saved = dist.isend, dist.irecv
        dist.isend, dist.irecv = self.isend, self.irecv
        return self

    def __exit__(self, *exc):
        dist.isend, dist.irecv = self._saved

    def isend(self, tensor, dst, tag=0, **_):
        with self.cv:
            self.box[(self.local.rank, int(dst), tag)].append(tensor.detach().clone())
            self.cv.notify_all()
        return _Work()

    def irecv(self, tensor, src, tag=0, **_):
        key = (int(src), self.local.rank, tag)

        def done(timeout):
            with self.cv:
                if not self.cv.wait_for(lambda: self.box[key], self.timeout):
                    raise RuntimeError(f"loopback: nothing from rank {src} (tag {tag})")
                tensor.copy_(self.box[key].popleft())

        return _Work(done)

    def run(self, world: int, fn) -> list:
        out, errors = [None] * world, []

        def body(rank):
            self.local.rank = rank
            try:
                out[rank] = fn(rank)
            except BaseException as exc:  # re-raised in the caller
                errors.append(exc)

        threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return out
