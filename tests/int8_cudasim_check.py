"""Check the Numba-CUDA INT8 kernels against the torch reference under Numba's simulator.

Run as a script with ``NUMBA_ENABLE_CUDASIM=1`` (set before Numba is imported, hence a separate
process; ``tests/int8/test_int8.py`` starts it). Exits 0 when every check passes.
"""

from __future__ import annotations

import os
import sys

import torch

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    sys.exit("set NUMBA_ENABLE_CUDASIM=1 before running this checker")

from dgl_rsc.backends import int8_numba as nb
from dgl_rsc.backends import int8_ref as ref
from dgl_rsc.backends import resolve_int8
from dgl_rsc.int8 import quantize


def main() -> None:
    assert nb.SIMULATOR, "the simulator is not active"
    assert resolve_int8("numba", "cpu") is nb
    gen = torch.Generator().manual_seed(0)
    m, n, d = 9, 7, 5
    for index in (torch.int32, torch.int64):
        lens = torch.randint(0, 5, (m,), generator=gen)
        lens[::3] = 0
        indptr = torch.zeros(m + 1, dtype=torch.int64)
        torch.cumsum(lens, 0, out=indptr[1:])
        indices = torch.cat([torch.randperm(n, generator=gen)[: int(k)] for k in lens])
        indptr, indices = indptr.to(index), indices.to(index)
        qx = torch.randint(-127, 128, (n, d), dtype=torch.int8, generator=gen)
        qv = torch.randint(-127, 128, (int(indices.numel()),), dtype=torch.int8, generator=gen)
        cs = torch.rand(d, generator=gen)
        rf = torch.rand(m, generator=gen)
        for vals in (None, qv):
            for row in (None, rf):
                want = ref.int8_spmm(indptr, indices, vals, qx, row, cs)
                got = nb.int8_spmm(indptr, indices, vals, qx, row, cs)
                what = f"int8_spmm differs ({index}, values: {vals is not None})"
                assert torch.equal(want, got), what
    x = torch.randn(6, 5, generator=gen) * 4
    x[1, 2] = float("nan")
    x[3] = 0.0
    for dim in (0, 1, None):
        for rounding in ("nearest", "stochastic"):
            q0, s0 = quantize(x, dim, rounding, 123)
            q1, s1 = quantize(x, dim, rounding, 123, nb.quantize_codes)
            assert torch.equal(q0, q1), f"codes differ (dim={dim}, {rounding})"
    print("int8 numba kernels match the torch reference")


if __name__ == "__main__":
    main()
