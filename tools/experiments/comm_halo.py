"""The halo at scale: METIS edge cut and halo rows per rank measured on the graphs here, the
model the projections use (:func:`halo_per_rank`), and the fit of the edge-cut fraction
against the part count.

The model: a rank owns ``n / P`` nodes; the ``d_u`` out-edges of a node ``u`` of another rank
go out in ``d_u / g`` clumps (``g``, the clump, fitted: a partitioner keeps a node's neighbours
together; 1 for a random placement), each cut with probability ``kappa(P)`` and then landing
on one of the ``P - 1`` other ranks, so ``u`` is in a given rank's halo with probability
``1 - (1 - kappa / (P - 1))^(d_u / g)``, and the mean halo per rank is ``(1 - 1/P)`` times
the sum of that over all nodes (1D at ``P`` parts; exact in expectation for a random
partition). Only the rows whose gradient is non-zero travel backward: with a share ``t`` of
the destination rows in the gradient's support, ``kappa`` becomes ``t kappa``. Measured here
against METIS partitions of real and synthetic graphs at 2-256 parts (``check``: measured over
modelled halo; ``g`` fitted per graph), with ``kappa(P)`` also fitted as ``kappa_2 + slope *
log2(P / 2)`` (capped at ``1 - 1/P``, a random partition's cut).

Example::

    python tools/experiments/comm_halo.py --graph npz:../shared/data/cora.npz \\
        --graph synthetic:100000:50:0.8:47 --parts 2 4 8 16 32 64 --out docs/results/comm_halo.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_common import machine, write_json

from dgl_rsc.base.memory import peak_rss_bytes
from dgl_rsc.distributed.partition import partition_nodes, partition_quality


def halo_per_rank(
    degrees: torch.Tensor,
    parts: int,
    kappa: float,
    support: float = 1.0,
    clump: float = 1.0,
    scale: float = 1.0,
) -> float:
    """Modelled mean halo rows per rank (see the module docstring). ``degrees``: out-degrees
    (the graph's, or a sample of its law: then ``scale`` = nodes / samples); ``support``:
    the fraction of destination rows whose gradient is non-zero (1.0: the forward halo);
    ``clump``: cut edges of one node that land on one rank together (a partitioner keeps a
    node's neighbours together: fitted per graph family, 1.0 for random placement)."""
    if parts < 2:
        return 0.0
    hit = min(kappa * support / (parts - 1), 1.0)  # a clump of cut edges lands on this rank
    miss = torch.exp(degrees.double() / clump * math.log1p(-hit)) if hit < 1 else 0.0
    return float(scale * (1 - 1 / parts) * (1 - miss).sum())


def fit_clump(rows: list, degrees: dict) -> float:
    """The ``clump`` (in [1, 64]) that best fits the measured mean halos of ``rows`` (least
    squares of the log ratio; ``degrees[graph]``: that graph's out-degrees)."""

    def loss(g):
        return sum(math.log(r["halo_mean"] / halo_per_rank(degrees[r["graph"]], r["parts"],
                                                           r["edge_cut_fraction"], clump=g)) ** 2
                   for r in rows if r["halo_mean"] > 0)  # fmt: skip

    grid = [1.0 * 1.05**i for i in range(86)]  # 1 .. ~64, 5 % steps
    return min(grid, key=loss)


def kappa_at(fit: dict, parts: int) -> float:
    """The fitted edge-cut fraction at ``parts`` (``fit``: ``{"kappa_2", "slope"}``)."""
    if parts < 2:
        return 0.0
    k = fit["kappa_2"] + fit["slope"] * math.log2(parts / 2)
    return min(max(k, 0.0), 1 - 1 / parts)


def fit_kappa(rows: list) -> dict:
    """Least-squares ``kappa_2`` and ``slope`` of ``rows`` (``{"parts", "edge_cut_fraction"}``)."""
    x = torch.tensor([math.log2(r["parts"] / 2) for r in rows], dtype=torch.float64)
    y = torch.tensor([r["edge_cut_fraction"] for r in rows], dtype=torch.float64)
    a = torch.stack([torch.ones_like(x), x], 1)
    sol = torch.linalg.lstsq(a, y.unsqueeze(1)).solution.squeeze(1)
    return {"kappa_2": float(sol[0]), "slope": float(sol[1]), "points": len(rows)}


def clump_at(degrees: torch.Tensor, parts: int, kappa: float, halo: float) -> float:
    """The clump for which :func:`halo_per_rank` gives the measured mean ``halo`` (bisection
    in ``[1/4, 4096]``: the modelled halo falls as the clump grows)."""
    lo, hi = 0.25, 4096.0
    for _ in range(60):
        mid = (lo * hi) ** 0.5
        if halo_per_rank(degrees, parts, kappa, clump=mid) > halo:
            lo = mid
        else:
            hi = mid
    return (lo * hi) ** 0.5


def degree_histogram(degrees: torch.Tensor) -> list:
    """``[[degree, nodes], ...]`` of an out-degree sequence (what the projection rebuilds)."""
    values, counts = torch.unique(degrees, return_counts=True)
    return [[int(v), int(c)] for v, c in zip(values, counts)]


def degree_law(mean: float, exponent: float, n: int, samples: int = 200_000, seed: int = 0):
    """``samples`` out-degrees of a power law (the synthetic generator's Pareto weights, tail
    ``exponent - 1``, capped at ``n - 1``) scaled to ``mean``; the model multiplies sums over
    them by ``n / samples``."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(samples, generator=gen, dtype=torch.float64)
    theta = (1.0 - u).pow(-1.0 / (exponent - 1.0))
    return (theta * mean / theta.mean()).clamp(max=n - 1)


def _graph(spec: str):
    from dgl_rsc.data import load_npz, synthetic_graph

    if spec.startswith("npz:"):
        d = load_npz(spec[4:])
        return d.name, d.src, d.dst, d.num_nodes
    n, deg, homophily, classes = spec.split(":")[1:]
    d = synthetic_graph(num_nodes=int(n), avg_degree=float(deg), homophily=float(homophily),
                        num_classes=int(classes), feat_dim=1)  # fmt: skip
    return spec, d.src, d.dst, d.num_nodes


#: out-degrees of the graphs measured in this process (for the clump fit)
DEGREES: dict = {}


def measure(spec: str, parts: list, method: str = "metis") -> list:
    """One row per part count: METIS's cut, the measured and modelled halo per rank, the
    partition's seconds and the process's peak memory."""
    name, src, dst, n = _graph(spec)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    deg = torch.bincount(src, minlength=n)
    DEGREES[name] = deg
    rows = []
    for p in parts:
        t0 = time.perf_counter()
        part = partition_nodes(src, dst, n, p, method)
        seconds = time.perf_counter() - t0
        q = partition_quality(src, dst, n, part, p)
        model = halo_per_rank(deg, p, q["edge_cut_fraction"])
        mean = sum(q["halo_nodes"]) / p
        rows.append({"graph": name, "spec": spec, "num_nodes": n, "num_edges": int(src.numel()),
                     "avg_degree": src.numel() / n, "method": method, "parts": p,
                     "edge_cut_fraction": q["edge_cut_fraction"], "halo_mean": mean,
                     "halo_max": max(q["halo_nodes"]), "halo_model": model,
                     "check": mean / model if model else None, "partition_s": seconds,
                     "peak_rss_gb": peak_rss_bytes() / 1e9})  # fmt: skip
        print(f"{name} P={p}: cut {q['edge_cut_fraction']:.3f}, halo {mean:.0f} per rank "
              f"(model {model:.0f}), {seconds:.1f} s", flush=True)  # fmt: skip
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--graph",
        action="append",
        default=[],
        help="npz:PATH or synthetic:NODES:DEGREE:HOMOPHILY:CLASSES (repeatable)",
    )
    p.add_argument("--parts", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64])
    p.add_argument("--method", default="metis")
    p.add_argument("--refit", metavar="JSON", help="fit the rows of this file again (the "
                   "graphs are rebuilt for their degrees, not partitioned)")  # fmt: skip
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.refit:
        with open(args.refit, encoding="utf-8") as f:
            rows = json.load(f)["rows"]
        for graph in dict.fromkeys(r["graph"] for r in rows):
            spec = next(r for r in rows if r["graph"] == graph).get("spec") or graph
            if not spec.startswith(("synthetic", "npz:")):  # rows of an older file
                spec = f"npz:{os.path.dirname(__file__)}/../../../shared/data/{graph}.npz"
            _, src, dst, n = _graph(spec)
            keep = src != dst
            DEGREES[graph] = torch.bincount(src[keep], minlength=n)
    else:
        rows = [r for g in args.graph for r in measure(g, args.parts, args.method)]
    for r in rows:
        r["halo_model"] = halo_per_rank(DEGREES[r["graph"]], r["parts"], r["edge_cut_fraction"])
    groups = {
        g: [r for r in rows if r["graph"] == g] for g in dict.fromkeys(r["graph"] for r in rows)
    }
    real = [r for r in rows if not r["graph"].startswith("synthetic")]
    if real:
        groups["real graphs"] = real
    fits = {}
    for name, sel in groups.items():
        fits[name] = {**fit_kappa(sel), "clump": fit_clump(sel, DEGREES)}
    for r in rows:  # each row against its own graph's fit, and the clump that matches it
        deg = DEGREES[r["graph"]]
        r["halo_model_fit"] = halo_per_rank(deg, r["parts"], r["edge_cut_fraction"],
                                            clump=fits[r["graph"]]["clump"])  # fmt: skip
        r["clump_at_p"] = clump_at(deg, r["parts"], r["edge_cut_fraction"], r["halo_mean"])
    degrees = {g: degree_histogram(d) for g, d in DEGREES.items() if g.startswith("synthetic")}
    write_json(args.out, {"machine": machine("cpu"), "command": " ".join(sys.argv),
                          "rows": rows, "kappa_fit": fits, "degrees": degrees})  # fmt: skip
    print(fits)


if __name__ == "__main__":
    main()
