"""Check the Numba backend against the torch reference under Numba's CUDA simulator.

Run as a script with ``NUMBA_ENABLE_CUDASIM=1`` in the environment (it must be set before Numba
is imported, hence a separate process; ``tests/backends/test_backends_cuda.py`` starts it). Exits 0
when every check passes; an ``AssertionError`` names the failing case. The simulator runs each
GPU thread as a Python thread, so the inputs are small.
"""

from __future__ import annotations

import os
import sys

import torch

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    sys.exit("set NUMBA_ENABLE_CUDASIM=1 before running this checker")

from dgl_rsc.backends import numba_backend as nb
from dgl_rsc.backends import resolve, torch_ref

INDEX = (torch.int32, torch.int64)
VALUES = (None, torch.float32, torch.float64, torch.float16, torch.bfloat16)


def random_csr(m, n, gen, index_dtype, empty_every=4):
    """``(indptr, indices)`` of an ``(m, n)`` CSR with uneven rows; every ``empty_every``-th
    row is empty."""
    lens = torch.randint(0, 7, (m,), generator=gen)
    lens[::empty_every] = 0
    indptr = torch.zeros(m + 1, dtype=torch.int64)
    torch.cumsum(lens, 0, out=indptr[1:])
    cols = [torch.randperm(n, generator=gen)[: int(x)].sort().values for x in lens]
    indices = torch.cat(cols) if cols else torch.zeros(0, dtype=torch.int64)
    return indptr.to(index_dtype), indices.to(index_dtype)


def same(a, b, what):
    if a is None or b is None:
        assert a is None and b is None, f"{what}: one side is None"
        return
    assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} != {b.dtype}"
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    assert torch.equal(a, b), f"{what}: values differ"


def check_scores(gen):
    for dtype in VALUES[1:]:
        for m, d in ((1, 3), (19, 5), (10, 40), (6, 0)):
            dy = (torch.randn(m, d, generator=gen) * 3).to(dtype)
            if m > 2:
                dy[1] = 0  # a zero row
            rn = torch.rand(m, generator=gen) * 2
            got = nb.row_scores(rn, dy)
            ref = torch_ref.row_scores(rn, dy)
            assert got.dtype == torch.float32 and got.shape == (m,)
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6, msg=f"scores {dtype}")
    # strided rows (a column slice of a wider tensor)
    wide = torch.randn(7, 12, generator=gen)
    rn = torch.rand(7, generator=gen)
    torch.testing.assert_close(
        nb.row_scores(rn, wide[:, 2:9]), torch_ref.row_scores(rn, wide[:, 2:9])
    )


def select_cases(gen):
    """``(name, key, row_nnz, budget, min_k)`` covering the selection's corner cases."""
    m = 40
    nnz = torch.randint(0, 9, (m,), generator=gen)
    key = torch.rand(m, generator=gen)
    key[nnz == 0] = 0
    ties = torch.randint(0, 4, (m,), generator=gen).float() * 0.25  # many duplicates and zeros
    total = int(nnz.sum())
    yield "budget 0, min_k 0", key, nnz, 0, 0
    yield "k=0 < min_k", key, nnz, 0, 5
    yield "budget covers all", key, nnz, total, 0
    yield "budget over all, min_k > m", key, nnz, 10 * total, 2 * m
    yield "mid budget", key, nnz, total // 3, 2
    yield "ties", ties, nnz, total // 2, 0
    yield "ties, min_k", ties, nnz, 3, 7
    inf = key.clone()
    inf[[3, 17]] = float("inf")
    yield "inf keys forced", inf, nnz, 1, 0
    yield "all zero keys", torch.zeros(m), nnz, total, 4
    yield "negative budget", key, nnz, -5, 1
    yield "empty", torch.zeros(0), torch.zeros(0, dtype=torch.int64), 10, 3


def check_select(gen):
    for name, key, nnz, budget, min_k in select_cases(gen):
        for idt in INDEX:
            got_mask, got_k = nb.select_rows(key, nnz.to(idt), budget, min_k)
            ref_mask, ref_k = torch_ref.select_rows(key, nnz.long(), budget, min_k)
            same(got_mask, ref_mask, f"select mask [{name}, {idt}]")
            same(got_k, ref_k, f"select k [{name}, {idt}]")


def check_slices(gen):
    for idt in INDEX:
        for vdt in VALUES:
            m, n = 23, 17
            indptr, indices = random_csr(m, n, gen, idt)
            values = None if vdt is None else torch.randn(indices.numel(), generator=gen).to(vdt)
            # A^T as the transposed CSR of A: sort entries by column, stable in row order
            rows = torch.repeat_interleave(torch.arange(m), (indptr[1:] - indptr[:-1]).long())
            perm = torch.sort(indices.long(), stable=True).indices
            t_indptr = torch.zeros(n + 1, dtype=torch.int64)
            torch.cumsum(torch.bincount(indices.long(), minlength=n), 0, out=t_indptr[1:])
            t_indptr, t_rows = t_indptr.to(idt), rows[perm].to(idt)
            t_vals = None if values is None else values[perm]
            for keep_p in (0.0, 0.4, 1.0):
                mask = torch.rand(m, generator=gen) < keep_p
                got = nb.slice_transposed(t_indptr, t_rows, t_vals, mask)
                ref = torch_ref.slice_transposed(t_indptr, t_rows, t_vals, mask)
                for g, r, part in zip(got, ref, ("indptr", "indices", "values")):
                    same(g, r, f"slice_transposed {part} [{idt}, {vdt}, keep {keep_p}]")
                ek = torch.rand(t_rows.numel(), generator=gen) < 0.2  # entries kept anyway
                got = nb.slice_transposed(t_indptr, t_rows, t_vals, mask, ek)
                ref = torch_ref.slice_transposed(t_indptr, t_rows, t_vals, mask, ek)
                for g, r, part in zip(got, ref, ("indptr", "indices", "values")):
                    same(g, r, f"slice_transposed+entry_keep {part} [{idt}, {vdt}, {keep_p}]")
    # no entries at all
    empty = torch.zeros(0, dtype=torch.int64)
    got = nb.slice_transposed(
        torch.zeros(4, dtype=torch.int64), empty, None, torch.ones(3, dtype=torch.bool)
    )
    same(got[0], torch.zeros(4, dtype=torch.int64), "slice_transposed of an empty matrix")


def main() -> int:
    assert nb.SIMULATOR, "numba_backend did not see the simulator"
    assert resolve("numba", torch.device("cpu")) is nb
    gen = torch.Generator().manual_seed(0)
    check_scores(gen)
    check_select(gen)
    check_slices(gen)
    print("cudasim: numba backend matches torch_ref (scores, select, slice_transposed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
