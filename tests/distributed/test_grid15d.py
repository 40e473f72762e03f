"""CAGNET's 1.5D in one process: the process grid, the per-rank plans (every edge on one rank,
messages inside a process column, the partial products adding up to the whole product), the
byte formulas, and the settings refused before any worker starts. The multi-process runs are
in test_block15d.py (``make test-dist``)."""

import pytest
import torch

from dgl_rsc.core.config import ConfigError
from dgl_rsc.distributed.grid import ProcessGrid, grid_problem, valid_replications
from dgl_rsc.distributed.halo import all_local
from dgl_rsc.distributed.partition import partition_nodes
from dgl_rsc.distributed.plan15d import block_plans, planned_bytes, rank_plan, replica_bytes

from .test_distributed import dgl_rsc, write_config


def test_the_grid_lays_ranks_out_by_block_and_replica():
    g = ProcessGrid(8, 2)
    assert g.blocks == 4
    assert [(g.block_of(r), g.replica_of(r)) for r in range(8)] == [
        (i, k) for i in range(4) for k in range(2)
    ]
    assert all(g.rank_of(g.block_of(r), g.replica_of(r)) == r for r in range(8))
    assert g.replica_group(2) == [4, 5] and g.column(1) == [1, 3, 5, 7]
    assert g.column_blocks(0) == [0, 2] and g.column_blocks(1) == [1, 3]
    assert [g.handler(j) for j in range(4)] == [0, 1, 0, 1]
    one = ProcessGrid(3)
    assert one.blocks == 3 and one.column(0) == [0, 1, 2] and one.replica_group(1) == [1]


def test_replications_a_run_cannot_take_are_named():
    assert valid_replications(16) == [1, 2, 4] and valid_replications(6) == [1, 2]
    assert grid_problem(8, 2) == "" and grid_problem(9, 3) == ""
    assert "does not divide the 6 processes; use one of 1, 2" in grid_problem(6, 4)
    assert "c * c <= P" in grid_problem(2, 2)
    with pytest.raises(ValueError, match="replication=3 does not divide the 4 processes"):
        ProcessGrid(4, 3)


def _graph(n=300, e=2400, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g), n


def _dense(rows, cols, shape):
    out = torch.zeros(shape)
    out.index_put_((rows, cols), torch.ones(rows.numel()), accumulate=True)
    return out


@pytest.mark.parametrize("world, c", [(4, 2), (9, 3), (8, 2), (4, 1)])
def test_the_ranks_partial_products_add_up_to_the_whole_product(world, c):
    """Forward: each block's replicas' partial sums add up to ``A X``; backward: the ranks'
    ``A_local^T dY`` scattered to their columns add up to ``A^T dY``. Every edge is on one
    rank, and every message stays inside a process column and lands where its receiver
    expects it."""
    src, dst, n = _graph()
    grid = ProcessGrid(world, c)
    part = partition_nodes(src, dst, n, grid.blocks, "metis", 0)
    plans = block_plans(src, dst, n, part, grid)
    gen = torch.Generator().manual_seed(1)
    x, dy = torch.randn(n, 3, generator=gen), torch.randn(n, 3, generator=gen)
    A = _dense(dst, src, (n, n))
    y, dx = torch.zeros(n, 3), torch.zeros(n, 3)
    kept = torch.cat([p.edge_ids for p in plans])
    assert torch.equal(kept.sort().values, torch.arange(src.numel()))
    for r, p in enumerate(plans):
        assert p.rank == r and p.num_parts == world
        assert torch.equal(p.owned, plans[grid.rank_of(grid.block_of(r), 0)].owned)
        cols = torch.cat([p.owned, p.halo])
        local = _dense(p.local_dst, p.local_src, (p.n_own, p.n_local))
        y[p.owned] += local @ x[cols]
        dx.index_add_(0, cols, local.t() @ dy[p.owned])
        central = p.local_src[: p.n_central_edges]
        assert bool((central < p.n_own).all())  # central rows read no halo
        for s, q in enumerate(plans):
            lo, hi = q.halo_offsets[r], q.halo_offsets[r + 1]
            assert torch.equal(p.owned[p.send_idx[s]], q.halo[lo:hi])
            if p.send_idx[s].numel():
                assert grid.replica_of(s) == grid.replica_of(r) == grid.handler(grid.block_of(r))
    torch.testing.assert_close(y, A @ x)
    torch.testing.assert_close(dx, A.t() @ dy)


def test_replication_one_is_the_1d_plan():
    src, dst, n = _graph()
    part = partition_nodes(src, dst, n, 4, "metis", 0)
    for a, b in zip(all_local(src, dst, n, part, 4), block_plans(src, dst, n, part,
                                                                   ProcessGrid(4))):  # fmt: skip
        for f in ("owned", "halo", "halo_offsets", "local_src", "local_dst", "edge_ids",
                  "in_degree", "out_degree"):  # fmt: skip
            assert torch.equal(getattr(a, f), getattr(b, f)), f
        assert all(torch.equal(s, t) for s, t in zip(a.send_idx, b.send_idx))
        assert a.n_central == b.n_central
    p = rank_plan(src, dst, n, part, ProcessGrid(4), 2)
    assert torch.equal(p.local_src, block_plans(src, dst, n, part, ProcessGrid(4))[2].local_src)


