"""OutputPool: buffers are reused only when nothing outside the pool holds them."""

import torch

from dgl_rsc.buffers import POOL_MIN_BYTES, OutputPool


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
