"""Time the CUDA backends' sampling kernels against the torch reference on one GPU.

For each graph size (a power-law CSR made on the GPU; Reddit scale: 233k rows, ~110M non-zeros;
ogbn-products scale: 2.45M rows, ~120M non-zeros) and D = 256, times with CUDA events (warm-up,
then the median of many repetitions):

* scoring ``s_i = a_i ||dY_i||`` (fp32 and bf16 ``dY``): cupy, numba, torch reference;
* selection at nnz budgets 0.05/0.1/0.2/0.3/0.5: cupy radix select, the torch reference
  (stable sort + cumsum), and ``torch.topk`` with the right ``k`` given (+ mask scatter): a
  lower bound for any topk-based method, which would not know ``k`` beforehand;
* ``slice_transposed`` at the same budgets: cupy, numba, torch reference;
* the sampled product ``A[S,:]^T @ dY`` (torch.sparse.mm on the sliced CSR) against the exact
  ``A^T @ dY`` (torch.sparse.mm on the full transposed CSR).

Every backend result is checked against the reference (``match`` in the JSON). Prints a table
and writes everything to ``--out`` as JSON.

    PYTHONPATH=. python3 tools/bench_kernels.py --out results/bench_kernels.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
import warnings
from types import SimpleNamespace

import torch

from dgl_rsc.backends import torch_ref
from dgl_rsc.base import _deps
from dgl_rsc.sampling import selection_key

warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")

SIZES = {"reddit": (232_965, 110_000_000), "products": (2_449_029, 120_000_000)}
BUDGETS = (0.05, 0.1, 0.2, 0.3, 0.5)


def power_law_graph(n, nnz, device, exponent=2.1, seed=0):
    """``(indptr, indices, values)`` int32 CSR of an ``(n, n)`` matrix: Pareto row degrees
    scaled to about ``nnz``, columns drawn from the same power law (skewed in-degrees too)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    theta = torch.rand(n, generator=gen, device=device, dtype=torch.float64).clamp(min=1e-9)
    theta = theta.pow(-1.0 / (exponent - 1.0))
    p = theta / theta.sum()
    lo, hi = 0.5, 64.0  # scale so that about nnz entries remain after clipping the degrees
    for _ in range(30):
        mid = (lo + hi) / 2
        if float((p * nnz * mid).round().clamp(min=1, max=n // 8).sum()) < nnz:
            lo = mid
        else:
            hi = mid
    deg = (p * nnz * hi).round().clamp(min=1, max=n // 8).long()
    indptr = torch.zeros(n + 1, dtype=torch.int64, device=device)
    torch.cumsum(deg, 0, out=indptr[1:])
    total = int(indptr[-1])
    cdf = torch.cumsum(p[torch.randperm(n, generator=gen, device=device)], 0)
    cols = torch.empty(total, dtype=torch.int32, device=device)
    step = 1 << 26
    for s in range(0, total, step):
        u = torch.rand(min(step, total - s), generator=gen, device=device, dtype=torch.float64)
        cols[s : s + step] = torch.searchsorted(cdf, u).clamp(max=n - 1).int()
    # sort columns within each row (cuSPARSE's CSR); duplicates are legal and kept
    rows = torch.repeat_interleave(torch.arange(n, device=device), deg, output_size=total)
    order = torch.sort(rows * n + cols.long()).indices
    del rows
    cols = cols[order]
    del order
    values = torch.rand(total, generator=gen, device=device) + 0.1
    return indptr.int(), cols, values


def transpose(indptr, indices, values, n):
    m = indptr.numel() - 1
    lens = (indptr[1:] - indptr[:-1]).long()
    rows = torch.repeat_interleave(
        torch.arange(m, device=indptr.device, dtype=torch.int32), lens, output_size=indices.numel()
    )
    perm = torch.sort(indices, stable=True).indices
    t_indptr = torch.zeros(n + 1, dtype=torch.int64, device=indptr.device)
    torch.cumsum(torch.bincount(indices, minlength=n), 0, out=t_indptr[1:])
    return t_indptr.int(), rows[perm], values[perm]


def timed(fn, reps, warmup=2):
    """Median milliseconds of ``fn()`` over ``reps`` runs, CUDA events, after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def same(a, b):
    return all(
        (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
        for x, y in zip(a, b)
    )


def csr_mm(indptr, indices, values, shape, X):
    A = torch.sparse_csr_tensor(indptr, indices, values, size=shape)
    return torch.sparse.mm(A, X)


def bench_scores(g, backends, reps, res):
    ms = res["ms"]
    for dt_name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        dy = g.dY.to(dt)
        ref = torch_ref.row_scores(g.row_norms, dy)
        ms[f"scores_{dt_name}/torch"] = timed(
            lambda dy=dy: torch_ref.row_scores(g.row_norms, dy), reps
        )
        for b_name, b in backends.items():
            out = b.row_scores(g.row_norms, dy)
            err = ((out - ref).abs() / ref.abs().clamp(min=1e-30)).max()
            res[f"scores_{dt_name}/{b_name}/max_rel_err"] = float(err)
            ms[f"scores_{dt_name}/{b_name}"] = timed(
                lambda b=b, dy=dy: b.row_scores(g.row_norms, dy), reps
            )


def bench_budget(g, frac, backends, reps, res):
    """Selection, both slices and the sampled product at one nnz budget fraction."""
    ms, n = res["ms"], g.n
    budget = int(frac * g.nnz)
    tag = f"b{frac:g}"
    mask, k = torch_ref.select_rows(g.key, g.row_nnz, budget, 10)
    kk = int(k)
    res[f"{tag}/k"] = kk
    ms[f"select_{tag}/torch.sort"] = timed(
        lambda: torch_ref.select_rows(g.key, g.row_nnz, budget, 10), reps
    )

    def topk_known_k():
        idx = torch.topk(g.key, kk, sorted=True).indices
        out = torch.zeros(n, dtype=torch.bool, device=g.key.device)
        out[idx] = True
        return out

    ms[f"select_{tag}/torch.topk(known k)"] = timed(topk_known_k, reps)
    if "cupy" in backends:
        cp_select = backends["cupy"].select_rows
        res[f"select_{tag}/cupy/match"] = same(cp_select(g.key, g.row_nnz, budget, 10), (mask, k))
        ms[f"select_{tag}/cupy"] = timed(lambda: cp_select(g.key, g.row_nnz, budget, 10), reps)

    t_args = (g.t_indptr, g.t_rows, g.t_vals, mask)
    ref_t = torch_ref.slice_transposed(*t_args)
    res[f"{tag}/nnz_kept"] = int(ref_t[1].numel())
    ms[f"slice_t_{tag}/torch"] = timed(lambda: torch_ref.slice_transposed(*t_args), reps)
    for b_name, b in backends.items():
        res[f"slice_t_{tag}/{b_name}/match"] = same(b.slice_transposed(*t_args), ref_t)
        ms[f"slice_t_{tag}/{b_name}"] = timed(lambda b=b: b.slice_transposed(*t_args), reps)
    ms[f"product_{tag}/torch.sparse"] = timed(
        lambda: csr_mm(*ref_t, (n, n), g.dY), max(3, reps // 4), warmup=1
    )


def host_us(fn, calls=50):
    """Host microseconds per call of an asynchronous ``fn`` (the GPU idle at the start)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def bench_host(g, backends, res):
    """Host-side cost per call of the sync-free steps, and of one ``cupy.from_dlpack``."""
    budget = int(0.1 * g.nnz)
    h = res["host_us"] = {
        "select/torch.sort": host_us(lambda: torch_ref.select_rows(g.key, g.row_nnz, budget, 10)),
        "scores_fp32/torch": host_us(lambda: torch_ref.row_scores(g.row_norms, g.dY)),
    }
    for b_name, b in backends.items():
        h[f"select/{b_name}"] = host_us(lambda b=b: b.select_rows(g.key, g.row_nnz, budget, 10))
        h[f"scores_fp32/{b_name}"] = host_us(lambda b=b: b.row_scores(g.row_norms, g.dY))
    if "cupy" in backends:
        cp = sys.modules["cupy"]
        h["cupy.from_dlpack(one tensor)"] = host_us(lambda: cp.from_dlpack(g.key), calls=200)


def bench_size(n, nnz_target, d, backends, reps, device):
    t0 = time.perf_counter()
    g = SimpleNamespace(n=n)
    g.indptr, g.indices, g.values = power_law_graph(n, nnz_target, device)
    g.nnz = g.indices.numel()
    g.t_indptr, g.t_rows, g.t_vals = transpose(g.indptr, g.indices, g.values, n)
    g.row_nnz = (g.indptr[1:] - g.indptr[:-1]).long()
    rows = torch.repeat_interleave(torch.arange(n, device=device), g.row_nnz)
    g.row_norms = torch.zeros(n, device=device).index_add_(0, rows, g.values.square()).sqrt()
    del rows
    gen = torch.Generator(device=device).manual_seed(1)
    scale = torch.randn(n, 1, generator=gen, device=device).exp()
    g.dY = torch.randn(n, d, generator=gen, device=device) * scale
    g.key = selection_key(torch_ref.row_scores(g.row_norms, g.dY), g.row_nnz, "topk")
    res = {"rows": n, "nnz": g.nnz, "d": d, "max_row_nnz": int(g.row_nnz.max()),
           "setup_s": round(time.perf_counter() - t0, 2), "ms": {}}  # fmt: skip
    bench_scores(g, backends, reps, res)
    bench_host(g, backends, res)
    ms = res["ms"]
    ms["product_exact/torch.sparse"] = timed(
        lambda: csr_mm(g.t_indptr, g.t_rows, g.t_vals, (n, n), g.dY), max(3, reps // 4), warmup=1
    )
    for frac in BUDGETS:
        bench_budget(g, frac, backends, reps, res)
        torch.cuda.empty_cache()
    return res


def _version(module: str):
    return getattr(sys.modules.get(module), "__version__", None)


def table(results):
    lines = []
    for size, res in results.items():
        ms = res["ms"]
        host = ", ".join(f"{k} {v:.0f}" for k, v in res.get("host_us", {}).items())
        lines.append(f"\nhost us/call ({size}): {host}")
        lines.append(f"\n== {size}: {res['rows']} rows, {res['nnz']} nnz, D={res['d']} ==")
        lines.append(f"{'operation':38s} {'ms':>9s}  {'vs torch':>8s}")
        for op, t in ms.items():
            family = op.split("/")[0]
            base = ms.get(f"{family}/torch") or ms.get(f"{family}/torch.sort")
            if family.startswith("product_"):
                base = ms["product_exact/torch.sparse"]
            speed = f"{base / t:7.2f}x" if base and t else ""
            lines.append(f"{op:38s} {t:9.3f}  {speed:>8s}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--sizes", default="reddit,products", help=f"comma list of {list(SIZES)}")
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--scale", type=float, default=1.0, help="shrink the graphs (quick runs)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_kernels needs a CUDA device")
    device = torch.device("cuda")
    backends = {}
    if _deps.cupy_available():
        from dgl_rsc.backends import cupy_backend

        backends["cupy"] = cupy_backend
    if _deps.numba_cuda_available():
        from dgl_rsc.backends import numba_backend

        backends["numba"] = numba_backend
    info = {
        "tool": "tools/bench_kernels.py",
        "command": "PYTHONPATH=. python3 tools/bench_kernels.py " + " ".join(argv or []),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cupy": _version("cupy") if "cupy" in backends else None,
        "numba": _version("numba") if "numba" in backends else None,
        "backends": list(backends),
        "reps": args.reps,
        "timing": "CUDA events around each call; 2 warm-ups; median of reps (products: reps/4)",
    }
    results = {}
    for size in args.sizes.split(","):
        n, nnz = SIZES[size]
        n, nnz = max(1000, int(n * args.scale)), max(10000, int(nnz * args.scale))
        results[size] = bench_size(n, nnz, args.d, backends, args.reps, device)
        torch.cuda.empty_cache()
        print(table({size: results[size]}), flush=True)
        with open(args.out, "w") as f:  # after each size, so a later failure keeps it
            json.dump({"info": info, "results": results}, f, indent=1)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
