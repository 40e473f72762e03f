"""What an INT8 layer is told: the rounding mode, the seed of its random numbers, the kernels.

:class:`Int8Spec` is the frozen, validated choice (one per model); :class:`Int8State` is the
per-layer object that hands every quantization call its own 32-bit seed, so stochastic
rounding is reproducible (same spec, same calls, same codes) and every call draws fresh
random numbers.
"""

from __future__ import annotations

import dataclasses

from ..quant.rounding import stream_seed

__all__ = ["ROUNDINGS", "PRECISIONS", "DENSE", "SPARSE", "SAVED", "Int8Spec", "Int8State"]

ROUNDINGS = ("nearest", "stochastic")
PRECISIONS = ("fp32", "int8")
DENSE = ("auto", "int8", "fp32")
SPARSE = DENSE
#: the precisions of the activations a weight gradient keeps (:mod:`dgl_rsc.int8.saved`)
SAVED = ("int8", "fp32")


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
        dense: the weight products (``X @ W`` and its gradients): ``"auto"``, each product
            in fp32 or in INT8, whichever measured faster for its shape on this machine
            (:mod:`dgl_rsc.int8.choose`: on a CPU without int8 dot products an INT8 GEMM
            costs an fp32 GEMM plus its quantization, or 19x fp32 through
            ``torch._int_mm``, so fp32 is kept; with VNNI or AMX, INT8 where it is faster);
            ``"int8"`` (the fastest integer engine) or ``"fp32"`` everywhere.
        sparse: the sparse products, likewise: ``"auto"`` (INT8, its operand's quantization
            included, or the exact fp32 engine, whichever measured faster per shape),
            ``"int8"`` or ``"fp32"``.
        saved: the activations the weight gradients keep from the forward to the backward:
            ``"int8"`` (codes per row, :mod:`dgl_rsc.int8.saved`: a quarter of the memory,
            the error of one quantization in the weight gradients) or ``"fp32"``.
    """

    rounding: str = "stochastic"
    seed: int = 0
    keep_last: bool = True
    backend: str = "auto"
    dense: str = "auto"
    sparse: str = "auto"
    saved: str = "int8"

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
        for name, value in (("dense", self.dense), ("sparse", self.sparse)):
            if value not in DENSE:
                raise ValueError(
                    f"{name}={value!r} is not one of {', '.join(DENSE)}; use 'auto' (INT8 "
                    "where it measured faster than fp32), 'int8' or 'fp32'."
                )
        if self.saved not in SAVED:
            raise ValueError(f"saved={self.saved!r} is not 'int8' or 'fp32' (the precision of "
                             "the activations kept for the weight gradients).")  # fmt: skip


class Int8State:
    """A layer's INT8 state: the spec, the layer's id, and a counter of quantization calls.

    ``next_seed()`` returns ``stream_seed(spec.seed, layer, call)`` and advances the counter.
    ``training`` mirrors the layer's mode (set by the layer at each forward): stochastic
    rounding applies in training only; an evaluation forward rounds to nearest, so its
    predictions are deterministic. ``prepared``: codes of the next sparse product's operand
    written ahead by the fused epilogue (:mod:`dgl_rsc.int8.codes`), taken by that product.
    """

    __slots__ = ("spec", "layer", "calls", "training", "prepared", "_weights")

    def __init__(self, spec: Int8Spec, layer: int = 0):
        self.spec, self.layer, self.calls, self.training = spec, int(layer), 0, True
        self.prepared = None
        self._weights: dict = {}

    @property
    def stochastic(self) -> bool:
        return self.spec.rounding == "stochastic" and self.training

    def next_seed(self) -> int:
        seed = stream_seed(self.spec.seed, self.layer, self.calls)
        self.calls += 1
        return seed

    def quantize(self, x, dim):
        """``(q, s)`` of ``x (R, C)`` with one scale per slice along ``dim``
        (:func:`dgl_rsc.int8.quantize.quantize`) by the spec's kernels: stochastic rounding
        with the next seed in training, nearest otherwise."""
        from ..backends import resolve_int8
        from .quantize import quantize

        kernels = resolve_int8(self.spec.backend, x.device)
        codes, rows = kernels.quantize_codes, getattr(kernels, "row_amax", None)
        if not self.stochastic:
            return quantize(x, dim, "nearest", 0, codes, rows)
        return quantize(x, dim, "stochastic", self.next_seed(), codes, rows)

    def weight_codes(self, w):
        """``(q (K, O) int8, s (1, 1))``: ``w``'s codes with one scale, made once per value
        of ``w`` (an optimizer step changes its version) and rounding mode, shared by the
        forward and the backward products."""
        key = (w.data_ptr(), w._version, tuple(w.shape), self.stochastic)
        hit = self._weights.get(id(w))
        if hit is None or hit[0] != key:
            hit = (key, self.quantize(w.detach(), None))
            self._weights[id(w)] = hit
        return hit[1]

    def __repr__(self) -> str:
        return f"Int8State(rounding={self.spec.rounding}, layer={self.layer}, calls={self.calls})"
