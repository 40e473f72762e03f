"""The exact CPU product's engine, DGL's kernel or the Numba kernels, picked by measurement
per structure and width (``dgl_rsc.sparse.engine_pick``): the same bits either way."""

import pytest
import torch

from dgl_rsc.base.pick import Registry
from dgl_rsc.core.spmm import spmm_csr
from dgl_rsc.sparse import engine_pick, products
from dgl_rsc.sparse.graph import Graph

from ..conftest import requires_dgl

pytest.importorskip("numba")


@pytest.fixture(autouse=True)
def fresh_picks(monkeypatch):
    """A registry of this test's own (the package's keeps choices for the process)."""
    reg = Registry()
    monkeypatch.setattr(engine_pick, "PICKS", reg)
    monkeypatch.setattr(engine_pick, "CPU_ENGINE", "auto")
    return reg


def _counting(monkeypatch):
    calls = {"dgl": 0, "numba": 0}
    real_dgl, real_mm = products._dgl_mm, products._mm

    def dgl(*a, **k):
        calls["dgl"] += 1
        return real_dgl(*a, **k)

    def numba(*a, **k):
        calls["numba"] += 1
        return real_mm(*a, **k)

    monkeypatch.setattr(products, "_dgl_mm", dgl)
    monkeypatch.setattr(products, "_mm", numba)
    return calls


def _matrix(n=300, seed=0):
    gen = torch.Generator().manual_seed(seed)
    src, dst = (
        torch.randint(0, n, (8 * n,), generator=gen),
        torch.randint(0, n, (8 * n,), generator=gen),
    )
    return Graph(src, dst, n).add_self_loop().adjacency()


@requires_dgl
def test_both_engines_run_twice_then_the_faster_alone(monkeypatch):
    import dgl_rsc  # noqa: F401 (plugs DGL's kernel in)

    A, X = _matrix(), torch.randn(300, 24)
    calls = _counting(monkeypatch)
    outs = [products.csr_mm(A, X).clone() for _ in range(5)]
    pick = engine_pick.chosen(A._s, 24, X.dtype, False)
    assert pick in ("dgl", "numba")
    assert calls[pick] == 2 + 3 and calls[{"dgl": "numba", "numba": "dgl"}[pick]] == 2
    assert all(torch.equal(o, outs[0]) for o in outs)
    engine_pick.CPU_ENGINE = "dgl"
    assert torch.equal(products.csr_mm(A, X), outs[0])
    engine_pick.CPU_ENGINE = "numba"
    assert torch.equal(products.csr_mm(A, X), outs[0])
    assert torch.equal(
        products.csr_mm(A, X[:, :5].contiguous()),
        products._mm(A, X[:, :5].contiguous(), products.NO_SCALES, None),
    )


def test_a_bad_switch_is_named(monkeypatch):
    monkeypatch.setattr(engine_pick, "CPU_ENGINE", "mkl")
    with pytest.raises(ValueError, match="CPU_ENGINE"):
        engine_pick.run(object(), 4, lambda: None, lambda: None)


def test_the_faster_trial_is_kept(fresh_picks):
    s = _matrix(50)._s
    times = iter([1.0, 0.5, 3.0, 1.0])  # dgl 1.0 / numba 0.5, then 3 / 1
    fresh_picks.timer = lambda name, fn: (fn(), next(times))
    for _ in range(2):
        engine_pick.run(s, 8, lambda: "d", lambda: "n")
    assert engine_pick.chosen(s, 8) == "numba"
    assert engine_pick.run(s, 8, lambda: "d", lambda: "n") == "n"


@requires_dgl
@pytest.mark.parametrize("fresh_tensors", [False, True])
def test_spmm_csr_on_raw_tensors_settles_its_pick_after_two_trials(monkeypatch, fresh_picks,
                                                                   fresh_tensors):  # fmt: skip
    """A custom layer calling ``spmm_csr`` with raw CSR tensors at every step: both engines
    run on the first two products only, with the same tensors or with new ones of the same
    graph each call (the structure is known by its fingerprint)."""
    import dgl_rsc  # noqa: F401 (plugs DGL's kernel in)

    A = _matrix()
    X = torch.randn(300, 16, requires_grad=True)
    calls = _counting(monkeypatch)
    outs = []
    for _ in range(6):
        indptr, indices = A.indptr, A.indices
        if fresh_tensors:
            indptr, indices = indptr.clone(), indices.clone()
        Y = spmm_csr(indptr, indices, None, A.shape, X)
        Y.sum().backward()
        outs.append(Y.detach())
    key = engine_pick.key(A._s, 16, X.dtype, False)
    assert fresh_picks.trials(engine_pick.KIND, key) == 2  # forward: two trials, then kept
    kept = fresh_picks.chosen(engine_pick.KIND, key)
    other = {"dgl": "numba", "numba": "dgl"}[kept]
    # 12 products (A^T of this square matrix has A's fingerprint): the first two ran both
    # engines, the other ten only the kept one
    assert calls[other] == 2 and calls[kept] == 12
    assert all(torch.equal(o, outs[0]) for o in outs)


def test_spmm_csr_keeps_one_structure_while_the_tensors_live():
    from dgl_rsc.core import spmm as core_spmm

    A = _matrix(40)
    indptr, indices = A.indptr.clone(), A.indices.clone()
    X = torch.randn(40, 3)
    before = len(core_spmm._RAW)
    spmm_csr(indptr, indices, None, A.shape, X)
    first = core_spmm._RAW.get(indptr, indices, A.shape, lambda p, i: None)
    spmm_csr(indptr, indices, None, A.shape, X)
    assert core_spmm._RAW.get(indptr, indices, A.shape, lambda p, i: None) is first
    assert first is not None and len(core_spmm._RAW) == before + 1
    indices.add_(0)  # an in-place change (its version moves): built again, never stale
    assert core_spmm._RAW.get(indptr, indices, A.shape, lambda p, i: "new") == "new"
    del indptr, indices
    assert len(core_spmm._RAW) == before  # dropped with the caller's tensors
