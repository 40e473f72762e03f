"""The distributed cost model's pieces (tools/experiments/comm_model.py, comm_halo.py,
comm_project.py): the fit recovers the rates that made a set of synthetic measurements, the
halo formula matches random partitions, and the projection's bytes follow its definitions
(the byte budget is F times exact fp32 1D's, replication 1 is 1D)."""

from __future__ import annotations

import importlib.util
import os
import random
import sys

import pytest
import torch

TOOLS = os.path.join(os.path.dirname(__file__), "..", "tools")


def _load(name):
    sys.path.insert(0, TOOLS)
    sys.path.insert(0, os.path.join(TOOLS, "experiments"))
    spec = importlib.util.spec_from_file_location(name, os.path.join(TOOLS, "experiments",
                                                                     f"{name}.py"))  # fmt: skip
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_fit_recovers_known_rates():
    cm = _load("comm_model")
    true = {"fixed_s": 0.02, "sparse_s": 3e-9, "dense_s": 1e-10, "elem_s": 2e-9,
            "score_s": 5e-9, "codec_s": 4e-9, "byte_s": 1e-9, "message_s": 2e-4}  # fmt: skip
    rng = random.Random(0)
    points = []
    for _ in range(40):
        p = rng.choice([1, 2, 4])
        ranks = []
        for _ in range(p):
            f = {"fixed": 1.0, "sparse": rng.uniform(1e6, 5e7), "dense": rng.uniform(1e7, 1e9),
                 "elem": rng.uniform(1e5, 1e7), "score": rng.choice([0.0, rng.uniform(1e5, 1e7)]),
                 "codec": rng.choice([0.0, rng.uniform(1e5, 1e7)]),
                 "bytes": 0.0 if p == 1 else rng.uniform(1e5, 1e8),
                 "messages": 0.0 if p == 1 else rng.uniform(10, 200)}  # fmt: skip
            ranks.append(f)
        point = {"ranks": ranks, "cores": 2.0, "cpu_s": [cm.work(true, f) for f in ranks]}
        point["measured_s"] = cm.epoch_time(true, ranks, 2.0)
        points.append(point)
    for target in ("wall", "cpu"):  # from the epochs, or from each rank's CPU seconds
        got = cm.fit(points, target=target)
        for k, v in true.items():
            assert got[k] == pytest.approx(v, rel=0.02), (target, k)
        assert all(abs(r - 1) < 1e-3 for _, _, r in cm.check(got, points))


def test_oversubscribed_processes_share_the_cores():
    cm = _load("comm_model")
    rates = dict.fromkeys(cm.PARAMS, 0.0) | {"fixed_s": 1.0}
    one = {f: 0.0 for f in cm.FEATURES} | {"fixed": 1.0}
    assert cm.epoch_time(rates, [one] * 2, cores=2) == 1.0  # one core each
    assert cm.epoch_time(rates, [one] * 4, cores=2) == 2.0  # four processes on two cores


def test_the_halo_formula_matches_random_partitions():
    ch = _load("comm_halo")
    g = torch.Generator().manual_seed(0)
    n, e = 5000, 60000
    src, dst = torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    deg = torch.bincount(src, minlength=n)
    from dgl_rsc.distributed.partition import partition_nodes, partition_quality

    for p in (2, 8, 32):
        part = partition_nodes(src, dst, n, p, "random")
        q = partition_quality(src, dst, n, part, p)
        model = ch.halo_per_rank(deg, p, q["edge_cut_fraction"])
        assert sum(q["halo_nodes"]) / p == pytest.approx(model, rel=0.03)
    assert ch.kappa_at({"kappa_2": 0.1, "slope": 0.1}, 8) == pytest.approx(0.3)
    assert ch.kappa_at({"kappa_2": 0.9, "slope": 0.5}, 4) == 0.75  # never above random's cut


def _graph(cp):
    cut = {p: min(0.05 * p**0.5, 1 - 1 / p) for p in (2, 4, 8, 16, 32, 64, 128, 256)}
    g = dict(cp.GRAPHS["ogbn-products"])
    return cp.Graph(g, cut, clump=1.3)


def test_the_byte_budget_is_f_times_exact_fp32_1d_and_c1_is_1d():
    cp = _load("comm_project")
    gr = _graph(cp)
    rates = {k: 1e-12 for k in ("fixed_s", "sparse_s", "dense_s", "elem_s", "score_s",
                                "codec_s")} | {"visited": 0.3}  # fmt: skip
    for p in (8, 64):
        exact = cp.project_one(gr, p, 1, "exact", rates, 25)
        budget = cp.project_one(gr, p, 1, "budget", rates, 25)
        assert budget["halo_bytes"] == pytest.approx(0.2 * exact["halo_bytes"])
        assert budget["epoch_s"] < exact["epoch_s"]
        rsc = cp.project_one(gr, p, 1, "rsc", rates, 25)
        assert rsc["halo_bytes"] < exact["halo_bytes"]
        bits = cp.project_one(gr, p, 1, "bits8", rates, 25)
        assert 0.25 < bits["halo_bytes"] / exact["halo_bytes"] < 0.3
        for c in (2, 4):  # a receiver of 1.5D gets 1/c of its block's halo at P / c parts
            one5 = cp.project_one(gr, p, c, "exact", rates, 25)
            f, b, _ = gr.halo_bytes(p // c)
            assert one5["halo_bytes"] == pytest.approx((f + b) / c)
            assert one5["sent_bytes"] == pytest.approx(f + b) and one5["replica_bytes"] > 0
            spread = cp.project_one(gr, p, c, "exact", rates, 25, deal="balanced")
            assert spread["sent_bytes"] == pytest.approx(one5["halo_bytes"])
            b15 = cp.project_one(gr, p, c, "budget", rates, 25)
            assert b15["halo_bytes"] == pytest.approx(0.2 * exact["halo_bytes"])
