"""The Cuthill-McKee walk of :func:`dgl_rsc.data.reorder.rcm_order`, compiled by Numba (its own
module, so that importing :mod:`dgl_rsc.data` does not import Numba)."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["cuthill_mckee"]


@njit(cache=True, boundscheck=False)
def cuthill_mckee(indptr, indices, seeds, degree):
    """``order (N,)`` int64: the Cuthill-McKee order (not reversed).

    Args:
        indptr: ``(N + 1,)`` int64 CSR row pointers; row ``v`` lists ``v``'s neighbours.
        indices: ``(E,)`` int64 neighbours.
        seeds: ``(N,)`` int64 every node, in the order walks may start from (lowest degree
            first); a walk starts at the first seed not yet reached.
        degree: ``(N,)`` int64 the key that orders a node's newly reached neighbours
            (ties by id).
    """
    n = indptr.size - 1
    order = np.empty(n, np.int64)
    seen = np.zeros(n, np.bool_)
    count = 0
    for s in seeds:
        if seen[s]:
            continue
        seen[s] = True
        order[count] = s
        count += 1
        head = count - 1
        while head < count:
            v = order[head]
            head += 1
            start = count
            for p in range(indptr[v], indptr[v + 1]):
                u = indices[p]
                if not seen[u]:
                    seen[u] = True
                    order[count] = u
                    count += 1
            if count - start > 1:
                new = order[start:count].copy()
                order[start:count] = new[np.argsort(degree[new] * n + new)]
    return order
