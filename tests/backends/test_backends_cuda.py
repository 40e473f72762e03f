"""The CuPy and Numba backends against the torch reference (``dgl_rsc.backends.torch_ref``).

* ``cudasim``: the Numba kernels under Numba's CPU simulator, in a subprocess (the simulator
  must be switched on before Numba is first imported); runs without a GPU.
* ``gpu``: both backends on fresh random CUDA inputs; integer outputs bit for bit, scores
  within float tolerance. Deselected by default (``pytest -m gpu`` runs them).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dgl_rsc.backends import resolve, torch_ref
from dgl_rsc.sampling import selection_key

from ..conftest import FLOAT_DTYPES as SCORE_DTYPES
from ..conftest import INDEX_DTYPES

ROOT = Path(__file__).resolve().parents[2]

BACKENDS = [pytest.param("cupy", id="cupy"), pytest.param("numba", id="numba")]
VALUE_DTYPES = [
    pytest.param(None, id="unweighted"),
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.float64, id="fp64"),
    pytest.param(torch.float16, id="fp16"),
    pytest.param(torch.bfloat16, id="bf16"),
]


# -- simulator ----------------------------------------------------------------------------------
@pytest.mark.heavy
@pytest.mark.cudasim
def test_numba_kernels_under_simulator():
    if importlib.util.find_spec("numba") is None:  # no import: this process keeps real numba
        pytest.skip("numba is not installed")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "cudasim_check.py")],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"cudasim checker failed:\n{proc.stdout}\n{proc.stderr}"
    assert "matches torch_ref" in proc.stdout


# -- GPU: fixtures and helpers -------------------------------------------------------------------
@pytest.fixture
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch.device("cuda", torch.cuda.current_device())


@pytest.fixture(params=BACKENDS)
def backend(request, cuda):
    return resolve(request.param, cuda)


@pytest.fixture(params=INDEX_DTYPES)
def index_dtype(request):
    return request.param


@pytest.fixture
def gen(cuda):
    """A generator with a fresh random seed, printed so that a failure can be reproduced
    (pytest shows captured output of failing tests)."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"generator seed {seed}")
    return torch.Generator(device=cuda).manual_seed(seed)


def poison_allocator(device, sizes=(1 << 12, 1 << 16, 1 << 20, 1 << 24)):
    """Fill blocks of torch's caching allocator with 0xA5 and free them, so that the next
    ``torch.empty`` of the backends most likely returns poisoned memory, not zeros."""
    blocks = [torch.full((s,), 0xA5, dtype=torch.uint8, device=device) for s in sizes]
    torch.cuda.synchronize(device)
    del blocks


def assert_same(got, ref, what):
    if ref is None:
        assert got is None, f"{what}: expected None"
        return
    assert got.dtype == ref.dtype, f"{what}: dtype {got.dtype} != {ref.dtype}"
    assert got.device == ref.device, f"{what}: device {got.device} != {ref.device}"
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    assert torch.equal(
        got, ref
    ), f"{what}: {(got != ref).sum().item()} of {ref.numel()} entries differ"


def power_law_csr(m, n, avg_deg, gen, index_dtype, device, exponent=2.1):
    """``(indptr, indices)`` with power-law row lengths, random columns, and empty rows."""
    theta = torch.rand(m, generator=gen, device=device).clamp(min=1e-4)
    theta = theta.pow(-1.0 / (exponent - 1.0))
    lens = (theta / theta.sum() * m * avg_deg).round().long().clamp(max=n)
    lens[torch.rand(m, generator=gen, device=device) < 0.1] = 0
    indptr = torch.zeros(m + 1, dtype=torch.int64, device=device)
    torch.cumsum(lens, 0, out=indptr[1:])
    nnz = int(indptr[-1])
    rows = torch.repeat_interleave(torch.arange(m, device=device), lens, output_size=nnz)
    cols = torch.randint(0, n, (nnz,), generator=gen, device=device)
    order = torch.sort(rows * n + cols).indices
    return indptr.to(index_dtype), cols[order].to(index_dtype)


def transpose(indptr, indices, values, n):
    """CSR of ``A^T`` (stable in row order), as ``dgl_rsc.sparse.csr`` builds it."""
    m = indptr.numel() - 1
    lens = (indptr[1:] - indptr[:-1]).long()
    rows = torch.repeat_interleave(torch.arange(m, device=indptr.device), lens)
    perm = torch.sort(indices.long(), stable=True).indices
    t_indptr = torch.zeros(n + 1, dtype=torch.int64, device=indptr.device)
    torch.cumsum(torch.bincount(indices.long(), minlength=n), 0, out=t_indptr[1:])
    vals = None if values is None else values[perm]
    return t_indptr.to(indptr.dtype), rows[perm].to(indptr.dtype), vals


