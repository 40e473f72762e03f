"""The one-pass epilogue (``dgl_rsc.sparse.epilogue``) and the GCN/SAGE forward that uses it
(``dgl_rsc.models.fused``): equal to the op-by-op path up to reassociation, outputs and
gradients, with dropout's mask regenerated from its seed."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dgl_rsc.nn as rnn
from dgl_rsc.models import fused
from dgl_rsc.models.paper import GCN, SAGE
from dgl_rsc.sparse import epilogue as E
from dgl_rsc.sparse.graph import Graph

pytest.importorskip("numba")


def _grads(y, inputs, g):
    return torch.autograd.grad(y, [t for t in inputs if t is not None and t.requires_grad], g)


@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.parametrize("terms", ["bias", "other", "both", "none"])
def test_numba_engine_equals_the_torch_reference(p, relu, terms):
    torch.manual_seed(0)
    x = torch.randn(300, 37, requires_grad=True)
    other = torch.randn(300, 37, requires_grad=True) if terms in ("other", "both") else None
    bias = torch.randn(37, requires_grad=True) if terms in ("bias", "both") else None
    g = torch.randn(300, 37)
    got = {}
    for engine in ("numba", "torch"):
        torch.manual_seed(7)  # the same seed drawn by both
        y = E.bias_act_dropout(x, other, bias, p=p, relu=relu, engine=engine)
        got[engine] = (y, _grads(y, (x, other, bias), g))
    (y1, g1), (y2, g2) = got["numba"], got["torch"]
    assert torch.equal(y1, y2)
    for a, b in zip(g1, g2):  # input gradients and the bias's column sums, bit for bit
        assert torch.equal(a, b)


@pytest.mark.parametrize("engine", ["numba", "torch"])
def test_without_dropout_it_is_the_op_by_op_layer(engine):
    torch.manual_seed(1)
    x = torch.randn(500, 64, requires_grad=True)
    other = torch.randn(500, 64, requires_grad=True)
    bias = torch.randn(64, requires_grad=True)
    g = torch.randn(500, 64)
    for training, p in ((True, 0.0), (False, 0.5)):  # no dropout, or evaluation
        y = E.bias_act_dropout(x, other, bias, p=p, training=training, engine=engine)
        ref = F.relu((x + other) + bias)
        assert torch.equal(y, ref)
        for a, b in zip(_grads(y, (x, other, bias), g), _grads(ref, (x, other, bias), g)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_the_mask_keeps_each_element_with_probability_one_minus_p():
    keep = E.keep_mask((400, 256), (12345, 678), 0.3)
    assert abs(keep.float().mean().item() - 0.7) < 0.01
    # neighbours independent: P(equal) = 0.7^2 + 0.3^2
    assert abs((keep[:, 1:] == keep[:, :-1]).float().mean().item() - 0.58) < 0.01
    assert abs((keep[1:] == keep[:-1]).float().mean().item() - 0.58) < 0.01
    assert torch.equal(keep, E.keep_mask((400, 256), (12345, 678), 0.3))
    assert not torch.equal(keep, E.keep_mask((400, 256), (12346, 678), 0.3))


def test_the_seed_follows_torch_manual_seed():
    x = torch.randn(50, 20)
    torch.manual_seed(3)
    a = E.bias_act_dropout(x, p=0.5)
    torch.manual_seed(3)
    b = E.bias_act_dropout(x, p=0.5)
    c = E.bias_act_dropout(x, p=0.5)
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("n,threads", [(0, 2), (1, 2), (1000, 1), (100003, 2), (100003, 3)])
def test_row_ranges_cover_every_row_once(n, threads):
    ranges = E._row_ranges(n, 256, threads)
    rows = [r for a, b, _ in ranges for r in range(a, b)]
    assert rows == list(range(n))
    assert [k for *_, k in ranges] == list(range(len(ranges)))


def test_bad_arguments_are_named():
    x = torch.randn(4, 3)
    with pytest.raises(ValueError, match="dropout probability"):
        E.bias_act_dropout(x, p=1.0)
    with pytest.raises(ValueError, match="bias must be"):
        E.bias_act_dropout(x, bias=torch.zeros(4))
    with pytest.raises(ValueError, match="unknown engine"):
        E.bias_act_dropout(x, engine="cuda")


# -- the models --------------------------------------------------------------------------
def _graph(n=120, seed=0):
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (6 * n,), generator=gen)
    dst = torch.randint(0, n, (6 * n,), generator=gen)
    return Graph(src, dst, n).add_self_loop()


class _SeededDropout(nn.Module):
    """Dropout with the epilogue's hashed mask for the seeds in ``seeds``, in order."""

    def __init__(self, p, seeds):
        super().__init__()
        self.p, self.seeds = p, seeds

    def forward(self, x):
        if not self.training:
            return x
        keep = E.keep_mask(x.shape, self.seeds.pop(0), self.p)
        scale = torch.tensor(1.0 / (1.0 - self.p), dtype=x.dtype)
        return torch.where(keep, x * scale, torch.zeros((), dtype=x.dtype))


