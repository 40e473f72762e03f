"""The global DGL patch: what it replaces, restores, and how stock models train inside it."""

import copy
import re

import pytest
import torch
import torch.nn.functional as F

import dgl_rsc

from ..conftest import labelled_graph, requires_dgl

pytestmark = [requires_dgl, pytest.mark.dgl, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def dgl():
    import dgl as _dgl
    import dgl.sparse

    return _dgl


def originals():
    from dgl_rsc.dgl.patch import patched_symbols

    return {(id(o), n): o.__dict__[n] for o, n in patched_symbols()}


def test_restores_every_symbol_on_exit_and_on_exception(dgl):
    before = originals()
    with dgl_rsc.patch(budget=0.2) as rsc:
        assert isinstance(rsc, dgl_rsc.RSCController)
        assert dgl_rsc.is_patched()
        during = originals()
        assert all(during[k] is not v for k, v in before.items())
    assert originals() == before and not dgl_rsc.is_patched()
    with pytest.raises(KeyError):
        with dgl_rsc.patch(budget=0.2):
            raise KeyError("boom")
    after = originals()
    assert all(after[k] is v for k, v in before.items())


def test_patches_do_not_nest(dgl):
    with dgl_rsc.patch(budget=0.2):
        with pytest.raises(RuntimeError, match="do not nest"):
            with dgl_rsc.patch(budget=0.3):
                pass
        assert dgl_rsc.is_patched()
    assert not dgl_rsc.is_patched()


def test_opening_is_atomic_across_threads(dgl):
    """Two threads entering at the same moment: exactly one gets the block, every time."""
    import threading

    def attempt():
        barrier, release = threading.Barrier(2), threading.Event()
        outcomes = []

        def enter():
            barrier.wait()
            try:
                with dgl_rsc.patch(budget=0.2):
                    outcomes.append("entered")
                    release.wait(timeout=10)
            except RuntimeError as exc:
                outcomes.append("refused" if "do not nest" in str(exc) else repr(exc))
                release.set()

        threads = [threading.Thread(target=enter) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=20)
        return sorted(outcomes)

    for _ in range(60):
        assert attempt() == ["entered", "refused"]
        assert not dgl_rsc.is_patched()


def test_other_threads_pass_through_exact(dgl):
    """Only the thread that opened the patch feeds the controller; another thread's
    products and gradients are DGL's own."""
    import threading

    import dgl.nn as dglnn

    g = dgl.add_self_loop(dgl.rand_graph(200, 2000))
    torch.manual_seed(0)
    conv = dglnn.GraphConv(8, 8)
    x = torch.randn(200, 8, requires_grad=True)
    conv(g, x).pow(2).sum().backward()
    ref_grad = x.grad.clone()
    x.grad = None
    seen = {}

    def worker():
        x_w = x.detach().clone().requires_grad_()
        conv(g, x_w).pow(2).sum().backward()
        seen["grad"] = x_w.grad

    with dgl_rsc.patch(budget=0.1) as rsc:
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert rsc.layers == []  # the other thread's product never reached the controller
        conv(g, x).pow(2).sum().backward()
        assert len(rsc.layers) == 1
    assert torch.equal(seen["grad"], ref_grad)


def test_sparse_api_forward_identical_and_layered(dgl):
    import dgl.sparse as dglsp

    torch.manual_seed(0)
    idx = torch.randint(0, 50, (2, 400))
    A = dglsp.spmatrix(idx, torch.rand(400), shape=(50, 50)).coalesce()
    # DGL multiplies a matrix held only as COO edge by edge (atomics over threads) and one
    # that has its CSR row by row, as the patch does: compare with the CSR path
    A.csr()
    X = torch.randn(50, 6, requires_grad=True)
    ref = [dglsp.spmm(A, X), dglsp.matmul(A, X), A @ X]
    with dgl_rsc.patch(budget=1.0, warmup_steps=0) as rsc:
        got = [dglsp.spmm(A, X), dglsp.matmul(A, X), A @ X]
        assert len(rsc.layers) == 3  # three approximated products: layers 0, 1, 2
        sum(g.sum() for g in got).backward()
        grad = X.grad.clone()
        S = dglsp.spmatrix(idx[:, :5], shape=(50, 50))
        assert isinstance(A @ S, dglsp.SparseMatrix)  # sparse @ sparse passes through
    for r, g in zip(ref, got):
        assert torch.equal(g, r)
    X.grad = None
    sum(r.sum() for r in ref).backward()
    torch.testing.assert_close(grad, X.grad, rtol=1e-5, atol=1e-5)


def test_sparse_value_gradient_exact(dgl):
    import dgl.sparse as dglsp

    idx = torch.randint(0, 30, (2, 200))
    val = torch.rand(200, requires_grad=True)
    A = dglsp.spmatrix(idx, val, shape=(30, 30))
    X = torch.randn(30, 4, requires_grad=True)
    G = torch.randn(30, 4)
    dglsp.spmm(A, X).backward(G)
    ref = val.grad.clone()
    val.grad = None
    with dgl_rsc.patch(budget=0.1, warmup_steps=0):
        dglsp.spmm(A, X).backward(G)
    torch.testing.assert_close(val.grad, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["gcn", "sage-mean", "sage-gcn", "weighted-gcn", "gcn2"])
def test_message_passing_forward_identical_and_full_budget_exact(dgl, kind):
    import dgl.nn as dglnn

    torch.manual_seed(0)
    g = dgl.add_self_loop(dgl.to_bidirected(dgl.rand_graph(200, 1500)))
    x = torch.randn(200, 12, requires_grad=True)
    w = torch.rand(g.num_edges()) + 0.1 if kind == "weighted-gcn" else None
    conv = {
        "gcn": lambda: dglnn.GraphConv(12, 8),
        "weighted-gcn": lambda: dglnn.GraphConv(12, 8),
        "sage-mean": lambda: dglnn.SAGEConv(12, 8, "mean"),
        "sage-gcn": lambda: dglnn.SAGEConv(12, 8, "gcn"),
        "gcn2": lambda: dglnn.GCN2Conv(12, 1),
    }[kind]()

    def run():
        if kind == "gcn2":
            return conv(g, x, x)
        return conv(g, x, edge_weight=w) if w is not None else conv(g, x)

    ref = run()
    ref.square().sum().backward()
    ref_grad = x.grad.clone()
    x.grad = None
    with dgl_rsc.patch(budget=1.0, warmup_steps=0) as rsc:
        out = run()
        out.square().sum().backward()
    assert torch.equal(out, ref)
    torch.testing.assert_close(x.grad, ref_grad, rtol=1e-5, atol=1e-5)
    assert rsc.stats()["layers"][0]["approx_calls"] == 1


def _small_graph(dgl, n=60, e=300, seed=0):
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen)
    return dgl.add_self_loop(dgl.graph((src, dst), num_nodes=n))


