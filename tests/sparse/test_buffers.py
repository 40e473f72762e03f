"""OutputPool: buffers are reused only when nothing outside the pool holds them."""

import torch

from dgl_rsc.sparse.buffers import POOL_MIN_BYTES, OutputPool


def test_reuse_only_after_release():
    pool = OutputPool()
    a = pool.empty((512, 1024), torch.float32)
    b = pool.empty((512, 1024), torch.float32)
    assert a.data_ptr() != b.data_ptr() and len(pool) == 2
    pa = a.data_ptr()
    view = a[10:20]
    del a
    c = pool.empty((512, 1024), torch.float32)
    assert c.data_ptr() != pa  # a slice of it is still alive
    del view
    assert pool.empty((512, 1024), torch.float32).data_ptr() == pa


def test_a_gradient_that_keeps_the_buffer_blocks_reuse():
    pool = OutputPool()
    w = torch.randn(512, 1024, requires_grad=True)

    class Op(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            out = pool.empty(g.shape, g.dtype)
            out.copy_(g)
            return out

    Op.apply(w).sum().backward()
    held = w.grad.data_ptr()
    assert pool.empty((512, 1024), torch.float32).data_ptr() != held  # .grad owns it
    assert bool(w.grad.eq(1).all())


def test_enabled_only_for_large_cpu_outputs():
    big = POOL_MIN_BYTES // 4
    assert OutputPool.enabled_for((big, 1), torch.float32, torch.device("cpu"))
    assert not OutputPool.enabled_for((big // 2, 1), torch.float32, torch.device("cpu"))
    assert not OutputPool.enabled_for((big, 1), torch.float32, torch.device("meta"))


def test_clear_and_nbytes():
    pool = OutputPool()
    x = pool.empty((256, 1024), torch.float64)
    assert pool.nbytes() == 256 * 1024 * 8
    pool.clear()
    assert pool.nbytes() == 0 and len(pool) == 0
    x.fill_(1.0)  # still valid after the pool let go of it
    assert float(x.sum()) == 256 * 1024


def test_tagged_buffers_are_clean_only_when_unmodified_since_marked():
    pool = OutputPool()
    shape = (512, 1024)
    a, clean = pool.take(shape, torch.float32, tag=7)
    assert not clean  # a new buffer holds anything
    a.zero_()
    pool.mark(a, 7)
    ptr = a.data_ptr()
    del a
    b, clean = pool.take(shape, torch.float32, tag=7)
    assert clean and b.data_ptr() == ptr
    b[3] += 1.0  # modified in place after the mark: no longer what tag 7 left
    del b
    c, clean = pool.take(shape, torch.float32, tag=7)
    assert not clean and c.data_ptr() == ptr
    pool.mark(c, 7)
    del c
    d, clean = pool.take(shape, torch.float32, tag=8)
    assert not clean  # another tag
    del d
    e = pool.empty(shape, torch.float32)  # an untagged writer forgets the mark
    del e
    f, clean = pool.take(shape, torch.float32, tag=7)
    assert not clean
    held, clean = pool.take(shape, torch.float32, tag=7)
    assert not clean and held.data_ptr() != f.data_ptr()  # f is alive: a second buffer


def test_sparse_writes_of_a_cached_slice_equal_full_writes():
    """A sampled product repeated on the same slice writes only its non-empty rows into a
    clean buffer; the results equal a fresh full write, also after something modified a
    released output in place."""
    from dgl_rsc.backends import torch_ref
    from dgl_rsc.sampling import draw_sample, sample_product
    from dgl_rsc.sparse.products import NO_SCALES, Scales

    from ..conftest import power_law_csr

    A = power_law_csr(3000, 12.0, seed=4)
    dY = torch.randn(3000, 128)
    s = draw_sample(A, dY, int(0.05 * A.nnz), "cost", 0, torch_ref, "none")
    fresh = sample_product(A, s, dY, NO_SCALES).clone()
    assert fresh.numel() * 4 >= POOL_MIN_BYTES and bool(fresh.eq(0).all(1).any())
    for step in range(4):
        out = sample_product(A, s, dY, NO_SCALES)
        assert torch.equal(out, fresh)
        if step == 1:
            out.fill_(5.0)  # a downstream in-place op on the released gradient
        del out
    sc = Scales(row=torch.rand(3000) + 0.5)
    ref = sample_product(A, s, dY, sc).clone()
    assert torch.equal(sample_product(A, s, dY, sc), ref)
    bad = Scales(col=torch.full((3000,), float("nan")))  # the output rows' scale
    assert bool(sample_product(A, s, dY, bad).isnan().all())  # as a full write gives