# -- GPU: scores --------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", SCORE_DTYPES)
@pytest.mark.parametrize(
    "shape",
    [(1, 1), (513, 7), (4099, 32), (20000, 256), (3, 1000)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_row_scores(backend, dtype, shape, gen, cuda):
    m, d = shape
    scale = torch.randn(m, 1, generator=gen, device=cuda).exp()
    dY = (torch.randn(m, d, generator=gen, device=cuda) * scale).to(dtype)
    row_norms = torch.rand(m, generator=gen, device=cuda) * 3
    row_norms[::5] = 0
    poison_allocator(cuda)
    got = backend.row_scores(row_norms, dY)
    ref = torch_ref.row_scores(row_norms, dY)
    assert got.dtype == torch.float32 and got.shape == (m,) and got.device == cuda
    torch.testing.assert_close(got, ref, rtol=2e-6 * max(1.0, d**0.5), atol=1e-30)


@pytest.mark.gpu
def test_row_scores_strided_and_nonfinite(backend, gen, cuda):
    wide = torch.randn(300, 70, generator=gen, device=cuda)
    dY = wide[:, 3:67]  # rows strided, columns contiguous, not 16-byte aligned
    dY[5, 2] = float("inf")
    dY[9, 0] = float("nan")
    row_norms = torch.rand(300, generator=gen, device=cuda)
    got = backend.row_scores(row_norms, dY)
    ref = torch_ref.row_scores(row_norms, dY)
    torch.testing.assert_close(got, ref, equal_nan=True)
    assert torch.isinf(got[5]) and torch.isnan(got[9])


# -- GPU: selection -----------------------------------------------------------------------------
def _keys(kind, m, gen, device):
    u = torch.rand(m, generator=gen, device=device)
    if kind == "continuous":
        return u * torch.randn(m, generator=gen, device=device).exp()
    if kind == "ties":  # three distinct values and zeros: tie buckets over many chunks
        return (u * 4).floor() * 0.5
    if kind == "constant":
        return torch.full((m,), 0.75, device=device)
    if kind == "inf":
        key = u.clone()
        key[torch.randint(0, m, (7,), generator=gen, device=device)] = float("inf")
        return key
    if kind == "zeros":
        return torch.zeros(m, device=device)
    raise AssertionError(kind)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 5, 300, 70001, 600000], ids=lambda m: f"m{m}")