def _grads(conv, g, x, proj):
    x = x.detach().clone().requires_grad_(True)
    out = conv(g, x)
    (out * proj).sum().backward()
    grads = {"x": x.grad, **{k: p.grad for k, p in conv.named_parameters()}}
    return out.detach(), grads


ATTENTION_AND_SUM = {
    # GAT's messages are u_mul_e with (E, H, 1) attention: one weight per edge when H = 1
    # (the patch takes the product over), per head when H > 1 (left to DGL)
    "gat-1head": (lambda dglnn: dglnn.GATConv(6, 4, num_heads=1), 1),
    "gat-3heads": (lambda dglnn: dglnn.GATConv(6, 4, num_heads=3), 0),
    "gin-sum": (lambda dglnn: dglnn.GINConv(torch.nn.Linear(6, 4), "sum", learn_eps=True), 1),
    "gin-mean": (lambda dglnn: dglnn.GINConv(torch.nn.Linear(6, 4), "mean"), 1),
    "gin-max": (lambda dglnn: dglnn.GINConv(torch.nn.Linear(6, 4), "max"), 0),
}


@pytest.mark.parametrize("kind", list(ATTENTION_AND_SUM))
def test_gat_and_gin_full_budget_gradients_equal_dgl(dgl, kind):
    build, taken = ATTENTION_AND_SUM[kind]
    g = _small_graph(dgl)
    torch.manual_seed(0)
    conv = build(dgl.nn)
    x = torch.randn(g.num_nodes(), 6)
    proj = torch.randn(conv(g, x).shape)
    ref_out, ref = _grads(conv, g, x, proj)
    with dgl_rsc.patch(budget=1.0, warmup_steps=0) as rsc:
        out, got = _grads(copy.deepcopy(conv), g, x, proj)
    assert len(rsc.layers) == taken
    assert torch.equal(out, ref_out)
    assert got.keys() == ref.keys()
    for name, r in ref.items():
        scale = float(r.abs().max())
        torch.testing.assert_close(got[name], r, rtol=1e-5, atol=1e-5 * scale, msg=name)


