"""The per-rank traffic predictor (:mod:`dgl_rsc.distributed.traffic`) against brute-force
counts of the 1D exchange and of the 1.5D scheme, and (slow) against the bytes a real
2-process run counts."""

import numpy as np
import pytest
import torch

from dgl_rsc.distributed.codecs import codec_for
from dgl_rsc.distributed.traffic import ModelShape, gradient_support, model_shape, rank_traffic
from dgl_rsc.models.paper import build_model

from .test_distributed import dgl_rsc, losses, write_config


def _graph(n=60, e=400, seed=0):
    g = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)
    train = torch.rand(n, generator=g) < 0.3
    return src, dst, n, train


def _brute(src, dst, n, part, shape, train, c, bits=32):
    """Bytes per rank by explicit loops over (block j, block i, node u) following the 1.5D
    scheme (c = 1: the 1D exchange)."""
    q = int(part.max()) + 1
    p = q * c
    sent, recv = np.zeros(p), np.zeros(p)
    support = [train.clone()]
    for _ in range(len(shape.widths) - 1):
        rows = support[-1].clone()
        for s, d in zip(src.tolist(), dst.tolist()):
            if support[-1][d]:
                rows[s] = True
        support.append(rows)
    support = support[::-1]

    def needed(j, i, mask):  # distinct nodes of block j with an edge into block i (masked)
        return len({s for s, d in zip(src.tolist(), dst.tolist())
                    if part[s] == j and part[d] == i and mask[d]})  # fmt: skip

    for width, grad, mask in zip(shape.widths, shape.grads, support):
        for j in range(q):
            for i in range(q):
                if i == j:
                    continue
                a, b = j * c + j % c, i * c + j % c  # owner replica -> handling replica
                rows = needed(j, i, torch.ones(n, dtype=torch.bool))
                nb = codec_for(bits).nbytes(rows, width) if rows else 0
                sent[a] += nb
                recv[b] += nb
                if grad:
                    rows = needed(j, i, mask)
                    nb = 4 * rows + codec_for(bits).nbytes(rows, width) if rows else 0
                    sent[b] += nb
                    recv[a] += nb
    return sent, recv


SHAPE = ModelShape(widths=(5, 3), grads=(False, True), dense_macs=0, params=10)


@pytest.mark.parametrize("parts, c", [(2, 1), (4, 1), (2, 2), (3, 2), (2, 3)])
@pytest.mark.parametrize("bits", [32, 8])
def test_halo_bytes_match_a_brute_force_count(parts, c, bits):
    src, dst, n, train = _graph()
    part = torch.arange(n) * parts // n
    pred = rank_traffic(src, dst, n, part, SHAPE, train, replication=c, bits=bits)
    sent, recv = _brute(src, dst, n, part, SHAPE, train, c, bits)
    assert len(pred) == parts * c
    got_sent = [r["forward_halo"]["sent"] + r["backward_halo"]["sent"] for r in pred]
    got_recv = [r["forward_halo"]["received"] + r["backward_halo"]["received"] for r in pred]
    np.testing.assert_allclose(got_sent, sent)
    np.testing.assert_allclose(got_recv, recv)
    if c == 1:
        assert all(r["replica_reduce"]["sent"] == r["replica_grad"]["sent"] == 0 for r in pred)
    else:  # per sum: the other replicas' chunks, and c - 1 copies of its own summed chunk
        nodes = torch.bincount(part, minlength=parts).tolist()
        for rank, r in enumerate(pred):
            n_i, k = nodes[rank // c], rank % c
            chunks = [(n_i * (m + 1)) // c - (n_i * m) // c for m in range(c)]
            per = 4.0 * (sum(chunks) - chunks[k] + (c - 1) * chunks[k])
            assert r["replica_reduce"]["sent"] == pytest.approx(per * sum(SHAPE.widths))
            assert r["replica_grad"]["received"] == pytest.approx(per * SHAPE.widths[1])
            assert r["allreduce"]["sent"] == pytest.approx(4 * 10 * 2 * (parts - 1) / parts)


def test_replication_one_is_the_1d_exchange_and_parameters_are_all_reduced():
    src, dst, n, train = _graph(seed=3)
    part = torch.arange(n) % 4
    a = rank_traffic(src, dst, n, part, SHAPE, train)
    b = rank_traffic(src, dst, n, part, SHAPE, train, replication=1)
    assert a == b
    assert all(r["allreduce"]["sent"] == pytest.approx(4 * 10 * 2 * 3 / 4) for r in a)


def test_gradient_support_grows_by_in_neighbours_towards_the_input():
    src, dst = torch.tensor([0, 1, 2]), torch.tensor([1, 2, 3])  # a path 0 -> 1 -> 2 -> 3
    train = torch.tensor([False, False, False, True])
    rows = gradient_support(src, dst, 4, train, 3)
    assert [r.nonzero().flatten().tolist() for r in rows] == [[1, 2, 3], [2, 3], [3]]


def test_model_shape_follows_the_layers_order_of_operations():
    gcn = model_shape(build_model("gcn", 128, 10, hidden=256, layers=3), 128)
    # aggregate first where the input is narrower (DGL's rule), the raw input needs no grad
    assert gcn.widths == (128, 256, 10) and gcn.grads == (False, True, True)
    small = model_shape(build_model("gcn", 1433, 7, hidden=16, layers=2), 1433)
    assert small.widths == (16, 7) and small.grads == (True, True)
    assert small.params == 1433 * 16 + 16 + 16 * 7 + 7 and small.dense_macs == 1433 * 16 + 16 * 7


@pytest.mark.slow
def test_predicted_bytes_equal_what_a_two_process_run_counts(tmp_path):
    cfg = write_config(tmp_path, train={"epochs": 3})
    out = tmp_path / "out"
    proc = dgl_rsc(cfg, "--out", str(out), "--nproc", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, runs = losses(out)
    run = next(r for r in runs if r["method"] == "exact")
    from dgl_rsc.data import load_dataset

    data = load_dataset("synthetic", num_nodes=500, avg_degree=8.0, num_classes=4, feat_dim=12,
                        seed=1)  # fmt: skip
    loops = torch.arange(500)
    src, dst = torch.cat([data.src, loops]), torch.cat([data.dst, loops])  # GCN's self-loops
    part = torch.from_numpy(np.load(run["distributed"]["partition"]["file"])["part"])
    shape = model_shape(build_model("gcn", 12, 4, hidden=16, layers=2), 12)
    pred = rank_traffic(src, dst, 500, part, shape, data.train_mask)
    for h in run["history"]:
        for r, measured in enumerate(h["dist"]["bytes"]):
            for kind in ("forward_halo", "backward_halo", "allreduce"):
                for f in ("sent", "received", "messages"):
                    assert measured[kind][f] == pred[r][kind][f], (kind, f, r)
