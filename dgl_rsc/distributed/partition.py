"""Node partitions of a graph for partition-parallel training: who owns which node.

A partition is a ``(N,)`` int64 vector ``part`` with ``part[v]`` in ``[0, P)``: rank
``part[v]`` owns node ``v``, its feature row and its in-edges (messages flow ``src -> dst``,
so a rank aggregates into the rows it owns). :func:`partition_nodes` computes one with a
method of :data:`PARTITIONERS`, :func:`partition_quality` measures it, and
:func:`load_or_partition` keeps both in an on-disk cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import numbers
import os
import re
import time
from typing import Callable, Optional, Union

import numpy as np
import torch

from ..base import _deps
from ..base.atomic import atomic_write_text
from ..base.names import did_you_mean
from ..base.npz_cache import read_entry, write_entry
from ..sparse.graph import check_edges

__all__ = [
    "PARTITIONERS",
    "metis_assignment",
    "partition_nodes",
    "partition_quality",
    "load_or_partition",
]

log = logging.getLogger(__name__)


def part_vector(
    part, n: int, parts: Optional[int] = None, name: str = "part", count: str = "parts",
    hint: str = "; compute it with partition_nodes",
) -> tuple[torch.Tensor, int]:  # fmt: skip
    """Validated ``(part, P)``: ``(N,)`` int64 on the CPU with values in ``[0, P)`` (``P`` the
    largest id plus one when ``parts`` is not given). ``name``, ``count`` and ``hint`` word the
    errors for the caller's argument (the mini-batch clusters call it ``partition``)."""
    part = torch.as_tensor(part)
    if part.shape != (n,) or part.is_floating_point() or part.dtype == torch.bool:
        raise ValueError(
            f"{name} must be an (N,) = ({n},) integer tensor, got {part.dtype} "
            f"{tuple(part.shape)}{hint}."
        )
    part = part.to("cpu", torch.int64)
    p = int(part.max()) + 1 if parts is None else int(parts)
    if int(part.min()) < 0 or int(part.max()) >= p:
        raise ValueError(
            f"{name} ids must lie in [0, {count}={p}); got [{part.min()}, {part.max()}]."
        )
    return part, p


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _check_args(n: int, parts, method, seed) -> None:
    if method not in PARTITIONERS:
        hint = did_you_mean(str(method), PARTITIONERS)
        raise ValueError(f"unknown method={method!r}.{hint} Known: {', '.join(PARTITIONERS)}.")
    if not _is_int(parts) or not 1 <= parts <= n:
        raise ValueError(
            f"parts={parts!r} must be an integer in [1, num_nodes={n}] (every "
            "part must own at least one node)."
        )
    if not _is_int(seed) or seed < 0:
        raise ValueError(f"seed={seed!r} must be a non-negative integer.")


def _symmetric_csr(src, dst, n) -> tuple[np.ndarray, np.ndarray]:
    """``(xadj (N+1,), adjncy (E',))`` int64 of the symmetrized graph, no loops, no repeats."""
    from ..data.graphdata import clean_edges

    s, d = clean_edges(src, dst, n, symmetrize=True)  # sorted by d, then s
    xadj = torch.zeros(n + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(d, minlength=n), 0, out=xadj[1:])
    return xadj.numpy(), s.numpy()


def metis_assignment(
    src,
    dst,
    n: int,
    parts: int,
    seed: int,
    instead: str = "use method='random' or 'contiguous'",
    progress: Optional[Callable[[int, int], None]] = None,
    report: Optional[dict] = None,
) -> torch.Tensor:
    """``(N,)`` int64 METIS part of each node: pymetis on the symmetrized graph without
    self-loops, METIS seeded with ``seed`` (deterministic for a given seed). Without pymetis,
    an ``ImportError`` that says how to install it, or what to do ``instead``. With
    ``progress`` (called as ``progress(step, 3)``: symmetrized, METIS, done), a graph of more
    than :data:`~dgl_rsc.distributed.metis_child.CHILD_EDGES` edges is cut in a child process
    (the same result) while ``progress`` keeps being called; ``report`` receives
    ``metis_s`` and, from a child, its peak resident memory ``metis_peak_bytes``."""
    pymetis, reason = _deps._probe("pymetis")
    if pymetis is None:
        raise ImportError(f"METIS partitions need pymetis, which is not usable ({reason}): "
                          f"`pip install pymetis`, or {instead}.")  # fmt: skip
    from .metis_child import CHILD_EDGES, metis_in_child

    step = progress or (lambda done, total: None)
    xadj, adjncy = _symmetric_csr(src, dst, n)
    step(1, 3)
    t0, report = time.perf_counter(), {} if report is None else report
    if progress is not None and adjncy.size > CHILD_EDGES:
        part, peak = metis_in_child(xadj, adjncy, parts, seed, lambda: step(1, 3))
        report["metis_peak_bytes"] = int(peak)
    else:
        result = pymetis.part_graph(parts, adjacency=pymetis.CSRAdjacency(xadj, adjncy),
                                    options=pymetis.Options(seed=int(seed)))  # fmt: skip
        part = np.asarray(result.vertex_part, dtype=np.int64)
    report["metis_s"] = time.perf_counter() - t0
    step(2, 3)
    return torch.as_tensor(part)