@pytest.mark.parametrize("kind", ["gat-1head", "gat-3heads", "gin-sum"])
def test_gat_and_gin_train_inside_the_patch(dgl, kind):
    build, taken = ATTENTION_AND_SUM[kind]
    g = _small_graph(dgl, n=200, e=1500, seed=1)
    torch.manual_seed(0)
    model = torch.nn.ModuleDict(
        {"enc": torch.nn.Linear(6, 6), "conv": build(dgl.nn), "head": torch.nn.Linear(4, 3)}
    )
    x = torch.randn(200, 6)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    losses = []
    with dgl_rsc.patch(budget=0.3, warmup_steps=1, cache_interval=2, min_width=0) as rsc:
        for _ in range(8):
            h = model["conv"](g, torch.tanh(model["enc"](x)))
            h = h.reshape(200, -1, 4).mean(1)  # average the heads
            loss = F.cross_entropy(model["head"](F.relu(h)), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rsc.step()
            losses.append(float(loss))
    assert all(torch.isfinite(torch.tensor(losses)))
    assert min(losses[1:]) < losses[0]
    assert len(rsc.layers) == taken
    if taken:  # the product was approximated after the warm-up step
        assert rsc.stats()["layers"][0]["approx_calls"] == 7


def test_calls_the_engine_cannot_match_go_to_dgl(dgl):
    """bf16/fp16 on the CPU, mixed dtypes, per-feature weights, max, an operand without
    gradient, an empty graph: DGL's own result or error, and no RSC layer."""
    import dgl.sparse as dglsp

    g = _small_graph(dgl, n=20, e=60)
    e = g.num_edges()
    x = torch.randn(20, 4, requires_grad=True)
    w = torch.rand(e, requires_grad=True)
    w_feat = torch.rand(e, 4, requires_grad=True)
    empty = dgl.graph((torch.tensor([], dtype=torch.long),) * 2, num_nodes=5)
    calls = {
        "bf16": lambda: dgl.ops.copy_u_sum(g, x.bfloat16()),
        "per-feature": lambda: dgl.ops.u_mul_e_sum(g, x, w_feat),
        "max": lambda: dgl.ops.copy_u_max(g, x),
        "no-grad-lhs": lambda: dgl.ops.u_mul_e_sum(g, x.detach(), w),
        "empty": lambda: dgl.ops.copy_u_sum(empty, x[:5]),
        "sparse-vector-values": lambda: dglsp.bspmm(
            dglsp.spmatrix(torch.stack(g.edges()), w_feat[:, :2]), x[:, :, None].expand(20, 4, 2)
        ),
    }
    errors = {
        "fp16": lambda: dgl.ops.copy_u_sum(g, x.half()),
        "zero-width": lambda: dgl.ops.copy_u_sum(g, torch.randn(20, 0, requires_grad=True)),
        "mixed-dtypes": lambda: dgl.ops.u_mul_e_sum(g, x, w.double()),
        "sparse-mixed-dtypes": lambda: dglsp.spmm(
            dglsp.spmatrix(torch.stack(g.edges()), w.double().detach()), x
        ),
    }
    refs = {k: f() for k, f in calls.items()}
    ref_errors = {}
    for k, f in errors.items():
        with pytest.raises(Exception) as exc:
            f()
        ref_errors[k] = exc.value
    with dgl_rsc.patch(budget=1.0, warmup_steps=0) as rsc:
        for k, f in calls.items():
            assert torch.equal(f(), refs[k]), k
        for k, f in errors.items():
            with pytest.raises(type(ref_errors[k])) as exc:
                f()
            assert _untimed(exc.value) == _untimed(ref_errors[k]), k
    assert rsc.layers == []


def _untimed(exc) -> str:
    """An error's message without DGL's ``[HH:MM:SS]`` log stamps (the two calls may fall
    in different seconds)."""
    return re.sub(r"\[\d\d:\d\d:\d\d\] ", "", str(exc))


def test_eval_under_no_grad_does_no_sampling(dgl):
    import dgl.nn as dglnn

    g = dgl.add_self_loop(dgl.rand_graph(100, 500))
    conv = dglnn.GraphConv(4, 4)
    with dgl_rsc.patch(budget=0.1) as rsc:
        with torch.no_grad():
            conv(g, torch.randn(100, 4))
    assert rsc.layers == []


def test_stock_graphconv_trains_within_one_point_of_exact(dgl):
    import dgl.nn as dglnn

    src, dst, feat, label, train, test = labelled_graph(n=2000, seed=3)
    g = dgl.add_self_loop(dgl.graph((src, dst), num_nodes=2000))

    class GCN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = dglnn.GraphConv(16, 32, activation=F.relu)
            self.c2 = dglnn.GraphConv(32, 4)

        def forward(self, g, x):
            return self.c2(g, self.c1(g, x))

    def train_and_test(use_rsc):
        torch.manual_seed(0)
        model = GCN()
        opt = torch.optim.Adam(model.parameters(), lr=0.02)
        epochs = 60
        ctx = dgl_rsc.patch(budget=0.3, total_steps=epochs, min_width=0) if use_rsc else None
        rsc = ctx.__enter__() if ctx else None
        try:
            for _ in range(epochs):
                loss = F.cross_entropy(model(g, feat)[train], label[train])
                opt.zero_grad()
                loss.backward()
                opt.step()
                if rsc:
                    rsc.step()
        finally:
            if ctx:
                ctx.__exit__(None, None, None)
        with torch.no_grad():
            pred = model(g, feat).argmax(1)
        return float((pred[test] == label[test]).float().mean()), rsc

    exact, _ = train_and_test(False)
    approx, rsc = train_and_test(True)
    assert exact > 0.5  # the task is learnable
    assert abs(approx - exact) <= 0.01, (exact, approx)
    st = rsc.stats()
    # the first conv aggregates the raw features (no grad): only the second is sampled
    assert len(st["layers"]) == 1 and st["visited_fraction"] < 0.7
    assert st["cache_hits"] > st["cache_misses"] > 0


def test_autocast_branch_casts_like_dgl(dgl, monkeypatch):
    """Under CUDA autocast DGL casts the operands (CUDA ones only) and computes with autocast
    off; the patch takes the same branch. Without a GPU the cast leaves CPU tensors alone:
    this checks that the branch runs, through DGL's cast, and agrees with DGL."""
    import dgl.backend.pytorch.sparse as dgl_sparse
    import dgl.nn as dglnn

    g = _small_graph(dgl)
    torch.manual_seed(0)
    conv = dglnn.GraphConv(6, 4)
    x = torch.randn(g.num_nodes(), 6, requires_grad=True)
    casts = []
    cast = dgl_sparse._cast_if_autocast_enabled
    monkeypatch.setattr(dgl_sparse, "_cast_if_autocast_enabled", lambda *a: casts.append(a) or
                        cast(*a))  # fmt: skip
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda: True)
    ref = conv(g, x)
    assert len(casts) == 1  # DGL's own gspmm
    with dgl_rsc.patch(budget=1.0, warmup_steps=0) as rsc:
        out = conv(g, x)
    assert len(casts) == 2 and len(casts[1]) == 2  # the patch cast (lhs, rhs) the same way
    assert torch.equal(out, ref) and len(rsc.layers) == 1
