"""``LocalGraph``: one rank's part of the graph, which the drop-in layers and the models take
unchanged; its aggregation exchanges the halo.

To a layer it looks like a ``DGLGraph`` of the owned nodes: ``num_nodes()``,
``in_degrees()`` (all in-edges of an owned node are local) and ``out_degrees()`` (the
*global* out-degrees, as a GCN normalization needs). Its ``rsc_aggregate`` (called by
:meth:`dgl_rsc.nn.RSCLayer._aggregate`) computes ``Y_own = diag(r) A_local X_local`` with
``A_local (n_own, n_own + n_halo)``:

- forward: the boundary rows go out (:class:`~dgl_rsc.distributed.exchange.HaloExchange`),
  the central rows (no remote in-neighbour) are aggregated while they travel, then the
  marginal rows with the halo;
- backward: the product's gradient for all local columns (exact, or RSC's sampled product
  with the rank's layer state), then the halo columns' part is sent back to the owners and
  what the others send is added to the owned rows.

A column scale (GCN's source normalization) is applied to the owned rows before they are
sent; the halo's scale values travel once per aggregation as one extra column when RSC needs
them to score rows of the normalized matrix.
"""

from __future__ import annotations

import functools
import time
from typing import Optional

import torch

from ..core.backward import feature_grad
from ..sparse.csr import CSR
from ..sparse.products import Scales, csr_mm, csr_t_mm
from .exchange import HaloExchange
from .halo import LocalPartition
from .runtime import DistContext

__all__ = ["LocalGraph", "HaloSpMM", "halo_reach"]


def _row_block(A: CSR, r0: int, r1: int, ncols: int) -> CSR:
    """Rows ``[r0, r1)`` of ``A`` as a CSR with ``ncols`` columns (no copy of the indices)."""
    lo, hi = int(A.indptr[r0]), int(A.indptr[r1])
    return CSR(A.indptr[r0 : r1 + 1] - lo, A.indices[lo:hi], None, (r1 - r0, ncols), check=False)


class LocalGraph:
    """The local graph of rank ``part.rank`` (see the module docstring).

    Args:
        part: the rank's :class:`~dgl_rsc.distributed.halo.LocalPartition`.
        ctx: the :class:`~dgl_rsc.distributed.runtime.DistContext`.
        exchange: a :class:`HaloExchange` (default: one with the raw 32-bit codec).
        overlap: aggregate the central rows while the halo is in flight.
    """

    is_block = False

    def __init__(self, part: LocalPartition, ctx: DistContext,
                 exchange: Optional[HaloExchange] = None, overlap: bool = True):  # fmt: skip
        self.part, self.ctx, self.overlap = part, ctx, overlap
        self.exchange = exchange or HaloExchange(part, ctx)
        dev = ctx.device
        n_own, n_local = part.n_own, part.n_local
        # local edges are sorted by (row, column): CSR by destination in that order
        counts = torch.bincount(part.local_dst, minlength=n_own)
        indptr = torch.zeros(n_own + 1, dtype=torch.long)
        torch.cumsum(counts, 0, out=indptr[1:])
        self.adj = CSR(indptr.to(dev), part.local_src.to(dev), None, (n_own, n_local))
        nc = part.n_central
        self.central = _row_block(self.adj, 0, nc, part.n_own)
        self.marginal = _row_block(self.adj, nc, n_own, n_local)
        self._in = part.in_degree.to(dev)
        self._out = part.out_degree.to(dev)

    # -- what layers ask of a graph -------------------------------------------------------------
    def num_nodes(self) -> int:
        return self.part.n_own

    num_src_nodes = num_dst_nodes = number_of_dst_nodes = num_nodes

    def num_edges(self) -> int:
        return int(self.part.local_src.numel())

    @property
    def device(self) -> torch.device:
        return self.ctx.device

    def in_degrees(self) -> torch.Tensor:
        """``(n_own,)`` in-degrees of the owned nodes."""
        return self._in

    def out_degrees(self) -> torch.Tensor:
        """``(n_own,)`` global out-degrees of the owned nodes."""
        return self._out

    def __repr__(self) -> str:
        p = self.part
        return (f"LocalGraph(rank={p.rank}/{p.num_parts}, owned={p.n_own} "
                f"({p.n_central} central), halo={p.n_halo}, edges={self.num_edges()})")  # fmt: skip

    # -- the aggregation ------------------------------------------------------------------------
    def rsc_aggregate(self, feat, edge_weight, state_for, row_scale=None, row_divide=False,
                      col_scale=None, score_col_scale=None):  # fmt: skip
        """``(n_own, *F)`` aggregation of ``feat (n_own, *F)`` over the local graph.

        ``state_for(A)`` gives the RSC slot of this product (or ``None``: exact backward).
        """
        if edge_weight is not None:
            raise NotImplementedError(
                "edge weights on a distributed LocalGraph are not supported yet; train "
                "without edge_weight or on one process."
            )
        flat = feat.reshape(feat.shape[0], -1)
        kind = "forward_halo" if torch.is_grad_enabled() else "eval_halo"
        hint = score_col_scale if col_scale is None else col_scale
        if col_scale is not None:
            flat = flat * col_scale.to(flat.dtype).unsqueeze(1)
        state = state_for(self.adj)
        hint_local = None
        if state is not None and hint is not None:
            col = hint.detach().to(flat.dtype).unsqueeze(1)
            halo_col = self.exchange.exchange_once(col, "control")  # 32-bit, not a halo slot
            hint_local = torch.cat([col, halo_col]).squeeze(1)
        row = None if row_scale is None else row_scale.detach()
        out = HaloSpMM.apply(flat, self, state, row, bool(row_divide and row is not None),
                             hint_local, kind)  # fmt: skip
        return out.reshape((out.shape[0],) + tuple(feat.shape[1:]))

    def halo_backward(self, g_halo: torch.Tensor, g_own: torch.Tensor, state, ticket=None,
                      reach=None) -> None:  # fmt: skip
        """The backward halo message of one product, 1D and 1.5D alike: the halo rows'
        gradient ``g_halo (n_halo, D)`` (rows ``halo_offsets[q]:halo_offsets[q + 1]`` belong
        to rank ``q``) goes to the owners, and what the others send is added to ``g_own
        (n_own, D)`` in place. ``state``: the product's RSC slot (or ``None``). The seam
        where what travels backward is chosen (a halo sample under a byte budget). ``ticket``:
        the forward's sample record, ``reach``: the rows the exact product reaches (see
        :meth:`~.budget_exchange.BudgetedExchange.backward`)."""
        self.exchange.backward(g_halo, g_own, ticket, reach=reach)


