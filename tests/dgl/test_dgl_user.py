"""What a DGL user meets (issue 23, item 8): a forgotten ``rsc.step()`` is detected and warned
about once, never kills the run; a patch or attach without ``total_steps`` warns that it never
switches to exact; products the patch cannot approximate are warned about and counted in
``stats()``; every such warning points at the user's line; the patched stock ``GraphConv``
and the drop-in train identically."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import dgl_rsc
from dgl_rsc import nn as rnn

from ..conftest import labelled_graph, requires_dgl

pytestmark = [requires_dgl, pytest.mark.dgl, pytest.mark.usefixtures("one_thread")]

HERE = __file__


@pytest.fixture(scope="module")
def data():
    import dgl

    src, dst, feat, label, train, _ = labelled_graph(n=400, feat_dim=16, avg_degree=6.0)
    g = dgl.add_self_loop(dgl.graph((src, dst), num_nodes=400))
    return g, feat, label, train


class Net(torch.nn.Module):
    """A 2-layer GCN of the given conv class (DGL's or the drop-in)."""

    def __init__(self, conv, dims=(16, 8, 4)):
        super().__init__()
        self.convs = torch.nn.ModuleList(conv(a, b) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, g, x):
        for i, conv in enumerate(self.convs):
            x = conv(g, x)  # the user's line the warnings point at
            x = F.relu(x) if i < len(self.convs) - 1 else x
        return x


def _stock(dims=(16, 8, 4)):
    import dgl.nn as dglnn

    torch.manual_seed(0)
    return Net(dglnn.GraphConv, dims)


def _dropin(dims=(16, 8, 4)):
    torch.manual_seed(0)
    return Net(rnn.GraphConv, dims)


def _train(model, data, steps, rsc=None, step=True, dtype=torch.float32):
    g, feat, label, train = data
    model = model.to(dtype)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(g, feat.to(dtype))[train].float(), label[train])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step and rsc is not None:
            rsc.step()
        losses.append(float(loss))
    return torch.tensor(losses, dtype=torch.float64)


def _ours(caught, fragment):
    return [w for w in caught if fragment in str(w.message)]


# -- a forgotten rsc.step() ------------------------------------------------------------------


