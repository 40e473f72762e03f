"""``dgl_rsc.patch``: run unmodified DGL models with RSC's backward inside a ``with`` block.

Inside the block, these DGL entry points are replaced:

- ``dgl.sparse.spmm``, ``dgl.sparse.matmul`` and ``SparseMatrix.__matmul__`` with a dense
  right operand (and the module-level ``spmm`` that ``matmul`` calls);
- the SpMM behind message passing, ``dgl.ops.spmm.gspmm_internal``, for homogeneous graphs
  with ``copy_u`` or ``u_mul_e`` (scalar edge weight) messages and ``sum`` or ``mean``
  reduction -- what ``dgl.nn.GraphConv``, ``SAGEConv`` (mean, gcn) and ``GCN2Conv`` use.

Every other call passes through to DGL unchanged. The i-th approximated product of a
training step is layer i of the controller; call ``rsc.step()`` once per optimizer step.
Products under ``torch.no_grad()`` (evaluation) do no sampling work. On exit -- normal or by
an exception -- every original symbol is put back. Patches do not nest: entering a second
one while one is active raises ``RuntimeError`` (one controller must own layer identity).
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Iterator, Union

import torch

from . import _deps
from .config import RSCConfig
from .controller import RSCController
from .dgl_interop import csr_from_graph_index, csr_from_sparse_matrix
from .spmm import spmm_matrix

__all__ = ["patch", "is_patched", "patched_symbols"]

_MARK = "__dgl_rsc_patch__"


def _module(name: str):
    _deps.require_dgl()
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
        (_module("dgl.ops.spmm"), "gspmm_internal"),
    ]


def is_patched() -> bool:
    """``True`` while a ``dgl_rsc.patch`` block is active."""
    return getattr(_module("dgl.sparse").spmm, _MARK, False)


def _wants_rsc(X) -> bool:
    return (
        isinstance(X, torch.Tensor)
        and X.is_floating_point()
        and X.requires_grad
        and torch.is_grad_enabled()
        and X.dim() >= 1
    )


def _make_wrappers(rsc: RSCController, originals: dict):
    sp_mod = _module("dgl.sparse.matmul")
    orig_spmm = originals[(sp_mod, "spmm")]
    orig_matmul = originals[(sp_mod, "matmul")]
    orig_gspmm = originals[(_module("dgl.ops.spmm"), "gspmm_internal")]
    SparseMatrix = _module("dgl.sparse").SparseMatrix

    def spmm(A, X):
        if isinstance(A, SparseMatrix) and A.val.dim() == 1 and _wants_rsc(X) and X.dim() <= 2:
            return spmm_matrix(csr_from_sparse_matrix(A, rsc.structures), X, rsc)
        return orig_spmm(A, X)

    def matmul(A, B):
        if isinstance(A, SparseMatrix) and isinstance(B, torch.Tensor):
            return spmm(A, B)
        return orig_matmul(A, B)

    def gspmm_internal(gidx, op, reduce_op, lhs_data, rhs_data):
        if (
            reduce_op == "sum"
            and gidx.number_of_etypes() == 1
            and _wants_rsc(lhs_data)
            and (op == "copy_lhs" or (op == "mul" and _scalar_edge(rhs_data, gidx)))
        ):
            base, eids = csr_from_graph_index(gidx, rsc.structures)
            A = base
            if op == "mul":
                w = rhs_data.reshape(-1)
                A = base.with_values(w if eids is None else w[eids.long()])
            flat = lhs_data.reshape(lhs_data.shape[0], -1)
            out = spmm_matrix(A, flat, rsc)
            return out.reshape((A.shape[0],) + tuple(lhs_data.shape[1:]))
        return orig_gspmm(gidx, op, reduce_op, lhs_data, rhs_data)

    for f in (spmm, matmul, gspmm_internal):
        setattr(f, _MARK, True)
    return spmm, matmul, gspmm_internal


def _scalar_edge(rhs, gidx) -> bool:
    return (
        isinstance(rhs, torch.Tensor)
        and rhs.is_floating_point()
        and rhs.numel() == gidx.num_edges(0)
    )


@contextlib.contextmanager
def patch(
    config: Union[None, RSCConfig, RSCController] = None, **overrides
) -> Iterator[RSCController]:
    """Replace DGL's sparse products by RSC's for the duration of the block.

    Args:
        config: an :class:`RSCConfig`, an existing :class:`RSCController`, or ``None``.
        **overrides: :class:`RSCConfig` fields (``budget=0.1``, ``total_steps=...``).

    Yields:
        The :class:`RSCController`; call its ``step()`` once per optimizer step and read
        ``stats()`` for what RSC did.

    Example (needs DGL)::

        with dgl_rsc.patch(budget=0.1, total_steps=200) as rsc:
            for epoch in range(200):
                loss = F.cross_entropy(model(g, x)[train], y[train])
                opt.zero_grad(); loss.backward(); opt.step(); rsc.step()
    """
    _deps.require_dgl()
    if is_patched():
        raise RuntimeError(
            "a dgl_rsc.patch block is already active; patches do not nest (one controller "
            "owns the layer order). Reuse the active controller instead of opening another."
        )
    if isinstance(config, RSCController):
        if overrides:
            raise TypeError("pass either an RSCController or RSCConfig fields, not both.")
        rsc = config
    else:
        rsc = RSCController(config, **overrides)
    symbols = patched_symbols()
    originals = {(owner, name): owner.__dict__[name] for owner, name in symbols}
    spmm, matmul, gspmm_internal = _make_wrappers(rsc, originals)
    replacement = {
        "spmm": spmm,
        "matmul": matmul,
        "__matmul__": matmul,
        "gspmm_internal": gspmm_internal,
    }
    try:
        for owner, name in symbols:
            setattr(owner, name, replacement[name])
        yield rsc
    finally:
        for (owner, name), original in originals.items():
            setattr(owner, name, original)