def _metis_dgl(src, dst, n: int, parts: int, seed: int) -> torch.Tensor:
    dgl = _deps.require_dgl()
    from ..data.graphdata import clean_edges

    s, d = clean_edges(src, dst, n, symmetrize=True)
    # DGL's wrapper takes no seed: METIS' default seed is used whatever ``seed`` says
    return dgl.metis_partition_assignment(dgl.graph((s, d), num_nodes=n), parts).long()


def _random(src, dst, n: int, parts: int, seed: int) -> torch.Tensor:
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))
    part = torch.empty(n, dtype=torch.int64)
    part[perm] = torch.arange(n) * parts // n  # part sizes differ by at most one
    return part


def _contiguous(src, dst, n: int, parts: int, seed: int) -> torch.Tensor:
    return torch.arange(n) * parts // n


#: ``method -> fn(src, dst, N, parts, seed) -> (N,) int64`` (arguments already validated).
PARTITIONERS: dict[str, Callable[..., torch.Tensor]] = {
    "metis": metis_assignment,  # pymetis on the symmetrized graph, seeded
    "metis-dgl": _metis_dgl,  # DGL's METIS (needs DGL; no seed: calls may differ)
    "random": _random,  # a seeded random permutation cut into equal parts
    "contiguous": _contiguous,  # node id ranges of equal size
}


def partition_nodes(
    src,
    dst,
    num_nodes: int,
    parts: int,
    method: str = "metis",
    seed: int = 0,
    progress: Optional[Callable[[int, int], None]] = None,
    report: Optional[dict] = None,
) -> torch.Tensor:
    """Assign each node to one of ``parts`` parts.

    Args:
        src, dst: ``(E,)`` integer edge list (``src -> dst``); direction, repeats and
            self-loops do not matter to METIS, which sees the symmetrized simple graph.
        num_nodes: ``N``.
        parts: ``P``, in ``[1, N]``.
        method: a key of :data:`PARTITIONERS`.
        seed: seed of ``random`` and of METIS (the same seed gives the same partition).
        progress, report: METIS's progress callback and measurements
            (:func:`metis_assignment`; other methods ignore them).

    Returns:
        ``(N,)`` int64 CPU tensor of part ids in ``[0, P)``; every part is non-empty.

    Raises:
        ValueError: bad arguments, unknown method (with the nearest one), or an empty part.
        ImportError: ``metis`` without pymetis, ``metis-dgl`` without DGL.

    Example:
        >>> src, dst = torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 0])
        >>> partition_nodes(src, dst, 5, 2, method="contiguous").tolist()
        [0, 0, 0, 1, 1]
    """
    src, dst, n = check_edges(src, dst, num_nodes)
    _check_args(n, parts, method, seed)
    kw = {"progress": progress, "report": report} if method == "metis" else {}
    part = PARTITIONERS[method](src, dst, n, int(parts), int(seed), **kw).to(torch.int64)
    sizes = torch.bincount(part, minlength=int(parts))
    if part.shape != (n,) or sizes.numel() != parts:
        raise RuntimeError(f"method {method!r} returned a malformed partition {tuple(part.shape)}.")
    if bool((sizes == 0).any()):
        empty = torch.nonzero(sizes == 0).flatten().tolist()
        raise ValueError(
            f"method={method!r} left part(s) {empty} of {parts} empty (this happens "
            "on tiny or disconnected graphs); use fewer parts or method='random'."
        )
    return part


