"""RSC's product as ``torch.library`` custom operators, for ``torch.compile`` (torch >= 2.4).

Under ``torch.compile`` the operator (:func:`dgl_rsc.core.spmm.spmm_matrix`) calls
``dgl_rsc::spmm`` instead of the ``autograd.Function``: dynamo sees one opaque node with a fake
(meta) implementation, and never traces the kernels (Numba's first-call compile included),
the structure caches or the controller. What changes from step to step enters at run time,
inside the operators, not as traced Python values, so a compiled model is not recompiled per
step:

- the matrix's structure comes in as its ``indptr``/``indices`` tensors and is looked up by
  their data pointers (the same :class:`~dgl_rsc.CSR` object, with its cached transpose and
  buffers, every step);
- the backward sampler is chosen by the forward operator when it runs: ``source`` is a
  registered controller's handle (a constant of the compiled graph) and ``slot`` its product
  index (``-1``: the controller's next product in call order), so the phase, the cached
  sample and the allocation are the controller's at that step. The forward returns a
  *ticket* (a 0-dim int64 tensor) that the autograd formula saves and the backward operator
  redeems for the same sampler.

Eager execution (torch 2.2.1, and torch >= 2.4 outside ``torch.compile``) keeps
:class:`~dgl_rsc.core.spmm.RSCSpMM`; both compute the same numbers.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from typing import Callable, NamedTuple, Optional

import torch

from ..base.tracing import HAS_OPS, compiling
from ..sparse.csr import CSR
from ..sparse.products import Scales, csr_mm, sddmm
from ..sparse.structure_cache import StructureCache
from .backward import feature_grad
from .fixed import Sampler

__all__ = [
    "HAS_OPS",
    "compiling",
    "SlotRef",
    "slot_ref",
    "handle",
    "compiled_spmm",
    "keyed_csr",
    "keyed_entry",
    "OpMatrix",
]

#: samplers of forwards whose backward has not run yet (oldest dropped beyond this)
MAX_TICKETS = 4096
#: keyed variants from this number on cache their values too (their traced indices are
#: placeholders): :mod:`dgl_rsc.pyg.compiled`
KEYED_VALUES = 100

_sources: dict[int, object] = {}  # handle -> controller (held while registered)
_handles = itertools.count(1)
_tickets: OrderedDict[int, object] = OrderedDict()
_ticket_ids = itertools.count(1)
_structures = StructureCache(capacity=16)
_keyed_cache: OrderedDict[tuple, tuple] = OrderedDict()  # key -> (key tensor, CSR, perm)


class SlotRef:
    """Product ``index`` of controller ``ctl``, bound to the step when the product runs (what
    a layer hands the operator while it is traced; eager code binds at once)."""

    __slots__ = ("ctl", "index")

    def __init__(self, ctl, index: int):
        self.ctl, self.index = ctl, index


def slot_ref(ctl, index: int):
    """``ctl.slot(index)`` in eager code; a :class:`SlotRef` while dynamo traces."""
    return SlotRef(ctl, index) if compiling() else ctl.slot(index)


def handle(ctl) -> int:
    """The operator handle of controller ``ctl`` (registered on first use, kept while the
    process holds the registration; a handful per run)."""
    h = getattr(ctl, "_rsc_op_handle", None)
    if h is None:
        h = next(_handles)
        _sources[h] = ctl
        ctl._rsc_op_handle = h
    return h


def _structure(indptr: torch.Tensor, indices: torch.Tensor, m: int, n: int,
               key: Optional[torch.Tensor] = None, tag: int = 0) -> CSR:  # fmt: skip
    """The CSR of these index tensors, the same object while they live unchanged; with a
    ``key`` tensor, the structure :func:`keyed_csr` built for it (``indptr``/``indices`` are
    then copies of that structure's, made afresh at every call)."""
    if key is not None:
        hit = _keyed_cache.get(_keyed(key, tag, m, n))  # the entry holds the key tensor
        if hit is not None:  # alive, so no other tensor has its address
            return hit[1]
        if tag >= KEYED_VALUES:  # the traced indices are placeholders: nothing to rebuild
            raise RuntimeError(
                f"dgl_rsc: the cached matrix of a compiled product (variant {tag}) is gone; "
                f"more than {_structures.capacity} graphs are in use at once."
            )
    k = ("op", indptr.data_ptr(), indices.data_ptr(), indptr._version, indices._version,
         m, n, indptr.device)  # fmt: skip
    return _structures.get_by_key(k, (indptr, indices),
                                  lambda: CSR(indptr, indices, None, (m, n)))  # fmt: skip


def _keyed(key: torch.Tensor, tag: int, m: int, n: int) -> tuple:
    return ("op-key", key.data_ptr(), key._version, tuple(key.shape), tag, m, n, key.device)


def _matrix(indptr, indices, values, m, n, key=None, tag=0) -> CSR:
    A = _structure(indptr, indices, m, n, key, tag)
    return A if values is None else A.with_values(values)


class OpMatrix(NamedTuple):
    """A sparse matrix while dynamo traces: what the custom operators take (the
    :class:`~dgl_rsc.CSR` they compute with is looked up inside them). ``key``/``tag``: the
    graph input and variant :func:`keyed_csr` cached the structure under, or ``None``."""

    indptr: torch.Tensor
    indices: torch.Tensor
    values: Optional[torch.Tensor]
    shape: tuple
    key: Optional[torch.Tensor] = None
    tag: int = 0

    @property
    def device(self) -> torch.device:
        return self.indptr.device

    @property
    def nnz(self) -> int:
        return self.indices.shape[0]

    def with_values(self, values: Optional[torch.Tensor]) -> OpMatrix:
        return self._replace(values=values)

    def row_nnz(self) -> torch.Tensor:
        return self.indptr[1:] - self.indptr[:-1]


def _scales(row, col, hint, row_divide) -> Scales:
    return Scales(row, col, bool(row_divide), hint, None)


def _sampler(source: int, slot: int, budget: float):
    if source > 0:
        ctl = _sources.get(source)
        if ctl is None:
            raise RuntimeError(
                "a compiled product names a controller that was registered while torch.compile "
                "traced; attach the controller (dgl_rsc.nn.attach, dgl_rsc.pyg.patch) before "
                "compiling, or call dgl_rsc.core.ops.handle(controller) first."
            )
        return ctl.next_layer() if slot < 0 else ctl.slot(slot)
    if budget > 0:
        return Sampler(budget)
    return None


def _issue(sampler) -> int:
    if sampler is None:
        return 0
    t = next(_ticket_ids)
    _tickets[t] = sampler
    while len(_tickets) > MAX_TICKETS:  # forwards that never ran a backward
        _tickets.popitem(last=False)
    return t


def _fresh(out: torch.Tensor) -> torch.Tensor:
    """``out`` handed to compiled code, which may write into it without bumping its version:
    a pooled buffer must not keep its mark of clean rows (:mod:`dgl_rsc.sparse.buffers`)."""
    torch.autograd.graph.increment_version(out)
    return out


if HAS_OPS:
    from torch.library import custom_op, register_autograd

    @custom_op("dgl_rsc::spmm", mutates_args=())
    def _spmm_op(indptr: torch.Tensor, indices: torch.Tensor, values: Optional[torch.Tensor],
                 X: torch.Tensor, row: Optional[torch.Tensor], col: Optional[torch.Tensor],
                 hint: Optional[torch.Tensor], m: int, n: int, row_divide: bool, source: int,
                 slot: int, budget: float, key: Optional[torch.Tensor],
                 tag: int) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        A = _matrix(indptr, indices, values, m, n, key, tag)
        Y = csr_mm(A, X, _scales(row, col, hint, row_divide))
        ticket = _issue(_sampler(source, slot, budget))
        return _fresh(Y), torch.tensor(ticket)

    @_spmm_op.register_fake
    def _(indptr, indices, values, X, row, col, hint, m, n, row_divide, source, slot, budget,
          key, tag):  # fmt: skip
        return X.new_empty((m, X.shape[1])), torch.empty((), dtype=torch.int64)

    @custom_op("dgl_rsc::spmm_dx", mutates_args=())
    def _dx_op(dY: torch.Tensor, ticket: torch.Tensor, indptr: torch.Tensor,
               indices: torch.Tensor, values: Optional[torch.Tensor],
               row: Optional[torch.Tensor], col: Optional[torch.Tensor],
               hint: Optional[torch.Tensor], m: int, n: int, row_divide: bool,
               key: Optional[torch.Tensor], tag: int) -> torch.Tensor:  # fmt: skip
        sampler = _tickets.pop(int(ticket), None)
        A = _matrix(indptr, indices, values, m, n, key, tag)
        dX = feature_grad(sampler, A, dY.contiguous(), _scales(row, col, hint, row_divide))
        return _fresh(dX)

    @_dx_op.register_fake
    def _(dY, ticket, indptr, indices, values, row, col, hint, m, n, row_divide, key, tag):
        return dY.new_empty((n, dY.shape[1]))

    @custom_op("dgl_rsc::spmm_dvalues", mutates_args=())
    def _dvalues_op(dY: torch.Tensor, X: torch.Tensor, indptr: torch.Tensor,
                    indices: torch.Tensor, values: torch.Tensor, row: Optional[torch.Tensor],
                    col: Optional[torch.Tensor], m: int, n: int,
                    row_divide: bool) -> torch.Tensor:  # fmt: skip
        A = _matrix(indptr, indices, values, m, n)
        scales = _scales(row, col, None, row_divide)
        return sddmm(A, dY.contiguous(), X, scales).to(values.dtype).clone()

    @_dvalues_op.register_fake
    def _(dY, X, indptr, indices, values, row, col, m, n, row_divide):
        return values.new_empty(values.shape)

    def _setup(ctx, inputs, output):
        indptr, indices, values, X, row, col, hint, m, n, row_divide, _, _, _, key, tag = inputs
        ctx.sizes = (m, n, row_divide, tag)
        need_dA = values is not None and ctx.needs_input_grad[2]
        ctx.save_for_backward(output[1], indptr, indices, values, X if need_dA else None,
                              row, col, hint, key)  # fmt: skip

    def _backward(ctx, dY, _dticket):
        ticket, indptr, indices, values, X, row, col, hint, key = ctx.saved_tensors
        m, n, row_divide, tag = ctx.sizes
        dvalues = dX = None
        if ctx.needs_input_grad[2]:
            dvalues = _dvalues_op(dY, X, indptr, indices, values, row, col, m, n, row_divide)
        if ctx.needs_input_grad[3]:
            dX = _dx_op(dY, ticket, indptr, indices, values, row, col, hint, m, n, row_divide,
                        key, tag)  # fmt: skip
        return (None, None, dvalues, dX) + (None,) * 11

    @custom_op("dgl_rsc::keyed_csr", mutates_args=())
    def _keyed_op(key: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, m: int, n: int,
                  tag: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        A, perm = _keyed_build(key, src, dst, m, n, tag)
        return A.indptr.clone(), A.indices.clone(), perm.clone()

    @_keyed_op.register_fake
    def _(key, src, dst, m, n, tag):
        index = torch.empty(src.shape, dtype=torch.int64, device=src.device)
        return index.new_empty((m + 1,)), index, index.new_empty(src.shape)

    register_autograd("dgl_rsc::spmm", _backward, setup_context=_setup)


def _source(rsc) -> tuple[int, int, float]:
    """``(source handle, slot, budget)`` of a resolved ``rsc`` argument while traced."""
    if rsc is None:
        return 0, -1, 0.0
    if isinstance(rsc, SlotRef):
        return handle(rsc.ctl), rsc.index, 0.0
    if hasattr(rsc, "next_layer") and hasattr(rsc, "structures"):  # a controller
        return handle(rsc), -1, 0.0
    if isinstance(rsc, (float, int)) and not isinstance(rsc, bool):
        return 0, -1, float(rsc)
    raise TypeError(
        f"under torch.compile, rsc must be None, a budget fraction, an RSCController or a "
        f"layer's slot, got {type(rsc).__name__}."
    )


def compiled_spmm(A: CSR, X: torch.Tensor, rsc, scales: Scales) -> torch.Tensor:
    """``(M, D)`` ``diag(r) A diag(c) X`` through ``dgl_rsc::spmm`` (see the module); ``rsc``
    is ``None`` where no backward for ``X`` is needed."""
    if not HAS_OPS:
        raise RuntimeError(
            f"torch.compile of dgl_rsc's products needs torch >= 2.4 (torch.library custom "
            f"operators); this is torch {torch.__version__}. Run the model eagerly."
        )
    if scales.quant is not None:
        raise NotImplementedError(
            "INT8 products (train.precision: int8) do not run under torch.compile yet; "
            "train them eagerly."
        )
    source, slot, budget = _source(rsc)
    key, tag = getattr(A, "key", None), getattr(A, "tag", 0)
    Y, _ = torch.ops.dgl_rsc.spmm(A.indptr, A.indices, A.values, X, scales.row, scales.col,
                                  scales.hint_col, A.shape[0], A.shape[1], scales.row_divide,
                                  source, slot, budget, key, tag)  # fmt: skip
    return Y


def keyed_entry(key: torch.Tensor, tag: int, m: int, n: int, build: Callable) -> tuple:
    """``(CSR, *extra)`` cached under graph input ``key`` and variant ``tag`` (built by
    ``build()`` on a miss): what a keyed operator returns copies of, and the product operator
    finds again by ``key``. Run inside custom operators only (real tensors)."""
    k = _keyed(key, tag, m, n)
    hit = _keyed_cache.get(k)
    if hit is None:
        hit = (key, *build())
        _keyed_cache[k] = hit
        while len(_keyed_cache) > _structures.capacity:
            _keyed_cache.popitem(last=False)
    return hit[1:]


def _keyed_build(key, src, dst, m, n, tag):
    """``(CSR, perm)`` of the edges ``src -> dst`` cached under ``key`` (see :func:`keyed_csr`)."""
    from ..sparse.graph import csr_by_destination

    return keyed_entry(key, tag, m, n, lambda: csr_by_destination(src, dst, n, m))


def keyed_csr(key: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, num_src: int,
              num_dst: int, tag: int, build: Callable) -> tuple:  # fmt: skip
    """``(A (num_dst, num_src), perm (E,))`` of the edges ``src[e] -> dst[e]`` (``perm``: the
    edge id of each stored entry), the structure built once per graph input ``key`` (a tensor
    that comes in unchanged at every step: PyG's ``edge_index``) and variant ``tag``.

    Eagerly ``build()`` (the caller's own cache); while dynamo traces, ``dgl_rsc::keyed_csr``
    returns copies of the cached structure and ``A`` is an :class:`OpMatrix` that names ``key``,
    so that the product operator finds the same :class:`~dgl_rsc.CSR` (and RSC's cached
    sample of it) at every step."""
    if not compiling():
        return build()
    indptr, indices, perm = torch.ops.dgl_rsc.keyed_csr(key, src.long(), dst.long(), num_dst,
                                                        num_src, tag)  # fmt: skip
    return OpMatrix(indptr, indices, None, (num_dst, num_src), key, tag), perm
