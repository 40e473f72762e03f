"""``ChebConv``: DGL's Chebyshev spectral graph convolution (Defferrard et al., 2016) with an
RSC backward for each of its sparse products."""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from ._base import RSCLayer
from .errors import layer_error

__all__ = ["ChebConv"]

LAMBDA_MAX_MESSAGE = (
    "lambda_max is not provided, using default value of 2. Compute the largest eigenvalue "
    "of the normalized Laplacian with dgl.laplacian_lambda_max(g) and pass it as lambda_max."
)


class ChebConv(RSCLayer):
    """Drop-in for ``dgl.nn.ChebConv``: same arguments, parameter names (``linear``) and
    output.

    ``h = linear([Z_0, ..., Z_{k-1}])`` with ``Z_0 = X``, ``Z_1 = L X``,
    ``Z_i = 2 L Z_{i-1} - Z_{i-2}`` and the scaled Laplacian
    ``L = 2 (I - D^-1/2 A D^-1/2) / lambda_max - I`` (``D``: in-degrees, at least 1).
    The ``k - 1`` sparse products ``D^-1/2 A D^-1/2 Z`` are RSC products, product ``j``
    (computing ``Z_{j+1}``) in slot ``j`` of the layer: ``rsc_products = k - 1``.

    Args:
        in_feats: input width ``D_in``.
        out_feats: output width ``D_out``.
        k: number of Chebyshev terms (at least 1).
        activation: callable applied last (default ``F.relu``, as DGL), or ``None``.
        bias: learn the bias of ``linear``.

    Shapes:
        ``forward(graph, feat (N, D_in), lambda_max=None) -> (N, D_out)``; ``lambda_max``:
        a list or ``(B,)`` tensor, one value per graph of a batch (``None``: 2, with a
        warning, as DGL).

    RSC approximates its backward once attached (:func:`dgl_rsc.nn.attach`).

    Example:
        >>> import torch; from dgl_rsc.sparse.graph import Graph
        >>> g = Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]))
        >>> conv = ChebConv(4, 2, k=3)
        >>> conv.rsc_products, conv(g, torch.randn(3, 4), lambda_max=[2.0]).shape
        (2, torch.Size([3, 2]))
    """

    def __init__(self, in_feats, out_feats, k, activation=F.relu, bias=True):
        super().__init__()
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise layer_error(f"k is the number of Chebyshev terms, at least 1; got {k!r}.")
        self._k = k
        self._in_feats = in_feats
        self._out_feats = out_feats
        self.activation = activation
        self.linear = nn.Linear(k * in_feats, out_feats, bias)
        self.rsc_products = k - 1

    @classmethod
    def from_dgl(cls, conv) -> ChebConv:
        """A ``ChebConv`` with the options of ``dgl.nn.ChebConv`` ``conv``."""
        return cls(
            conv._in_feats,
            conv._out_feats,
            conv._k,
            activation=conv.activation,
            bias=conv.linear.bias is not None,
        )

    def reset_parameters(self):
        """``nn.Linear``'s initialization of ``linear``; drops RSC's cached samples."""
        self.linear.reset_parameters()
        self.clear_cache()

    def forward(self, graph, feat, lambda_max=None):
        d_invsqrt = torch.pow(graph.in_degrees().to(feat).clamp(min=1), -0.5)
        re_norm = 2.0 / _per_node(graph, feat, lambda_max)

        def laplacian_product(z, slot):  # D^-1/2 A D^-1/2 z, both scalings fused
            return self._aggregate(graph, z, slot=slot, row_scale=d_invsqrt, col_scale=d_invsqrt)

        x_0 = feat
        terms = [x_0]
        if self._k > 1:
            h = laplacian_product(x_0, 0)
            x_1 = -re_norm * h + x_0 * (re_norm - 1)
            terms.append(x_1)
        for i in range(2, self._k):
            h = laplacian_product(x_1, i - 1)
            x_i = -2 * re_norm * h + x_1 * 2 * (re_norm - 1) - x_0
            terms.append(x_i)
            x_1, x_0 = x_i, x_1
        h = self.linear(torch.cat(terms, dim=1))
        if self.activation:
            h = self.activation(h)
        return h

    def extra_repr(self):
        return "in={_in_feats}, out={_out_feats}, k={_k}".format(**self.__dict__)


def _per_node(graph, feat: torch.Tensor, lambda_max) -> torch.Tensor:
    """``(N, 1)`` ``lambda_max`` of each node's graph in a batch (as DGL builds it)."""
    batch = getattr(graph, "batch_size", 1)
    if lambda_max is None:
        warnings.warn(LAMBDA_MAX_MESSAGE, stacklevel=3)
        lambda_max = [2] * batch
    if isinstance(lambda_max, list):
        lambda_max = torch.Tensor(lambda_max).to(feat)
    if not isinstance(lambda_max, torch.Tensor):
        raise layer_error(
            f"lambda_max must be None, a list or a tensor with one value per graph, got "
            f"{type(lambda_max).__name__}."
        )
    if lambda_max.dim() == 1:
        lambda_max = lambda_max.unsqueeze(-1)
    if lambda_max.shape[0] != batch:
        raise layer_error(
            f"lambda_max has {lambda_max.shape[0]} values but the graph batches {batch} "
            "graph(s): pass one value per graph (dgl.laplacian_lambda_max(g))."
        )
    counts = graph.batch_num_nodes().to(lambda_max.device)
    return torch.repeat_interleave(lambda_max, counts, dim=0)