def partition_quality(src, dst, num_nodes: int, part, parts: Optional[int] = None) -> dict:
    """Size, balance and edge cut of a partition, as plain Python numbers (JSON-ready).

    Rank ``r`` owns the nodes with ``part == r`` and their in-edges. A node is *marginal*
    when at least one of its in-neighbours lives on another part, *central* otherwise; the
    *halo* of ``r`` is the set of distinct remote in-neighbours of its nodes.

    Args:
        src, dst: ``(E,)`` edge list, counted as given (repeats count).
        num_nodes: ``N``.
        part: ``(N,)`` part ids.
        parts: ``P``; default ``part.max() + 1``.

    Returns:
        ``{"parts", "num_nodes", "num_edges", "nodes", "edges", "halo_nodes", "marginal",
        "central"`` (lists of length ``P``), ``"edge_cut"`` (edges across parts),
        ``"edge_cut_fraction"``, ``"node_balance"``, ``"edge_balance"`` (max / mean; 1.0 for
        a graph without edges)``}``.

    Example:
        >>> q = partition_quality(torch.tensor([0, 1]), torch.tensor([1, 2]), 3,
        ...                       torch.tensor([0, 0, 1]))
        >>> q["edges"], q["edge_cut"], q["halo_nodes"], q["marginal"], q["central"]
        ([1, 1], 1, [0, 1], [0, 1], [2, 0])
    """
    src, dst, n = check_edges(src, dst, num_nodes)
    part, p = part_vector(part, n, parts)
    cut = part[src] != part[dst]
    nodes = torch.bincount(part, minlength=p)
    edges = torch.bincount(part[dst], minlength=p)
    halo = torch.unique(part[dst[cut]] * n + src[cut])
    halo_nodes = torch.bincount(torch.div(halo, n, rounding_mode="floor"), minlength=p)
    marginal = torch.bincount(part[torch.unique(dst[cut])], minlength=p)
    n_cut, e = int(cut.sum()), int(src.numel())
    return {
        "parts": p,
        "num_nodes": n,
        "num_edges": e,
        "nodes": nodes.tolist(),
        "edges": edges.tolist(),
        "edge_cut": n_cut,
        "edge_cut_fraction": n_cut / e if e else 0.0,
        "halo_nodes": halo_nodes.tolist(),
        "marginal": marginal.tolist(),
        "central": (nodes - marginal).tolist(),
        "node_balance": float(nodes.max()) / (n / p),
        "edge_balance": float(edges.max()) / (e / p) if e else 1.0,
    }


# ---- the disk cache -----------------------------------------------------------------------

_QUALITY_KEYS = frozenset(("parts", "num_nodes", "num_edges", "nodes", "edges", "edge_cut",
                           "edge_cut_fraction", "halo_nodes", "marginal", "central",
                           "node_balance", "edge_balance"))  # fmt: skip
_FORMAT = "dgl_rsc.partition/1"  # marks a file as ours; bump it when the layout changes
_NAME = re.compile(r"part-[a-z0-9-]+-p\d+-s\d+-[0-9a-f]{20}\.(npz|json)")


def _cache_key(src, dst, n: int, parts: int, method: str, seed: int) -> str:
    h = hashlib.sha256(_FORMAT.encode())
    h.update(json.dumps([n, int(src.numel()), parts, method, seed]).encode())
    for t in (src, dst):  # int64, contiguous: hashed in place
        h.update(memoryview(t.contiguous().numpy()).cast("B"))
    return h.hexdigest()


def _read_part(path: str, key: str, n: int, parts: int) -> tuple[str, Optional[torch.Tensor]]:
    """``("hit", part)`` or ``(why not, None)``; why not is missing/corrupt/stale/foreign."""
    status, arrays = read_entry(path, _FORMAT, key, ("part", "num_nodes"))
    if status != "hit":
        return status, None
    if int(arrays["num_nodes"]) != n:
        return "stale", None
    if arrays["part"].dtype.kind not in "iu":
        return "corrupt", None
    part = torch.from_numpy(arrays["part"].astype(np.int64))
    ok = part.shape == (n,) and bool(((part >= 0) & (part < parts)).all())
    ok = ok and bool((torch.bincount(part, minlength=parts) > 0).all())  # no empty part
    return ("hit", part) if ok else ("corrupt", None)


def _read_quality(
    path: str, key: str, part: torch.Tensor, parts: int, num_edges: int
) -> tuple[str, Optional[dict]]:
    """Like :func:`_read_part`; a record whose quality does not fit ``part`` (its keys, its
    sizes, its node counts per part) is ``corrupt``."""  # fmt: skip
    if not os.path.exists(path):
        return "missing", None
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return "corrupt", None
    if not isinstance(record, dict) or record.get("format") != _FORMAT:
        return "foreign", None
    if record.get("key") != key:
        return "stale", None
    q = record.get("quality")
    ok = isinstance(q, dict) and set(q) == _QUALITY_KEYS
    ok = ok and (q["parts"], q["num_nodes"], q["num_edges"]) == (parts, part.numel(), num_edges)
    ok = ok and q["nodes"] == torch.bincount(part, minlength=parts).tolist()
    return ("hit", q) if ok else ("corrupt", None)


