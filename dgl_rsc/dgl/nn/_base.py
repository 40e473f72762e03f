"""What every drop-in RSC layer shares: its controller slots and the approximated aggregation."""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from torch import nn

from ...backends.narrow_mm import narrow_mm, padded_mm
from ...backends.narrow_mm import takes as takes_narrow
from ...base.user_warnings import warn_user
from ...core.controller import RSCController
from ...core.ops import compiling, slot_ref
from ...core.ops import handle as op_handle
from ...core.spmm import spmm_matrix
from ...int8.gemm import int8_matmul
from ...int8.saved import saved_matmul
from ...int8.spec import Int8State
from ...sparse.structure_cache import StructureCache
from ..interop import message_structure
from .errors import layer_error
from .input_cache import InputAggregationCache
from .messages import feature_weighted_sum, resolve_edge_weight

__all__ = [
    "RSCLayer",
    "check_in_degrees",
    "expand_as_pair",
    "ZERO_IN_DEGREE_MESSAGE",
    "UNATTACHED_MESSAGE",
]

ZERO_IN_DEGREE_MESSAGE = (
    "There are 0-in-degree nodes in the graph, output for those nodes will be invalid. This "
    "is harmful for some applications, causing silent performance regression. Adding "
    "self-loop on the input graph by calling `g = dgl.add_self_loop(g)` (or "
    "`g.add_self_loop()` for a dgl_rsc.Graph) will resolve the issue. Setting "
    "``allow_zero_in_degree`` to be `True` when constructing this module will suppress the "
    "check and let the code run."
)

UNATTACHED_MESSAGE = (
    "{name} is not attached to an RSC controller, so its backward is exact (no RSC). Attach "
    "the model's layers with `rsc = dgl_rsc.nn.attach(model, budget=0.1, total_steps=...)` "
    "and call `rsc.step()` after each optimizer step; `dgl_rsc.nn.exact(model)` chooses the "
    "exact backward without this warning."
)


def check_in_degrees(graph) -> None:
    """Raise :class:`~dgl_rsc.nn.RSCLayerError` (a ``dgl.DGLError`` with DGL) when a node has
    no in-edges."""
    zero = getattr(graph, "zero_in_degree", None)  # a dgl_rsc.Graph knows (torch.compile)
    if zero if zero is not None else bool((graph.in_degrees() == 0).any()):
        raise layer_error(ZERO_IN_DEGREE_MESSAGE)


def expand_as_pair(feat, graph):
    """``(feat_src, feat_dst)`` as DGL's ``expand_as_pair``: a pair as given; on a block the
    destination features are the first ``N_dst`` rows of ``feat``; else ``feat`` twice."""
    if isinstance(feat, tuple):
        return feat
    if getattr(graph, "is_block", False):
        return feat, feat[: graph.num_dst_nodes()]
    return feat, feat


