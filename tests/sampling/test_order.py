"""``stable_order`` equals torch's stable sort on every path (packed float32, NumPy float64,
the torch fallback), with the odd values torch orders in its own way."""

import pytest
import torch

from dgl_rsc.sampling.order import stable_order


def _odd_values(m: int, gen: torch.Generator) -> torch.Tensor:
    v = torch.randn(m, generator=gen)
    for frac, value in ((0.3, 0.0), (0.1, -0.0), (0.05, float("inf")), (0.05, float("-inf")),
                        (0.05, float("nan")), (0.02, -float("nan")), (0.2, 1.5)):  # fmt: skip
        v[torch.rand(m, generator=gen) < frac] = value
    return v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("descending", [False, True])
def test_equals_torch_stable_sort(dtype, descending):
    gen = torch.Generator().manual_seed(3)
    for m in (1, 2, 7, 100, 5000):
        for _ in range(5):
            v = _odd_values(m, gen).to(dtype)
            want = torch.sort(v, descending=descending, stable=True).indices
            got = stable_order(v, descending=descending)
            assert got.dtype == torch.int64
            assert torch.equal(got, want)


def test_nan_free_float64_and_ties_keep_index_order():
    v = torch.tensor([2.0, 1.0, 2.0, -0.0, 0.0, 1.0], dtype=torch.float64)
    assert stable_order(v).tolist() == [3, 4, 1, 5, 0, 2]
    assert stable_order(v.float(), descending=True).tolist() == [0, 2, 1, 5, 3, 4]


def test_empty_and_wrong_shape():
    assert stable_order(torch.empty(0)).numel() == 0
    with pytest.raises(ValueError, match="1-D"):
        stable_order(torch.zeros(2, 2))
