"""What every drop-in RSC layer shares: its controller slot and the approximated aggregation."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..config import RSCConfig
from ..controller import RSCController
from ..graph import adjacency
from ..spmm import spmm_matrix
from ..structure_cache import StructureCache

__all__ = ["RSCLayer", "check_in_degrees", "ZERO_IN_DEGREE_MESSAGE"]

ZERO_IN_DEGREE_MESSAGE = (
    "There are 0-in-degree nodes in the graph, output for those nodes will be invalid. This "
    "is harmful for some applications, causing silent performance regression. Adding "
    "self-loop on the input graph by calling `g = dgl.add_self_loop(g)` (or "
    "`g.add_self_loop()` for a dgl_rsc.graph.Graph) will resolve the issue. Setting "
    "``allow_zero_in_degree`` to be `True` when constructing this module will suppress the "
    "check and let the code run."
)


def check_in_degrees(graph) -> None:
    """Raise ``ValueError`` (DGL raises ``DGLError``) when a node has no in-edges."""
    if bool((graph.in_degrees() == 0).any()):
        raise ValueError(ZERO_IN_DEGREE_MESSAGE)


class RSCLayer(nn.Module):
    """Base of the drop-in convolutions.

    A layer is driven by the controller it is attached to (:func:`dgl_rsc.nn.attach`), as
    layer ``rsc_index`` of it. A layer that is not attached makes a private controller with
    the default :class:`~dgl_rsc.RSCConfig` and counts one step per training forward.
    """

    def __init__(self):
        super().__init__()
        self._rsc_ctl: Optional[RSCController] = None
        self._rsc_index = 0
        self._rsc_private = False
        self._rsc_seen = False
        self._rsc_exact = False
        self._rsc_structures: Optional[StructureCache] = None

    def rsc_attach(self, controller: RSCController, index: int) -> None:
        """Make this layer layer ``index`` of ``controller``."""
        self._rsc_ctl, self._rsc_index, self._rsc_private = controller, index, False
        self._rsc_exact = False

    def rsc_exact(self) -> None:
        """Use the exact backward (no controller, no sampling), like the DGL layer."""
        self._rsc_ctl, self._rsc_index, self._rsc_private = None, 0, False
        self._rsc_exact = True

    def rsc_controller(self) -> RSCController:
        """The controller driving this layer (a private one is made on first use)."""
        if self._rsc_ctl is None:
            self._rsc_ctl = RSCController(RSCConfig())
            self._rsc_index, self._rsc_private = 0, True
        return self._rsc_ctl

    def _aggregate(self, graph, feat: torch.Tensor, edge_weight=None, **scales) -> torch.Tensor:
        """``(N_dst, *F)`` sum over in-edges of ``w_e * feat[src]``; backward approximated.

        ``scales``: ``row_scale``/``row_divide``, ``col_scale`` and ``score_col_scale`` of
        :func:`dgl_rsc.spmm.spmm_matrix` (the layer's normalization, fused into the product).
        """
        if self._rsc_exact:
            if self._rsc_structures is None:
                self._rsc_structures = StructureCache()
            A = adjacency(graph, edge_weight, self._rsc_structures)
            out = spmm_matrix(A, feat.reshape(feat.shape[0], -1), None, **scales)
            return out.reshape((A.shape[0],) + tuple(feat.shape[1:]))
        ctl = self.rsc_controller()
        grad = torch.is_grad_enabled() and feat.requires_grad
        if self._rsc_private and self.training and grad:
            if self._rsc_seen:
                ctl.step()
            self._rsc_seen = True
        A = adjacency(graph, edge_weight, ctl.structures)
        flat = feat.reshape(feat.shape[0], -1)
        state = ctl.slot(self._rsc_index) if grad else None
        out = spmm_matrix(A, flat, state, **scales)
        return out.reshape((A.shape[0],) + tuple(feat.shape[1:]))
