"""The sampling core's registries: rules (keys and masses) and backends (the protocol)."""

import pytest
import torch

from dgl_rsc import RSCConfig
from dgl_rsc.backends import BACKENDS, SamplingBackend, resolve, torch_ref
from dgl_rsc.core.config import ConfigError
from dgl_rsc.sampling import RULES, get_rule, kept_count, selection_key

from ..conftest import DEVICES, power_law_csr


@pytest.mark.parametrize("rule", list(RULES))
def test_every_rule_keeps_the_key_contract(rule):
    """Keys the backends can rank: float32, >= 0, 0 for useless rows, +inf for non-finite."""
    g = torch.Generator().manual_seed(0)
    s = torch.rand(500, generator=g) * torch.randint(0, 2, (500,), generator=g)
    s[:5] = torch.tensor([float("nan"), float("inf"), 1e-38, 3e38, 0.0])
    nnz = torch.randint(0, 40, (500,), generator=g)
    nnz[5:10] = 0
    key = selection_key(s, nnz, rule)
    assert key.dtype == torch.float32 and key.shape == (500,)
    assert bool((key >= 0).all())
    assert torch.isinf(key[:2]).all() and key[4] == 0
    assert bool((key[5:10] == 0).all())
    assert bool(((key > 0) == ((s != 0) & (nnz > 0))).all())
    mass = RULES[rule].mass(torch.rand(10))
    assert bool((mass >= 0).all())
    RSCConfig(rule=rule)  # the config accepts every registered rule


def test_unknown_rule_messages():
    with pytest.raises(ValueError, match="known rules: topk, cost"):
        get_rule("random")
    with pytest.raises(ConfigError, match="Did you mean 'cost'"):
        RSCConfig(rule="costs")


def test_kept_count_is_one_definition_for_ints_and_tensors():
    cases = [(5, 10, 0, 0), (0, 10, 3, 0), (0, 2, 5, 0), (4, 10, 2, 7), (12, 10, 0, 0)]
    for fit, useful, min_k, forced in cases:
        as_int = kept_count(fit, useful, min_k, forced)
        as_t = kept_count(torch.tensor(fit), torch.tensor(useful), min_k, torch.tensor(forced))
        assert int(as_t) == as_int
    assert kept_count(0, 2, 5, 0) == 2 and kept_count(4, 10, 2, 7) == 7


def test_reference_backend_follows_the_protocol_and_the_count():
    assert isinstance(torch_ref, SamplingBackend)
    key = torch.tensor([3.0, 0.0, 2.0, float("inf"), 1.0])
    nnz = torch.tensor([4, 1, 4, 2, 1])
    mask, k = torch_ref.select_rows(key, nnz, 6, 0)
    assert mask.tolist() == [True, False, False, True, False] and int(k) == 2


def test_backend_registry_and_resolve_errors():
    from dgl_rsc.backends import numba_cpu

    assert set(BACKENDS) == {"torch", "cupy", "numba", "numba-cpu"}
    assert resolve("auto", "cpu") is numba_cpu and resolve("torch", "cpu") is torch_ref
    assert resolve("numba-cpu", "cpu") is numba_cpu
    with pytest.raises(ValueError, match="Did you mean 'cupy'"):
        resolve("cupi", "cpu")
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        resolve("cupy", "cpu")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("readback", [True, False], ids=["readback", "product"])
def test_nonfinite_rows_marks_the_columns_a_bad_row_reaches(monkeypatch, device, readback):
    """The non-finite term of a sampled product: ``None`` or zeros for a finite ``dY``, NaN
    exactly in the columns of ``A`` that a NaN or Inf row reaches, whether the check reads
    ``sum(dY)`` back (the CPU; a GPU at or above ``_READBACK_NNZ`` entries) or multiplies."""
    from dgl_rsc.sampling import draw
    from dgl_rsc.sparse.products import Scales

    monkeypatch.setattr(draw, "_READBACK_NNZ", 0 if readback else 1 << 62)
    A = power_law_csr(200, 4.0, seed=11, device=device)
    dY = torch.randn(200, 6, device=device)
    sc = Scales(torch.rand(200, device=device) + 0.5, torch.rand(200, device=device) + 0.5)
    clean = draw.nonfinite_rows(A, dY, sc)
    cpu = torch.device(device).type == "cpu"
    if readback or cpu:
        assert clean is None
    else:
        assert clean.shape == (200, 1) and not bool(clean.any())
    dY[17, 2], dY[40, 0] = float("nan"), float("inf")
    bad = draw.nonfinite_rows(A, dY, sc)
    dense = A.to_dense()
    reach = (dense[17] != 0) | (dense[40] != 0)
    assert bool(reach.any()) and bool(torch.isnan(bad[reach, 0]).all())
    assert not bool(bad[~reach].any())