@pytest.mark.parametrize("how", ["patch", "attach"])
def test_a_missing_step_is_warned_once_at_the_users_line_and_counted(data, how):
    cfg = dict(budget=0.3, total_steps=8, switch_at=0.5, warmup_steps=1, min_width=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if how == "patch":
            with dgl_rsc.patch(**cfg) as rsc:
                _train(_stock(), data, 8, rsc, step=False)
        else:
            model = _dropin()
            rsc = rnn.attach(model, **cfg)
            _train(model, data, 8, rsc, step=False)
    missing = _ours(caught, "rsc.step() was not called")
    assert len(missing) == 1 and missing[0].filename == HERE
    st = rsc.stats()
    assert st["implicit_steps"] == 7 and st["step"] == 7
    assert len(st["layers"]) == 2  # the products map onto the same two layers every pass
    assert st["phase"] == "exact"  # the schedule advanced: the switch at step 4 happened
    # the drop-in model's first layer reuses its input aggregation after the second pass
    # (dgl_rsc/dgl/nn/input_cache.py): its second layer's product is the one approximated
    assert st["layers"][0 if how == "patch" else 1]["approx_calls"] > 0


def test_steps_called_correctly_give_no_warning(data):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with dgl_rsc.patch(budget=0.3, total_steps=5) as rsc:
            _train(_stock(), data, 5, rsc)
    assert not [w for w in caught if "dgl_rsc" in str(w.message) or "rsc." in str(w.message)]
    assert rsc.stats()["implicit_steps"] == 0 and rsc.stats()["not_approximated"] == 0


# -- no total_steps ---------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["patch", "attach"])
def test_no_total_steps_warns_that_it_never_switches(data, how):
    def enter(**cfg):
        if how == "patch":
            with dgl_rsc.patch(**cfg):
                pass
        else:
            rnn.attach(_dropin(), **cfg)

    for cfg, expected in [({"budget": 0.2}, 1), ({"budget": 0.2, "total_steps": 10}, 0),
                          ({"budget": 0.2, "switch_at": 1.0}, 0)]:  # fmt: skip
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            enter(**cfg)
        found = _ours(caught, "has no total_steps")
        assert len(found) == expected, cfg
        if found:
            assert found[0].filename == HERE and "total_steps=" in str(found[0].message)


# -- products the patch cannot approximate ------------------------------------------------------


def test_bf16_features_are_warned_once_and_reported_not_approximated(data):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with dgl_rsc.patch(budget=0.3, total_steps=3) as rsc:
            losses = _train(_stock(), data, 3, rsc, dtype=torch.bfloat16)
    assert torch.isfinite(losses).all()
    found = _ours(caught, "is not approximated")
    assert len(found) == 1 and "bfloat16 features on cpu" in str(found[0].message)
    assert found[0].filename == HERE
    st = rsc.stats()
    assert st["not_approximated"] == 6  # 2 layers x 3 steps
    assert st["not_approximated_reasons"] == {"bfloat16 features on cpu": 6}
    assert st["visited_fraction"] is None and st["nnz_exact"] == 0


def test_unattached_warning_points_at_the_users_line(data):
    g, feat, *_ = data
    model = _dropin()
    with pytest.warns(UserWarning, match="not attached") as caught:
        model(g, feat).sum().backward()
    assert _ours(caught, "not attached")[0].filename == HERE


# -- the patched stock GraphConv and the drop-in -------------------------------------------------


@pytest.mark.parametrize("dims", [(16, 8, 4), (16, 8, 16)], ids=["weight-first", "both-orders"])
@pytest.mark.parametrize("rescale", ["ls", "mass"])
def test_patched_graphconv_and_dropin_train_identically(data, dims, rescale):
    """Both score rows of the normalized matrix D^-1/2 A D^-1/2 and size the sampled product
    in its space: the same rows are kept with the same factor, so at the same seed and budget
    the runs match to rounding, in both of DGL's orders (weight first when in > out, else
    aggregation first: the second layer of (16, 8, 16)). The first layer's input needs no
    gradient, so both layers must multiply by a weight first to be products of both."""
    g, feat, label, train = data
    data = (g, feat, label % dims[-1], train)
    cfg = dict(budget=0.2, total_steps=12, switch_at=1.0, warmup_steps=1, cache_interval=3,
               tune_interval=3, seed=5, rescale=rescale, min_width=0)  # fmt: skip
    with dgl_rsc.patch(**cfg) as rsc_patch:
        patched = _train(_stock(dims), data, 12, rsc_patch)
    # the drop-in would reuse its first layer's input aggregation (one product fewer, which
    # the patched stock layer keeps): off here, so that both run the same products
    model = rnn.cache_input_aggregation(_dropin(dims), enabled=False)
    rsc_drop = rnn.attach(model, **cfg)
    dropin = _train(model, data, 12, rsc_drop)
    torch.testing.assert_close(patched, dropin, rtol=1e-5, atol=1e-6)
    a, b = rsc_patch.stats(), rsc_drop.stats()
    assert a["nnz_visited"] == b["nnz_visited"] and a["visited_fraction"] < 0.6


def test_each_kind_of_skipped_product_is_counted_and_empty_ones_are_not(data):
    import dgl

    g = data[0]
    x = torch.randn(g.num_nodes(), 4, requires_grad=True)
    empty = dgl.graph((torch.tensor([], dtype=torch.long),) * 2, num_nodes=g.num_nodes())
    with pytest.warns(UserWarning, match="reduce 'max' is not approximated"):
        with dgl_rsc.patch(budget=0.5, total_steps=4) as rsc:
            dgl.ops.copy_u_max(g, x)
            dgl.ops.copy_u_max(g, x)
            dgl.ops.copy_u_sum(empty, x)  # nothing to approximate: not counted
            with torch.no_grad():
                dgl.ops.copy_u_max(g, x)  # evaluation: not a training product
    assert rsc.stats()["not_approximated_reasons"] == {"reduce 'max'": 2}
