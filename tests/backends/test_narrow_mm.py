"""``narrow_mm``: a classifier's narrow weight product on the padded weight, the weight
gradient in the transposed order; equal to ``torch.matmul`` and its gradients to 1e-5."""

import pytest
import torch

from dgl_rsc.backends import narrow_mm as nm


@pytest.mark.parametrize("m", [1, 7, 10, 15])
@pytest.mark.parametrize("needs", ["both", "x", "w"])
def test_narrow_mm_equals_matmul_outputs_and_gradients(m, needs):
    g = torch.Generator().manual_seed(m)
    x = torch.randn(500, 64, generator=g)
    w = torch.randn(64, m, generator=g)
    dy = torch.randn(500, m, generator=g)
    a, b = x.clone().requires_grad_(needs != "w"), w.clone().requires_grad_(needs != "x")
    c, d = x.clone().requires_grad_(needs != "w"), w.clone().requires_grad_(needs != "x")
    out, ref = nm.narrow_mm(a, b), torch.matmul(c, d)
    assert nm.takes(a, b) and out.is_contiguous() and out.shape == (500, m)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    out.backward(dy)
    ref.backward(dy)
    for got, want in ((a, c), (b, d)):
        assert (got.grad is None) == (want.grad is None)
        if want.grad is not None:
            torch.testing.assert_close(got.grad, want.grad, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("case", ["wide", "float64", "batched"])
def test_other_products_run_torch_matmul(case, monkeypatch):
    x, w = torch.randn(50, 8), torch.randn(8, 4)
    if case == "wide":
        w = torch.randn(8, nm.NARROW)
    elif case == "float64":
        x, w = x.double(), w.double()
    else:
        x = torch.randn(3, 50, 8)
    assert not nm.takes(x, w)
    monkeypatch.setattr(nm._NarrowMM, "apply", lambda *a: pytest.fail("padded path taken"))
    torch.testing.assert_close(nm.narrow_mm(x, w), torch.matmul(x, w))