@pytest.mark.parametrize("cls,kw", [(GCN, {}), (GCN, {"hidden": 8}), (SAGE, {}),
                                    (SAGE, {"aggregator": "gcn"})])  # fmt: skip
@pytest.mark.parametrize("rsc", [False, True])
def test_fused_model_equals_the_op_by_op_model(monkeypatch, cls, kw, rsc):
    """Same weights, same dropout masks: outputs and every gradient equal to 1e-5 (widths
    12 -> 16 -> 16 -> 5 take both orders of GraphConv; hidden 8 transforms first)."""
    g = _graph()
    x = torch.randn(120, 12)
    y = torch.randint(0, 5, (120,))
    torch.manual_seed(0)
    kw = {"hidden": 16, "layers": 3, "dropout": 0.4, **kw}
    model, ref = cls(12, 5, **kw), cls(12, 5, **kw)
    ref.load_state_dict(model.state_dict())
    ref.fused_epilogue = False
    seeds = [(11, 22), (33, 44), (55, 66), (77, 88)]
    draws = list(seeds)
    monkeypatch.setattr(E, "_draw_seed", lambda: draws.pop(0))
    ref.dropout = _SeededDropout(0.4, list(seeds))
    ctls = []
    if rsc:  # budget 1.0: the RSC operator runs, its backward exact
        ctls = [rnn.attach(m, budget=1.0, total_steps=10) for m in (model, ref)]
    else:
        rnn.exact(model), rnn.exact(ref)
    assert fused.applies(model, g, x) and not fused.applies(ref, g, x)
    for _ in range(2):  # the second step reuses the first layer's aggregation
        out, out_ref = model(g, x), ref(g, x)
        torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-6)
        F.cross_entropy(out, y).backward()
        F.cross_entropy(out_ref, y).backward()
        for (name, a), b in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6, msg=name)
            a.grad = b.grad = None
        for c in ctls:
            c.step()
    model.eval(), ref.eval()
    torch.testing.assert_close(model(g, x), ref(g, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["off", "batch_norm", "hook", "activation", "float64"])
def test_the_op_by_op_forward_runs_where_fusion_cannot_see_the_layer(case):
    g, x = _graph(), torch.randn(120, 12)
    model = GCN(12, 5, hidden=16, layers=2, batch_norm=case == "batch_norm")
    if case == "off":
        model.fused_epilogue = False
    if case == "hook":
        model.dropout.register_forward_hook(lambda m, i, o: None)
    if case == "activation":
        model.convs[0]._activation = torch.relu
    if case == "float64":
        model, x = model.double(), x.double()
    assert not fused.applies(model, g, x)
    assert fused.applies(GCN(12, 5, hidden=16, layers=2), g, torch.randn(120, 12))


def test_the_launcher_key_reaches_the_model():
    from dgl_rsc.launcher.schema import TRAIN_RULES, TrainConfig

    assert TrainConfig().fused_epilogue is True and "fused_epilogue" in TRAIN_RULES


@pytest.mark.parametrize("x_grad,width", [(False, 12), (True, 10)])
def test_the_order_follows_the_sparse_rows_each_costs(x_grad, width):
    """12 -> 10: DGL transforms first; with an input that needs no gradient, aggregating first
    reads 12-wide rows once against 10-wide rows forward and backward."""
    conv = rnn.GraphConv(12, 10)
    rnn.exact(conv)
    rnn.cache_input_aggregation(conv, False)
    widths = []
    real = conv._aggregate
    conv._aggregate = lambda g, feat, *a, **k: widths.append(feat.shape[1]) or real(
        g, feat, *a, **k
    )
    g, x = _graph(), torch.randn(120, 12, requires_grad=x_grad)
    x_ref = x.detach().clone().requires_grad_(x_grad)
    out = conv.pre_activation(g, x)[0] + conv.bias
    assert widths == [width]
    ref = rnn.GraphConv(12, 10)
    ref.load_state_dict(conv.state_dict())
    rnn.exact(ref)
    torch.testing.assert_close(out, ref(g, x_ref), rtol=1e-5, atol=1e-6)
