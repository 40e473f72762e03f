"""Time the forward sparse product and the INT8 kernels on one GPU, against cuSPARSE.

For each graph size (the power-law CSR of tools/bench_kernels.py: Reddit scale, 233k rows and
~110M non-zeros; ogbn-products scale, 2.45M rows and ~120M non-zeros) and D = 256:

* ``forward``: ``rf * (A diag(cf) X) + bias`` (a GCN layer's symmetric normalization and bias)
  by dgl_rsc's kernel (``cuda/spmm_forward.cu``; fp32 and bf16 X, fp32 accumulation; several
  chunk sizes and the row-ordered plan), by cuSPARSE (``torch.sparse.mm`` on the matrix with the
  factors folded into its values, bias added after: the fastest cuSPARSE form, folding not
  timed; fp32 and bf16) and by the message-passing gather (``index_select`` of the source rows,
  weighted, ``index_add_`` into the output, in chunks of edges: what PyG's and DGL's
  gather-scatter paths do). Errors against cuSPARSE fp32.
* ``int8``: the INT8 sparse product (``cuda/int8_spmm.cu`` through CuPy and the Numba-CUDA
  kernel; bit-compared with the torch reference on the device) against the fp32 and bf16
  cuSPARSE products; ``torch._int_mm`` against fp32 (TF32 off and on) and bf16 ``torch.mm`` on
  a layer's dense shapes; the int8 codes of a ``(N, 256)`` tensor.

CUDA events, warm-up, median of ``--reps``. Prints a table, writes JSON (device, versions, date).

    PYTHONPATH=. python3 tools/experiments/bench_forward.py --out results/forward.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from bench_kernels import SIZES, power_law_graph, timed

from dgl_rsc.backends import spmm_cupy

warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-30))


def csr(indptr, indices, vals, n, dtype):
    return torch.sparse_csr_tensor(indptr.long(), indices.long(), vals.to(dtype), size=(n, n))


def gather(indptr, indices, w, X, bias, step=1 << 23):
    """The message-passing form: per edge chunk, ``X[src] * w`` added into ``out[dst]``."""
    n = indptr.numel() - 1
    rows = torch.repeat_interleave(torch.arange(n, device=X.device), indptr[1:] - indptr[:-1])
    out = torch.zeros((n, X.shape[1]), dtype=X.dtype, device=X.device)
    for s in range(0, indices.numel(), step):
        msg = X.index_select(0, indices[s : s + step]).mul_(w[s : s + step, None])
        out.index_add_(0, rows[s : s + step], msg)
    return out.add_(bias)


def bench_forward(name, n, nnz, d, reps, dev):
    indptr, indices, _ = power_law_graph(n, nnz, dev)
    deg = (indptr[1:] - indptr[:-1]).float()
    ones = torch.ones(indices.numel(), device=dev)
    in_deg = torch.zeros(n, device=dev).index_add_(0, indices.long(), ones)
    rf, cf = deg.clamp(min=1).rsqrt(), in_deg.clamp(min=1).rsqrt()
    gen = torch.Generator(device=dev).manual_seed(1)
    X = torch.randn((n, d), generator=gen, device=dev)
    bias = torch.randn(d, generator=gen, device=dev)
    row_ids = torch.repeat_interleave(torch.arange(n, device=dev), indptr[1:] - indptr[:-1])
    w = rf[row_ids] * cf[indices.long()]
    del row_ids
    res = dict(graph=name, rows=n, nnz=int(indices.numel()), dim=d, max_row=int(deg.max()))
    A32 = csr(indptr, indices, w, n, torch.float32)
    del ones
    ref = torch.sparse.mm(A32, X).add_(bias)
    res["cusparse_fp32_ms"] = timed(lambda: torch.sparse.mm(A32, X).add_(bias), reps)
    Xb = X.bfloat16()
    try:
        Ab = csr(indptr, indices, w, n, torch.bfloat16)
        outb = torch.sparse.mm(Ab, Xb).add_(bias.bfloat16())
        bb = bias.bfloat16()
        res["cusparse_bf16_ms"] = timed(lambda A=Ab: torch.sparse.mm(A, Xb).add_(bb), reps)
        res["cusparse_bf16_err"] = rel(outb, ref)
        del Ab, outb
    except RuntimeError as e:  # cuSPARSE has no bf16 SpMM for this build
        res["cusparse_bf16_error"] = str(e).splitlines()[0][:200]
    torch.cuda.synchronize()
    t0 = torch.cuda.Event(enable_timing=True)
    t1 = torch.cuda.Event(enable_timing=True)
    t0.record()
    p = spmm_cupy.plan(indptr)
    t1.record()
    t1.synchronize()
    res["plan_ms"] = t0.elapsed_time(t1)
    res["long_rows"], res["items"] = int(p.long_row.numel()), int(p.row.numel())
    ours = lambda Y, q: spmm_cupy.spmm_forward(indptr, indices, None, Y, cf, rf, bias, p=q)  # noqa: E731
    res["ours_fp32_err"] = rel(ours(X, p), ref)
    res["ours_fp32_ms"] = timed(lambda: ours(X, p), reps)
    res["ours_bf16_err"] = rel(ours(Xb, p), ref)
    res["ours_bf16_ms"] = timed(lambda: ours(Xb, p), reps)
    for chunk in (128, 2048, 1 << 30):
        q = spmm_cupy.plan(indptr, chunk)
        res[f"ours_fp32_chunk{min(chunk, 10**9)}_ms"] = timed(lambda q=q: ours(X, q), reps)
    try:
        res["gather_fp32_err"] = rel(gather(indptr, indices, w, X, bias), ref)
        once = lambda: gather(indptr, indices, w, X, bias)  # noqa: E731
        res["gather_fp32_ms"] = timed(once, max(3, reps // 4))
    except torch.cuda.OutOfMemoryError as e:
        res["gather_fp32_error"] = str(e).splitlines()[0][:200]
    res["speedup_bf16_vs_cusparse_fp32"] = res["cusparse_fp32_ms"] / res["ours_bf16_ms"]
    if "cusparse_bf16_ms" in res:
        res["speedup_bf16_vs_cusparse_bf16"] = res["cusparse_bf16_ms"] / res["ours_bf16_ms"]
    res["speedup_fp32_vs_cusparse_fp32"] = res["cusparse_fp32_ms"] / res["ours_fp32_ms"]
    return res


def bench_int8(name, n, nnz, d, reps, dev):
    from dgl_rsc.backends import int8_cupy, int8_numba
    from dgl_rsc.int8 import ref

    indptr, indices, _ = power_law_graph(n, nnz, dev)
    gen = torch.Generator(device=dev).manual_seed(2)
    qx = torch.randint(-127, 128, (n, d), dtype=torch.int8, generator=gen, device=dev)
    cs, rf = torch.rand(d, generator=gen, device=dev), torch.rand(n, generator=gen, device=dev)
    res = dict(graph=name, rows=n, nnz=int(indices.numel()), dim=d)
    want = ref.int8_spmm(indptr, indices, None, qx, rf, cs)
    for label, mod in (("cupy", int8_cupy), ("numba", int8_numba)):
        try:
            got = mod.int8_spmm(indptr, indices, None, qx, rf, cs)
            res[f"int8_{label}_bit_equal"] = bool(torch.equal(got, want))
            run = lambda m=mod: m.int8_spmm(indptr, indices, None, qx, rf, cs)  # noqa: E731
            res[f"int8_{label}_ms"] = timed(run, reps)
        except Exception as e:  # a backend that fails is reported, not fatal
            res[f"int8_{label}_error"] = f"{type(e).__name__}: {e}"[:300]
    del want
    ones = torch.ones(indices.numel(), device=dev)
    X = torch.randn((n, d), generator=gen, device=dev)
    A32 = csr(indptr, indices, ones, n, torch.float32)
    res["cusparse_fp32_ms"] = timed(lambda: torch.sparse.mm(A32, X), reps)
    try:
        Ab, Xb = csr(indptr, indices, ones, n, torch.bfloat16), X.bfloat16()
        res["cusparse_bf16_ms"] = timed(lambda: torch.sparse.mm(Ab, Xb), reps)
    except RuntimeError as e:
        res["cusparse_bf16_error"] = str(e).splitlines()[0][:200]
    from dgl_rsc.int8.quantize import quantize

    codes = int8_cupy.quantize_codes
    res["codes_ms"] = timed(lambda: quantize(X, 1, "nearest", 0, codes=codes), reps)
    return res


def bench_gemm(reps, dev):
    rows = []
    shapes = ((232_965, 256, 256), (232_965, 608, 256), (2_449_029, 256, 256), (2_449_029, 104, 48))
    for m, k, nn in shapes:
        gen = torch.Generator(device=dev).manual_seed(3)
        a32 = torch.randn((m, k), generator=gen, device=dev)
        b32 = torch.randn((k, nn), generator=gen, device=dev)
        a8 = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=gen, device=dev)
        b8 = torch.randint(-127, 128, (k, nn), dtype=torch.int8, generator=gen, device=dev)
        r = dict(shape=[m, k, nn])
        torch.backends.cuda.matmul.allow_tf32 = False
        r["fp32_ms"] = timed(lambda a=a32, b=b32: a @ b, reps)
        torch.backends.cuda.matmul.allow_tf32 = True
        r["tf32_ms"] = timed(lambda a=a32, b=b32: a @ b, reps)
        torch.backends.cuda.matmul.allow_tf32 = False
        ab, bb = a32.bfloat16(), b32.bfloat16()
        r["bf16_ms"] = timed(lambda a=ab, b=bb: a @ b, reps)
        try:
            r["int_mm_ms"] = timed(lambda a=a8, b=b8: torch._int_mm(a, b), reps)
            exact = (a8[:256].cpu().long() @ b8.cpu().long()).int()
            r["int_mm_exact"] = bool(torch.equal(torch._int_mm(a8[:256], b8).cpu(), exact))
        except RuntimeError as e:  # cuBLASLt refuses some int8 shapes
            r["int_mm_error"] = str(e).splitlines()[0][:200]
        print(json.dumps(r), flush=True)
        rows.append(r)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--what", default="forward,int8,gemm", help="comma list: forward, int8, gemm")
    ap.add_argument("--presets", nargs="+", default=["reddit", "products"], choices=sorted(SIZES))
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device")
    dev = torch.device("cuda")
    what = args.what.split(",")
    date = datetime.datetime.now().isoformat(timespec="seconds")
    out = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, date=date,
               cuda=torch.version.cuda, python=platform.python_version(), forward=[], int8=[],
               gemm=[])  # fmt: skip
    for preset in args.presets:
        n, nnz = SIZES[preset]
        if "forward" in what:
            r = bench_forward(preset, n, nnz, args.dim, args.reps, dev)
            out["forward"].append(r)
            print(json.dumps(r), flush=True)
        torch.cuda.empty_cache()
        if "int8" in what:
            r = bench_int8(preset, n, nnz, args.dim, args.reps, dev)
            out["int8"].append(r)
            print(json.dumps(r), flush=True)
        torch.cuda.empty_cache()
    if "gemm" in what:
        out["gemm"] = bench_gemm(args.reps, dev)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    cols = (
        "cusparse_fp32_ms",
        "cusparse_bf16_ms",
        "ours_fp32_ms",
        "ours_bf16_ms",
        "gather_fp32_ms",
    )
    print("\ngraph     " + " ".join(f"{c[:-3]:>14s}" for c in cols) + "  (ms)")
    for r in out["forward"]:
        print(f"{r['graph']:9s} " + " ".join(f"{r.get(c, float('nan')):14.2f}" for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
