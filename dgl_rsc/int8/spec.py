"""What an INT8 layer is told: the rounding mode, the seed of its random numbers, the kernels.

:class:`Int8Spec` is the frozen, validated choice (one per model); :class:`Int8State` is the
per-layer object that hands every quantization call its own 32-bit seed, so stochastic
rounding is reproducible (same spec, same calls, same codes) and every call draws fresh
random numbers.
"""

from __future__ import annotations

import dataclasses

import torch

from ..base import _deps
from ..quant.rounding import stream_seed

__all__ = ["ROUNDINGS", "PRECISIONS", "DENSE", "Int8Spec", "Int8State"]

ROUNDINGS = ("nearest", "stochastic")
PRECISIONS = ("fp32", "int8")
DENSE = ("auto", "int8", "fp32")


@dataclasses.dataclass(frozen=True)
class Int8Spec:
    """How a model runs its products in INT8.

    Attributes:
        rounding: ``"nearest"`` (round half to even) or ``"stochastic"`` (``floor(v + u)``,
            ``u`` from the counter-based hash of :mod:`dgl_rsc.quant.rounding`: unbiased).
        seed: seed of the stochastic rounding (ignored with ``"nearest"``).
        keep_last: leave the last convolution of the model in fp32 (its output feeds the
            softmax/loss directly).
        backend: kernels of the sparse product: ``"auto"``, ``"torch"``, ``"numba-cpu"``,
            ``"numba"`` or ``"cupy"`` (:func:`dgl_rsc.backends.resolve_int8`).
        dense: the weight products (``X @ W`` and its gradients): ``"int8"``, ``"fp32"``, or
            ``"auto"``: INT8 on CUDA and on CPUs with int8 dot-product instructions
            (:func:`dgl_rsc.base._deps.int_mm_fast_on_cpu`), fp32 elsewhere. An INT8 GEMM
            without those instructions costs an fp32 GEMM plus the quantization passes
            (the integers go through fp32 BLAS, :mod:`dgl_rsc.int8.gemm`), so it can only
            be slower; the sparse products, bound by the bytes they gather, are INT8
            everywhere.
    """

    rounding: str = "stochastic"
    seed: int = 0
    keep_last: bool = True
    backend: str = "auto"
    dense: str = "auto"

    def __post_init__(self):
        if self.rounding not in ROUNDINGS:
            raise ValueError(
                f"rounding={self.rounding!r} is not one of {', '.join(ROUNDINGS)}; use "
                "'nearest' or 'stochastic'."
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {self.seed!r}.")
        if not isinstance(self.keep_last, bool):
            raise ValueError(f"keep_last must be True or False, got {self.keep_last!r}.")
        if self.dense not in DENSE:
            raise ValueError(
                f"dense={self.dense!r} is not one of {', '.join(DENSE)}; use 'auto' (INT8 "
                "weight products where the hardware has int8 GEMMs), 'int8' or 'fp32'."
            )

    def dense_int8(self, device) -> bool:
        """Whether the weight products run in INT8 on ``device`` (see ``dense``)."""
        if self.dense != "auto":
            return self.dense == "int8"
        return torch.device(device).type == "cuda" or _deps.int_mm_fast_on_cpu()


class Int8State:
    """A layer's INT8 state: the spec, the layer's id, and a counter of quantization calls.

    ``next_seed()`` returns ``stream_seed(spec.seed, layer, call)`` and advances the counter.
    ``training`` mirrors the layer's mode (set by the layer at each forward): stochastic
    rounding applies in training only; an evaluation forward rounds to nearest, so its
    predictions are deterministic.
    """

    __slots__ = ("spec", "layer", "calls", "training")

    def __init__(self, spec: Int8Spec, layer: int = 0):
        self.spec, self.layer, self.calls, self.training = spec, int(layer), 0, True

    @property
    def stochastic(self) -> bool:
        return self.spec.rounding == "stochastic" and self.training

    def next_seed(self) -> int:
        seed = stream_seed(self.spec.seed, self.layer, self.calls)
        self.calls += 1
        return seed

    def __repr__(self) -> str:
        return f"Int8State(rounding={self.spec.rounding}, layer={self.layer}, calls={self.calls})"
