"""``dgl_rsc.patch(enabled=False)``: the off switch that lets one loop run stock DGL and RSC."""

import pytest
import torch

import dgl_rsc
import dgl_rsc.dgl.patch

from ..conftest import requires_dgl

pytestmark = [requires_dgl, pytest.mark.dgl]


def test_disabled_patch_is_stock_dgl_and_step_is_a_no_op():
    import dgl
    import dgl.nn as dglnn

    g = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, 50, (2, 300), generator=g)
    graph = dgl.add_self_loop(dgl.graph((src, dst), num_nodes=50))
    x = torch.randn(50, 8, generator=g, requires_grad=True)
    torch.manual_seed(0)
    conv = dglnn.GraphConv(8, 4)
    ref = conv(graph, x)
    (gref,) = torch.autograd.grad(ref.square().sum(), x)
    before = {(o, n): o.__dict__[n] for o, n in dgl_rsc.dgl.patch.patched_symbols()}
    with dgl_rsc.patch(budget=0.1, enabled=False) as rsc:
        assert not dgl_rsc.is_patched()
        assert all(o.__dict__[n] is f for (o, n), f in before.items())
        for _ in range(3):
            out = conv(graph, x)
            (grad,) = torch.autograd.grad(out.square().sum(), x)
            rsc.step()
    assert torch.equal(out, ref) and torch.equal(grad, gref)
    stats = rsc.stats()
    assert stats["enabled"] is False and stats["step"] == 0 and stats["layers"] == []
    assert stats["visited_fraction"] is None
    with pytest.raises(ValueError, match="budget"):
        with dgl_rsc.patch(budget=5.0, enabled=False):
            pass
