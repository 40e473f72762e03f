"""Single-operation benchmark: exact backward product vs RSC's, side by side in one process.

For a power-law matrix ``A`` and an output gradient ``dY (n, d)`` this times

- the exact ``A^T @ dY`` through every engine available: the package's engine (DGL's kernel
  where DGL imports, else the Numba CSR kernels, on the cached transpose; torch.sparse
  without either, cuSPARSE on CUDA), the Numba kernels on their own, and,
  when DGL imports, DGL's message-passing kernel (``copy_u``/``sum`` on the graph whose
  aggregation is ``A^T``: what stock ``dgl.nn`` convs run) and ``dgl.sparse.spmm``; the
  forward ``A @ X`` on the package's engine and on DGL's message passing;
- RSC at several budgets: scoring + selection, slicing (cutting ``A[S, :]^T``), and the
  sampled product, each separately; the refresh amortized over ``cache_interval`` steps;
  the per-step backward for cache intervals 1 and 10 measured through ``RSCController``;
- the relative error ``||approx - exact|| / ||exact||``.

Ratios are against the fastest exact engine (``prod x``, ``stepN x``) and against DGL's
message passing (``vs DGL``). Results go to a JSON file with the machine and
the date. Example::

    python tools/bench_spmm.py --nodes 200000 --nnz 10000000 --dim 256 --out results/cpu.json
    python tools/bench_spmm.py --device cuda --preset reddit --out results/h100.json
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))

from bench_common import grad_like, machine, power_law_csr, sync, timeit, write_json

from dgl_rsc import RSCController
from dgl_rsc.backends import resolve
from dgl_rsc.base import _deps
from dgl_rsc.core.spmm import spmm_matrix
from dgl_rsc.sampling import draw_sample, sample_product, selection_key
from dgl_rsc.sparse.products import NO_SCALES, _mm, cpu_engine, csr_mm, csr_t_mm

PRESETS = {
    "cpu": dict(nodes=200_000, nnz=10_000_000),
    # the two graphs of the CPU engine issue (quickstart size, and the 200k graph)
    "quickstart": dict(nodes=30_000, nnz=1_500_000, dim=64),
    "g200k": dict(nodes=200_000, nnz=8_200_000, dim=128),
    "reddit": dict(nodes=233_000, nnz=114_000_000),
    "products": dict(nodes=2_400_000, nnz=124_000_000),
}


DGL_MP = "DGL message passing (copy_u/sum)"


def dgl_message_graphs(A):
    """``(g, g_t)``: DGL graphs whose ``copy_u``/``sum`` aggregation is ``A @ X`` and
    ``A^T @ dY`` (edge ``j -> i`` for ``A[i, j]``), with their in-CSR built up front."""
    import dgl

    rows = torch.repeat_interleave(
        torch.arange(A.shape[0], device=A.indptr.device), A.row_nnz().long()
    )
    cols = A.indices.long()
    g = dgl.graph((cols, rows), num_nodes=max(A.shape))
    g_t = dgl.graph((rows, cols), num_nodes=max(A.shape))
    for graph in (g, g_t):
        graph.create_formats_()
    return g, g_t


def exact_engines(A, dY, X, device, reps):
    """``({engine: backward seconds}, {engine: forward seconds})``."""
    bwd = {"dgl_rsc engine (cached transpose)": timeit(lambda: csr_t_mm(A, dY), device, reps)}
    fwd = {"dgl_rsc engine": timeit(lambda: csr_mm(A, X), device, reps)}
    if torch.device(device).type == "cpu" and cpu_engine() == "dgl":  # and without DGL:
        At = A.transpose()
        bwd["Numba kernel (the engine without DGL)"] = timeit(
            lambda: _mm(At.indptr, At.indices, None, At.shape, dY, NO_SCALES, At.pool()),
            device, reps,
        )  # fmt: skip
    if _deps.dgl_available() and torch.device(device).type == "cpu":
        import dgl
        import dgl.sparse as dglsp

        g, g_t = dgl_message_graphs(A)
        n_t, n = A.shape[1], A.shape[0]
        bwd[DGL_MP] = timeit(lambda: dgl.ops.copy_u_sum(g_t, dY)[:n_t], device, reps)
        pad = X.new_zeros(max(A.shape) - X.shape[0], X.shape[1])
        Xp = torch.cat([X, pad]) if pad.shape[0] else X
        fwd[DGL_MP] = timeit(lambda: dgl.ops.copy_u_sum(g, Xp)[:n], device, reps)
        t_indptr, t_rows, _ = A.transposed()
        At = dglsp.from_csr(t_indptr.long(), t_rows.long(), shape=(A.shape[1], A.shape[0]))
        bwd["dgl.sparse.spmm (CSR of A^T)"] = timeit(lambda: dglsp.spmm(At, dY), device, reps)
    return bwd, fwd


def rsc_parts(A, dY, budget, rule, backend, device, reps):
    """Seconds of (score + select, slice, product) and the sampled gradient."""
    row_nnz = A.row_nnz()
    norms = A.row_norms()

    def score_select():
        s = backend.row_scores(norms, dY)
        return backend.select_rows(
            selection_key(s, row_nnz, rule), row_nnz, int(budget * A.nnz), 10
        )

    t_select = timeit(score_select, device, reps)
    mask, k = score_select()
    if hasattr(backend, "slice_rows"):  # what draw_sample does: cut from the kept rows
        t_slice = timeit(
            lambda: backend.slice_rows(A.indptr, A.indices, None, A.shape, mask), device, reps
        )
    else:
        t_indptr, t_rows, _ = A.transposed()
        t_slice = timeit(
            lambda: backend.slice_transposed(t_indptr, t_rows, None, mask), device, reps
        )
    s = draw_sample(A, dY, int(budget * A.nnz), rule, 10, backend)
    t_prod = timeit(lambda: sample_product(A, s, dY, NO_SCALES), device, reps)
    return t_select, t_slice, t_prod, sample_product(A, s, dY, NO_SCALES), int(k), int(s.nnz)


def controller_step_time(A, dY, budget, rule, cache_interval, device, steps):
    """Mean backward seconds per step through the controller (refreshes included)."""
    import time

    rsc = RSCController(
        budget=budget,
        rule=rule,
        warmup_steps=0,
        cache_interval=cache_interval,
        tune_interval=10**9,
        min_k=10,
    )
    X = torch.zeros(A.shape[1], dY.shape[1], device=device, requires_grad=True)
    spmm_matrix(A, X, RSCController(budget=budget, warmup_steps=0)).backward(dY)  # warm-up:
    X.grad = None  # the first backward on CUDA starts autograd's device thread
    total = 0.0
    for _ in range(steps):
        Y = spmm_matrix(A, X, rsc)
        sync(device)
        t0 = time.perf_counter()
        Y.backward(dY)
        sync(device)
        total += time.perf_counter() - t0
        X.grad = None
        rsc.step()
    return total / steps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), help="graph size preset")
    ap.add_argument("--nodes", type=int, default=200_000)
    ap.add_argument("--nnz", type=int, default=10_000_000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--budgets", default="0.05,0.1,0.2,0.3,0.5")
    ap.add_argument("--rules", default="topk,cost")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--backend", default="auto", help="auto | torch | cupy | numba")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10, help="controller steps per interval")
    ap.add_argument("--index-dtype", default="int64", choices=["int32", "int64"])
    ap.add_argument("--threads", type=int, default=None, help="torch (and DGL) CPU threads")
    ap.add_argument("--out", default="results/bench_spmm.json")
    args = ap.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.preset:
        preset = PRESETS[args.preset]
        args.nodes, args.nnz = preset["nodes"], preset["nnz"]
        args.dim = preset.get("dim", args.dim)
    device = torch.device(args.device)
    idt = getattr(torch, args.index_dtype)

    A = power_law_csr(args.nodes, args.nnz, device=device, index_dtype=idt)
    dY = grad_like(A.shape[0], args.dim, device=device)
    X = grad_like(A.shape[1], args.dim, seed=2, device=device)
    A.transposed()  # the cached transpose is built once per graph, not per step
    backend = resolve(args.backend, device)
    print(
        f"A: {A.shape[0]} x {A.shape[1]}, nnz {A.nnz}, max row {int(A.row_nnz().max())}, "
        f"d={args.dim}, device={device}, backend={backend.__name__.rsplit('.', 1)[-1]}"
    )

    engines, fwd = exact_engines(A, dY, X, device, args.reps)
    best_name = min(engines, key=engines.get)
    exact_t = engines[best_name]
    dgl_t = engines.get(DGL_MP)
    exact = csr_t_mm(A, dY)
    for name, t in engines.items():
        print(f"exact A^T@dY  {name:<40s} {t * 1e3:9.1f} ms")
    for name, t in fwd.items():
        print(f"forward A@X   {name:<40s} {t * 1e3:9.1f} ms")

    rows = []
    hdr = (
        f"{'rule':>5} {'budget':>6} {'k':>9} {'nnz%':>6} {'select':>8} {'slice':>8} "
        f"{'product':>8} {'prod x':>7} {'vs DGL':>7} {'target':>7} {'amort10':>8} "
        f"{'step1 x':>8} {'step10 x':>8} {'rel.err':>8}"
    )
    print(hdr)
    for rule in args.rules.split(","):
        for b in [float(x) for x in args.budgets.split(",")]:
            t_sel, t_sl, t_p, approx, k, kept = rsc_parts(
                A, dY, b, rule, backend, device, args.reps
            )
            err = float((approx - exact).norm() / exact.norm())
            step1 = controller_step_time(A, dY, b, rule, 1, device, max(3, args.steps // 3))
            step10 = controller_step_time(A, dY, b, rule, 10, device, args.steps)
            row = dict(
                rule=rule,
                budget=b,
                k=k,
                nnz_kept=kept,
                nnz_fraction=kept / A.nnz,
                select_s=t_sel,
                slice_s=t_sl,
                product_s=t_p,
                product_speedup=exact_t / t_p,
                product_speedup_vs_dgl=None if dgl_t is None else dgl_t / t_p,
                target_vs_dgl=(1.0 / b) / 2.0,
                refresh_over_exact=(t_sel + t_sl) / exact_t,
                amortized_refresh_10_over_exact=(t_sel + t_sl) / 10 / exact_t,
                step_cache1_s=step1,
                step_cache10_s=step10,
                step_speedup_cache1=exact_t / step1,
                step_speedup_cache10=exact_t / step10,
                rel_error=err,
            )
            rows.append(row)
            print(
                f"{rule:>5} {b:6.2f} {k:9d} {100 * kept / A.nnz:6.1f} {t_sel * 1e3:8.1f} "
                f"{t_sl * 1e3:8.1f} {t_p * 1e3:8.1f} {exact_t / t_p:7.2f} "
                f"{(dgl_t or float('nan')) / t_p:7.2f} {0.5 / b:7.2f} "
                f"{100 * (t_sel + t_sl) / 10 / exact_t:7.1f}% {exact_t / step1:8.2f} "
                f"{exact_t / step10:8.2f} {err:8.3f}"
            )
    print(
        "select/slice/product in ms; 'prod x' = fastest exact/product; 'vs DGL' = DGL message"
        " passing/product ('target' = (1/budget)/2); 'amort10' = refresh/10 as % of exact;"
        " 'stepN x' = fastest exact / per-step backward with cache_interval N"
    )
    result = dict(
        machine=machine(device),
        cpu_engine=cpu_engine(),
        graph=dict(nodes=A.shape[0], nnz=A.nnz, dim=args.dim, index_dtype=args.index_dtype),
        threads=torch.get_num_threads(),
        forward_engines_s=fwd,
        exact_engines_s=engines,
        fastest_exact=best_name,
        rows=rows,
        command=" ".join(sys.argv),
    )
    write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
