"""``remainder_groups``: the fixed partition of the rows, the unbiased per-step product, and
checkpoints (this version's and the earlier ones')."""

import pytest
import torch

from dgl_rsc import CSR, RSCConfig, RSCController, spmm_matrix
from dgl_rsc.backends import resolve
from dgl_rsc.core.config import ConfigError
from dgl_rsc.sampling import draw_sample, row_norms
from dgl_rsc.sampling.draw import cut_rows
from dgl_rsc.sampling.remainder import Groups, Partition, step_product
from dgl_rsc.sparse.products import Scales

from ..conftest import power_law_csr


@pytest.fixture
def A():
    return power_law_csr(500, 8.0, seed=5)


def _rows(t_slice: CSR) -> set:
    """The rows of ``A`` a slice ``A[S, :]^T`` holds entries of."""
    return set(t_slice.indices.tolist())


@pytest.mark.parametrize("backend", ["torch", "numba-cpu"])
def test_the_partition_splits_every_row_once_into_equal_groups(A, backend):
    be = resolve(backend, "cpu")
    part = Partition.draw(A, 4, torch.Generator().manual_seed(0))
    assert part.labels.shape == (500,) and part.token == A.token and part.fits(A, 4)
    assert not part.fits(A, 5)
    sizes = torch.bincount(part.labels, minlength=4)
    assert sizes.sum() == 500 and int(sizes.max() - sizes.min()) <= 1
    again = Partition.draw(A, 4, torch.Generator().manual_seed(0))
    assert torch.equal(again.labels, part.labels)  # drawn from the generator alone
    nnz = A.row_nnz()
    for g in range(4):
        t = part.slice(g, A, be)  # each group's slice holds its rows whole
        rows = set(torch.nonzero(part.labels == g).squeeze(1).tolist())
        assert _rows(t) == {r for r in rows if nnz[r] > 0}
        assert t.shape == (A.shape[1], A.shape[0])
        assert t.nnz == int(nnz[part.labels == g].sum())
    with pytest.raises(ValueError, match="groups must be >= 1"):
        Partition.draw(A, 0)


def _dense(A, scales, dtype):
    dense = A.to_dense().to(dtype)
    r = scales.row_factor()
    if r is not None:
        dense = r.to(dtype).unsqueeze(1) * dense
    if scales.col is not None:
        dense = dense * scales.col.to(dtype)
    return dense


@pytest.mark.parametrize("factor", [None, 1.5], ids=["plain", "scaled-sample"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scaled", ["none", "gcn", "mean", "weights"])
def test_a_step_is_the_sample_plus_its_group_without_the_sample_times_k(A, dtype, scaled,
                                                                        factor):  # fmt: skip
    """``step_product`` against dense algebra: the sample's rows (times its factor) plus the
    step's group of the partition without the sample's rows, times K; the group cycles from
    the sample's offset; the visited non-zeros are the group's slice's."""
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
    part = Partition.draw(A, 3, gen)
    s.rest = Groups(part, 2)
    dense = _dense(A, scales, dtype)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for use in range(4):
        g = (2 + use) % 3
        assert s.rest.group(use) == g
        kept = s.mask.to(dtype).unsqueeze(1) * (1.0 if factor is None else factor)
        kept[(part.labels == g) & ~s.mask] = 3.0
        got, nnz = step_product(A, s, dY, scales, use, be)
        torch.testing.assert_close(got, (kept * dense).T @ dY, rtol=tol, atol=tol)
        assert int(nnz) == int(A.row_nnz()[part.labels == g].sum()) > 0
    if factor is None:  # restored from a checkpoint: no mask, the slice says the rows
        s.mask, s.rest = None, Groups.restore(s.rest.export(), part, 500)
        got, _ = step_product(A, s, dY, scales, 1, be)
        kept = torch.zeros(500, 1, dtype=dtype)
        kept[s.t_slice.indices.long()] = 1.0
        kept[(part.labels == 0) & (kept.squeeze(1) == 0)] = 3.0
        torch.testing.assert_close(got, (kept * dense).T @ dY, rtol=tol, atol=tol)


def test_a_sample_that_drops_nothing_has_no_groups(A):
    """Budget 1.0: every row that can contribute is kept, so no group is added and the
    controller's step equals the exact product."""
    X = torch.randn(500, 6, dtype=torch.float64, requires_grad=True)
    G = torch.randn(500, 6, dtype=torch.float64)
    ctl = RSCController(budget=1.0, remainder_groups=4, warmup_steps=0, guard=False,
                        total_steps=100)  # fmt: skip
    got = _grads(ctl, A, X, G, 2)
    X.grad = None
    spmm_matrix(A, X).mul(G).sum().backward()
    sample = ctl.layers[0].sample
    assert not sample.rest and len(sample.rest) == 0
    for g in got:
        torch.testing.assert_close(g, X.grad, rtol=1e-12, atol=1e-12)


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
    ctl = RSCController(min_width=0, budget=0.1, remainder_groups=5, cache_interval=5,
                        warmup_steps=0, guard=False, total_steps=100)  # fmt: skip
    grads = _grads(ctl, A, X, G, 5)
    X.grad = None
    spmm_matrix(A, X).mul(G).sum().backward()
    exact = X.grad
    torch.testing.assert_close(torch.stack(grads).mean(0), exact)
    assert all((g - exact).norm() > 1e-3 * exact.norm() for g in grads)  # each is sampled
    stats = ctl.stats()
    # the groups' non-zeros are counted as visited: more than the sample's alone
    plain = RSCController(min_width=0, budget=0.1, cache_interval=5, warmup_steps=0, guard=False,
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


def test_groups_saved_by_earlier_versions_restore_as_a_partition(A):
    """Checkpoints of earlier engines hold each group's dropped rows (or their slices) and
    no partition: a resume makes those groups a partition (each row in its old group), and
    the next steps add those rows, times K."""
    dY = torch.randn(500, 6, dtype=torch.float64)
    be = resolve("torch", "cpu")
    s = draw_sample(A, dY, int(0.1 * A.nnz), "cost", 1, be, "none", norms=row_norms(A))
    dropped = torch.nonzero(~s.mask).squeeze(1)
    old_rows = [dropped[g::3] for g in range(3)]
    as_rows = [{"rows": r, "nnz": A.row_nnz()[r].sum()} for r in old_rows]
    as_slices = []
    for r in old_rows:
        mask = torch.zeros(500, dtype=torch.bool)
        mask[r] = True
        t = cut_rows(A, mask, be)
        as_slices.append({"indptr": t.indptr, "indices": t.indices, "values": t.values})
    dense = _dense(A, Scales(), torch.float64)
    for saved in (as_rows, as_slices):
        rest = Groups.restore(saved, None, 500)
        assert len(rest) == 3 and rest.offset == 0
        for g, r in enumerate(old_rows):  # (a slice says only the rows with entries)
            r = r[A.row_nnz()[r] > 0]
            assert r.numel() and bool((rest.partition.labels[r] == g).all())
        s.rest = rest
        got, _ = step_product(A, s, dY, Scales(), 1, be)
        kept = s.mask.double().unsqueeze(1)
        kept[(rest.partition.labels == 1) & ~s.mask] = 3.0
        torch.testing.assert_close(got, (kept * dense).T @ dY)
    empty = [{"rows": torch.zeros(0, dtype=torch.long), "nnz": torch.tensor(0)}] * 3
    assert not Groups.restore(empty, None, 500)
