"""The forward passes of PyG's ``GCNConv``, ``SAGEConv`` (mean) and ``GCN2Conv`` on the RSC
operator, shared by the drop-in classes (:mod:`dgl_rsc.pyg.convs`) and the global patch
(:mod:`dgl_rsc.pyg.patch`).

Each function takes the PyG module (its options and parameters are read, never changed,
except PyG's own ``cached`` normalization) and a :class:`Front`: where the structures are
cached, which RSC argument a product gets (a controller slot, the controller itself, or
``None`` for the exact backward) and whom to tell when a call goes to PyG instead. A
function returns ``None`` when the engine does not take the call (``torch.sparse`` and
``SparseTensor`` inputs, which PyG then routes to the fused ``message_and_aggregate``, also
served by RSC); where a forward has started, the aggregation itself falls back to the
module's stock ``propagate`` for features the engine does not take (3-D, fp16 on the CPU).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch

from ..base import _deps
from ..core.ops import compiling
from ..dgl.nn.input_cache import InputAggregationCache
from ..sparse.structure_cache import StructureCache
from .adjacency import (
    aggregate,
    edge_csr,
    flow_indices,
    sparse_csr,
    sparse_reads,
    takes_features,
)
from .compiled import gcn_matrix

__all__ = [
    "Front",
    "passthrough_reason",
    "gcn_forward",
    "sage_forward",
    "gcn2_forward",
    "fused_product",
]

_HOOKS = (
    "_propagate_forward_pre_hooks",
    "_propagate_forward_hooks",
    "_message_forward_pre_hooks",
    "_message_forward_hooks",
    "_aggregate_forward_pre_hooks",
    "_aggregate_forward_hooks",
    "_message_and_aggregate_forward_pre_hooks",
    "_message_and_aggregate_forward_hooks",
)


@dataclasses.dataclass(frozen=True)
class Front:
    """How a forward reaches the RSC core.

    Attributes:
        rsc: ``rsc(x, A)`` -> the ``rsc`` argument of the product ``A @ x``.
        structures: the cache of CSR structures built from PyG's graph inputs.
        passthrough: ``passthrough(module, reason)`` is called when a call goes to PyG.
        inputs: ``inputs(module)`` -> the module's cache of its input's aggregation, or
            ``None`` (no reuse: every call aggregates in PyG's order).
        noted: ``noted(built)`` counts a reused (``built``: first computed) aggregation.
    """

    rsc: Callable
    structures: StructureCache
    passthrough: Callable[[object, str], None]
    inputs: Callable[[object], Optional[InputAggregationCache]] = lambda module: None
    noted: Callable[[bool], None] = lambda built: None


def passthrough_reason(conv, edge_index) -> Optional[str]:
    """Why ``conv`` must run PyG's own message passing on ``edge_index`` (a LongTensor), or
    ``None``: explain mode, decomposed layers and registered message-passing hooks need
    PyG's per-edge messages; an ``EdgeIndex`` keeps its own sparse metadata."""
    if type(edge_index).__name__ == "EdgeIndex":
        return "EdgeIndex input"
    if getattr(conv, "explain", None):
        return "explain mode"
    if getattr(conv, "decomposed_layers", 1) != 1:
        return "decomposed_layers > 1"
    if any(getattr(conv, h, None) for h in _HOOKS):
        return "message-passing hooks"
    return None


def _is_edge_index(edge_index) -> bool:
    return isinstance(edge_index, torch.Tensor) and edge_index.layout == torch.strided


def _propagate(conv, front: Front, A_of, x, stock, mean: bool = False):
    """RSC's aggregation of ``x`` over ``A_of()`` when the engine takes ``x``, else PyG's
    ``stock()`` (told to ``front``)."""
    if not takes_features(x):
        front.passthrough(conv, f"features of shape {tuple(x.shape)} and dtype {x.dtype}")
        return stock()
    A = A_of()
    return aggregate(A, x, front.rsc(x, A), mean=mean)


def _input_aggregation(conv, front: Front, x, reads: tuple, A_of, width: int, mean=False):
    """``(N_dst, D_in)``: the aggregation of an input that needs no gradient (the dataset's
    features), reused while the same unchanged ``x`` and graph tensors ``reads`` come back
    (:class:`~dgl_rsc.dgl.nn.input_cache.InputAggregationCache`: built the second time the
    same ``x`` comes, so that input dropout never builds one; not where ``x`` or a graph
    tensor needs a gradient); where it is not (yet) cached, computed here when aggregating
    first costs no more sparse work than PyG's order (``D_in`` <= ``2 width``: transforming
    first reads ``width``-wide rows forward and backward). ``None``: PyG's order runs."""
    grads = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, *reads))
    if compiling() or grads or not takes_features(x):
        return None
    cache = front.inputs(conv)
    if cache is None or not cache.enabled:
        return None

    def build():
        return aggregate(A_of(), x, None, mean=mean)

    out = cache.get(x, reads, build, front.noted)
    if out is not None:
        return out
    if x.shape[1] > 2 * width:
        return None
    A = A_of()
    return aggregate(A, x, front.rsc(x, A), mean=mean)  # x needs no gradient: no slot


