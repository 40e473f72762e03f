"""``dgl_rsc.patch``: run unmodified DGL models with RSC's backward inside a ``with`` block.

Inside the block, these DGL entry points are replaced:

- ``dgl.sparse.spmm``, ``dgl.sparse.matmul`` and ``SparseMatrix.__matmul__`` with a dense
  right operand (and the module-level ``spmm`` that ``matmul`` calls);
- the SpMM behind message passing, ``dgl.ops.spmm.gspmm_internal``, for graphs with one
  edge type (bipartite graphs and blocks included) with ``copy_u`` or ``u_mul_e`` (one
  weight per edge) messages and ``sum`` or ``mean`` reduction -- what ``dgl.nn.GraphConv``,
  ``SAGEConv`` (mean, gcn), ``GCN2Conv``, ``ChebConv``, ``GINConv`` and single-head
  ``GATConv`` use;
- ``dgl.nn.GraphConv.forward``, only to tell the product the source normalization it applies
  before aggregating (``norm="both"``/``"left"``), so that rows are scored as rows of the
  normalized matrix, as :class:`dgl_rsc.nn.GraphConv` scores them (both then train alike),
  and to reuse the aggregation of an input that needs no gradient: where DGL aggregates the
  layer's input before any weight (``in <= out``, no edge weights), the same features on the
  same graph give the same product, computed once per block by DGL's own kernel (bit for bit
  what DGL computes; :mod:`dgl_rsc.dgl.nn.input_cache` has the rules). A layer that
  transforms first (``in > out``) keeps DGL's order: reordering it would change its numerics.

A call is taken over only when the engine computes it exactly as DGL does (on the CPU: the
same numbers, bit for bit): floating features that need a gradient (fp32/fp64 on the CPU,
where DGL computes bf16 in bf16 and refuses fp16), matching dtypes and devices, a non-empty
product, a graph that may hold its in-edge CSR. Every other call -- per-feature edge
weights, multi-head attention ``(E, H, 1)`` with ``H > 1``, ``max``/``min``, empty relations,
graphs restricted to COO (``g.formats("coo")``), evaluation under ``torch.no_grad()`` --
passes through to DGL unchanged, DGL's errors included; one that trains (its operand needs a
gradient) is warned about once per reason at the user's line and counted in
``rsc.stats()["not_approximated"]``. A ``SparseMatrix`` is multiplied
through its CSR (``A.csr()``, which DGL then keeps), as DGL does once a matrix has it; DGL
multiplies a matrix held only as COO edge by edge, with atomic adds across threads, which
agrees to rounding only. Under CUDA autocast the operands are cast as DGL casts them.

While the block lasts, glibc keeps freed large blocks for reuse (``keep_freed_memory``,
:func:`dgl_rsc.base.memory.freed_memory_kept`), restored on exit.

The i-th approximated product of a training step is layer i of the controller; call
``rsc.step()`` once per optimizer step. Products under ``torch.no_grad()`` (evaluation) do
no sampling work. On exit -- normal or by an exception -- every original symbol is put back.
Patches do not nest: entering a second one while one is active raises ``RuntimeError`` (one
controller must own layer identity).

Threads: the patch replaces module attributes, so it is visible to every thread, but only
the thread that opened the block feeds its controller; products computed in any other
thread (a data loader, an evaluation thread) pass through to DGL exactly. Opening a patch is
atomic: of two threads entering at once, one gets the block and the other the
``RuntimeError`` above.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import threading
from typing import Iterator, Union

import torch

from ..base.flags import require_flag
from ..base.memory import freed_memory_kept
from ..base.user_warnings import warn_user
from ..core.config import RSCConfig, warn_never_exact
from ..core.controller import RSCController
from ..core.disabled import disabled_controller
from ..core.spmm import spmm_matrix
from . import private as dgl_private
from .interop import csr_from_graph_index, csr_from_sparse_matrix
from .nn.input_cache import InputAggregationCache

__all__ = ["patch", "is_patched", "patched_symbols"]

_MARK = "__dgl_rsc_patch__"

#: serializes the check-then-replace of opening a patch and the restore of closing one (a
#: lock, not state: which patch is active lives on the DGL modules themselves)
_ACTIVATION = threading.Lock()


def _module(name: str):
    dgl_private.require()
    return importlib.import_module(name)


def patched_symbols():
    """``[(owner, attribute name)]`` of every symbol the patch replaces."""
    sp = _module("dgl.sparse")
    sp_matmul = _module("dgl.sparse.matmul")
    return [
        (sp, "spmm"),
        (sp, "matmul"),
        (sp_matmul, "spmm"),
        (sp_matmul, "matmul"),
        (sp.SparseMatrix, "__matmul__"),
        (_module(dgl_private.GSPMM[0]), dgl_private.GSPMM[1]),
        (_graphconv_class(), "forward"),
    ]


def _graphconv_class():
    """``dgl.nn.pytorch.GraphConv``: its forward is wrapped to tell the product its source
    normalization, so that RSC scores rows of the normalized matrix (as the drop-in does)."""
    return _module("dgl.nn.pytorch.conv.graphconv").GraphConv


def is_patched() -> bool:
    """``True`` while a ``dgl_rsc.patch`` block is active."""
    return getattr(_module("dgl.sparse").spmm, _MARK, False)


#: dtypes the product engine computes exactly as DGL does, per device type (on the CPU DGL
#: computes bf16 in bf16 and refuses fp16, while the engine computes both in fp32: those
#: calls go to DGL)
_DTYPES = {
    "cpu": (torch.float32, torch.float64),
    "cuda": (torch.float16, torch.bfloat16, torch.float32, torch.float64),
}


def _wants_rsc(X) -> bool:
    """``X`` is a non-empty dense operand that needs a gradient and that the engine takes."""
    return (
        isinstance(X, torch.Tensor)
        and X.dtype in _DTYPES.get(X.device.type, ())
        and X.requires_grad
        and torch.is_grad_enabled()
        and X.dim() >= 1
        and X.numel() > 0
    )


def _trains(X) -> bool:
    """``X`` is an operand of a training product (a gradient will flow through it)."""
    return (
        isinstance(X, torch.Tensor) and X.requires_grad and torch.is_grad_enabled()
        and X.numel() > 0
    )  # fmt: skip


def _left_to_dgl(rsc: RSCController, X, what: str) -> None:
    """Count a training product the engine cannot take (``what`` it is), warning once per
    reason at the user's line."""
    if X.dtype not in _DTYPES.get(X.device.type, ()):
        reason = f"{str(X.dtype).replace('torch.', '')} features on {X.device.type}"
    else:
        reason = what
    if rsc.note_not_approximated(reason):
        warn_user(
            f"dgl_rsc.patch: a training product with {reason} is not approximated (DGL "
            "computes it exactly; RSC takes fp32/fp64 features on the CPU, fp16 to fp64 on "
            "CUDA, copy_u or u_mul_e with one weight per edge, sum or mean). "
            "rsc.stats()['not_approximated'] counts such products."
        )


