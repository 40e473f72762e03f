"""Node orders: renumber a graph's nodes once, at load time, so that the sparse products read
neighbour features from memory in a friendlier order; results go back to the dataset's order.

An order is a permutation ``perm (N,)`` with ``perm[new] = old``: node ``new`` of the reordered
graph is node ``perm[new]`` of the dataset. Edges, features, labels and masks all follow it, so
a model trained on the reordered graph computes the same numbers (up to the order of floating
point sums) for the same node; :func:`to_original` puts per-node outputs back in the dataset's
order.

Orders (:data:`NODE_ORDERS`):

- ``none``: the dataset's own order.
- ``degree``: by in-degree, highest first, ties in the dataset's order. The hubs, whose rows
  every product reads most often, sit together at the front.
- ``rcm``: reverse Cuthill-McKee. A breadth-first walk over in-edges from the lowest-degree
  node not yet reached (one walk per connected component), each node's new neighbours taken
  by increasing degree (ties by id); the walk's order is then reversed. Neighbours get nearby
  numbers, which narrows the band of the adjacency. For the package's graphs (undirected:
  both directions stored) this is the textbook RCM; ``O(E log d)`` in a compiled loop.

Example:
    >>> import torch
    >>> from dgl_rsc.data import synthetic_graph
    >>> d = synthetic_graph(num_nodes=200, avg_degree=6.0, num_classes=3, feat_dim=4)
    >>> r, perm = reorder(d, "degree")
    >>> back = to_original(r.label, perm)
    >>> bool(torch.equal(r.feat, d.feat[perm])), bool(torch.equal(back, d.label))
    (True, True)
    >>> deg = r.in_degrees()
    >>> bool((deg[:-1] >= deg[1:]).all())
    True
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import numpy as np
import torch

from ..base.names import unknown
from .graphdata import GraphData

__all__ = [
    "NODE_ORDERS",
    "degree_order",
    "inverse",
    "permute",
    "rcm_order",
    "reorder",
    "to_original",
]


def degree_order(data: GraphData) -> torch.Tensor:
    """``perm (N,)`` int64: nodes by in-degree, highest first, ties in the dataset's order."""
    return torch.sort(data.in_degrees(), descending=True, stable=True).indices


def rcm_order(data: GraphData) -> torch.Tensor:
    """``perm (N,)`` int64: reverse Cuthill-McKee over in-edges (see the module docstring)."""
    from ._cuthill_mckee import cuthill_mckee

    n = data.num_nodes
    src, dst = data.src.cpu(), data.dst.cpu()
    if src.numel() > 1 and not bool((dst[1:] >= dst[:-1]).all()):
        by_dst = torch.argsort(dst, stable=True)
        src, dst = src[by_dst], dst[by_dst]
    degree = torch.bincount(dst, minlength=n)
    indptr = torch.zeros(n + 1, dtype=torch.int64)
    torch.cumsum(degree, 0, out=indptr[1:])
    seeds = torch.sort(degree, stable=True).indices  # lowest degree first
    order = cuthill_mckee(indptr.numpy(), src.numpy(), seeds.numpy(), degree.numpy())
    return torch.from_numpy(np.ascontiguousarray(order[::-1])).to(data.device)


def _identity(data: GraphData) -> torch.Tensor:
    return torch.arange(data.num_nodes, device=data.device)


#: ``name -> function(GraphData) -> perm (N,)`` with ``perm[new] = old``
NODE_ORDERS: dict[str, Callable[[GraphData], torch.Tensor]] = {
    "none": _identity,
    "degree": degree_order,
    "rcm": rcm_order,
}


def inverse(perm: torch.Tensor) -> torch.Tensor:
    """``inv (N,)`` with ``inv[perm[i]] = i``: a dataset node's new id."""
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device, dtype=perm.dtype)
    return inv


def reorder(data: GraphData, method: str) -> tuple[GraphData, Optional[torch.Tensor]]:
    """``(reordered data, perm)`` for node order ``method`` (a key of :data:`NODE_ORDERS`).

    The edges of the result are sorted by destination, then source (the loaders' order).
    ``none`` returns ``data`` itself and ``perm`` ``None``.

    Raises:
        ValueError: ``method`` is not a known order (the message names the nearest one).
    """
    if method not in NODE_ORDERS:
        raise unknown("node order", method, NODE_ORDERS)
    if method == "none":
        return data, None
    perm = NODE_ORDERS[method](data).to(data.device, torch.int64)
    return permute(data, perm), perm


def permute(data: GraphData, perm: torch.Tensor) -> GraphData:
    """``data`` with node ``perm[new]`` renamed ``new`` (edges, features, labels, masks)."""
    n = data.num_nodes
    if tuple(perm.shape) != (n,) or not torch.equal(
        torch.sort(perm).values, torch.arange(n, device=perm.device)
    ):
        raise ValueError(f"a node order must be a permutation of 0..{n - 1}, got shape "
                         f"{tuple(perm.shape)} or repeated ids.")  # fmt: skip
    inv = inverse(perm)
    key = torch.sort(inv[data.dst] * n + inv[data.src]).values
    per_node = {
        f.name: getattr(data, f.name)[perm]
        for f in dataclasses.fields(data)
        if f.name in ("feat", "label", "train_mask", "val_mask", "test_mask")
    }
    return dataclasses.replace(data, src=key % n, dst=key // n, **per_node)


def to_original(x: torch.Tensor, perm: Optional[torch.Tensor]) -> torch.Tensor:
    """Per-node rows ``x (N, ...)`` of the reordered graph, in the dataset's order
    (``x`` itself when ``perm`` is ``None``)."""
    if perm is None:
        return x
    out = torch.empty_like(x)
    out[perm.to(x.device)] = x
    return out