def _normalized(conv, front: Front, x, edge_index, edge_weight, improved: bool):
    """``(edge_index, edge_weight, A_of)`` after PyG's ``gcn_norm`` (and its ``cached``
    option), ``A_of()`` building the weighted ``A`` on the structure sorted once per graph."""
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    n = x.size(conv.node_dim)
    if compiling() and conv.normalize and conv._cached_edge_index is None and edge_weight is None:
        A = gcn_matrix(conv, edge_index, n, x.dtype, improved)  # no gcn_norm traced
        if A is not None:
            return None, None, lambda: A
    norm = None
    if not conv.normalize:
        built = (edge_index, None)
        norm_ei, norm_w = edge_index, edge_weight
    elif conv._cached_edge_index is not None:
        norm_ei, norm_w = conv._cached_edge_index
        built = (norm_ei, None)
    else:
        args = (edge_index, edge_weight, n, improved, conv.add_self_loops, conv.flow, x.dtype)
        norm = _kept_norm(front, args, lambda: gcn_norm(*args))
        norm_ei, norm_w = norm.edges
        if conv.cached:
            conv._cached_edge_index = (norm_ei, norm_w)
        # the loops gcn_norm adds depend on the structure only: key on the input graph
        built = (edge_index, ("gcn_norm", bool(conv.add_self_loops)), norm_ei)

    def A_of():
        if norm is not None and norm.A is not None:  # kept with its normalization
            return norm.A
        A, perm = edge_csr(built[0], n, n, conv.flow, front.structures, *built[1:])
        A = A if norm_w is None else A.with_values(norm_w[perm])
        if norm is not None and norm.kept:
            norm.A = A
        return A

    return norm_ei, norm_w, A_of


@dataclasses.dataclass
class _Norm:
    edges: tuple  # gcn_norm's (edge_index, edge_weight)
    kept: bool  # held by the structure cache (False: computed for this call only)
    A: Optional[object] = None  # the weighted A, built on first use where kept


def _kept_norm(front: Front, args: tuple, compute: Callable) -> _Norm:
    """PyG's ``gcn_norm(*args)`` (``args``: edge_index, edge_weight, num_nodes, improved,
    add_self_loops, flow, dtype), computed once while the same ``edge_index`` and edge
    weights come back unchanged (keyed by identity and version counter, both held alive):
    the same numbers as computing it at every call, which is what PyG's forward does unless
    the layer is ``cached``. Edge weights that need a gradient are normalized afresh (the
    gradient flows through the normalization)."""
    edge_index, edge_weight = args[:2]
    if edge_weight is not None and edge_weight.requires_grad and torch.is_grad_enabled():
        return _Norm(compute(), False)
    weights = None if edge_weight is None else (id(edge_weight), edge_weight._version)
    key = ("gcn_norm_values", id(edge_index), edge_index._version, weights, *args[2:],
           edge_index.device)  # fmt: skip
    return front.structures.get_by_key(key, (edge_index, edge_weight),
                                       lambda: _Norm(compute(), True))  # fmt: skip


