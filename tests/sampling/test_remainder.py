"""``remainder_groups``: the dropped rows' groups and the unbiased per-step product."""

import pytest
import torch

from dgl_rsc import CSR, RSCConfig, RSCController, spmm_matrix
from dgl_rsc.backends import resolve
from dgl_rsc.core.config import ConfigError
from dgl_rsc.sampling import draw_sample, row_norms
from dgl_rsc.sampling.remainder import cut_groups

from ..conftest import power_law_csr


@pytest.fixture
def A():
    return power_law_csr(500, 8.0, seed=5)


def _rows(t_slice: CSR) -> set:
    """The rows of ``A`` a slice ``A[S, :]^T`` holds entries of."""
    return set(t_slice.indices.tolist())


@pytest.mark.parametrize("backend", ["torch", "numba-cpu"])
def test_groups_split_exactly_the_dropped_rows_that_contribute(A, backend):
    dY = torch.randn(500, 6)
    dY[:20] = 0  # rows whose score is zero: nothing to estimate
    be = resolve(backend, "cpu")
    s = draw_sample(A, dY, int(0.1 * A.nnz), "cost", 1, be, "none", norms=row_norms(A))
    groups = cut_groups(A, s, 4, torch.Generator().manual_seed(0))
    assert len(groups) == 4
    sets = [set(r.tolist()) for r in groups.rows]
    assert all(r.tolist() == sorted(r.tolist()) for r in groups.rows)
    assert all(not (a & b) for i, a in enumerate(sets) for b in sets[i + 1 :])  # disjoint
    dropped = ~s.mask & (A.row_nnz() > 0)
    dropped[:20] = False
    assert set().union(*sets) == set(torch.nonzero(dropped).squeeze(1).tolist())
    # each group's slice holds its rows whole: its non-zeros are those rows' non-zeros
    nnz = A.row_nnz()
    for g, rows in enumerate(sets):
        t = groups.slice(g, A, be)
        assert _rows(t) == rows and t.shape == (A.shape[1], A.shape[0])
        assert t.nnz == int(nnz[sorted(rows)].sum()) == int(groups.nnz[g])
    assert len(cut_groups(A, s, 4, torch.Generator().manual_seed(0), uses=2)) == 2


