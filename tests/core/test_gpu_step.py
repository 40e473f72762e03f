"""On a CUDA device: the whole RSC step with the CUDA backends equals the torch backend's."""

import pytest
import torch

import dgl_rsc.nn as rnn
from dgl_rsc import RSCController, spmm_matrix
from dgl_rsc.sparse.graph import Graph

from ..conftest import power_law_csr

pytestmark = pytest.mark.gpu


@pytest.fixture
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch.device("cuda:0")


def step_grads(A, X, Gs, backend, **cfg):
    """Gradients and the kept-row structure ``A[S, :]^T`` of each step."""
    rsc = RSCController(backend=backend, warmup_steps=1, cache_interval=2, tune_interval=2, **cfg)
    grads, slices = [], []
    for G in Gs:
        X.grad = None
        spmm_matrix(A, X, rsc).backward(G)
        grads.append(X.grad.clone())
        s = rsc.layers[0]._sample
        slices.append(None if s is None else (s.t_slice.indptr.clone(), s.t_slice.indices.clone()))
        rsc.step()
    return grads, slices, rsc


@pytest.mark.parametrize("backend", ["cupy", "numba"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("rule", ["topk", "cost"])
def test_training_step_matches_torch_backend(cuda, backend, index_dtype, weighted, rule):
    A = power_law_csr(5000, 12.0, weighted=weighted, index_dtype=index_dtype, device=cuda, seed=3)
    X = torch.randn(5000, 32, device=cuda, requires_grad=True)
    Gs = [torch.randn(5000, 32, device=cuda) * torch.rand(5000, 1, device=cuda) for _ in range(5)]
    ref, ref_slices, rsc_ref = step_grads(A, X, Gs, "torch", rule=rule, budget=0.2)
    got, got_slices, rsc = step_grads(A, X, Gs, backend, rule=rule, budget=0.2)
    # the same rows are kept, so the same structure is multiplied ...
    for r, g in zip(ref_slices, got_slices):
        assert (r is None) == (g is None)
        if r is not None:
            assert torch.equal(r[0], g[0]) and torch.equal(r[1], g[1])
    # ... and the gradients agree up to cuSPARSE's summation order (not bit-reproducible:
    # two torch-backend runs already differ by ~1e-6 of the gradient's scale; an element
    # that cancels can differ by more than 1e-5 of itself)
    for r, g in zip(ref, got):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5 * float(r.abs().max()))
    assert [s["k"] for s in rsc.stats()["layers"]] == [s["k"] for s in rsc_ref.stats()["layers"]]


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"]
)
def test_dropin_layer_trains_on_cuda(cuda, dtype):
    n = 4000
    gen = torch.Generator(device=cuda).manual_seed(0)
    src = torch.randint(0, n, (40000,), device=cuda, generator=gen)
    dst = torch.randint(0, n, (40000,), device=cuda, generator=gen)
    g = Graph(src, dst, n).add_self_loop()
    conv = rnn.GraphConv(16, 8).to(cuda)
    rsc = rnn.attach(torch.nn.ModuleList([conv]), budget=0.3, warmup_steps=0)
    x = torch.randn(n, 16, device=cuda, dtype=dtype, requires_grad=True)
    conv = conv.to(dtype)
    out = conv(g, x)
    assert out.dtype == dtype and out.device.type == "cuda"
    out.float().square().sum().backward()
    assert torch.isfinite(x.grad.float()).all()
    # the sample within its budget, plus one of the 10 groups of the dropped rows (about 7%
    # of the non-zeros here; 0.371-0.373 on an H200, 2026-11-26)
    assert 0.3 < rsc.stats()["visited_fraction"] <= 0.3 + 0.1


@pytest.mark.parametrize("backend", ["torch", "cupy", "numba"])
@pytest.mark.parametrize("factor", [None, 1.5], ids=["plain", "scaled-sample"])
def test_a_step_with_remainder_groups_on_cuda(cuda, backend, factor):
    """The CUDA step (the partition's group slice cut on its first use, its product and the
    sample's added) against dense algebra; a group's slice is cut only when its step comes."""
    from dgl_rsc.backends import resolve
    from dgl_rsc.sampling import draw_sample, row_norms
    from dgl_rsc.sampling.remainder import Groups, Partition, step_product
    from dgl_rsc.sparse.products import Scales

    A = power_law_csr(3000, 10.0, weighted=True, index_dtype=torch.int32, device=cuda, seed=4)
    deg = A.row_nnz().float().clamp(min=1)
    scales = Scales(deg.rsqrt(), deg.rsqrt())
    gen = torch.Generator(device=cuda).manual_seed(2)
    dY = torch.randn(3000, 24, device=cuda, generator=gen)
    be = resolve(backend, cuda)
    s = draw_sample(A, dY, int(0.1 * A.nnz), "cost", 1, be, "none", norms=row_norms(A))
    s.factor = None if factor is None else torch.tensor(factor, device=cuda)
    part = Partition.draw(A, 4, gen)
    s.rest = Groups(part, 0)
    dense = scales.row_factor().unsqueeze(1) * A.to_dense() * scales.col
    for use in range(5):
        g = use % 4
        kept = s.mask.float().unsqueeze(1) * (1.0 if factor is None else factor)
        kept[(part.labels == g) & ~s.mask] = 4.0
        got, nnz = step_product(A, s, dY, scales, use, be)
        assert got.device.type == "cuda"
        torch.testing.assert_close(got, (kept * dense).T @ dY, rtol=1e-4, atol=1e-4)
        assert int(nnz) == int(A.row_nnz()[part.labels == g].sum()) > 0
        cut = [t is not None for t in part._slices]
        assert cut == [i <= min(use, 3) for i in range(4)]
