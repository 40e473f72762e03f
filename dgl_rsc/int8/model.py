"""Switch a model's dgl_rsc convolutions to INT8 products, or back.

What runs in INT8 (int8 operands, int32 accumulation, one fp32 dequantize per product):

* every sparse product of a quantized convolution: the forward ``A @ X``, the exact backward
  ``A^T @ dY`` and RSC's sampled backward ``A[S, :]^T @ dY[S, :]``;
* the weight products of :class:`~dgl_rsc.nn.GraphConv` (``X @ W`` and both of its
  gradients);

each product in INT8 or fp32, whichever measured faster for its shape on this machine
(``dense``/``sparse`` ``"auto"``, :mod:`dgl_rsc.int8.choose`), or as forced (``"int8"``,
``"fp32"``).

What stays in fp32 (the rule): the first layer's aggregation where it is computed once per
run (:mod:`dgl_rsc.dgl.nn.input_cache`), the last convolution of the model (``keep_last=True``: its
output is the logits; the activation its weight gradient keeps is INT8 with ``saved="int8"``),
the degree normalization values (applied in fp32 before quantizing or
at the dequantize), bias, activation, dropout, batch normalization, softmax and loss, the
parameters themselves and the optimizer state (INT8 codes exist only inside a product), the
score and scale estimates of RSC, per-feature edge weights, and the ``nn.Linear`` layers of
the other convolutions (:class:`~dgl_rsc.nn.SAGEConv`, ``GCN2Conv``, ``ChebConv``: their
aggregations are INT8, their dense layers are not, yet).

>>> import torch
>>> from dgl_rsc.models import build_model
>>> model = build_model("gcn", in_feats=4, num_classes=3, hidden=8, layers=3)
>>> quantize_model(model, rounding="nearest")
['convs.0', 'convs.1']
>>> dequantize_model(model)
"""

from __future__ import annotations

import logging

from torch import nn

from .spec import Int8Spec, Int8State

__all__ = ["quantize_model", "dequantize_model", "int8_layers"]

log = logging.getLogger(__name__)


def _convs(model: nn.Module) -> list:
    return [(n, m) for n, m in model.named_modules() if hasattr(m, "rsc_set_int8")]


def quantize_model(
    model: nn.Module,
    rounding: str = "stochastic",
    *,
    seed: int = 0,
    keep_last: bool = True,
    backend: str = "auto",
    dense: str = "auto",
    sparse: str = "auto",
    saved: str = "int8",
) -> list:
    """Run the products of ``model``'s dgl_rsc convolutions in INT8 (see the module doc for
    what stays in fp32). Works with or without RSC attached (:func:`dgl_rsc.nn.attach`), in
    either order. Returns the names of the quantized layers.

    Args:
        model: a module holding :mod:`dgl_rsc.nn` convolutions (convert DGL ones with
            :func:`dgl_rsc.nn.convert` first).
        rounding: ``"stochastic"`` or ``"nearest"`` (:class:`~dgl_rsc.int8.spec.Int8Spec`).
        seed: seed of the stochastic rounding (per layer and per call, see
            :class:`~dgl_rsc.int8.spec.Int8State`).
        keep_last: leave the last convolution in fp32.
        backend: kernels of the sparse products (:func:`dgl_rsc.backends.resolve_int8`).
        dense: where the weight products run in INT8 (:class:`~dgl_rsc.int8.spec.Int8Spec`:
            ``"auto"`` where that measured faster than fp32).
        sparse: where the sparse products run in INT8 (likewise).
        saved: the precision of the activations the weight gradients keep (``"int8"``: every
            convolution's, the fp32 last one's too; :mod:`dgl_rsc.int8.saved`).

    Raises:
        ValueError: ``model`` has no dgl_rsc convolution, or an option is invalid.
    """
    spec = Int8Spec(rounding=rounding, seed=seed, keep_last=keep_last, backend=backend,
                    dense=dense, sparse=sparse, saved=saved)  # fmt: skip
    convs = _convs(model)
    if not convs:
        raise ValueError(
            f"{type(model).__name__} holds no dgl_rsc convolution, so nothing can run in INT8; "
            "build it with dgl_rsc.nn layers or convert it with dgl_rsc.nn.convert(model)."
        )
    chosen = convs[:-1] if keep_last else convs
    if not chosen:
        log.warning("quantize_model: the only convolution is the last one and keep_last=True: "
                    "nothing runs in INT8")  # fmt: skip
    names = {n for n, _ in chosen}
    for i, (name, conv) in enumerate(convs):
        conv.rsc_set_int8(Int8State(spec, i) if name in names else None)
        if name not in names and spec.saved == "int8" and hasattr(conv, "rsc_set_saved_int8"):
            conv.rsc_set_saved_int8(Int8State(spec, i))  # fp32 products, INT8 saved inputs
    return [n for n, _ in chosen]


def dequantize_model(model: nn.Module) -> None:
    """Run every dgl_rsc convolution of ``model`` in fp32 again."""
    for _, conv in _convs(model):
        conv.rsc_set_int8(None)
        if hasattr(conv, "rsc_set_saved_int8"):
            conv.rsc_set_saved_int8(None)


def int8_layers(model: nn.Module) -> list:
    """Names of ``model``'s convolutions that run in INT8."""
    return [n for n, m in _convs(model) if m.rsc_int8() is not None]
