"""Drop-in ``GCNConv``, ``SAGEConv`` (mean) and ``GCN2Conv`` for PyTorch Geometric.

Each class *is* PyG's class (a subclass: same constructor, defaults, parameters, state-dict
keys, ``reset_parameters()``, ``__repr__``, ``cached`` normalization) whose aggregation runs
on the RSC operator: exact forward, backward of the features approximated once the layer is
attached to a controller (:func:`dgl_rsc.pyg.attach`, then ``rsc.step()`` per optimizer
step). Unattached, the backward is exact and the layer warns once, as the DGL drop-ins do.

Importing this module needs ``torch_geometric`` (``dgl_rsc.pyg`` loads it on first use of
one of these names).
"""

import warnings
from typing import Union

import torch
from torch import Tensor

from ..base import _deps
from ..dgl.nn._base import RSCLayer
from .forwards import Front, fused_product, gcn2_forward, gcn_forward, sage_forward

__all__ = ["GCNConv", "SAGEConv", "GCN2Conv", "RSCPygLayer", "PASSTHROUGH_MESSAGE"]

_tg = _deps.require_torch_geometric()
_convs = _tg.nn.conv
Adj = _tg.typing.Adj
OptPairTensor = _tg.typing.OptPairTensor
OptTensor = _tg.typing.OptTensor
Size = _tg.typing.Size

PASSTHROUGH_MESSAGE = (
    "{name}: a call with {reason} runs PyG's own message passing, whose backward is exact "
    "(no RSC). dgl_rsc.pyg takes edge_index LongTensors, torch.sparse and SparseTensor "
    "adjacencies with 2-D fp32/fp64 features (any float on CUDA) without hooks, explain "
    "mode or decomposed layers."
)


class RSCPygLayer(RSCLayer):
    """What the PyG drop-ins add to PyG's class: the controller slot of their one product
    (:class:`~dgl_rsc.nn.RSCLayer`) and a warning, once per reason, when a call goes to
    PyG's exact message passing."""

    rsc_products = 1

    def _rsc_front(self) -> Front:
        return Front(lambda x, A: self._backward_state(0, x, A), self._structures(),
                     _warn_passthrough, lambda module: self._rsc_input_cache,
                     self._note_cached_input)  # fmt: skip

    def _note_cached_input(self, built: bool) -> None:
        if self._rsc_ctl is not None:
            self._rsc_ctl.note_cached_input(built)

    def _rsc_fused(self, adj_t, x):
        """PyG's fused path (``torch.sparse`` / ``SparseTensor`` adjacency) through RSC, or
        ``None`` (then PyG's ``message_and_aggregate`` runs)."""
        feat = x[0] if isinstance(x, (tuple, list)) else x
        return fused_product(self._rsc_front(), adj_t, feat, self.aggr)


def _clears_cache_on_reset(cls):
    """``cls.reset_parameters``: PyG's initialization, then RSC's cached samples dropped
    (they are stale)."""

    def reset_parameters(self):
        """PyG's initialization; also drops RSC's cached samples (they are stale)."""
        super(cls, self).reset_parameters()
        self.clear_cache()

    cls.reset_parameters = reset_parameters
    return cls


def _warn_passthrough(module, reason: str) -> None:
    seen = module.__dict__.setdefault("_rsc_passthrough_seen", set())
    if reason not in seen and module.training and torch.is_grad_enabled():
        seen.add(reason)
        warnings.warn(
            PASSTHROUGH_MESSAGE.format(name=type(module).__name__, reason=reason), stacklevel=4
        )


@_clears_cache_on_reset
class GCNConv(_convs.GCNConv, RSCPygLayer):
    """Drop-in for ``torch_geometric.nn.GCNConv`` (same signature and defaults) with an RSC
    backward for the aggregation ``D^-1/2 (A + I) D^-1/2 (X W)``.

    Shapes:
        ``forward(x (N, D_in), edge_index (2, E) | adj_t (N, N), edge_weight (E,) = None)
        -> (N, D_out)``.

    Example:
        >>> import torch
        >>> conv = GCNConv(4, 2)
        >>> conv(torch.randn(3, 4), torch.tensor([[0, 1, 2], [1, 2, 0]])).shape
        torch.Size([3, 2])
    """

    def message_and_aggregate(self, adj_t: Adj, x: Tensor) -> Tensor:
        out = self._rsc_fused(adj_t, x)
        return super().message_and_aggregate(adj_t, x) if out is None else out

    # PyG compiles ``propagate`` from this annotation, found by class name in the source:
    # propagate_type: (x: Tensor, edge_weight: OptTensor)
    def forward(self, x: Tensor, edge_index: Adj, edge_weight: OptTensor = None) -> Tensor:
        out = gcn_forward(self, self._rsc_front(), x, edge_index, edge_weight)
        return super().forward(x, edge_index, edge_weight) if out is None else out


