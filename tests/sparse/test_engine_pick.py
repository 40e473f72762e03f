"""The exact CPU product's engine, DGL's kernel or the Numba kernels, picked by measurement
per structure and width (``dgl_rsc.sparse.engine_pick``): the same bits either way."""

import pytest
import torch

from dgl_rsc.sparse import engine_pick, products
from dgl_rsc.sparse.graph import Graph

from ..conftest import requires_dgl

pytest.importorskip("numba")


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

    monkeypatch.setattr(engine_pick, "CPU_ENGINE", "auto")
    A, X = _matrix(), torch.randn(300, 24)
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
    outs = [products.csr_mm(A, X).clone() for _ in range(5)]
    pick = engine_pick.picks(A._s)[24]
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


def test_the_faster_trial_is_kept(monkeypatch):
    monkeypatch.setattr(engine_pick, "CPU_ENGINE", "auto")

    class S:
        pass

    s, clock = S(), iter([0.0, 1.0, 1.5, 10.0, 13.0, 14.0])  # dgl 1.0 / numba 0.5, then 3 / 1
    monkeypatch.setattr(engine_pick.time, "perf_counter", lambda: next(clock))
    for _ in range(2):
        engine_pick.run(s, 8, lambda: "d", lambda: "n")
    assert engine_pick.picks(s)[8] == "numba"
    assert engine_pick.run(s, 8, lambda: "d", lambda: "n") == "n"