class HaloSpMM(torch.autograd.Function):
    """``Y_own = diag(r) A_local [X_own; X_halo]`` with the halo exchanged (see
    :mod:`dgl_rsc.distributed.local_graph`); the backward returns ``dX_own`` with the other
    ranks' contributions added."""

    @staticmethod
    def forward(ctx, x_own, graph: LocalGraph, state, row, row_divide, hint_local, kind):
        ex = graph.exchange
        nc = graph.part.n_central
        rows_c = None if row is None else row[:nc]
        rows_m = None if row is None else row[nc:]
        handle = ex.start_forward(x_own, kind)
        if not graph.overlap:
            halo = ex.finish_forward(handle)
        t0 = time.perf_counter()
        y_c = csr_mm(graph.central, x_own, Scales(rows_c, None, row_divide))
        ex.timings["forward_central"] += time.perf_counter() - t0
        if graph.overlap:
            halo = ex.finish_forward(handle)
        ctx.ticket = ex.forward_sample(handle)  # what the backward sends follows the forward
        t0 = time.perf_counter()
        x_local = torch.cat([x_own, halo])
        y_m = csr_mm(graph.marginal, x_local, Scales(rows_m, None, row_divide))
        ex.timings["forward_marginal"] += time.perf_counter() - t0
        ctx.graph, ctx.state, ctx.row_divide = graph, state, row_divide
        ctx.save_for_backward(row, hint_local)
        return torch.cat([y_c, y_m])

    @staticmethod
    def backward(ctx, dY):
        row, hint_local = ctx.saved_tensors
        graph = ctx.graph
        scales = Scales(row, None, ctx.row_divide, hint_local)
        A = graph.adj
        dx_local = feature_grad(ctx.state, A, dY, scales)  # the operator's one backward
        n_own = graph.part.n_own
        g_own = dx_local[:n_own].clone()
        reach = functools.partial(halo_reach, graph, dY)  # asked for by a byte budget only
        graph.halo_backward(dx_local[n_own:], g_own, ctx.state, ctx.ticket, reach)
        return g_own, None, None, None, None, None, None


def halo_reach(graph: LocalGraph, dY: torch.Tensor) -> torch.Tensor:
    """``(n_halo,)`` bool: the halo columns to which the *exact* backward product gives a
    non-zero row (an in-edge from a row whose gradient ``dY (n_own, D)`` is not all zero),
    which the exact exchange sends back: the reference of a byte budget. One product of
    the marginal rows with a column vector."""
    nc, n_own = graph.part.n_central, graph.part.n_own
    hit = (dY[nc:] != 0).any(dim=1, keepdim=True).to(torch.float32)
    return csr_t_mm(graph.marginal, hit)[n_own:, 0] > 0
