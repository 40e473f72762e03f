"""Time the budget solver for L layers x n rows next to one exact backward product.

python tools/experiments/bench_solver.py --device cuda --layers 3 --rows 2400000
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_common import grad_like, machine, power_law_csr, timeit, write_json

from dgl_rsc.core.solver import LayerProblem, allocate
from dgl_rsc.sampling import selection_key
from dgl_rsc.sparse.products import csr_t_mm


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--rows", type=int, default=2_400_000)
    ap.add_argument("--nnz", type=int, default=120_000_000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--budget", type=float, default=0.1)
    ap.add_argument("--rule", default="cost")
    ap.add_argument("--out", default="results/bench_solver.json")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    A = power_law_csr(args.rows, args.nnz, device=dev)
    dY = grad_like(args.rows, args.dim, device=dev)
    A.transposed()
    exact = timeit(lambda: csr_t_mm(A, dY), dev, reps=5)
    problems = []
    for layer in range(args.layers):
        s = A.row_norms() * grad_like(args.rows, 8, seed=10 + layer, device=dev).norm(dim=1)
        key = selection_key(s, A.row_nnz(), args.rule)
        mass = s.square() if args.rule == "cost" else s
        problems.append(LayerProblem(key, mass, A.row_nnz(), args.dim, 10))
    total = args.layers * A.nnz * args.dim
    solve = timeit(lambda: allocate(problems, args.budget * total), dev, reps=3)
    alloc = allocate(problems, args.budget * total)
    print(
        f"solver {args.layers} x {args.rows} rows on {dev}: {solve * 1e3:.1f} ms; one exact "
        f"A^T@dY ({A.nnz} nnz x {args.dim}): {exact * 1e3:.1f} ms; ratio {solve / exact:.2f}; "
        f"k={alloc.k}"
    )
    write_json(
        args.out,
        dict(
            machine=machine(dev),
            layers=args.layers,
            rows=args.rows,
            nnz=A.nnz,
            dim=args.dim,
            solve_s=solve,
            exact_product_s=exact,
            k=alloc.k,
            objective=alloc.objective,
            command=" ".join(sys.argv),
        ),
    )


if __name__ == "__main__":
    main()
