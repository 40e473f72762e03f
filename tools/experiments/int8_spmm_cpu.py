"""The INT8 pieces on the CPU against their fp32 counterparts, in one process.

Sparse product: the fp32 row kernel (``dgl_rsc.sparse.cpu_spmm``) against the INT8 kernel
(``dgl_rsc.backends.int8_cpu``) on the same random CSR (``--nodes`` rows, ``--degree``
entries each) at ``--width``, and the two ways to quantize the product's operand (the scaled
copy then ``quantize``, against the fused ``quantize_columns``). Dense product: the integer
engines of ``dgl_rsc.int8.gemm`` (``float32`` over exact slices, ``float64``, and
``int_mm``: ``torch._int_mm`` where this torch has a CPU one) against fp32 and bf16 GEMMs of the
same shape, as the forward (``N x D @ D x D``) and the weight gradient (``D x N @ N x D``).

    python tools/experiments/int8_spmm_cpu.py --out docs/results/int8_spmm_cpu.json
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench_common import machine, timeit, write_json

from dgl_rsc.backends import int8_cpu
from dgl_rsc.base._deps import int_mm_on_cpu
from dgl_rsc.int8.gemm import int_mm_any_k
from dgl_rsc.int8.quantize import quantize
from dgl_rsc.sparse.cpu_spmm import spmm_rows


def _sparse(n: int, degree: int, width: int, reps: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    indices = torch.randint(0, n, (n * degree,), generator=gen)
    indptr = torch.arange(0, n * degree + 1, degree)
    x = torch.randn(n, width, generator=gen)
    col = torch.rand(n, generator=gen) + 0.5
    out = torch.empty(n, width)
    q, s = int8_cpu.quantize_columns(x, col, "stochastic", 1)
    cs = s.reshape(-1)
    ms = {
        "fp32_product": timeit(lambda: spmm_rows(indptr, indices, None, x, out), "cpu", reps),
        "int8_product": timeit(
            lambda: int8_cpu.int8_spmm(indptr, indices, None, q, None, cs), "cpu", reps
        ),  # fmt: skip
        "quantize_scaled_copy": timeit(
            lambda: quantize(x * col.reshape(-1, 1), 0, "stochastic", 1, int8_cpu.quantize_codes),
            "cpu",
            reps,
        ),  # fmt: skip
        "quantize_fused": timeit(
            lambda: int8_cpu.quantize_columns(x, col, "stochastic", 1), "cpu", reps
        ),  # fmt: skip
    }
    ms = {k: v * 1e3 for k, v in ms.items()}
    ms["int8_with_fused_quantize_vs_fp32"] = ms["fp32_product"] / (
        ms["int8_product"] + ms["quantize_fused"]
    )
    return ms


def _dense(n: int, width: int, reps: int) -> dict:
    gen = torch.Generator().manual_seed(1)
    shapes = {"forward": (n, width, width), "weight_grad": (width, n, width)}
    engines = ("float32", "float64", *(("int_mm",) if int_mm_on_cpu() else ()))
    rows = {}
    for name, (m, k, o) in shapes.items():
        a = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=gen)
        b = torch.randint(-127, 128, (k, o), dtype=torch.int8, generator=gen)
        fa, fb = a.float(), b.float()
        row = {"fp32": timeit(lambda x=fa, y=fb: torch.matmul(x, y), "cpu", reps)}
        ha, hb = fa.bfloat16(), fb.bfloat16()
        row["bf16"] = timeit(lambda x=ha, y=hb: torch.matmul(x, y), "cpu", reps)
        for engine in engines:
            row[f"int8_{engine}"] = timeit(lambda e=engine, x=a, y=b: int_mm_any_k(x, y, e), "cpu",
                                           reps)  # fmt: skip
        rows[name] = {"shape": [m, k, o], **{key: v * 1e3 for key, v in row.items()}}
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=200000)
    p.add_argument("--degree", type=int, default=100)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    sparse = _sparse(args.nodes, args.degree, args.width, args.reps)
    dense = _dense(args.nodes, args.width, args.reps)
    for key, value in sparse.items():
        print(f"sparse {key:>34}: {value:9.2f}")
    for name, row in dense.items():
        print(f"dense {name:>12} {row['shape']}: " + "  ".join(
            f"{k} {v:.1f} ms" for k, v in row.items() if k != "shape"))  # fmt: skip
    write_json(args.out, {
        "tool": "tools/experiments/int8_spmm_cpu.py",
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "nodes": args.nodes, "degree": args.degree, "width": args.width,
        "machine": machine("cpu"), "int_mm_on_cpu": int_mm_on_cpu(),
        "sparse_ms": sparse, "dense_ms": dense,
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