@_clears_cache_on_reset
class SAGEConv(_convs.SAGEConv, RSCPygLayer):
    """Drop-in for ``torch_geometric.nn.SAGEConv`` with ``aggr="mean"`` (the default): same
    signature, parameters (``lin_l``, ``lin_r``, ``lin`` with ``project``) and output; the
    mean aggregation's backward approximated by RSC.

    Raises:
        ValueError: for any other ``aggr`` (sum, max, lstm, multi-aggregation, an
            ``Aggregation`` module): keep ``torch_geometric.nn.SAGEConv`` for those.

    Shapes:
        ``forward(x (N, D) | (x_src (N_src, D_src), x_dst (N_dst, D_dst) | None),
        edge_index (2, E) | adj_t (N_dst, N_src), size=None) -> (N_dst, D_out)``.

    Example:
        >>> import torch
        >>> conv = SAGEConv(4, 2)
        >>> conv(torch.randn(3, 4), torch.tensor([[0, 1, 2], [1, 2, 0]])).shape
        torch.Size([3, 2])
    """

    def __init__(self, in_channels, out_channels, aggr="mean", normalize=False,
                 root_weight=True, project=False, bias=True, **kwargs):  # fmt: skip
        if not (isinstance(aggr, str) and aggr == "mean"):
            raise ValueError(
                f"dgl_rsc.pyg.SAGEConv supports aggr='mean' only, got aggr={aggr!r}: other "
                "aggregations are not one sparse product for RSC to approximate; keep "
                "torch_geometric.nn.SAGEConv for them."
            )
        super().__init__(in_channels, out_channels, aggr, normalize, root_weight, project, bias,
                         **kwargs)  # fmt: skip

    def message_and_aggregate(self, adj_t: Adj, x: OptPairTensor) -> Tensor:
        st = _deps.sparse_tensor_class()
        if st is not None and isinstance(adj_t, st):  # PyG's SAGEConv ignores its values
            adj_t = adj_t.set_value(None, layout=None)
        out = self._rsc_fused(adj_t, x)
        return super().message_and_aggregate(adj_t, x) if out is None else out

    # propagate_type: (x: OptPairTensor)
    def forward(
        self, x: Union[Tensor, OptPairTensor], edge_index: Adj, size: Size = None
    ) -> Tensor:
        out = sage_forward(self, self._rsc_front(), x, edge_index, size)
        return super().forward(x, edge_index, size) if out is None else out


@_clears_cache_on_reset
class GCN2Conv(_convs.GCN2Conv, RSCPygLayer):
    """Drop-in for ``torch_geometric.nn.GCN2Conv`` (GCNII) with an RSC backward for the
    normalized aggregation.

    Shapes:
        ``forward(x (N, C), x_0 (N, C), edge_index (2, E) | adj_t (N, N),
        edge_weight (E,) = None) -> (N, C)``.

    Example:
        >>> import torch
        >>> conv = GCN2Conv(4, alpha=0.1, theta=0.5, layer=1)
        >>> x = torch.randn(3, 4)
        >>> conv(x, x, torch.tensor([[0, 1, 2], [1, 2, 0]])).shape
        torch.Size([3, 4])
    """

    def message_and_aggregate(self, adj_t: Adj, x: Tensor) -> Tensor:
        out = self._rsc_fused(adj_t, x)
        return super().message_and_aggregate(adj_t, x) if out is None else out

    # propagate_type: (x: Tensor, edge_weight: OptTensor)
    def forward(
        self, x: Tensor, x_0: Tensor, edge_index: Adj, edge_weight: OptTensor = None
    ) -> Tensor:
        out = gcn2_forward(self, self._rsc_front(), x, x_0, edge_index, edge_weight)
        return super().forward(x, x_0, edge_index, edge_weight) if out is None else out