@pytest.mark.parametrize("factor", [None, 1.5], ids=["merged", "two-products"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scaled", ["none", "gcn", "mean", "weights"])
def test_a_step_is_the_sample_plus_its_group_times_k(A, dtype, scaled, factor):
    """``step_product`` against the two products in dense algebra: the two slices' products
    added into one output (DGL's kernel where DGL imports), or without DGL and with no factor
    on the sample (the default) one Numba product over the grouped entries."""
    from dgl_rsc.sampling.remainder import Groups, _numba_step, step_product
    from dgl_rsc.sparse.products import Scales

    gen = torch.Generator().manual_seed(1)
    deg = A.row_nnz().to(dtype).clamp(min=1)
    scales = {"none": Scales(), "gcn": Scales(deg.rsqrt(), deg.rsqrt()),
              "mean": Scales(deg, None, row_divide=True), "weights": Scales()}[scaled]  # fmt: skip
    if scaled == "weights":
        A = CSR(A.indptr, A.indices, torch.rand(A.nnz, generator=gen), A.shape)
    dY = torch.randn(500, 40, dtype=dtype, generator=gen)
    be = resolve("numba-cpu", "cpu")
    s = draw_sample(A, dY, int(0.1 * A.nnz), "cost", 1, be, "none", norms=row_norms(A))
    s.factor = None if factor is None else torch.tensor(factor)
    s.rest = cut_groups(A, s, 3, gen)
    r = scales.row_factor()
    dense = A.to_dense().to(dtype)
    if r is not None:
        dense = r.to(dtype).unsqueeze(1) * dense
    if scales.col is not None:
        dense = dense * scales.col.to(dtype)
    for use in range(4):
        g = use % 3
        kept = s.mask.to(dtype).unsqueeze(1) * (1.0 if factor is None else factor)
        kept[s.rest.rows[g]] = 3.0
        want = (kept * dense).T @ dY
        got, nnz = step_product(A, s, dY, scales, use, 3, be)
        tol = 1e-12 if dtype == torch.float64 else 1e-5
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        assert int(nnz) == int(s.rest.nnz[g]) > 0
    numba = _numba_step(A, s, dY)  # the CPU engine without DGL, no factor: one Numba product
    assert (s.rest._grouped is not None) == numba  # the path the step took
    assert all((t is None) == numba for t in s.rest._slices)  # else every slice cut at once
    if factor is None:  # restored from a checkpoint: no mask, the slice says the rows
        s.mask, s.rest = None, Groups.restore(s.rest.export())
        got, _ = step_product(A, s, dY, scales, 1, 3, be)
        kept = torch.zeros(500, 1, dtype=dtype)
        kept[s.t_slice.indices.long()] = 1.0
        kept[s.rest.rows[1]] = 3.0
        tol = 1e-12 if dtype == torch.float64 else 1e-5
        torch.testing.assert_close(got, (kept * dense).T @ dY, rtol=tol, atol=tol)


def _grads(ctl, A, X, G, steps):
    out = []
    for _ in range(steps):
        X.grad = None
        spmm_matrix(A, X, ctl).mul(G).sum().backward()
        ctl.step()
        out.append(X.grad.clone())
    return out


def test_one_cycle_of_groups_averages_to_the_exact_gradient(A):
    """Over K steps of one sample (the same ``dY``) each dropped row enters once, times K:
    the mean of the K sampled gradients is the exact one."""
    X = torch.randn(500, 6, dtype=torch.float64, requires_grad=True)
    G = torch.randn(500, 6, dtype=torch.float64)
    ctl = RSCController(budget=0.1, remainder_groups=5, cache_interval=5, warmup_steps=0,
                        guard=False, total_steps=100)  # fmt: skip
    grads = _grads(ctl, A, X, G, 5)
    X.grad = None
    spmm_matrix(A, X).mul(G).sum().backward()
    exact = X.grad
    torch.testing.assert_close(torch.stack(grads).mean(0), exact)
    assert all((g - exact).norm() > 1e-3 * exact.norm() for g in grads)  # each is sampled
    stats = ctl.stats()
    # the groups' non-zeros are counted as visited: more than the sample's alone
    plain = RSCController(budget=0.1, cache_interval=5, warmup_steps=0, guard=False,
                          total_steps=100)  # fmt: skip
    _grads(plain, A, X, G, 5)
    assert stats["visited_fraction"] > plain.stats()["visited_fraction"]


def test_remainder_resumes_identically_from_a_checkpoint(A, tmp_path):
    def make():
        return RSCController(budget=0.2, remainder_groups=3, cache_interval=4, warmup_steps=1,
                             guard=False, total_steps=100)  # fmt: skip

    X = torch.randn(500, 6, requires_grad=True)
    Gs = [torch.randn(500, 6) for _ in range(8)]
    ref = make()
    want = [g for G in Gs for g in _grads(ref, A, X, G, 1)]
    first = make()
    for G in Gs[:3]:
        _grads(first, A, X, G, 1)
    path = tmp_path / "rsc.pt"
    torch.save(first.state_dict(), path)
    resumed = make()
    resumed.load_state_dict(torch.load(path, weights_only=True))
    A2 = CSR(A.indptr.clone(), A.indices.clone(), None, A.shape)
    for G, w in zip(Gs[3:], want[3:]):
        torch.testing.assert_close(_grads(resumed, A2, X, G, 1)[0], w)


def test_remainder_groups_config_errors():
    assert RSCConfig().remainder_groups == 10 and RSCConfig().scale_mode == "none"
    assert RSCConfig(remainder_groups=0).scale_mode == "ls"
    with pytest.raises(ConfigError, match="remainder_groups=-1 is out of range"):
        RSCConfig(remainder_groups=-1)
    with pytest.raises(ConfigError, match="remainder_groups needs diagonal='sample'"):
        RSCConfig(remainder_groups=4, diagonal="exact")


def test_groups_saved_as_slices_by_the_previous_version_restore_as_rows(A):
    """Checkpoints of the morning's engine hold each group's slice; a resume reads its rows
    back (the slice's column ids) with the same non-zeros."""
    from dgl_rsc.sampling.remainder import Groups

    dY = torch.randn(500, 6)
    be = resolve("torch", "cpu")
    s = draw_sample(A, dY, int(0.1 * A.nnz), "cost", 1, be, "none", norms=row_norms(A))
    groups = cut_groups(A, s, 3, torch.Generator().manual_seed(4))
    legacy = [{"indptr": t.indptr, "indices": t.indices, "values": t.values}
              for t in (groups.slice(g, A, be) for g in range(3))]  # fmt: skip
    back = Groups.restore(legacy)
    assert [r.tolist() for r in back.rows] == [r.tolist() for r in groups.rows]
    assert [int(n) for n in back.nnz] == [int(n) for n in groups.nnz]
    again = Groups.restore(groups.export())
    assert [r.tolist() for r in again.rows] == [r.tolist() for r in groups.rows]