@pytest.mark.parametrize("kind", ["continuous", "ties", "constant", "inf", "zeros"])
def test_select_rows(backend, m, kind, index_dtype, gen, cuda):
    key = _keys(kind, m, gen, cuda)
    row_nnz = torch.randint(0, 50, (m,), generator=gen, device=cuda)
    row_nnz[torch.rand(m, generator=gen, device=cuda) < 0.05] = 0
    key[row_nnz == 0] = 0  # as selection_key does
    total = int(row_nnz.sum())
    budgets = [0, 1, total // 20, total // 3, total - 1, total, 2 * total + 5, -3]
    for budget in budgets:
        for min_k in (0, 10, m + 3):
            poison_allocator(cuda)
            got_mask, got_k = backend.select_rows(key, row_nnz.to(index_dtype), budget, min_k)
            ref_mask, ref_k = torch_ref.select_rows(key, row_nnz, budget, min_k)
            what = f"{kind} m={m} budget={budget} min_k={min_k}"
            assert_same(got_k, ref_k, f"k [{what}]")
            assert_same(got_mask, ref_mask, f"mask [{what}]")


@pytest.mark.gpu
@pytest.mark.parametrize("rule", ["topk", "cost"])
def test_select_rows_from_pipeline_keys(backend, rule, gen, cuda):
    indptr, _ = power_law_csr(50000, 50000, 20, gen, torch.int64, cuda)
    row_nnz = (indptr[1:] - indptr[:-1]).long()
    dY = torch.randn(50000, 64, generator=gen, device=cuda)
    scores = backend.row_scores(row_nnz.float().sqrt(), dY)
    key = selection_key(scores, row_nnz, rule)
    for frac in (0.05, 0.1, 0.3, 0.5, 1.0):
        budget = int(frac * int(indptr[-1]))
        got = backend.select_rows(key, row_nnz, budget, 10)
        ref = torch_ref.select_rows(key, row_nnz, budget, 10)
        assert_same(got[1], ref[1], f"k [{rule} {frac}]")
        assert_same(got[0], ref[0], f"mask [{rule} {frac}]")


# -- GPU: slicing -------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("value_dtype", VALUE_DTYPES)
@pytest.mark.parametrize("shape", [(3000, 2000), (40000, 45000)], ids=["small", "large"])
def test_slice_transposed(backend, index_dtype, value_dtype, shape, gen, cuda):
    m, n = shape
    indptr, indices = power_law_csr(m, n, 12, gen, index_dtype, cuda)
    values = None
    if value_dtype is not None:
        values = torch.randn(indices.numel(), generator=gen, device=cuda).to(value_dtype)
    t_indptr, t_rows, t_vals = transpose(indptr, indices, values, n)
    for keep in (0.0, 0.05, 0.5, 1.0):
        mask = torch.rand(m, generator=gen, device=cuda) < keep
        poison_allocator(cuda)
        got = backend.slice_transposed(t_indptr, t_rows, t_vals, mask)
        ref = torch_ref.slice_transposed(t_indptr, t_rows, t_vals, mask)
        for g, r, part in zip(got, ref, ("indptr", "indices", "values")):
            assert_same(g, r, f"{part} [keep {keep}]")


@pytest.mark.gpu
def test_empty_matrix(backend, index_dtype, cuda):
    t_indptr = torch.zeros(6, dtype=index_dtype, device=cuda)
    t_rows = torch.zeros(0, dtype=index_dtype, device=cuda)
    mask = torch.ones(4, dtype=torch.bool, device=cuda)
    for g, r in zip(
        backend.slice_transposed(t_indptr, t_rows, None, mask),
        torch_ref.slice_transposed(t_indptr, t_rows, None, mask),
    ):
        assert_same(g, r, "empty slice_transposed")
    m0, k0 = backend.select_rows(
        torch.zeros(0, device=cuda), torch.zeros(0, dtype=torch.long, device=cuda), 5, 3
    )
    assert m0.numel() == 0 and int(k0) == 0


# -- GPU: streams, dispatch, errors --------------------------------------------------------------
@pytest.mark.gpu
def test_side_stream(backend, gen, cuda):
    """Kernels run on torch's current stream: results are right without a device sync."""
    indptr, indices = power_law_csr(20000, 20000, 16, gen, torch.int32, cuda)
    t_indptr, t_rows, _ = transpose(indptr, indices, None, 20000)
    row_nnz = (indptr[1:] - indptr[:-1]).long()
    dY = torch.randn(20000, 128, generator=gen, device=cuda)
    ref_s = torch_ref.row_scores(row_nnz.float().sqrt(), dY)
    ref_m, ref_k = torch_ref.select_rows(ref_s, row_nnz, int(indptr[-1]) // 5, 10)
    ref = torch_ref.slice_transposed(t_indptr, t_rows, None, ref_m)
    side = torch.cuda.Stream(cuda)
    side.wait_stream(torch.cuda.current_stream(cuda))
    with torch.cuda.stream(side):
        s = backend.row_scores(row_nnz.float().sqrt(), dY)
        mask, k = backend.select_rows(ref_s, row_nnz, int(indptr[-1]) // 5, 10)
        got = backend.slice_transposed(t_indptr, t_rows, None, mask)
    torch.cuda.current_stream(cuda).wait_stream(side)
    torch.testing.assert_close(s, ref_s)
    assert_same(mask, ref_m, "mask on a side stream")
    assert_same(k, ref_k, "k on a side stream")
    for g, r in zip(got[:2], ref[:2]):
        assert_same(g, r, "slice on a side stream")


@pytest.mark.gpu
def test_resolve_auto_is_cupy(cuda):
    from dgl_rsc.backends import cupy_backend

    assert resolve("auto", cuda) is cupy_backend
    assert resolve("auto", "cuda") is cupy_backend


@pytest.mark.gpu
def test_cpu_tensors_rejected(backend):
    with pytest.raises(ValueError, match="CUDA tensors"):
        backend.row_scores(torch.ones(3), torch.ones(3, 2))
    with pytest.raises(TypeError, match="dtype"):
        backend.select_rows(
            torch.ones(3, dtype=torch.float64, device="cuda"),
            torch.ones(3, dtype=torch.long, device="cuda"),
            2,
        )
