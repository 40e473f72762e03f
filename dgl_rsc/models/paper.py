"""The models of the RSC paper's runs: GCN, GraphSAGE and GCNII, built through ``MODELS``.

Every model is built from the convolutions of an engine (:mod:`dgl_rsc.models.engines`):
:mod:`dgl_rsc.nn` layers for ``native`` and ``dgl`` (the default ``native``), the stock
``dgl.nn`` layers for ``patch`` and ``stock``. For the same seed every engine draws the same
initial weights, so a run on one engine can be compared step by step with a run on another.

Example:
    >>> import torch
    >>> from dgl_rsc.sparse.graph import Graph
    >>> g = Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0])).add_self_loop()
    >>> model = build_model("gcn", in_feats=4, num_classes=3, hidden=8, layers=2)
    >>> model(g, torch.randn(3, 4)).shape
    torch.Size([3, 3])
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from torch import nn

from ..base.names import did_you_mean
from ..core.config import ConfigError, unknown_key_message
from . import fused, restricted
from .engines import conv_classes

__all__ = ["GCN", "SAGE", "GCNII", "ResGCN", "MODELS", "build_model", "model_params"]

#: Constructor arguments that the launcher fills from the data, not from the config.
DATA_ARGS = ("in_feats", "num_classes", "engine")


#: ``argument -> (lowest, highest or None, kind)``: the one rule of each model argument
_RULES = {
    "layers": (1, None, int), "hidden": (1, None, int), "ffn_multiplier": (1, None, int),
    "dropout": (0.0, 1.0, float), "input_dropout": (0.0, 1.0, float),
    "alpha": (0.0, 1.0, float), "lambda_": (0.0, None, float),
}  # fmt: skip


def _check(**args) -> None:
    """Each named argument against its rule in :data:`_RULES`, or a ``ValueError``."""
    for name, value in args.items():
        lo, hi, kind = _RULES[name]
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{name} must be an integer, got {value!r}.")
        if value < lo or (hi is not None and value > hi):
            raise ValueError(f"{name}={value!r} is out of range [{lo}, {hi or 'inf'}].")


class _Stack(nn.Module):
    """Shared body of GCN and SAGE: ``layers`` convs with norm, ReLU and dropout between."""

    SELF_LOOPS = True
    #: hidden layers' bias, ReLU and dropout in one pass each way, scalings in the product
    #: (:mod:`dgl_rsc.models.fused`, where it applies); ``False``: op by op
    fused_epilogue = True

    def __init__(self, dims, make_conv, dropout, input_dropout, batch_norm):
        super().__init__()
        _check(dropout=dropout, input_dropout=input_dropout)
        self.convs = nn.ModuleList(make_conv(a, b) for a, b in zip(dims[:-1], dims[1:]))
        norms = [nn.BatchNorm1d(d) if batch_norm else nn.Identity() for d in dims[1:-1]]
        self.norms = nn.ModuleList(norms)
        self.dropout = nn.Dropout(dropout)
        self.input_dropout = nn.Dropout(input_dropout)

    def forward(self, graph, feat: torch.Tensor, edge_weight=None) -> torch.Tensor:
        """``feat (N, F)`` -> logits ``(N, C)``; ``edge_weight (E,)`` weights every
        aggregation's messages (GraphSAINT's normalization in mini-batch training)."""
        ctl = restricted.applies(self, graph, feat, edge_weight)  # RSCConfig.restrict
        if ctl is not None:
            return restricted.restricted_forward(self, graph, feat, ctl)
        if fused.applies(self, graph, feat):
            return fused.fused_forward(self, graph, feat, edge_weight)
        h = self.input_dropout(feat)
        for i, conv in enumerate(self.convs):
            h = conv(graph, h) if edge_weight is None else conv(graph, h, edge_weight=edge_weight)
            if i < len(self.norms):
                h = self.dropout(F.relu(self.norms[i](h)))
        return h


class GCN(_Stack):
    """``layers`` ``GraphConv`` (symmetric norm) with BatchNorm (optional), ReLU, dropout.

    The graph must have no zero-in-degree node (the launcher adds self-loops).

    Args:
        in_feats: input width ``F``.
        num_classes: output width ``C``.
        hidden: hidden width.
        layers: number of graph convolutions (>= 1).
        dropout: dropout after each hidden layer.
        input_dropout: dropout on the input features (Kipf and Welling use 0.5).
        batch_norm: ``BatchNorm1d`` after each hidden convolution.
        engine: a name of :data:`dgl_rsc.models.engines.ENGINES` (which convolutions).

    Shapes:
        ``forward(graph, feat (N, F)) -> (N, C)``.
    """

    def __init__(self, in_feats: int, num_classes: int, hidden: int = 256, layers: int = 3,
                 dropout: float = 0.5, input_dropout: float = 0.0, batch_norm: bool = False,
                 engine: str = "native"):  # fmt: skip
        _check(layers=layers, hidden=hidden)
        conv = conv_classes(engine).GraphConv
        dims = [in_feats] + [hidden] * (layers - 1) + [num_classes]
        super().__init__(dims, lambda a, b: conv(a, b), dropout, input_dropout, batch_norm)


class SAGE(_Stack):
    """``layers`` ``SAGEConv`` (``"mean"`` or ``"gcn"``) with BatchNorm (optional), ReLU,
    dropout. Takes graphs with isolated nodes (no self-loops needed).

    Args are those of :class:`GCN` plus ``aggregator`` (``"mean"`` or ``"gcn"``).

    Shapes:
        ``forward(graph, feat (N, F)) -> (N, C)``.
    """

    SELF_LOOPS = False

    def __init__(self, in_feats: int, num_classes: int, hidden: int = 256, layers: int = 3,
                 dropout: float = 0.5, input_dropout: float = 0.0, batch_norm: bool = False,
                 aggregator: str = "mean", engine: str = "native"):  # fmt: skip
        _check(layers=layers, hidden=hidden)
        if aggregator not in ("mean", "gcn"):
            raise ValueError(f"aggregator must be 'mean' or 'gcn', got {aggregator!r}.")
        conv = conv_classes(engine).SAGEConv
        dims = [in_feats] + [hidden] * (layers - 1) + [num_classes]
        super().__init__(
            dims, lambda a, b: conv(a, b, aggregator), dropout, input_dropout, batch_norm
        )


class GCNII(nn.Module):
    """GCNII (Chen et al., 2020): ``Linear -> layers x GCN2Conv -> Linear``.

    ``h0 = relu(W_in x)``; layer ``l`` computes ``relu(GCN2Conv_l(g, h, h0))`` with initial
    residual ``alpha`` and identity mapping ``beta_l = log(lambda_ / l + 1)``; dropout before
    every convolution and before the output layer. Needs self-loops like :class:`GCN`.

    Shapes:
        ``forward(graph, feat (N, F)) -> (N, C)``.
    """

    SELF_LOOPS = True

    def __init__(self, in_feats: int, num_classes: int, hidden: int = 256, layers: int = 4,
                 dropout: float = 0.5, alpha: float = 0.1, lambda_: float = 0.5,
                 engine: str = "native"):  # fmt: skip
        super().__init__()
        _check(layers=layers, hidden=hidden, dropout=dropout, alpha=alpha, lambda_=lambda_)
        conv = conv_classes(engine).GCN2Conv
        self.lin_in = nn.Linear(in_feats, hidden)
        self.convs = nn.ModuleList(
            conv(hidden, layer=i + 1, alpha=alpha, lambda_=lambda_) for i in range(layers)
        )
        self.lin_out = nn.Linear(hidden, num_classes)
        self.dropout = nn.Dropout(dropout)

    def forward(self, graph, feat: torch.Tensor) -> torch.Tensor:
        """``feat (N, F)`` -> logits ``(N, C)``."""
        h = h0 = F.relu(self.lin_in(self.dropout(feat)))
        for conv in self.convs:
            h = F.relu(conv(graph, self.dropout(h), h0))
        return self.lin_out(self.dropout(h))


class ResGCN(nn.Module):
    """GCN in residual blocks with layer normalization and a feed-forward module: the GCN
    baseline of Platonov et al. (ICLR 2023, "A critical look at the evaluation of GNNs under
    heterophily"), which reaches about 83.6 ROC-AUC on tolokers.

    ``h = GELU(Dropout(W_in x))``; each block ``h = h + FFN(Â LayerNorm(h))`` with ``Â`` the
    symmetric-normalized adjacency without self-loops (``GraphConv(norm="both",
    weight=False)``, whose aggregation RSC approximates) and ``FFN = Dropout(W2 GELU(Dropout(W1
    .)))``; the output is ``W_out LayerNorm(h)``.

    Shapes:
        ``forward(graph, feat (N, F)) -> (N, C)``.
    """

    SELF_LOOPS = False

    def __init__(self, in_feats: int, num_classes: int, hidden: int = 512, layers: int = 3,
                 dropout: float = 0.2, ffn_multiplier: int = 1,
                 engine: str = "native"):  # fmt: skip
        super().__init__()
        _check(layers=layers, hidden=hidden, ffn_multiplier=ffn_multiplier, dropout=dropout)
        conv = conv_classes(engine).GraphConv
        width = hidden * ffn_multiplier
        self.lin_in = nn.Linear(in_feats, hidden)
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))
        self.convs = nn.ModuleList(
            conv(hidden, hidden, norm="both", weight=False, bias=False, allow_zero_in_degree=True)
            for _ in range(layers)
        )
        self.ffn_in = nn.ModuleList(nn.Linear(hidden, width) for _ in range(layers))
        self.ffn_out = nn.ModuleList(nn.Linear(width, hidden) for _ in range(layers))
        self.norm_out = nn.LayerNorm(hidden)
        self.lin_out = nn.Linear(hidden, num_classes)
        self.dropout = nn.Dropout(dropout)

    def forward(self, graph, feat: torch.Tensor, edge_weight=None) -> torch.Tensor:
        """``feat (N, F)`` -> logits ``(N, C)`` (``edge_weight (E,)`` as for :class:`GCN`)."""
        h = F.gelu(self.dropout(self.lin_in(feat)))
        for norm, conv, w1, w2 in zip(self.norms, self.convs, self.ffn_in, self.ffn_out):
            x = conv(graph, norm(h), edge_weight=edge_weight)
            h = h + self.dropout(w2(F.gelu(self.dropout(w1(x)))))
        return self.lin_out(self.norm_out(h))


MODELS = {"gcn": GCN, "sage": SAGE, "gcn2": GCNII, "resgcn": ResGCN}


def model_params(name: str) -> dict:
    """``{parameter: default}`` that a config may set for model ``name``."""
    sig = inspect.signature(_model_class(name).__init__)
    return {k: p.default for k, p in sig.parameters.items() if k != "self" and k not in DATA_ARGS}


def _model_class(name: str):
    if not isinstance(name, str) or name not in MODELS:
        hint = did_you_mean(str(name), MODELS)
        raise ConfigError(f"unknown model '{name}'.{hint} Known models: {', '.join(MODELS)}.")
    return MODELS[name]


def build_model(
    name: str, in_feats: int, num_classes: int, engine: str = "native", **params
) -> nn.Module:
    """Build registered model ``name``; unknown ``params`` raise :class:`ConfigError`."""
    allowed = model_params(name)
    for key in params:
        if key not in allowed:
            raise ConfigError(unknown_key_message(key, allowed, f"model ({name})"))
    return _model_class(name)(in_feats, num_classes, engine=engine, **params)
