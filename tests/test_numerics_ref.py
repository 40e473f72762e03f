"""The native engine gives the saved numbers (tools/experiments/numerics_ref.py) on every torch.

``make test`` runs this on torch 2.2.1 with DGL, ``make test-modern`` on torch 2.15 without:
the logits, losses and RSC gradients of a small GCN and GraphSAGE at budget 0.3 must match
``tests/data/numerics_ref.npz`` within 1e-5 (relative to each array's largest magnitude), and
the rows RSC kept must be the same integers.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def tool():
    path = os.path.join(ROOT, "tools", "experiments", "numerics_ref.py")
    spec = importlib.util.spec_from_file_location("numerics_ref", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def saved(tool):
    with np.load(tool.DEFAULT_PATH) as f:
        return dict(f)


def test_saved_file_covers_every_case_and_an_approximated_backward(tool, saved):
    for case, _, _ in tool.CASES:
        kept = saved[f"{case}/kept"]
        assert kept.shape == (tool.STEPS, tool.LAYERS)
        assert (kept[0] == 0).all()  # the warm-up step is exact
        # later steps sampled: every product kept some rows, and fewer than all of them
        assert ((kept[1:] > 0) & (kept[1:] < tool.N)).all(), kept
        assert np.isfinite(saved[f"{case}/loss"]).all()
        assert saved[f"{case}/loss"][-1] < saved[f"{case}/loss"][0]


def test_this_torch_reproduces_the_saved_outputs(tool, capsys):
    rc = tool.main(["--check", "--out", tool.DEFAULT_PATH])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "matches" in out


def test_compare_reports_what_differs(tool, saved):
    fresh = {k: np.array(v) for k, v in saved.items() if "/" in k}
    assert tool.compare(saved, fresh) == []
    key = "gcn-numba/logits"
    scale = np.abs(saved[key]).max()
    fresh[key] = saved[key] + 0.5e-5 * scale  # within the tolerance
    assert tool.compare(saved, fresh) == []
    fresh[key] = saved[key] + 3e-5 * scale
    fresh["gcn-torch/kept"] = saved["gcn-torch/kept"] + 1
    fresh["sage-numba/loss"] = np.full_like(saved["sage-numba/loss"], np.nan)
    del fresh["gcn-numba/loss"]
    problems = tool.compare(saved, fresh)
    assert [p.split(":")[0] for p in problems] == [
        "gcn-numba/logits",
        "gcn-numba/loss",
        "gcn-torch/kept",
        "sage-numba/loss",
    ]
    assert "not computed" in problems[1]
