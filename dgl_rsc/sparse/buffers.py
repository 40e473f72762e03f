"""``OutputPool``: reusable CPU output buffers for the sparse products.

A product's dense ``(M, D)`` output is a large allocation on every call. glibc serves blocks
above its mmap ceiling (32 MiB) from fresh pages, and their first-touch faults cost more than
the sampled product itself (200k x 128 fp32: 39 ms on one core to fault and zero 102 MB, 12 ms
to zero a reused buffer; ``docs/benchmarks.md``). CUDA has torch's caching allocator; on the CPU
the products keep their own buffers here, so that the default allocator is no handicap and no
environment variable is needed.

A buffer is handed out as an alias, ``buf.detach()``: a tensor of its own (not an autograd
view, so it may be returned from a custom ``autograd.Function`` and modified in place) that
shares the buffer's storage and its version counter. The storage's use count says whether
anyone still holds the alias or a view of it (autograd, a ``.grad`` that kept it, a user's
reference): a buffer is reused only when the pool holds the last reference, so handing it
out again can never overwrite a live tensor. The shared version counter says whether anyone
modified it in place since its writer last :meth:`~OutputPool.mark`-ed it.

That makes sparse writes possible: a sampled product whose slice touches few output rows
:meth:`~OutputPool.take`-s its buffer with a tag (the slice's structure token). When the
buffer it gets was last written, under the same tag, by a product that left every other row
zero, and nothing touched it since, the product writes only the rows its slice reaches; any
other buffer is written whole. Buffers belong to one sparse structure and are freed with it or
by :meth:`OutputPool.clear`.
"""

from __future__ import annotations

import functools
from collections import OrderedDict

import torch

__all__ = ["OutputPool", "POOL_MIN_BYTES"]

#: outputs smaller than this come from torch's allocator (glibc reuses such blocks anyway)
POOL_MIN_BYTES = 1 << 20
_MAX_PER_KEY = 16  # buffers of one shape held at most (a safety bound; use stays far below)
_MAX_KEYS = 8

_use_count = getattr(torch._C, "_storage_Use_Count", None)


@functools.cache
def _sole_owner_count() -> int:
    """The use count of a storage that one tensor alone holds.

    torch 2.2 reports 1; newer releases (2.15 at least) keep the storage's Python object alive
    with the storage once it has been asked for, which adds one reference of its own. Measured,
    not assumed, so that the pool works on both.
    """
    t = torch.empty(1)
    t.untyped_storage()
    return _use_count(t.untyped_storage()._cdata)


def _free(buf: torch.Tensor) -> bool:
    """Whether the pool holds the only reference to ``buf``'s storage.

    ``buf`` itself holds the references of :func:`_sole_owner_count`; every live alias, view
    or storage object adds one.
    """
    return _use_count(buf.untyped_storage()._cdata) <= _sole_owner_count()


def _alias(buf: torch.Tensor) -> torch.Tensor:
    """A tensor sharing ``buf``'s storage and version counter that is not an autograd view."""
    return buf.detach()


class OutputPool:
    """Buffers keyed by ``(shape, dtype)``, reused once nothing outside the pool holds them.

    Example:
        >>> pool = OutputPool()
        >>> a = pool.empty((1024, 512), torch.float32)
        >>> b = pool.empty((1024, 512), torch.float32)   # ``a`` is alive: a second buffer
        >>> a.data_ptr() != b.data_ptr()
        True
        >>> ptr = a.data_ptr(); del a
        >>> pool.empty((1024, 512), torch.float32).data_ptr() == ptr
        True
    """

    def __init__(self):
        self._bufs: OrderedDict[tuple, list] = OrderedDict()
        self._marks: dict[int, tuple] = {}  # data_ptr -> (tag, version when marked)

    @staticmethod
    def enabled_for(shape, dtype: torch.dtype, device: torch.device) -> bool:
        """Pooled: CPU outputs of at least :data:`POOL_MIN_BYTES`, when torch can tell use."""
        if _use_count is None or torch.device(device).type != "cpu":
            return False
        n = 1
        for s in shape:
            n *= int(s)
        return n * torch.empty((), dtype=dtype).element_size() >= POOL_MIN_BYTES

    def empty(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialized CPU tensor of ``shape`` (the caller writes every element)."""
        return self.take(shape, dtype)[0]

    def take(self, shape, dtype: torch.dtype, tag=None) -> tuple[torch.Tensor, bool]:
        """``(tensor, clean)``: a CPU tensor of ``shape``, and whether it holds exactly what
        the last product marked with ``tag`` (not ``None``) left in it, unmodified since.

        A free buffer so marked is preferred; otherwise any free buffer, or a new one, with
        ``clean`` false (its content is arbitrary).
        """
        key = (tuple(int(s) for s in shape), dtype)
        bufs = self._bufs.setdefault(key, [])
        self._bufs.move_to_end(key)
        free = [b for b in bufs if _free(b)]
        for buf in free if tag is not None else ():
            if self._marks.get(buf.data_ptr()) == (tag, buf._version):
                return _alias(buf), True
        if free:
            buf = free[0]
        else:
            buf = torch.empty(key[0], dtype=dtype)
            if len(bufs) < _MAX_PER_KEY:
                bufs.append(buf)
            while len(self._bufs) > _MAX_KEYS:
                for old in self._bufs.popitem(last=False)[1]:
                    self._marks.pop(old.data_ptr(), None)
        self._marks.pop(buf.data_ptr(), None)
        return _alias(buf), False

    def mark(self, out: torch.Tensor, tag) -> None:
        """Record that ``out`` (from :meth:`take`) now holds a product tagged ``tag``
        (nothing is recorded for a tensor that is not one of the pool's buffers)."""
        ptr = out.data_ptr()
        for buf in self._bufs.get((tuple(out.shape), out.dtype), ()):
            if buf.data_ptr() == ptr:
                self._marks[ptr] = (tag, out._version)
                return

    def nbytes(self) -> int:
        """Bytes held by the pool's buffers."""
        return sum(b.numel() * b.element_size() for bufs in self._bufs.values() for b in bufs)

    def clear(self) -> None:
        """Drop every buffer (aliases handed out stay valid: they keep their storage)."""
        self._bufs.clear()
        self._marks.clear()

    def __len__(self) -> int:
        return sum(len(b) for b in self._bufs.values())