def _sparse_product(A, X, rsc: RSCController):
    """RSC's ``A @ X`` for a ``SparseMatrix`` with scalar values, or ``None`` when the call
    is not one the engine computes exactly as ``dgl.sparse.spmm`` (DGL then handles it,
    errors included)."""
    if not (
        _wants_rsc(X)
        and X.dim() <= 2
        and A.val.dim() == 1
        and A.val.dtype == X.dtype
        and A.val.device == X.device
        and A.shape[1] == X.shape[0]
        and A.nnz > 0
    ):
        return None
    return spmm_matrix(csr_from_sparse_matrix(A, rsc.structures), X, rsc)


def _message_product(gidx, op, reduce_op, lhs, rhs, rsc: RSCController, score_col=None):
    """RSC's ``gspmm`` for ``copy_u``/``u_mul_e`` (one weight per edge) with ``sum`` on one
    edge type, or ``None`` for any other call (DGL then handles it). ``score_col (N_src,)``:
    the column normalization already applied to ``lhs`` (RSC scores rows of the normalized
    matrix, as the drop-in layers do)."""
    etypes, num_edges = dgl_private.index_counts(gidx)
    if reduce_op != "sum" or op not in ("copy_lhs", "mul") or etypes != 1:
        return None
    if not _wants_rsc(lhs) or num_edges == 0 or not dgl_private.has_in_csr(gidx):
        return None
    if op == "mul" and not (
        isinstance(rhs, torch.Tensor)
        and rhs.dtype == lhs.dtype
        and rhs.device == lhs.device
        and rhs.dim() <= lhs.dim()
        and rhs.shape[0] == num_edges
        and rhs.numel() == num_edges
    ):
        return None
    A, eids = csr_from_graph_index(gidx, rsc.structures)
    if lhs.shape[0] != A.shape[1] or lhs.device != A.device:
        return None
    if op == "mul":
        w = rhs.reshape(num_edges)
        A = A.with_values(w if eids is None else w[eids.long()])
    tail = tuple(lhs.shape[1:])
    if score_col is not None and (score_col.numel() != A.shape[1] or
                                  score_col.device != lhs.device):  # fmt: skip
        score_col = None
    out = spmm_matrix(A, lhs.reshape(lhs.shape[0], math.prod(tail)), rsc,
                      score_col_scale=score_col)  # fmt: skip
    return out.reshape((A.shape[0],) + tail)


