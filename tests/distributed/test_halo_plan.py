"""dgl_rsc.distributed.halo: per-rank plans reproduce the global A @ X and A^T @ dY when all
ranks are simulated in one process; the communication counts of
tools/experiments/comm_sim.py match a brute-force count."""

from __future__ import annotations

import doctest
import importlib.util
import json
import math
import os

import pytest
import torch

from dgl_rsc.distributed import halo as halo_module
from dgl_rsc.distributed.halo import all_local, build_local, halo_rows
from dgl_rsc.distributed.partition import partition_nodes

from ..conftest import power_law_csr

N_ISLAND = 12  # nodes 0..11 form a component of their own
N_ISOLATED = 7  # the last 7 nodes have no edges at all
SELECT = ("degree", "random")  # the kept-row rules of tools/experiments/comm_sim.py


def _load_comm_sim():
    path = os.path.join(
        os.path.dirname(__file__), "..", "..", "tools", "experiments", "comm_sim.py"
    )
    spec = importlib.util.spec_from_file_location("comm_sim", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def graph():
    """Directed power-law edges with repeats and self-loops, an island, isolated nodes."""
    body = power_law_csr(200, 5.0, seed=4)
    rows = torch.repeat_interleave(torch.arange(200), body.indptr.diff())
    src, dst = body.indices + N_ISLAND, rows + N_ISLAND
    g = torch.Generator().manual_seed(0)
    island_src = torch.randint(0, N_ISLAND, (40,), generator=g)
    island_dst = torch.randint(0, N_ISLAND, (40,), generator=g)
    src = torch.cat([src, island_src, src[:15], torch.tensor([30, 31])])  # repeats, loops
    dst = torch.cat([dst, island_dst, dst[:15], torch.tensor([30, 31])])
    return src, dst, N_ISLAND + 200 + N_ISOLATED


def _partitions(graph):
    src, dst, n = graph
    for p in (1, 2, 3, 4):
        for method in ("metis", "random", "contiguous"):
            yield f"{method}-P{p}", p, partition_nodes(src, dst, n, p, method, seed=1)
    island = torch.randint(1, 3, (n,), generator=torch.Generator().manual_seed(2))
    island[:N_ISLAND] = 0  # part 0 has no remote neighbour and nobody needs its rows
    yield "island-P3", 3, island


def _simulate_forward(plans, x):
    """Every rank gathers its halo through the owners' send_idx and aggregates locally."""
    xs = [x[lp.owned] for lp in plans]
    y = torch.zeros_like(x)
    for lp in plans:
        recv = torch.cat([xs[q][plans[q].send_idx[lp.rank]] for q in range(lp.num_parts)])
        h = torch.cat([xs[lp.rank], recv])
        local = torch.zeros(lp.n_own, x.shape[1], dtype=x.dtype)
        y[lp.owned] = local.index_add_(0, lp.local_dst, h[lp.local_src])
    return y


def _simulate_backward(plans, dy):
    """Local ``A^T dY``; each halo block's gradient goes back to its owner, added at
    ``send_idx``."""
    dh = []
    for lp in plans:
        grad = torch.zeros(lp.n_local, dy.shape[1], dtype=dy.dtype)
        dh.append(grad.index_add_(0, lp.local_src, dy[lp.owned][lp.local_dst]))
    dx = torch.zeros_like(dy)
    for lp in plans:
        mine = dh[lp.rank][: lp.n_own].clone()
        for q, other in enumerate(plans):
            lo, hi = (other.n_own + int(o) for o in other.halo_offsets[lp.rank : lp.rank + 2])
            mine.index_add_(0, lp.send_idx[q], dh[q][lo:hi])
        dx[lp.owned] = mine
    return dx


def test_simulated_ranks_reproduce_the_global_products(graph, one_thread):
    src, dst, n = graph
    g = torch.Generator().manual_seed(0)
    # integer values: every sum is exact in float64, whatever the order
    x = torch.randint(-50, 50, (n, 3), generator=g).double()
    dy = torch.randint(-50, 50, (n, 3), generator=g).double()
    ax = torch.zeros_like(x).index_add_(0, dst, x[src])
    at_dy = torch.zeros_like(dy).index_add_(0, src, dy[dst])
    for name, _, part in _partitions(graph):
        plans = all_local(src, dst, n, part)
        assert torch.equal(_simulate_forward(plans, x), ax), name
        assert torch.equal(_simulate_backward(plans, dy), at_dy), name


def test_plan_invariants(graph):
    src, dst, n = graph
    out_deg, in_deg = torch.bincount(src, minlength=n), torch.bincount(dst, minlength=n)
    for name, p, part in _partitions(graph):
        plans = all_local(src, dst, n, part)
        assert [lp.rank for lp in plans] == list(range(p)), name
        # every node owned once, every edge local to exactly one rank
        assert torch.equal(
            torch.sort(torch.cat([lp.owned for lp in plans])).values, torch.arange(n)
        ), name
        ids = torch.cat([lp.edge_ids for lp in plans])
        assert torch.equal(torch.sort(ids).values, torch.arange(src.numel())), name
        for lp in plans:
            tag = f"{name} rank {lp.rank}"
            assert all(t.dtype == torch.int64 for t in (lp.owned, lp.halo, lp.local_src)), tag
            assert torch.equal(lp.local_nodes[lp.local_src], src[lp.edge_ids]), tag
            assert torch.equal(lp.owned[lp.local_dst], dst[lp.edge_ids]), tag
            key = lp.local_dst * lp.n_local + lp.local_src
            assert bool((key.diff() >= 0).all()), tag  # sorted by row, then column
            assert bool((part[lp.owned] == lp.rank).all()), tag
            # central first, each group ascending; central rows read owned columns only
            central, marginal = lp.owned[: lp.n_central], lp.owned[lp.n_central :]
            assert bool((central.diff() > 0).all() and (marginal.diff() > 0).all()), tag
            remote_rows = torch.unique(lp.local_dst[lp.local_src >= lp.n_own])
            assert torch.equal(remote_rows, torch.arange(lp.n_central, lp.n_own)), tag
            assert bool((lp.local_src[: lp.n_central_edges] < lp.n_own).all()), tag
            assert bool((lp.local_dst[lp.n_central_edges :] >= lp.n_central).all()), tag
            # halo blocks by owner, ascending ids inside
            for q in range(p):
                block = lp.halo[lp.halo_offsets[q] : lp.halo_offsets[q + 1]]
                assert bool((part[block] == q).all() and (block.diff() > 0).all()), tag
            assert lp.recv_counts[lp.rank] == 0 and lp.send_counts[lp.rank] == 0, tag
            assert torch.equal(lp.out_degree, out_deg[lp.owned]), tag
            assert torch.equal(lp.in_degree, in_deg[lp.owned]), tag
            assert torch.equal(lp.global_to_local(lp.local_nodes), torch.arange(lp.n_local))
        rows = halo_rows(src, dst, n, part, p)
        sent = torch.tensor([lp.send_counts for lp in plans])
        received = torch.tensor([lp.recv_counts for lp in plans]).T
        assert torch.equal(rows, sent) and torch.equal(rows, received), name


def test_build_local_equals_all_local(graph):
    src, dst, n = graph
    part = partition_nodes(src, dst, n, 3, "metis", seed=0)
    for lp in all_local(src, dst, n, part):
        one = build_local(src, dst, n, part, lp.rank)
        for field in (
            "owned",
            "halo",
            "halo_offsets",
            "local_src",
            "local_dst",
            "edge_ids",
            "out_degree",
            "in_degree",
        ):
            assert torch.equal(getattr(one, field), getattr(lp, field)), field
        assert one.n_central == lp.n_central
        assert all(torch.equal(a, b) for a, b in zip(one.send_idx, lp.send_idx))


def test_island_and_isolated_nodes(graph):
    src, dst, n = graph
    part = dict((name, part) for name, _, part in _partitions(graph))["island-P3"]
    island = all_local(src, dst, n, part)[0]
    assert island.n_central == island.n_own == N_ISLAND and island.n_halo == 0
    assert island.send_counts == [0, 0, 0]
    assert island.global_to_local(torch.tensor([n - 1])).tolist() == [-1]
    one = all_local(src, dst, n, torch.zeros(n, dtype=torch.int64))[0]
    assert one.n_central == n and one.n_halo == 0 and one.local_src.numel() == src.numel()
    isolated = torch.arange(n - N_ISOLATED, n)
    assert bool(torch.isin(isolated, one.owned[: one.n_central]).all())
    # an explicit part count allows empty parts: their plans are empty
    first, empty = all_local(src, dst, n, torch.zeros(n, dtype=torch.int64), parts=2)
    assert empty.n_own == empty.n_halo == 0 and empty.local_src.numel() == 0
    assert first.send_counts == [0, 0] and first.halo_offsets.tolist() == [0, 0, 0]


def test_errors(graph):
    src, dst, n = graph
    part = partition_nodes(src, dst, n, 2, "random")
    with pytest.raises(ValueError, match=r"rank=2 must lie in \[0, 2\)"):
        build_local(src, dst, n, part, 2)
    with pytest.raises(ValueError, match="part must be an"):
        all_local(src, dst, n, part[:-1])
    with pytest.raises(ValueError, match="rows must be an"):
        halo_rows(src, dst, n, part, rows=torch.ones(n))


def _brute_force(src, dst, part, p, kept=None):
    """``needs[r][q]`` = set of nodes of ``q`` that rank ``r`` needs, by a loop over edges."""
    needs = [[set() for _ in range(p)] for _ in range(p)]
    for u, v in zip(src.tolist(), dst.tolist()):
        if part[u] != part[v] and (kept is None or kept[v]):
            needs[int(part[v])][int(part[u])].add(u)
    return needs


def test_comm_sim_counts_match_a_brute_force_count(graph):
    cs = _load_comm_sim()
    src, dst, n = graph
    p, widths = 3, [5, 7, 11]
    part = partition_nodes(src, dst, n, p, "random", seed=3)
    in_degree = torch.bincount(dst, minlength=n)
    kept = [None] + [cs.kept_rows(part, p, 0.3, in_degree, how, 9) for how in SELECT]
    exact, sparse = _brute_force(src, dst, part, p), _brute_force(src, dst, part, p, kept[1])
    sparse3 = _brute_force(src, dst, part, p, kept[2])
    got = cs.halo_bytes(src, dst, n, part, p, widths, kept)
    for r in range(p):
        recv = sum(len(s) for s in exact[r])
        returned = sum(len(exact[q][r]) for q in range(p))  # gradients of r's rows
        rsc = (
            sum(len(sparse[q][r]) for q in range(p)) * 7
            + sum(len(sparse3[q][r]) for q in range(p)) * 11
        )
        assert got["halo_fwd_input"][r] == recv * 5 * 4
        assert got["halo_fwd_hidden"][r] == recv * 18 * 4
        assert got["halo_bwd"][r] == returned * 18 * 4
        assert got["halo_bwd_rsc"][r] == rsc * 4
        assert got["halo_rsc_cached"][r] == (recv * 18 + rsc) * 4
    assert 0 < got["halo_bwd_rsc"].sum() < got["halo_bwd"].sum()


@pytest.mark.parametrize("how", SELECT)
def test_kept_rows_per_rank(graph, how):
    cs = _load_comm_sim()
    src, dst, n = graph
    part = partition_nodes(src, dst, n, 4, "random", seed=0)
    in_degree = torch.bincount(dst, minlength=n)
    keep = cs.kept_rows(part, 4, 0.25, in_degree, how, seed=1)
    for r in range(4):
        mine = part == r
        assert int(keep[mine].sum()) == math.ceil(0.25 * int(mine.sum()))
        if how == "degree":  # nothing dropped has a higher in-degree than what is kept
            assert int(in_degree[mine & ~keep].max()) <= int(in_degree[mine & keep].min())


def test_cagnet_formulas():
    cs = _load_comm_sim()
    got = cs.cagnet_bytes(1000, 16, [128, 256, 256], c=2)
    words = 1000 * (128 + 256 + 256 + 256 + 256)
    assert got == {"cagnet_1d": words * 4, "cagnet_1.5d": words * 2, "cagnet_2d": words}
    assert "cagnet_1.5d" not in cs.cagnet_bytes(1000, 3, [8], c=2)  # c must divide P


def test_kept_fractions_from_a_number_or_json(tmp_path):
    cs = _load_comm_sim()
    assert cs._kept_fractions("0.2", 3) == [0.2, 0.2, 0.2]
    listed = tmp_path / "kept.json"
    listed.write_text("[0.3, 0.4]")  # layers 2..L
    assert cs._kept_fractions(str(listed), 3) == [1.0, 0.3, 0.4]
    stats = tmp_path / "stats.json"  # RSCController.stats()
    stats.write_text(json.dumps({"layers": [{"k": 10, "rows": 100}, {"k": 5, "rows": 100}]}))
    assert cs._kept_fractions(str(stats), 3) == [1.0, 0.1, 0.05]
    listed.write_text("[0.1]")
    with pytest.raises(ValueError, match="need 3 \\(or 2\\) fractions"):
        cs._kept_fractions(str(listed), 3)
    with pytest.raises(ValueError, match="not a number nor a readable JSON"):
        cs._kept_fractions(str(tmp_path / "missing.json"), 3)


def test_comm_sim_end_to_end_and_never_overwrites_foreign_files(tmp_path, one_thread):
    cs = _load_comm_sim()
    out = str(tmp_path / "cs.json")
    argv = [
        "--graph",
        "synthetic:400:6",
        "--parts",
        "2,4",
        "--methods",
        "metis,random",
        "--widths",
        "8,16",
        "--kept",
        "0.2",
        "--out",
        out,
    ]
    record = cs.main(argv)
    with open(out) as f:
        saved = json.load(f)
    assert saved["tool"] == cs.TOOL and saved["results"] == record["results"]
    kinds = {(r["method"], r["parts"]) for r in saved["results"]}
    assert kinds == {(m, p) for m in ("metis", "random", "cagnet") for p in (2, 4)}
    assert os.path.getsize(str(tmp_path / "cs.png")) > 1000
    cs.main(argv)  # our own files may be replaced
    (tmp_path / "cs.png").write_bytes(b"somebody's picture")
    with pytest.raises(SystemExit):
        cs.main(argv)
    assert (tmp_path / "cs.png").read_bytes() == b"somebody's picture"
    cs.main(argv + ["--force"])
    assert (tmp_path / "cs.png").read_bytes() != b"somebody's picture"


def test_comm_sim_quantized_volumes_follow_the_codec(one_thread):
    """The simulator's quantized rows cost what the codec sends per row, and the totals
    shrink with the width."""
    from dgl_rsc.distributed.quant import HEADER_BYTES, payload_bytes

    cs = _load_comm_sim()
    for width in (1, 7, 64, 256):
        for bits in (2, 4, 8, 16, 32):
            body = payload_bytes(1000, width, bits) - HEADER_BYTES
            assert 0 <= body - 1000 * cs.row_bytes(width, bits) < 16  # alignment padding
    name, src, dst, n = cs.load_graph("synthetic:400:6")
    part = torch.arange(n) % 4
    kept = [None, torch.rand(n, generator=torch.Generator().manual_seed(0)) < 0.2]
    out = cs.halo_bytes(src, dst, n, part, 4, [8, 16], kept, bits=(8, 4, 2))
    fp32 = out["halo_exact_cached"]
    rows = (out["halo_fwd_hidden"] + out["halo_bwd"]) / (16 * 4)  # one layer of width 16
    assert torch.equal(out["halo_exact_cached_q8"], rows * (4 + 16))
    for hi, lo in ((8, 4), (4, 2)):
        assert (out[f"halo_exact_cached_q{lo}"] <= out[f"halo_exact_cached_q{hi}"]).all()
        assert (out[f"halo_rsc_cached_q{lo}"] <= out[f"halo_rsc_cached_q{hi}"]).all()
    assert (out["halo_rsc_cached_q2"] < fp32).all() and (fp32 > 0).all()


def test_docstring_examples_run():
    assert doctest.testmod(halo_module).failed == 0
