"""The Numba CPU backend (the CPU default) against the torch reference: the same masks, the
same counts, the same slices, bit for bit."""

import pytest
import torch

from dgl_rsc.backends import SamplingBackend, numba_cpu, torch_ref
from dgl_rsc.backends import resolve as resolve_backend
from dgl_rsc.sampling import draw_sample
from dgl_rsc.sparse.csr import CSR

from ..conftest import power_law_csr


def random_keys(m, gen):
    key = torch.rand(m, generator=gen)
    tied = torch.rand(m, generator=gen) < 0.4
    key = torch.where(tied, key.mul(4).round() / 4, key)  # many exact ties
    key[torch.rand(m, generator=gen) < 0.15] = 0.0
    key[torch.rand(m, generator=gen) < 0.03] = float("inf")
    key[torch.rand(m, generator=gen) < 0.02] = -0.0
    return key


def test_follows_the_protocol():
    assert isinstance(numba_cpu, SamplingBackend)
    assert resolve_backend("auto", "cpu") is numba_cpu


@pytest.mark.parametrize("seed", range(6))
def test_select_rows_equals_the_reference(seed):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(60):
        m = int(torch.randint(1, 400, (1,), generator=gen))
        key = random_keys(m, gen)
        nnz = torch.randint(0, 30, (m,), generator=gen)
        budget = int(torch.randint(0, int(nnz.sum()) + 10, (1,), generator=gen))
        min_k = int(torch.randint(0, 20, (1,), generator=gen))
        want = torch_ref.select_rows(key, nnz, budget, min_k)
        got = numba_cpu.select_rows(key, nnz, budget, min_k)
        assert torch.equal(got[0], want[0]) and int(got[1]) == int(want[1])


def test_select_rows_edge_cases():
    for key, nnz, budget, min_k in [
        ([0.0, 0.0], [1, 1], 5, 3),  # nothing useful
        ([1.0, 1.0, 1.0], [2, 2, 2], 3, 0),  # all tied, one fits
        ([2.0, 1.0], [10, 1], 0, 0),  # nothing fits
        ([2.0, 1.0], [10, 1], 10**9, 0),  # everything fits
        ([float("inf"), 1.0, float("inf")], [5, 1, 5], 1, 0),  # forced rows over budget
        ([1e-40, 3e38, 1e-45], [1, 1, 1], 2, 0),  # denormals and the largest floats
    ]:
        k, n = torch.tensor(key), torch.tensor(nnz)
        want = torch_ref.select_rows(k, n, budget, min_k)
        got = numba_cpu.select_rows(k, n, budget, min_k)
        assert torch.equal(got[0], want[0]) and int(got[1]) == int(want[1]), (key, nnz)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("keep", [False, True])
def test_slices_equal_the_reference(weighted, keep):
    gen = torch.Generator().manual_seed(3)
    A = power_law_csr(700, 9.0, seed=5)
    if weighted:
        A = A.with_values(torch.rand(A.nnz, generator=gen))
    ti, tr, perm = A.transposed()
    tv = None if A.values is None else A.values[perm]
    for frac in (0.0, 0.1, 0.5, 1.0):
        mask = torch.rand(700, generator=gen) < frac
        entry_keep = torch.rand(A.nnz, generator=gen) < 0.05 if keep else None
        want = torch_ref.slice_transposed(ti, tr, tv, mask, entry_keep)
        got = numba_cpu.slice_transposed(ti, tr, tv, mask, entry_keep)
        for w, g in zip(want, got):
            assert (w is None and g is None) or torch.equal(w, g)
        if not keep:
            rows = numba_cpu.slice_rows(A.indptr, A.indices, A.values, A.shape, mask)
            for w, g in zip(want, rows):
                assert (w is None and g is None) or torch.equal(w, g)


def test_slices_of_a_rectangular_matrix_with_int32_indices():
    src = torch.tensor([0, 0, 1, 3, 3, 3], dtype=torch.int32)
    dst = torch.tensor([4, 1, 0, 2, 4, 3], dtype=torch.int32)
    A = CSR.from_coo(src.long(), dst.long(), None, (4, 6))
    A = CSR(A.indptr.int(), A.indices.int(), None, (4, 6))
    mask = torch.tensor([True, False, False, True])
    ti, tr, _ = A.transposed()
    want = torch_ref.slice_transposed(ti, tr, None, mask)
    for got in (numba_cpu.slice_transposed(ti, tr, None, mask),
                numba_cpu.slice_rows(A.indptr, A.indices, None, A.shape, mask)):  # fmt: skip
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert got[0].dtype == torch.int32 and got[1].dtype == torch.int32


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_the_parallel_cut_equals_the_serial_one(monkeypatch, threads, weighted, index_dtype):
    """Kept rows cut in parts at once (each part counts its columns, then writes its rows at
    positions after the lower parts'): the same slice, bit for bit, as the serial cut and the
    reference, empty kept rows and empty columns included."""
    A = power_law_csr(3000, 15.0, weighted=weighted, seed=4, index_dtype=index_dtype)
    gen = torch.Generator().manual_seed(6)
    mask = torch.rand(3000, generator=gen) < 0.4
    mask[:50] = True  # some kept rows are empty in a power-law matrix
    ti, tr, perm = A.transposed()
    tv = None if A.values is None else A.values[perm]
    want = torch_ref.slice_transposed(ti, tr, tv, mask)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    monkeypatch.setattr(numba_cpu, "PARALLEL_CUT_MIN", 0)
    got = numba_cpu.slice_rows(A.indptr, A.indices, A.values, A.shape, mask)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert got[0].dtype == index_dtype and got[1].dtype == index_dtype
    assert (got[2] is None) == (want[2] is None)
    if weighted:
        assert torch.equal(got[2], want[2])


def test_draw_sample_is_the_same_on_both_backends():
    A = power_law_csr(2000, 12.0, seed=2)
    dY = torch.randn(2000, 16, generator=torch.Generator().manual_seed(0))
    for rule in ("topk", "cost"):
        for diagonal in ("sample", "exact"):
            a = draw_sample(A, dY, int(0.1 * A.nnz), rule, 10, torch_ref, "none",
                            diagonal=diagonal)  # fmt: skip
            b = draw_sample(A, dY, int(0.1 * A.nnz), rule, 10, numba_cpu, "none",
                            diagonal=diagonal)  # fmt: skip
            assert torch.equal(a.mask, b.mask) and int(a.k) == int(b.k)
            assert torch.equal(a.t_slice.indptr, b.t_slice.indptr)
            assert torch.equal(a.t_slice.indices, b.t_slice.indices)
