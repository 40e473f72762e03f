"""Estimator fidelity of RSC's sampled backward product, side by side at equal work.

On a GCN-normalized power-law graph with self-loops (``Â = D^-1/2 (A + I) D^-1/2``, what
``GraphConv(norm="both")`` computes) and an output gradient ``dY`` with log-normal row norms,
this measures the relative error ``||Ĝ - G|| / ||G||`` and the norm ratio ``||Ĝ|| / ||G||`` of
the aggregation's input gradient ``G = Â^T dY`` for

1. the row selection (table ``selection``): scoring rows of the binary ``A + I`` (the old
   drop-ins) or of the normalized ``Â`` (the paper's score), each with the ``topk`` and
   ``cost`` rules, with the self-loop diagonal sampled like any entry or kept exactly; and the
   original RSC code's setting (``Â`` without its diagonal sampled by top-k, the diagonal exact
   on top of the budget, i.e. for free). "Work" is non-zeros visited (an exact diagonal counts
   ``N``); every row except "diagonal free" spends the same work.
2. the scale of the sampled product (table ``scale``): none (the paper), total/kept score mass
   (``rescale`` before this study), the least-squares optimum ``<G_S, G> / ||G_S||^2`` (an
   oracle: it needs ``G``), its estimate from a few dropped rows drawn with probability
   proportional to their score (what the package does), and the energy ratio
   ``sqrt(sum s^2 / sum_S s^2)``.

``dY`` is ``random`` (independent Gaussian row directions) or ``coherent`` (rows share a
direction: ``v + 0.5 * noise``), both with row norms ``exp(N(0, 1))``. Example::

    python tools/experiments/fidelity.py --nodes 20000 --degree 19 --out docs/results/fidelity.json
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_common import machine, write_json

from dgl_rsc.backends import torch_ref
from dgl_rsc.data import synthetic_graph
from dgl_rsc.sampling import draw_sample, estimate_ls_scale, sample_product
from dgl_rsc.sparse.graph import Graph
from dgl_rsc.sparse.products import Scales, csr_t_mm


def make_graph(n, degree, seed):
    data = synthetic_graph(n, avg_degree=degree, feat_dim=4, seed=seed)
    loops = torch.arange(n)
    g = Graph(torch.cat([data.src, loops]), torch.cat([data.dst, loops]), n)
    A = g.adjacency()
    deg_in = A.row_nnz().float().clamp(min=1)
    deg_out = g.out_degrees().float().clamp(min=1)
    return A, Scales(row=deg_in.pow(-0.5), col=deg_out.pow(-0.5))


def make_dy(n, d, kind, seed):
    gen = torch.Generator().manual_seed(seed)
    norms = torch.randn(n, 1, generator=gen).exp()
    noise = torch.randn(n, d, generator=gen) / d**0.5
    if kind == "coherent":
        v = torch.randn(1, d, generator=gen)
        noise = v / v.norm() + 0.5 * noise
    return norms * noise / noise.norm(dim=1, keepdim=True)


def rel(a, b):
    return float((a - b).norm() / b.norm())


def selection_rows(A, scales, dY, budget):
    """Error and work of each selection variant at ``budget`` (no scale)."""
    G = csr_t_mm(A, dY, scales)
    n_diag = int(A.diagonal()[1].sum())
    binary = Scales(row=scales.row)  # the old drop-ins: column scale unseen by the scores
    out = []
    variants = [
        ("binary A+I, topk (old drop-ins)", binary, "topk", "sample", budget * A.nnz),
        ("normalized, topk, diagonal sampled", scales, "topk", "sample", budget * A.nnz),
        ("normalized, cost, diagonal sampled", scales, "cost", "sample", budget * A.nnz),
        ("normalized, topk, diagonal exact", scales, "topk", "exact", budget * A.nnz),
        ("normalized, cost, diagonal exact", scales, "cost", "exact", budget * A.nnz),
        ("original: topk, diagonal exact for free", scales, "topk", "exact",
         budget * A.nnz + n_diag),
    ]  # fmt: skip
    for name, sc, rule, diag, nnz_budget in variants:
        sampled = int(nnz_budget) - (n_diag if diag == "exact" else 0)  # the diagonal on top
        s = draw_sample(A, dY, sampled, rule, 10, torch_ref, False, sc, diag)
        if sc is binary:  # score without the column scale, multiply with it
            approx = sample_product(A, s, dY, Scales(row=scales.row)) * scales.col[:, None]
        else:
            approx = sample_product(A, s, dY, scales)
        work = int(s.nnz)
        out.append({"variant": name, "error": rel(approx, G), "norm_ratio": float(
            approx.norm() / G.norm()), "work": work, "work_fraction": work / A.nnz})  # fmt: skip
    return out


def scale_rows(A, scales, dY, budget, rule, diag, probe_rows, seed):
    G = csr_t_mm(A, dY, scales)
    n_diag = int(A.diagonal()[1].sum()) if diag == "exact" else 0  # applied on top
    s = draw_sample(A, dY, int(budget * A.nnz) - n_diag, rule, 10, torch_ref, False, scales,
                    diag)  # fmt: skip
    GS = sample_product(A, s, dY, scales)
    mask = s.mask
    sc = torch.nan_to_num(s.scores)
    total, kept = float(sc.sum()), float(sc[mask].sum())
    gen = torch.Generator().manual_seed(seed)
    est = float(estimate_ls_scale(A, dY, scales, GS, s.scores, mask, probe_rows, gen,
                                  skip_diagonal=diag == "exact"))  # fmt: skip
    factors = {
        "none (paper)": 1.0,
        "score mass (old rescale)": total / kept if kept > 0 else 1.0,
        "least squares (oracle)": float((GS * G).sum() / GS.square().sum()),
        "least squares, estimated": est,
        "energy ratio": float((sc.square().sum() / sc[mask].square().sum()).sqrt()),
    }
    return [
        {
            "scale": k,
            "factor": f,
            "error": rel(f * GS, G),
            "norm_ratio": float((f * GS).norm() / G.norm()),
        }
        for k, f in factors.items()
    ]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=20000)
    p.add_argument("--degree", type=float, default=19.0)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--budgets", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.3])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--probe-rows", type=int, default=256)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    A, scales = make_graph(args.nodes, args.degree, 0)
    result = {"machine": machine("cpu"), "command": " ".join(sys.argv), "nnz": A.nnz,
              "nodes": args.nodes, "selection": [], "scale": []}  # fmt: skip
    for kind in ("random", "coherent"):
        for budget in args.budgets:
            for seed in range(args.seeds):
                dY = make_dy(args.nodes, args.dim, kind, seed)
                for row in selection_rows(A, scales, dY, budget):
                    result["selection"].append({"dy": kind, "budget": budget, "seed": seed,
                                                **row})  # fmt: skip
                for rule in ("topk", "cost"):
                    for diag in ("sample", "exact"):
                        rows = scale_rows(A, scales, dY, budget, rule, diag, args.probe_rows,
                                          seed)  # fmt: skip
                        for row in rows:
                            result["scale"].append(
                                {
                                    "dy": kind,
                                    "budget": budget,
                                    "seed": seed,
                                    "rule": rule,
                                    "diagonal": diag,
                                    **row,
                                }
                            )
    write_json(args.out, result)
    summarize(result)


def summarize(result):
    import statistics as st

    def mean(rows, key):
        return st.mean(r[key] for r in rows)

    print(f"nnz {result['nnz']}")
    print("selection (mean over seeds): error random / coherent, work fraction")
    names = dict.fromkeys(r["variant"] for r in result["selection"])
    for b in sorted({r["budget"] for r in result["selection"]}):
        for v in names:
            rows = [r for r in result["selection"] if r["variant"] == v and r["budget"] == b]
            e = [mean([r for r in rows if r["dy"] == k], "error") for k in ("random", "coherent")]
            work = mean(rows, "work_fraction")
            print(f"  b={b:<5} {v:<42} {e[0]:.3f} / {e[1]:.3f}  work {work:.3f}")
    print("scale (cost rule, diagonal sampled: the defaults; mean over seeds): error, norm ratio")
    for b in sorted({r["budget"] for r in result["scale"]}):
        for kind in ("random", "coherent"):
            rows = [r for r in result["scale"] if r["budget"] == b and r["dy"] == kind
                    and r["rule"] == "cost" and r["diagonal"] == "sample"]  # fmt: skip
            for sc in dict.fromkeys(r["scale"] for r in rows):
                rr = [r for r in rows if r["scale"] == sc]
                print(
                    f"  b={b:<5} {kind:<9} {sc:<28} err {mean(rr, 'error'):.3f} "
                    f"norm {mean(rr, 'norm_ratio'):.3f} factor {mean(rr, 'factor'):.3f}"
                )


if __name__ == "__main__":
    main()
