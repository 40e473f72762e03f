"""Quantize once, fused (``dgl_rsc.int8.codes``): the hidden epilogue writes the next INT8
product's codes, saving one bit per element; equal bit for bit to the op-by-op INT8 path
(epilogue, then the product quantizing its operand) given the same draws."""

import pytest
import torch

from dgl_rsc.int8 import codes, quantize_model
from dgl_rsc.models import build_model
from dgl_rsc.nn import exact
from dgl_rsc.sparse.epilogue import bias_act_dropout
from dgl_rsc.sparse.epilogue_bits import bias_act_dropout_bits, pack_bits
from dgl_rsc.sparse.graph import Graph

pytest.importorskip("numba")


@pytest.mark.parametrize("engine", ["numba", "torch"])
@pytest.mark.parametrize("p, with_col", [(0.0, False), (0.5, True)])
def test_the_bit_epilogue_equals_the_one_pass_epilogue(engine, p, with_col):
    """Same ``y`` (the same dropout draw), same gradients, one bit saved per element, and
    the column maxima of ``|diag(col) y|``."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(300, 37, generator=gen, requires_grad=True)
    other = torch.randn(300, 37, generator=gen, requires_grad=True)
    bias = torch.randn(37, generator=gen, requires_grad=True)
    col = torch.rand(300, generator=gen) + 0.5 if with_col else None
    g = torch.randn(300, 37, generator=gen)
    torch.manual_seed(3)
    y0 = bias_act_dropout(x, other, bias, p=p, engine=engine)
    grads0 = torch.autograd.grad((y0 * g).sum(), (x, other, bias))
    torch.manual_seed(3)
    y1, amax = bias_act_dropout_bits(x, other, bias, p=p, col=col, measure=True, engine=engine)
    (bits,) = y1.grad_fn.saved_tensors  # all it keeps for the backward
    grads1 = torch.autograd.grad((y1 * g).sum(), (x, other, bias))
    assert torch.equal(y0, y1)
    assert all(torch.equal(a, b) for a, b in zip(grads0, grads1))
    scaled = y0.detach() if col is None else y0.detach() * col[:, None]
    assert torch.equal(amax, scaled.abs().amax(0, keepdim=True))
    assert bits.dtype == torch.uint8 and bits.shape == (300, 5)
    assert torch.equal(bits, pack_bits(y0.detach() > 0))


def _model(seed, sparse="int8"):
    torch.manual_seed(seed)
    model = build_model("gcn", in_feats=12, num_classes=4, hidden=24, layers=4, dropout=0.5)
    exact(model)
    quantize_model(model, "stochastic", seed=5, sparse=sparse, dense="fp32")
    return model


def _graph(n=150):
    gen = torch.Generator().manual_seed(2)
    src, dst = (
        torch.randint(0, n, (6 * n,), generator=gen),
        torch.randint(0, n, (6 * n,), generator=gen),
    )
    loops = torch.arange(n)
    return Graph(torch.cat([src, dst, loops]), torch.cat([dst, src, loops]), n)


def _steps(model, g, x, steps=3):
    out = []
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for s in range(steps):
        torch.manual_seed(100 + s)  # the same dropout draws in both runs
        logits = model(g, x)
        opt.zero_grad()
        logits.square().sum().backward()
        out.append((logits.detach(), [p.grad.clone() for p in model.parameters()]))
        opt.step()
    return out


def test_fused_codes_equal_the_op_by_op_int8_path(monkeypatch):
    """Four layers, the middle two INT8 and aggregating first: the epilogues of layers 0 and
    1 write the codes of layers 1 and 2; outputs and every gradient equal the path where
    each product quantizes its own operand, over three steps (stochastic rounding)."""
    g, x = _graph(), torch.randn(150, 12)
    taken = []
    real_take = codes.Prepared.take

    def take(self, *a):
        out = real_take(self, *a)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(codes.Prepared, "take", take)
    fused = _steps(_model(0), g, x)
    assert taken and all(taken) and len(taken) == 2 * 3  # two products a step took them
    from dgl_rsc.dgl.nn.graphconv import GraphConv

    monkeypatch.setattr(GraphConv, "int8_operand", lambda self, graph, feat: None)
    plain = _steps(_model(0), g, x)
    assert len(taken) == 6  # none written ahead
    for (y0, g0), (y1, g1) in zip(plain, fused):
        assert torch.equal(y0, y1)
        assert all(torch.equal(a, b) for a, b in zip(g0, g1))


def test_codes_are_written_only_where_int8_is_kept(monkeypatch):
    """``sparse="auto"`` while the choice is measured, or kept on fp32: the product times
    or runs fp32 with its own quantization, nothing is written ahead."""
    from dgl_rsc.base.pick import Registry
    from dgl_rsc.int8 import choose

    monkeypatch.setattr(
        choose, "PICKS", Registry(timer=lambda n, f: (f(), {"fp32": 1.0}.get(n, 9.0)))
    )
    written = []
    real = codes.epilogue_codes

    def spy(*a, **k):
        written.append(a[5] is not None)  # ahead: (state, col) when codes are written
        return real(*a, **k)

    from dgl_rsc.models import fused

    monkeypatch.setattr(fused, "epilogue_codes", spy)
    _steps(_model(0, sparse="auto"), _graph(), torch.randn(150, 12), steps=6)
    assert written and not any(written)


def test_a_stale_operand_is_quantized_again():
    from dgl_rsc.int8.spec import Int8Spec, Int8State

    y = torch.randn(10, 4)
    state = Int8State(Int8Spec(rounding="nearest"))
    p = codes.Prepared(y, None, ("q", "s"))
    assert p.take(y, None) == ("q", "s")
    assert p.take(y, torch.ones(10)) is None  # another column scale
    y.add_(1.0)  # modified in place since
    assert p.take(y, None) is None
    assert state.prepared is None


def test_in_place_the_output_overwrites_the_input_and_gradients_hold():
    gen = torch.Generator().manual_seed(1)
    leaf = torch.randn(200, 40, generator=gen, requires_grad=True)
    bias = torch.randn(40, generator=gen, requires_grad=True)
    g = torch.randn(200, 40, generator=gen)
    torch.manual_seed(7)
    y0, _ = bias_act_dropout_bits(leaf * 2.0, None, bias, p=0.3)
    grads0 = torch.autograd.grad((y0 * g).sum(), (leaf, bias))
    x = leaf * 2.0
    ptr = x.data_ptr()
    torch.manual_seed(7)
    y1, _ = bias_act_dropout_bits(x, None, bias, p=0.3, inplace=True)
    assert y1.data_ptr() == ptr and torch.equal(y0, y1)
    grads1 = torch.autograd.grad((y1 * g).sum(), (leaf, bias))
    assert all(torch.equal(a, b) for a, b in zip(grads0, grads1))
    saved = leaf.exp()  # exp saves its output: overwriting it must be refused, not wrong
    with pytest.raises(RuntimeError):
        y2, _ = bias_act_dropout_bits(saved, None, bias, p=0.3, inplace=True)
        y2.sum().backward()