class RSCLayer(nn.Module):
    """Base of the drop-in convolutions.

    A layer runs :attr:`rsc_products` approximated sparse products per forward; product
    ``j`` is driven by slot ``rsc_index + j`` of the controller the layer is attached to
    (:func:`dgl_rsc.nn.attach` gives the layers of a model consecutive slots in module
    order). A layer that was never attached computes the exact backward and warns once
    (a training forward of an unattached layer almost always means a forgotten ``attach``);
    :func:`dgl_rsc.nn.exact` asks for the exact backward without the warning.
    """

    #: approximated sparse products per forward, each with its own controller slot
    rsc_products: int = 1

    def __init__(self):
        super().__init__()
        self._rsc_ctl: Optional[RSCController] = None
        self._rsc_index = 0
        self._rsc_mode = "unattached"  # "attached" | "exact" | "unattached"
        self._rsc_warned = False
        self._rsc_structures: Optional[StructureCache] = None
        self._rsc_int8: Optional[Int8State] = None
        self._rsc_saved: Optional[Int8State] = None
        self._rsc_input_cache = InputAggregationCache()

    # -- attachment -------------------------------------------------------------------
    def rsc_attach(self, controller: RSCController, index: int) -> None:
        """Drive product ``j`` of this layer by slot ``index + j`` of ``controller``."""
        self.clear_cache()
        self._rsc_ctl, self._rsc_index, self._rsc_mode = controller, int(index), "attached"
        op_handle(controller)  # known to the custom operators before torch.compile traces
        self._rsc_input_cache.notify = controller.note_cached_input  # compiled reuse counts

    def rsc_exact(self) -> None:
        """Use the exact backward (no controller, no sampling, no warning)."""
        self.clear_cache()
        self._rsc_ctl, self._rsc_index, self._rsc_mode = None, 0, "exact"
        self._rsc_input_cache.notify = None

    def rsc_controller(self) -> Optional[RSCController]:
        """The controller driving this layer, or ``None`` (exact backward)."""
        return self._rsc_ctl

    def rsc_slots(self) -> range:
        """The controller slots of this layer's products (empty when not attached)."""
        if self._rsc_ctl is None:
            return range(0)
        return range(self._rsc_index, self._rsc_index + self.rsc_products)

    def clear_cache(self) -> None:
        """Drop RSC's cached row samples of this layer's products (called by
        ``reset_parameters``: new weights make the old samples stale)."""
        if self._rsc_ctl is not None:
            states = self._rsc_ctl.layers
            for i in self.rsc_slots():
                if i < len(states):  # a slot that never ran has no state to clear
                    states[i].clear_cache()
        self._rsc_structures = None
        self._rsc_input_cache.clear()

    # -- precision --------------------------------------------------------------------
    def rsc_set_int8(self, state: Optional[Int8State]) -> None:
        """Run this layer's products in INT8 (``state``, see :func:`dgl_rsc.int8.quantize_model`)
        or in the operands' precision (``None``)."""
        if state is not None and not isinstance(state, Int8State):
            raise TypeError(f"state must be an Int8State or None, got {type(state).__name__}.")
        self._rsc_int8 = state

    def rsc_int8(self) -> Optional[Int8State]:
        """This layer's INT8 state, or ``None`` (fp32 products)."""
        return self._rsc_int8

    def rsc_set_saved_int8(self, state: Optional[Int8State]) -> None:
        """Keep the activations this fp32 layer's weight gradients save in INT8 (``state``,
        :mod:`dgl_rsc.int8.saved`; the last layer of an INT8 model), or in fp32 (``None``)."""
        if state is not None and not isinstance(state, Int8State):
            raise TypeError(f"state must be an Int8State or None, got {type(state).__name__}.")
        self._rsc_saved = state

    def _matmul(self, x: torch.Tensor, w: torch.Tensor, reassociate: bool = False):
        """``x @ w``: on a quantized layer each product (forward and gradients) in INT8 or
        fp32, whichever its spec's ``dense`` asks or measured faster
        (:mod:`dgl_rsc.int8.choose`); ``reassociate``: a narrow ``w`` on the CPU through
        :func:`narrow_mm` (equal up to rounding)."""
        state = self._rsc_int8
        narrow = reassociate and takes_narrow(x, w)  # under 16 wide: INT8 never pays there
        if (
            state is None
            or w.dim() != 2
            or state.spec.dense == "fp32"
            or (narrow and state.spec.dense == "auto")
        ):
            saved = self._rsc_saved if state is None else state
            if _saves_int8(saved, x, w):
                saved.training = self.training
                return saved_matmul(x, w, saved, padded_mm if narrow else None)
            return narrow_mm(x, w) if reassociate else torch.matmul(x, w)
        state.training = self.training
        return int8_matmul(x, w, state)

    # -- the aggregation --------------------------------------------------------------
    def _aggregate(
        self, graph, feat: torch.Tensor, edge_weight=None, *, slot: int = 0, **scales
    ) -> torch.Tensor:
        """``(N_dst, *F)`` sum over in-edges of ``w_e * feat[src]`` (DGL's ``copy_u`` /
        ``u_mul_e`` with ``sum``); the backward of product ``slot`` approximated by RSC.

        ``feat``: ``(N_src, *F)``. ``edge_weight``: ``(E,)``, ``(E, 1)`` or per feature
        ``(E, *W)`` (then computed exactly, see :mod:`dgl_rsc.nn.messages`). ``scales``:
        ``row_scale``/``row_divide``, ``col_scale`` and ``score_col_scale`` of
        :func:`dgl_rsc.core.spmm.spmm_matrix` (the layer's normalization, fused into the product).
        """
        if not 0 <= slot < self.rsc_products:
            raise IndexError(
                f"slot {slot} is out of range: {type(self).__name__} declares "
                f"rsc_products={self.rsc_products}."
            )
        custom = getattr(graph, "rsc_aggregate", None)
        if custom is not None:  # a graph with its own aggregation (a distributed LocalGraph)
            if self._rsc_int8 is not None:
                raise layer_error(
                    "INT8 products are not supported on a distributed graph; train with "
                    "precision fp32 (dgl_rsc.int8.dequantize_model(model))."
                )
            return custom(feat, edge_weight, lambda A: self._backward_state(slot, feat, A),
                          **scales)  # fmt: skip
        A, eids = message_structure(graph, self._structures())
        if feat.dim() == 0 or feat.shape[0] != A.shape[1]:
            raise layer_error(
                f"feat has shape {tuple(feat.shape)} but the graph has {A.shape[1]} source "
                f"nodes; node features must be ({A.shape[1]}, D)."
            )
        weights = resolve_edge_weight(edge_weight, graph.num_edges(), feat)
        if weights.per_feature:
            return feature_weighted_sum(A, eids, feat, weights, **scales)
        if weights.values is not None:
            A = A.with_values(weights.values if eids is None else weights.values[eids])
        flat = feat.reshape(feat.shape[0], math.prod(feat.shape[1:]))
        state = self._backward_state(slot, feat, A)
        if self._rsc_int8 is not None:
            self._rsc_int8.training = self.training
        out = spmm_matrix(A, flat, state, quant=self._rsc_int8,
                          memo=self._memo(graph, feat, weights.values), **scales)  # fmt: skip
        return out.reshape((A.shape[0],) + weights.out_tail)

    def _memo(self, graph, feat: torch.Tensor, values) -> int:
        """While torch.compile traces: the input cache's memo handle for a product of input
        ``feat`` that eager code would reuse across steps (:mod:`.input_cache`); else 0."""
        if not compiling() or self._rsc_int8 is not None or not self._rsc_input_cache.enabled:
            return 0
        return self._rsc_input_cache.handle if _constant_input(graph, feat, values) else 0

    def _cached_input(self, graph, feat, edge_weight, build: Callable[[], torch.Tensor]):
        """``build()``'s ``(N_dst, D)`` aggregation of ``feat``, computed once and reused while
        ``feat``, the graph and ``edge_weight`` stay the same (:mod:`.input_cache`; in fp32 on an
        INT8 layer, whose transform stays INT8 where its spec says), or ``None``
        where that cannot hold: then the layer computes its plain path (also while traced by
        torch.compile: the cache's state changes over the first steps and would recompile)."""
        if (not isinstance(feat, torch.Tensor) or compiling()
                or getattr(graph, "rsc_aggregate", None) is not None
                or not _constant_input(graph, feat, edge_weight)):  # fmt: skip
            return None
        if edge_weight is not None and edge_weight.numel() != graph.num_edges():
            return None
        A, _ = message_structure(graph, self._structures())
        used = None if self._rsc_ctl is None else self._rsc_ctl.note_cached_input
        return self._rsc_input_cache.get(feat, (A.indptr, A.indices, edge_weight),
                                         lambda: self._fp32(build), used)  # fmt: skip

    def _fp32(self, build: Callable[[], torch.Tensor]) -> torch.Tensor:
        """``build()`` with this layer's products in fp32: a product computed once per run
        gains nothing from INT8 and would keep one draw of its rounding error for good."""
        state, self._rsc_int8 = self._rsc_int8, None
        try:
            return build()
        finally:
            self._rsc_int8 = state

    def _structures(self) -> StructureCache:
        if self._rsc_ctl is not None:
            return self._rsc_ctl.structures
        if self._rsc_structures is None:
            self._rsc_structures = StructureCache()
        return self._rsc_structures

    def _backward_state(self, slot: int, feat: torch.Tensor, A):
        """The controller slot that approximates this product's backward, or ``None``."""
        if not (torch.is_grad_enabled() and feat.requires_grad) or A.nnz == 0:
            return None
        if self._rsc_mode == "attached":
            return slot_ref(self._rsc_ctl, self._rsc_index + slot)  # bound when it runs
        if self._rsc_mode == "unattached" and not self._rsc_warned:
            self._rsc_warned = True
            warn_user(UNATTACHED_MESSAGE.format(name=type(self).__name__))
        return None


def _saves_int8(state: Optional[Int8State], x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether an fp32 ``x @ w`` keeps ``x`` for its weight gradient in INT8: the state says
    so and ``x`` is an activation (it needs a gradient), the weight a parameter in training."""
    if state is None or state.spec.saved != "int8" or x.dim() != 2 or w.dim() != 2:
        return False
    return torch.is_grad_enabled() and x.requires_grad and w.requires_grad


def _constant_input(graph, feat: torch.Tensor, edge_weight) -> bool:
    """Nothing an aggregation of ``feat`` reads needs a gradient and ``graph`` is a whole
    graph (not a block): the same product may serve every step (:mod:`.input_cache`)."""
    if feat.requires_grad or getattr(graph, "is_block", False):
        return False
    return edge_weight is None or not edge_weight.requires_grad
