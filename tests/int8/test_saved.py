"""Activations saved for the weight gradients in INT8 (``dgl_rsc.int8.saved``): a quarter of
the bytes, the input freed after the forward, the weight gradient's error bounded; the other
gradients exact."""

import gc
import weakref

import pytest
import torch

from dgl_rsc.int8 import Int8Spec, Int8State, int8_matmul, quantize_model
from dgl_rsc.int8.saved import SavedRows, saved_matmul


def rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_saved_rows_give_the_weight_gradient_within_one_quantization(rounding):
    gen = torch.Generator().manual_seed(0)
    x, dy = torch.randn(5000, 48, generator=gen), torch.randn(5000, 7, generator=gen)
    rows = SavedRows(x, Int8State(Int8Spec(rounding=rounding)))
    assert rows.q.dtype == torch.int8 and rows.nbytes() < x.numel() * x.element_size() / 3.5
    want = x.t() @ dy
    err = rel(rows.t_times(dy, chunk=1024), want)
    assert 0 < err < 0.01  # 8 bits per row: about 0.5% on Gaussian rows
    # the chunks sum what one product of the dequantized rows gives, up to fp32 rounding
    torch.testing.assert_close(rows.t_times(dy, chunk=1024), rows.dequantized().t() @ dy,
                               rtol=1e-4, atol=1e-4)  # fmt: skip


def _activation(seed=1, n=300, k=24):
    gen = torch.Generator().manual_seed(seed)
    leaf = torch.randn(n, k, generator=gen, requires_grad=True)
    return leaf, leaf * 1.0  # an activation: the output of an op, needing a gradient


@pytest.mark.parametrize("product", ["saved_matmul", "int8_matmul"])
def test_the_input_is_freed_after_the_forward_and_gradients_hold(product):
    """Only the codes stay: the activation itself is freed once its forward is done; ``dx``
    is the fp32 product's exactly (``saved_matmul``) or within INT8 (``int8_matmul``), ``dw``
    within one quantization of the input."""
    leaf, x = _activation()
    w = torch.randn(24, 16, generator=torch.Generator().manual_seed(2), requires_grad=True)
    state = Int8State(Int8Spec(rounding="stochastic", dense="int8"))
    fn = saved_matmul if product == "saved_matmul" else int8_matmul
    y = fn(x, w, state)
    ref = weakref.ref(x)
    del x
    gc.collect()
    assert ref() is None  # nothing kept the fp32 activation
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(3))
    (y * g).sum().backward()
    leaf2, x2 = _activation()
    w2 = w.detach().clone().requires_grad_(True)
    ((x2 @ w2) * g).sum().backward()
    if product == "saved_matmul":
        assert torch.equal(leaf.grad, leaf2.grad)  # dx = dy @ w^T in fp32
        assert 0 < rel(w.grad, w2.grad) < 0.01
    else:
        assert rel(leaf.grad, leaf2.grad) < 0.03 and rel(w.grad, w2.grad) < 0.03


def test_an_int8_model_keeps_its_saved_activations_in_int8(monkeypatch):
    """Every convolution's weight product keeps an INT8 copy of its activation input (the
    fp32 last layer's too), none with ``saved="fp32"``; the gradients stay close."""
    from dgl_rsc.int8 import saved as saved_mod
    from dgl_rsc.models import build_model
    from dgl_rsc.nn import exact
    from dgl_rsc.sparse.graph import Graph

    made = []
    real = saved_mod.SavedRows.__init__

    def init(self, x, state):
        made.append(None if x is None else tuple(x.shape))
        real(self, x, state)

    monkeypatch.setattr(saved_mod.SavedRows, "__init__", init)
    gen = torch.Generator().manual_seed(4)
    n = 200
    src, dst = (
        torch.randint(0, n, (1200,), generator=gen),
        torch.randint(0, n, (1200,), generator=gen),
    )
    g = Graph(torch.cat([src, dst, torch.arange(n)]), torch.cat([dst, src, torch.arange(n)]), n)
    x = torch.randn(n, 32, generator=gen)
    grads = {}
    for saved in ("int8", "fp32"):
        torch.manual_seed(0)
        model = exact(build_model("gcn", in_feats=32, num_classes=5, hidden=20, layers=3,
                                  dropout=0.0))  # fmt: skip
        quantize_model(model, "nearest", saved=saved, dense="fp32", sparse="fp32")
        made.clear()
        model(g, x).square().sum().backward()
        grads[saved] = [p.grad for p in model.parameters()]
        if saved == "int8":
            assert (n, 20) in made and len(made) == 2  # convs.1's input and convs.2's input
        else:
            assert made == []
    for a, b in zip(grads["int8"], grads["fp32"]):
        assert rel(a, b) < 0.02


def test_the_cpu_kernels_give_the_reference_values():
    """Row maxima (NaN kept) and the one-pass dequantize equal torch's ops; quantizing with
    the kernel's maxima gives the same codes and scales."""
    pytest.importorskip("numba")
    from dgl_rsc.backends import int8_cpu
    from dgl_rsc.int8.quantize import quantize

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(700, 33, generator=gen)
    x[3, 4], x[9, 0] = float("nan"), float("-inf")
    want = x.abs().amax(1, keepdim=True)
    got = int8_cpu.row_amax(x)
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(
        got.nan_to_num(), want.nan_to_num()
    )
    y = torch.randn(700, 33, generator=gen)
    q0, s0 = quantize(y, 1, "stochastic", 3, int8_cpu.quantize_codes)
    q1, s1 = quantize(y, 1, "stochastic", 3, int8_cpu.quantize_codes, int8_cpu.row_amax)
    assert torch.equal(q0, q1) and torch.equal(s0, s1)
    out = torch.empty(100, 33)
    assert torch.equal(
        int8_cpu.dequantize_rows(q0, s0, 250, out), q0[250:350].float() * s0[250:350]
    )