def _normalized_sparse(conv, front: Front, x, adj, edge_weight):
    """``A``: PyG's ``gcn_norm`` of a sparse ``adj_t`` (``SparseTensor`` or ``torch.sparse``)
    with its structure cached under ``adj_t``'s, or ``None`` (PyG's forward runs).

    ``gcn_norm`` builds a new adjacency at every call; keyed on its own index tensors, the
    structure -- and RSC's sample of it -- would be new at every step (no cached sample, a
    fresh selection per step: a lower visited fraction than the same graph's ``edge_index``,
    and the selection's cost every step). PyG's ``cached=True`` keeps its first result."""
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    cached = conv._cached_adj_t if _deps.is_sparse_tensor(adj) else conv._cached_edge_index
    if compiling() or not conv.normalize or cached is not None or edge_weight is not None:
        return None  # the same tensors every step: the structure cache sees them already
    norm = gcn_norm(adj, None, x.size(conv.node_dim), conv.improved, conv.add_self_loops,
                    conv.flow, x.dtype)  # fmt: skip
    norm = norm[0] if isinstance(norm, tuple) else norm
    A = sparse_csr(norm, front.structures, (adj, ("gcn_norm", bool(conv.add_self_loops))))
    if A is not None and conv.cached:  # as PyG's forward would have kept it
        if _deps.is_sparse_tensor(adj):
            conv._cached_adj_t = norm
        else:
            conv._cached_edge_index = (norm, None)
    return A


def gcn_forward(conv, front: Front, x, edge_index, edge_weight=None):
    """``GCNConv.forward`` on the RSC operator, or ``None`` (PyG's forward runs)."""
    if isinstance(x, (tuple, list)):
        return None
    if not _is_edge_index(edge_index):
        if not takes_features(x) or passthrough_reason(conv, edge_index) is not None:
            return None  # PyG's forward (its spmm is the patch's, where it takes the call)
        A = _normalized_sparse(conv, front, x, edge_index, edge_weight)
        if A is None or A.shape[1] != x.shape[0] or A.device != x.device:
            return None
        first = _input_aggregation(conv, front, x, sparse_reads(edge_index), lambda: A,
                                   conv.out_channels)  # fmt: skip
        out = conv.lin(first) if first is not None else _transformed(conv, front, A, x)
        return out if conv.bias is None else out + conv.bias
    why = passthrough_reason(conv, edge_index)
    if why is not None:
        front.passthrough(conv, why)
        return None
    norm_ei, norm_w, A_of = _normalized(conv, front, x, edge_index, edge_weight, conv.improved)
    first = _input_aggregation(conv, front, x, (edge_index, edge_weight), A_of,
                               conv.out_channels)  # fmt: skip
    if first is not None:  # A (X W) = (A X) W: the input's aggregation first
        out = conv.lin(first)
        return out if conv.bias is None else out + conv.bias
    h = conv.lin(x)
    out = _propagate(conv, front, A_of, h,
                     lambda: conv.propagate(norm_ei, x=h, edge_weight=norm_w))  # fmt: skip
    if conv.bias is not None:
        out = out + conv.bias
    return out


def _transformed(conv, front: Front, A, x):
    h = conv.lin(x)
    return aggregate(A, h, front.rsc(h, A))


