"""Bytes and messages each rank sends and receives per training epoch, predicted from a
partition and the model's shape: the 1D halo exchange of :mod:`.exchange`, and CAGNET's
sparsity-aware 1.5D products (``replication`` c > 1; ``/work/tools/SPEC-15D.md``'s scheme).

Nothing is trained: the aggregations' widths come from one forward of the model on a tiny
probe graph (:func:`model_shape`), the rows each exchange carries from the partition
(:func:`~dgl_rsc.distributed.halo.halo_rows`). Backward, a halo row travels only where its
gradient is non-zero: the last aggregation's output gradient lives on the training nodes, and
each aggregation further down adds the in-neighbours of the rows above
(:func:`gradient_support`). Message sizes are the codecs' own (:mod:`.codecs`): fp32 rows, or
the quantized payload; a backward row also carries its int32 index.

1.5D with ``P = q c`` ranks: the graph is cut into ``q`` row blocks, rank ``r = i c + k``
holds block ``i`` as replica ``k`` and handles the column blocks ``j`` with ``j % c == k``.
Forward, rank ``(j, j % c)`` sends the rows of block ``j`` that block ``i`` needs to rank
``(i, j % c)``; the partial sums are summed over the ``c`` replicas (``replica_reduce``: a
reduce-scatter and all-gather of ``c`` row chunks, ``2 (c - 1)`` messages each way, about
``2 (c - 1) / c`` of the block's values). Backward, the same rows' gradients go back to ``(j,
j % c)``, and ``dH_j`` is summed the same way in its replica group (``replica_grad``). The
parameters' gradients are all-reduced over the rank's process column (``q`` ranks). With
``c = 1`` this is the 1D exchange exactly. (The spec's implementation notes, branch
dist-15d, fix these choices.)
"""

from __future__ import annotations

import dataclasses

import torch

from ..sparse.graph import check_edges
from .codecs import codec_for
from .halo import halo_rows
from .partition import part_vector

__all__ = ["ModelShape", "model_shape", "gradient_support", "rank_traffic", "TRAFFIC_KINDS"]