def load_or_partition(
    src,
    dst,
    num_nodes: int,
    parts: int,
    method: str = "metis",
    seed: int = 0,
    cache_dir: Union[str, os.PathLike, None] = None,
    progress: Optional[Callable[[int, int], None]] = None,
    report: Optional[dict] = None,
) -> tuple[torch.Tensor, dict, Optional[str]]:
    """:func:`partition_nodes` and :func:`partition_quality`, cached on disk.

    The file ``cache_dir/part-{method}-p{parts}-s{seed}-{hash}.npz`` (numpy, loaded with
    ``allow_pickle=False``) holds the part vector, the full SHA-256 key of (edge list, ``N``,
    ``parts``, ``method``, ``seed``) and ``N``; the quality sits next to it as ``.json``.
    Both are written atomically. A file of ours whose key or ``N`` does not match, whose
    content fails its checks (part ids in ``[0, P)``, no empty part; the quality's keys and
    node counts match the part vector), or a file at that name that cannot be read, is
    recomputed and replaced with a logged warning. A
    readable file at that name without our format marker is not ours: it is left untouched,
    the result is recomputed and not cached (``path`` is then ``None``).

    Args:
        src, dst, num_nodes, parts, method, seed: as in :func:`partition_nodes`.
        cache_dir: the cache folder (created when missing); ``None`` disables the cache.
        progress: passed to :func:`partition_nodes` when the partition is computed.
        report: filled with ``cached`` (the partition was read from the cache), the seconds
            of ``partition_s`` (computing or reading it) and ``quality_s``, and what
            :func:`metis_assignment` measured.

    Returns:
        ``(part (N,) int64, quality dict, path of the .npz or None)``.
    """
    src, dst, n = check_edges(src, dst, num_nodes)
    _check_args(n, parts, method, seed)
    report = {} if report is None else report
    t0 = time.perf_counter()
    if cache_dir is None:
        part = partition_nodes(src, dst, n, parts, method, seed, progress, report)
        report.update(cached=False, partition_s=time.perf_counter() - t0)
        t0 = time.perf_counter()
        quality = partition_quality(src, dst, n, part, parts)
        report["quality_s"] = time.perf_counter() - t0
        return part, quality, None
    parts, seed = int(parts), int(seed)
    key = _cache_key(src, dst, n, parts, method, seed)
    name = f"part-{method}-p{parts}-s{seed}-{key[:20]}"
    if not _NAME.fullmatch(name + ".npz"):  # only ever write names of our own pattern
        raise ValueError(f"method={method!r} cannot name a cache file; use lowercase names.")
    path = os.path.join(os.fspath(cache_dir), name + ".npz")
    qpath = path[: -len(".npz")] + ".json"
    status, part = _read_part(path, key, n, parts)
    report["cached"] = status == "hit"
    if status != "hit":
        if status != "missing":
            log.warning("partition cache %s is %s; recomputing it", path, status)
        part = partition_nodes(src, dst, n, parts, method, seed, progress, report)
        if status == "foreign":
            log.warning("%s is not a dgl_rsc partition file; left untouched, not cached", path)
            report["partition_s"] = time.perf_counter() - t0
            return part, partition_quality(src, dst, n, part, parts), None
        write_entry(path, _FORMAT, key, {"part": part.numpy(), "num_nodes": np.array(n)},
                    compressed=True)  # fmt: skip
    report["partition_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    status, quality = _read_quality(qpath, key, part, parts, int(src.numel()))
    if status == "hit":
        report["quality_s"] = time.perf_counter() - t0
        return part, quality, path
    quality = partition_quality(src, dst, n, part, parts)
    report["quality_s"] = time.perf_counter() - t0
    if status == "foreign":
        log.warning("%s is not a dgl_rsc partition file; left untouched, not cached", qpath)
    else:
        if status != "missing":
            log.warning("partition quality %s is %s; rewriting it", qpath, status)
        record = {"format": _FORMAT, "key": key, "quality": quality}
        atomic_write_text(qpath, json.dumps(record, indent=1))
    return part, quality, path