def gcn2_forward(conv, front: Front, x, x_0, edge_index, edge_weight=None):
    """``GCN2Conv.forward`` on the RSC operator, or ``None`` (PyG's forward runs)."""
    if not _is_edge_index(edge_index):
        return None
    why = passthrough_reason(conv, edge_index)
    if why is not None:
        front.passthrough(conv, why)
        return None
    norm_ei, norm_w, A_of = _normalized(conv, front, x, edge_index, edge_weight, False)
    h = _propagate(conv, front, A_of, x,
                   lambda: conv.propagate(norm_ei, x=x, edge_weight=norm_w))  # fmt: skip
    h = h * (1 - conv.alpha)
    x_0 = conv.alpha * x_0[: h.size(0)]
    keep, mix = 1.0 - conv.beta, conv.beta
    if conv.weight2 is None:  # (1 - beta) s + beta s W1 with s = h + x_0
        s = h + x_0
        return torch.addmm(s, s, conv.weight1, beta=keep, alpha=mix)
    out = torch.addmm(h, h, conv.weight1, beta=keep, alpha=mix)
    return out + torch.addmm(x_0, x_0, conv.weight2, beta=keep, alpha=mix)


def _sage_sizes(conv, pair, size):
    """``(x_src, num_src, num_dst)`` as PyG's ``propagate`` infers them."""
    i, j = flow_indices(conv.flow)
    x_src = pair[j]
    sizes = [None, None] if size is None else list(size)
    if sizes[j] is None and isinstance(x_src, torch.Tensor):
        sizes[j] = x_src.size(0)
    if sizes[i] is None and isinstance(pair[i], torch.Tensor):
        sizes[i] = pair[i].size(0)
    n_src = sizes[j] if sizes[j] is not None else sizes[i]
    n_dst = sizes[i] if sizes[i] is not None else sizes[j]
    return x_src, n_src, n_dst


def sage_forward(conv, front: Front, x, edge_index, size=None):
    """``SAGEConv.forward`` with ``aggr="mean"`` on the RSC operator, or ``None``."""
    if conv.aggr != "mean" or not _is_edge_index(edge_index):
        return None
    why = passthrough_reason(conv, edge_index)
    if why is not None:
        front.passthrough(conv, why)
        return None
    pair = (x, x) if isinstance(x, torch.Tensor) else tuple(x)
    if conv.project and hasattr(conv, "lin"):
        pair = (conv.lin(pair[0]).relu(), pair[1])
    x_src, n_src, n_dst = _sage_sizes(conv, pair, size)

    def A_of():
        return edge_csr(edge_index, n_src, n_dst, conv.flow, front.structures)[0]

    def stock():
        return conv.propagate(edge_index, x=pair, size=size)

    if not isinstance(x_src, torch.Tensor) or x_src.size(0) != n_src:
        return None
    out = None
    if isinstance(x, torch.Tensor) and size is None:  # one node set: A is edge_index's alone
        out = _input_aggregation(conv, front, x_src, (edge_index,), A_of, conv.out_channels,
                                 mean=True)  # fmt: skip
    if out is None:
        out = _propagate(conv, front, A_of, x_src, stock, mean=True)
    out = conv.lin_l(out)
    if conv.root_weight and pair[1] is not None:
        out = out + conv.lin_r(pair[1])
    if conv.normalize:
        out = torch.nn.functional.normalize(out, p=2.0, dim=-1)
    return out


def fused_product(front: Front, adj_t, x, reduce) -> Optional[torch.Tensor]:
    """``adj_t @ x`` with ``reduce`` ``"sum"``/``"add"``/``"mean"`` on the RSC operator (the
    fused ``message_and_aggregate`` and ``torch_geometric.utils.spmm``), or ``None``."""
    if reduce not in ("sum", "add", "mean") or not takes_features(x):
        return None
    A = sparse_csr(adj_t, front.structures)
    if A is None or A.shape[1] != x.shape[0] or A.device != x.device:
        return None
    return aggregate(A, x, front.rsc(x, A), mean=reduce == "mean")