def _message_reason(gidx, op, reduce_op, lhs, rhs) -> str:
    """Why :func:`_message_product` left a training ``gspmm`` to DGL (for the warning)."""
    if reduce_op != "sum":
        return f"reduce {reduce_op!r}"
    if op not in ("copy_lhs", "mul"):
        return f"message op {op!r}"
    etypes, num_edges = dgl_private.index_counts(gidx)
    if etypes != 1:
        return "several edge types"
    if not dgl_private.has_in_csr(gidx):
        return "a graph restricted to COO formats"
    if op == "mul" and isinstance(rhs, torch.Tensor) and rhs.numel() != num_edges:
        return "per-feature or multi-head edge weights"
    return "operands of mixed dtypes or devices"


def _graphconv_col(conv, graph, feat):
    """``(N_src,)`` the source normalization stock ``GraphConv`` ``conv`` applies before its
    aggregation (``norm`` ``"both"``: ``d_out^-1/2``; ``"left"``: ``1/d_out``), or ``None``."""
    norm = dgl_private.graphconv_norm(conv)
    if norm not in ("left", "both"):
        return None
    src = feat[0] if isinstance(feat, tuple) else feat
    if not isinstance(src, torch.Tensor) or not src.is_floating_point():
        return None
    degs = graph.out_degrees().to(src).clamp(min=1)
    return torch.pow(degs, -0.5) if norm == "both" else 1.0 / degs


def _make_wrappers(rsc: RSCController, originals: dict, owner_thread: int):
    """The replacement functions; calls from threads other than ``owner_thread`` go to DGL."""
    sp_mod = _module("dgl.sparse.matmul")
    orig_spmm = originals[(sp_mod, "spmm")]
    orig_matmul = originals[(sp_mod, "matmul")]
    orig_gspmm = originals[(_module(dgl_private.GSPMM[0]), dgl_private.GSPMM[1])]
    orig_graphconv = originals[(_graphconv_class(), "forward")]
    SparseMatrix = _module("dgl.sparse").SparseMatrix

    def owned() -> bool:
        return threading.get_ident() == owner_thread

    def spmm(A, X):
        out = _sparse_product(A, X, rsc) if owned() and isinstance(A, SparseMatrix) else None
        if out is None and owned() and _trains(X) and getattr(A, "nnz", 0) > 0:
            _left_to_dgl(rsc, X, "a SparseMatrix product the engine does not take")
        return orig_spmm(A, X) if out is None else out

    def matmul(A, B):
        if isinstance(A, SparseMatrix) and isinstance(B, torch.Tensor):
            return spmm(A, B)
        return orig_matmul(A, B)

    def gspmm_internal(gidx, op, reduce_op, lhs_data, rhs_data):
        if not owned():
            return orig_gspmm(gidx, op, reduce_op, lhs_data, rhs_data)
        col = hint.pop("col", None)  # one aggregation per GraphConv forward
        reuse = hint.pop("input", None)
        if (
            reuse is not None
            and op == "copy_lhs"
            and reduce_op == "sum"
            and not (
                _trains(lhs_data) or torch.is_autocast_enabled() or not dgl_private.has_in_csr(gidx)
            )
        ):
            cache, feat = reuse
            A, _ = csr_from_graph_index(gidx, rsc.structures)

            def build():
                return orig_gspmm(gidx, op, reduce_op, lhs_data, rhs_data)

            out = cache.get(feat, (A.indptr, A.indices), build, rsc.note_cached_input)
            if out is not None:
                return out
        if torch.is_autocast_enabled():  # DGL computes in the autocast dtype: so do we
            args, autocast_off = dgl_private.autocast_operands(lhs_data, rhs_data)
            with autocast_off():
                out = _message_product(gidx, op, reduce_op, *args, rsc, col)
        else:
            out = _message_product(gidx, op, reduce_op, lhs_data, rhs_data, rsc, col)
        if out is None and _trains(lhs_data) and dgl_private.index_counts(gidx)[1] > 0:
            _left_to_dgl(rsc, lhs_data, _message_reason(gidx, op, reduce_op, lhs_data, rhs_data))
        return orig_gspmm(gidx, op, reduce_op, lhs_data, rhs_data) if out is None else out

    hint: dict = {}  # the source normalization of the GraphConv forward in progress
    inputs: dict = {}  # id(conv) -> (conv, its InputAggregationCache) while the block lasts

    def graphconv_forward(self, graph, feat, weight=None, edge_weight=None):
        if owned() and not hint:
            col = _graphconv_col(self, graph, feat)
            if col is not None:
                hint["col"] = col
            if (isinstance(feat, torch.Tensor) and edge_weight is None
                    and not getattr(graph, "is_block", False)
                    and dgl_private.graphconv_aggregates_input(self, weight)):  # fmt: skip
                entry = inputs.get(id(self))
                if entry is None or entry[0] is not self:
                    entry = inputs[id(self)] = (self, InputAggregationCache())
                hint["input"] = (entry[1], feat)
        try:
            return orig_graphconv(self, graph, feat, weight=weight, edge_weight=edge_weight)
        finally:
            hint.clear()

    for f in (spmm, matmul, gspmm_internal, graphconv_forward):
        setattr(f, _MARK, True)
    return spmm, matmul, gspmm_internal, graphconv_forward


