"""Shared fixtures: devices, dtypes, index dtypes, small power-law graphs."""

from __future__ import annotations

import os

os.environ.setdefault("OUTDATED_IGNORE", "1")  # ogb's version check needs the network

import pytest
import torch

from dgl_rsc.base import _deps
from dgl_rsc.sparse.csr import CSR

DEVICES = [pytest.param("cpu", id="cpu")]
if torch.cuda.is_available():
    DEVICES.append(pytest.param("cuda:0", id="cuda", marks=pytest.mark.gpu))

FLOAT_DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.float64, id="fp64"),
    pytest.param(torch.float16, id="fp16"),
    pytest.param(torch.bfloat16, id="bf16"),
]
INDEX_DTYPES = [pytest.param(torch.int32, id="i32"), pytest.param(torch.int64, id="i64")]

# tolerance of a float result against an fp64 reference, relative to the reference's norm
RTOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 3e-3, torch.bfloat16: 2e-2}


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


@pytest.fixture(params=FLOAT_DTYPES)
def dtype(request):
    return request.param


@pytest.fixture(params=INDEX_DTYPES)
def index_dtype(request):
    return request.param


def power_law_csr(
    n: int,
    avg_degree: float,
    exponent: float = 2.2,
    weighted: bool = False,
    seed: int = 0,
    index_dtype=torch.int64,
    device="cpu",
    square: bool = True,
) -> CSR:
    """A Chung-Lu style random matrix whose row and column degrees follow a power law."""
    g = torch.Generator().manual_seed(seed)
    theta = torch.rand(n, generator=g).clamp(min=1e-6).pow(-1.0 / (exponent - 1.0))
    p = theta / theta.sum()
    e = int(n * avg_degree)
    rows = torch.multinomial(p, e, replacement=True, generator=g)
    cols = torch.multinomial(p, e, replacement=True, generator=g)
    key = torch.unique(rows * n + cols)
    rows, cols = key // n, key % n
    vals = torch.rand(rows.numel(), generator=g) + 0.1 if weighted else None
    A = CSR.from_coo(rows, cols, vals, (n, n))
    return CSR(
        A.indptr.to(index_dtype).to(device),
        A.indices.to(index_dtype).to(device),
        None if vals is None else A.values.to(device),
        A.shape,
    )


@pytest.fixture
def one_thread():
    """Graphs of a few hundred nodes run fastest on one thread (and do not stall when the
    machine's other cores are busy); the previous setting is restored after each test."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def fake_glibc(monkeypatch):
    """``keep_freed_memory``'s calls recorded (the list this yields) instead of made: glibc
    present, nothing kept yet, no allocator chosen through the environment; the test
    process's allocator stays as it is."""
    from dgl_rsc.base import memory

    calls = []
    monkeypatch.setattr(memory, "glibc", lambda: object())
    monkeypatch.setattr(memory, "_KEPT", [False])
    for var in ("LD_PRELOAD", "GLIBC_TUNABLES", *memory._USER_ENV):
        monkeypatch.delenv(var, raising=False)

    def keep(keep=True):
        calls.append(keep)
        memory._KEPT[0] = keep
        return True

    monkeypatch.setattr(memory, "keep_freed_memory", keep)
    return calls


@pytest.fixture
def ogb_ready():
    """The OGB loader tests' dependencies (the tests also carry the ``dgl`` marker)."""
    if not _deps.dgl_available():
        pytest.skip("dgl not available")
    pytest.importorskip("ogb")


@pytest.fixture
def small_graph():
    return power_law_csr(400, 8.0, weighted=True, seed=1)


# A test that needs DGL carries the `dgl` marker (``requires_dgl`` is the same marker); one that
# needs torch_geometric the `pyg` marker, torch_sparse's SparseTensor the `torch_sparse` marker,
# torch.compile of dgl_rsc's custom operators (torch >= 2.4) the `compile` marker.
# Where the dependency does not import, such tests are deselected (counted in pytest's summary),
# never skipped-to-pass: the torch 2.2 environment (`make test`) runs the DGL tests, the torch
# 2.15 one (`make test-modern`) the PyG and SparseTensor tests.
requires_dgl = pytest.mark.dgl

#: Python source that makes every absolute ``import dgl...`` fail in the interpreter that runs it
#: (prepended to the code of a test's subprocess); relative imports inside dgl_rsc (for example
#: ``from ..dgl import kernels``, the package's DGL front end) are not DGL and pass.
BLOCK_DGL = (
    "import builtins\n"
    "real = builtins.__import__\n"
    "def guard(name, globals=None, locals=None, fromlist=(), level=0):\n"
    "    if level == 0 and (name == 'dgl' or name.startswith('dgl.')):\n"
    "        raise ImportError('dgl blocked for this test')\n"
    "    return real(name, globals, locals, fromlist, level)\n"
    "builtins.__import__ = guard\n"
)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "compile: needs torch.compile of custom operators (torch >= 2.4; "
        "deselected elsewhere, the modern leg runs them)"
    )  # fmt: skip


def _compiles() -> bool:
    from dgl_rsc.core.ops import HAS_OPS

    return HAS_OPS


def pytest_collection_modifyitems(config, items):
    probes = (("dgl", _deps.dgl_available), ("pyg", _deps.torch_geometric_available),
              ("torch_sparse", _deps.torch_sparse_available), ("compile", _compiles))  # fmt: skip
    missing = [m for m, ok in probes if not ok()]
    drop = [item for item in items if any(item.get_closest_marker(m) for m in missing)]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [item for item in items if item not in drop]


SHARED_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")


def labelled_graph(n=1500, classes=4, feat_dim=16, avg_degree=12.0, homophily=0.8, seed=0):
    """A small homophilous power-law graph with class-dependent noisy features.

    Returns ``(src, dst, feat, label, train_mask, test_mask)``; edges symmetric, no loops.
    """
    g = torch.Generator().manual_seed(seed)
    label = torch.randint(0, classes, (n,), generator=g)
    theta = torch.rand(n, generator=g).clamp(min=1e-4).pow(-1 / 1.5)
    e = int(n * avg_degree / 2)
    src = torch.multinomial(theta, e, replacement=True, generator=g)
    same = torch.rand(e, generator=g) < homophily
    by_class = [torch.nonzero(label == c).squeeze(1) for c in range(classes)]
    dst = torch.multinomial(theta, e, replacement=True, generator=g)
    for c in range(classes):
        sel = same & (label[src] == c)
        pick = torch.multinomial(theta[by_class[c]], int(sel.sum()), replacement=True, generator=g)
        dst[sel] = by_class[c][pick]
    keep = src != dst
    src, dst = src[keep], dst[keep]
    key = torch.unique(torch.cat([src * n + dst, dst * n + src]))
    src, dst = key // n, key % n
    means = torch.randn(classes, feat_dim, generator=g)
    feat = means[label] + 2.5 * torch.randn(n, feat_dim, generator=g)
    perm = torch.randperm(n, generator=g)
    train_mask = torch.zeros(n, dtype=torch.bool)
    test_mask = torch.zeros(n, dtype=torch.bool)
    train_mask[perm[: n // 2]] = True
    test_mask[perm[n // 2 :]] = True
    return src, dst, feat, label, train_mask, test_mask