def test_replica_bytes_are_a_ring_all_reduces_volume():
    for world, c in ((4, 2), (9, 3), (16, 4)):
        grid = ProcessGrid(world, c)
        for rows, width in ((10, 3), (1001, 16), (2, 5)):
            per = [replica_bytes(rows, width, grid, k) for k in range(c)]
            assert sum(s for s, _ in per) == sum(r for _, r in per)  # sent = received
            ring = 2 * (c - 1) / c * rows * width * 4
            assert max(s for s, _ in per) <= ring + 2 * 4 * width * (c - 1)
            assert sum(s for s, _ in per) == 2 * (c - 1) * rows * width * 4
    assert replica_bytes(10, 3, ProcessGrid(4, 1), 0) == (0, 0)


def test_planned_bytes_of_a_1d_plan_are_the_halo_rows():
    src, dst, n = _graph()
    part = partition_nodes(src, dst, n, 4, "metis", 0)
    plans = block_plans(src, dst, n, part, ProcessGrid(4))
    for p in plans:
        b = planned_bytes(p, ProcessGrid(4), 16)
        assert b["forward_halo"] == (64 * sum(p.send_counts), 64 * p.n_halo)
        assert b["backward_halo"] == (68 * p.n_halo, 68 * sum(p.send_counts))
        assert b["replica_reduce"] == b["replica_grad"] == (0, 0)
    sent = [planned_bytes(p, ProcessGrid(4, 2), 16)["forward_halo"] for p in
            block_plans(src, dst, n, partition_nodes(src, dst, n, 2, "metis", 0),
                        ProcessGrid(4, 2))]  # fmt: skip
    assert sum(s for s, _ in sent) == sum(r for _, r in sent) > 0


def _dist(**sec):
    from dgl_rsc.launcher.schema import resolve

    raw = {"dataset": {"name": "synthetic"}, "model": {"name": "gcn"},
           "distributed": {"partitions": 4, **sec}}  # fmt: skip
    return resolve(raw).distributed


def test_1_5d_settings_are_validated():
    d = _dist(algorithm="1.5d", replication=2, replica_bits=8)
    assert (d.algorithm, d.replication, d.replica_bits) == ("1.5d", 2, 8)
    assert _dist().algorithm == "1d" and _dist().replication == 1
    cases = {
        "does not divide the 4 processes; use one of 1, 2": dict(algorithm="1.5d",
                                                                   replication=3),
        "c \\* c <= P": dict(algorithm="1.5d", replication=4),
        "replication=2 needs distributed.algorithm: 1.5d": dict(replication=2),
        "cannot use distributed.method=metis-dgl": dict(algorithm="1.5d", method="metis-dgl"),
        "replica_bits='adaptive' is not one of 32, 16, 8, 4, 2": dict(
            algorithm="1.5d", replica_bits="adaptive"),
        "replica_bits sets the width of 1.5D's replica messages": dict(replica_bits=8),
        "Did you mean '1.5d'": dict(algorithm="1.5D"),
    }  # fmt: skip
    for words, sec in cases.items():
        with pytest.raises(ConfigError, match=words):
            _dist(**sec)


def test_a_replication_that_does_not_divide_nproc_stops_before_any_worker(tmp_path):
    cfg = write_config(tmp_path)
    proc = dgl_rsc(cfg, "--out", str(tmp_path / "o"), "--nproc", "4", "--set",
                   "distributed.algorithm=1.5d", "--set", "distributed.replication=3")  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "distributed.replication=3 does not divide the 4 processes" in proc.stderr
    assert "starting 4 workers" not in proc.stdout and "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()


def test_a_replica_looks_to_a_layer_like_its_whole_block():
    """A layer sees the block's rows with their full in-degrees, out-degrees and edge count
    (SAGE clamps its mean's degrees by ``num_edges()``), though the rank holds a part of
    their edges."""
    import datetime

    from dgl_rsc.distributed.block15d import BlockGraph
    from dgl_rsc.distributed.runtime import DistContext

    src, dst, n = _graph()
    grid = ProcessGrid(4, 2)
    part = partition_nodes(src, dst, n, 2, "metis", 0)
    for r, plan in enumerate(block_plans(src, dst, n, part, grid)):
        ctx = DistContext(r, 4, torch.device("cpu"), datetime.timedelta(seconds=5))
        graph = BlockGraph(plan, ctx, grid)
        rows = plan.owned
        assert graph.num_nodes() == rows.numel()
        assert torch.equal(graph.in_degrees(), torch.bincount(dst, minlength=n)[rows])
        assert torch.equal(graph.out_degrees(), torch.bincount(src, minlength=n)[rows])
        assert graph.num_edges() == int(torch.isin(dst, rows).sum()) > plan.local_src.numel()
        assert f"replica={r % 2}/2" in repr(graph)