@contextlib.contextmanager
def patch(
    config: Union[None, RSCConfig, RSCController] = None,
    *,
    enabled: bool = True,
    keep_freed_memory: bool = True,
    **overrides,
) -> Iterator[RSCController]:
    """Replace DGL's sparse products by RSC's for the duration of the block.

    Args:
        config: an :class:`RSCConfig`, an existing :class:`RSCController`, or ``None``.
        enabled: ``False`` makes the block a no-op (DGL runs stock; the yielded controller's
            ``step()`` does nothing, its ``stats()`` says ``enabled: False``).
        keep_freed_memory: glibc keeps freed large blocks for reuse while the block lasts
            (:func:`dgl_rsc.base.memory.freed_memory_kept`: no page faults for each step's
            fresh tensors; restored on exit; left alone where the process or its user set
            the allocator). The numbers are unchanged; the block's process keeps its peak
            memory mapped until the block ends.
        **overrides: :class:`RSCConfig` fields (``budget=0.1``, ``total_steps=...``).

    Yields:
        The :class:`RSCController`; call its ``step()`` once per optimizer step and read
        ``stats()`` for what RSC did.

    Raises:
        TypeError: ``enabled`` or ``keep_freed_memory`` is not ``True`` or ``False``.

    Example (needs DGL)::

        with dgl_rsc.patch(budget=0.1, total_steps=200) as rsc:
            for epoch in range(200):
                loss = F.cross_entropy(model(g, x)[train], y[train])
                opt.zero_grad(); loss.backward(); opt.step(); rsc.step()
    """
    dgl_private.require()
    enabled = require_flag(enabled, "dgl_rsc.patch(enabled=...)")
    keep_freed_memory = require_flag(keep_freed_memory, "dgl_rsc.patch(keep_freed_memory=...)")
    if not enabled:
        yield disabled_controller(config, **overrides)
        return
    rsc = RSCController.coerce(config, **overrides)
    warn_never_exact(rsc.config, "dgl_rsc.patch()")
    symbols = patched_symbols()
    with _ACTIVATION:
        if is_patched():
            raise RuntimeError(
                "a dgl_rsc.patch block is already active; patches do not nest (one "
                "controller owns the layer order). Reuse the active controller instead of "
                "opening another."
            )
        originals = {(owner, name): owner.__dict__[name] for owner, name in symbols}
        spmm, matmul, gspmm_internal, graphconv_forward = _make_wrappers(
            rsc, originals, threading.get_ident()
        )
        replacement = {
            "spmm": spmm,
            "matmul": matmul,
            "__matmul__": matmul,
            "gspmm_internal": gspmm_internal,
            "forward": graphconv_forward,
        }
        for owner, name in symbols:
            setattr(owner, name, replacement[name])
    try:
        with freed_memory_kept(keep_freed_memory):
            yield rsc
    finally:
        with _ACTIVATION:
            for (owner, name), original in originals.items():
                setattr(owner, name, original)