#: what :func:`rank_traffic` predicts, per rank (``replica_*`` only with ``replication > 1``)
TRAFFIC_KINDS = ("forward_halo", "backward_halo", "replica_reduce", "replica_grad", "allreduce")


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What the traffic and the work of one training step depend on.

    Attributes:
        widths: dense operand width of each aggregation, in forward order.
        grads: whether each aggregation's input needs a gradient (a backward exchange).
        dense_macs: multiply-adds per node of the dense layers' forward (all 2-D weights).
        params: trainable parameters (the gradient all-reduce).
    """

    widths: tuple
    grads: tuple
    dense_macs: int
    params: int


class _Probe:
    """A 4-node graph whose aggregation returns its input and records its width."""

    is_block = False

    def __init__(self):
        self.seen, self.device, self._n = [], torch.device("cpu"), 4

    def num_nodes(self, *_):
        return self._n

    num_src_nodes = num_dst_nodes = number_of_dst_nodes = num_nodes

    def num_edges(self, *_):
        return self._n

    def in_degrees(self):
        return torch.ones(self._n)

    out_degrees = in_degrees

    def rsc_aggregate(self, feat, edge_weight, state_for, **scales):
        self.seen.append((int(feat[0].numel()), bool(feat.requires_grad)))
        return feat * 1.0


def model_shape(model: torch.nn.Module, in_feats: int) -> ModelShape:
    """The :class:`ModelShape` of ``model`` (one forward on a probe graph, in train mode;
    the model's mode is restored)."""
    probe, mode = _Probe(), model.training
    model.train()
    try:
        model(probe, torch.randn(probe._n, in_feats))
    finally:
        model.train(mode)
    weights = [p for p in model.parameters() if p.requires_grad]
    return ModelShape(widths=tuple(w for w, _ in probe.seen),
                      grads=tuple(g for _, g in probe.seen),
                      dense_macs=sum(p.numel() for p in weights if p.dim() == 2),
                      params=sum(p.numel() for p in weights))  # fmt: skip


def gradient_support(src, dst, num_nodes: int, train_mask, layers: int) -> list:
    """``(N,)`` bool masks of the rows where each aggregation's output gradient can be
    non-zero, in forward order: the training nodes for the last, and for each one below,
    the rows above and their in-neighbours (``src`` of an edge into them; residual models
    keep the rows above)."""
    src, dst, n = check_edges(src, dst, num_nodes)
    rows = torch.as_tensor(train_mask).to(torch.bool).cpu().clone()
    out = [rows]
    for _ in range(layers - 1):
        rows = rows.clone()
        rows[src[out[-1][dst]]] = True
        out.append(rows)
    return out[::-1]


def _row_bytes(rows: torch.Tensor, width: int, bits, index: bool) -> torch.Tensor:
    """Bytes of messages of ``rows`` rows each (a ``(P, P)`` table) at ``bits``."""
    codec = codec_for(32 if bits == "adaptive" else int(bits))
    per = torch.tensor([[codec.nbytes(int(x), width) if x else 0 for x in row]
                        for row in rows.tolist()], dtype=torch.float64)  # fmt: skip
    return per + (4.0 * rows.double() if index else 0.0)


def _block_moves(m: torch.Tensor, c: int, owner_sends: bool) -> torch.Tensor:
    """``(P, P)`` rows moved between ranks from the block table ``m[j, i]`` (rows of block
    ``j`` that block ``i`` needs): forward they go ``(j, j % c) -> (i, j % c)``, backward
    (``owner_sends=False``) back the other way."""
    q = m.shape[0]
    out = torch.zeros(q * c, q * c, dtype=m.dtype)
    for j in range(q):
        k = j % c
        for i in range(q):
            if i != j and m[j, i]:
                a, b = j * c + k, i * c + k
                out[(a, b) if owner_sends else (b, a)] = m[j, i]
    return out


def rank_traffic(src, dst, num_nodes: int, part, shape: ModelShape, train_mask,
                 replication: int = 1, bits=32, backward_bits=None) -> list:  # fmt: skip
    """Predicted bytes and messages of one training epoch, per rank.

    Args:
        src, dst, num_nodes: the global edge list (self-loops as the model trains with).
        part: ``(N,)`` block of each node: ``q`` blocks (``P = q * replication`` ranks).
        shape: the model's :class:`ModelShape`.
        train_mask: ``(N,)`` bool, the nodes of the loss.
        replication: ``c`` (1: the 1D exchange).
        bits, backward_bits: halo widths forward and backward (``backward_bits`` defaults
            to ``bits``; ``"adaptive"`` is counted as 32). Replica sums travel in fp32.

    Returns:
        ``P`` dicts ``{kind: {"sent", "received", "messages"}}`` over :data:`TRAFFIC_KINDS`
        (``messages``: sent plus received, as the byte counters count them; the parameters'
        all-reduce counts one).
    """
    src, dst, n = check_edges(src, dst, num_nodes)
    part, q = part_vector(part, n)
    c = int(replication)
    p = q * c
    nodes = torch.bincount(part, minlength=q).double()
    out = [{k: {"sent": 0.0, "received": 0.0, "messages": 0} for k in TRAFFIC_KINDS}
           for _ in range(p)]  # fmt: skip

    def add(kind, table, per_peer=1):  # table[a, b]: bytes from rank a to rank b
        for r in range(p):
            d = out[r][kind]
            d["sent"] += float(table[r].sum())
            d["received"] += float(table[:, r].sum())
            d["messages"] += per_peer * int((table[r] > 0).sum() + (table[:, r] > 0).sum())

    bw = bits if backward_bits is None else backward_bits
    support = gradient_support(src, dst, n, train_mask, len(shape.widths))
    fwd_rows = _block_moves(halo_rows(src, dst, n, part, q), c, True)
    for width, grad, rows in zip(shape.widths, shape.grads, support):
        add("forward_halo", _row_bytes(fwd_rows, width, bits, index=False))
        if c > 1:
            _replica(out, nodes, width, c, "replica_reduce")
        if grad:
            m = halo_rows(src, dst, n, part, q, rows=rows)
            moves = _block_moves(m, c, False)  # the index and the payload: one message
            add("backward_halo", _row_bytes(moves, width, bw, index=True))
            if c > 1:
                _replica(out, nodes, width, c, "replica_grad")
    group = q if c > 1 else p  # 1.5D: over the process column
    wire = 4.0 * shape.params * 2 * (group - 1) / group
    for r in range(p):
        if group > 1:
            out[r]["allreduce"].update(sent=wire, received=wire, messages=1)
    return out


def _replica(out: list, nodes: torch.Tensor, width: int, c: int, kind: str) -> None:
    """One sum of each block's ``(n_i, width)`` fp32 rows over its replica group: replica
    ``k`` sends the ``c - 1`` other chunks and ``c - 1`` copies of its own summed chunk
    (chunk ``m``: rows ``[n m / c, n (m + 1) / c)``), and receives as much."""
    for i, n_i in enumerate(int(x) for x in nodes.tolist()):
        for k in range(c):
            own = (n_i * (k + 1)) // c - (n_i * k) // c
            moved = 4.0 * width * (n_i - own + (c - 1) * own)
            d = out[i * c + k][kind]
            d["sent"] += moved
            d["received"] += moved
            d["messages"] += 4 * (c - 1)
