"""Dropout on a rank's node rows.

``global`` (default): every rank draws the mask of the *whole* graph, ``(N, D)``, from the
generator all ranks share (seeded alike, drawn in the same order) and keeps its own rows. The
masks, and so the training, are then those of one process on the whole graph, bit for bit:
``torch.nn.functional.dropout`` on the CPU draws ``bernoulli_(1 - p)`` over the input's shape
and multiplies by ``mask / (1 - p)``, which is what :class:`NodeDropout` does. It costs ``N x D``
random numbers per dropout per rank.

``local``: each rank draws only its rows (``n_own x D``); statistically the same, cheaper, but
not equal to a single-process run.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["NodeDropout", "DROPOUT_MODES", "localize_dropout"]

DROPOUT_MODES = ("global", "local")


class NodeDropout(nn.Module):
    """Dropout of ``(n_own, *D)`` rows as the rows ``owned`` of a ``(num_nodes, *D)`` draw.

    Args:
        p: drop probability.
        owned: ``(n_own,)`` global ids of this rank's rows, in local order.
        num_nodes: ``N``.
        mode: ``"global"`` or ``"local"`` (see the module docstring).
    """

    def __init__(self, p: float, owned: torch.Tensor, num_nodes: int, mode: str = "global"):
        super().__init__()
        if mode not in DROPOUT_MODES:
            raise ValueError(f"dropout mode must be one of {DROPOUT_MODES}, got {mode!r}.")
        self.p, self.num_nodes, self.mode = float(p), int(num_nodes), mode
        self.register_buffer("owned", owned.long(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0 or x.numel() == 0:
            return x
        if self.p == 1.0:
            return x * 0
        if self.mode == "local":
            return nn.functional.dropout(x, self.p, True)
        if x.shape[0] != self.owned.numel():
            raise ValueError(
                f"NodeDropout got {x.shape[0]} rows but the rank owns {self.owned.numel()} "
                "nodes: it applies to node feature rows only."
            )
        full = torch.empty((self.num_nodes,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
        mask = full.bernoulli_(1 - self.p).div_(1 - self.p)
        return x * mask[self.owned]

    def extra_repr(self) -> str:
        return f"p={self.p}, mode={self.mode}, owned={self.owned.numel()}/{self.num_nodes}"


def localize_dropout(model: nn.Module, owned: torch.Tensor, num_nodes: int, mode: str):
    """Replace every ``nn.Dropout`` of ``model`` (in place) by a :class:`NodeDropout`; returns
    ``model``. Dropout inside a layer (``SAGEConv``'s ``feat_drop``) is replaced too."""
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Dropout):
            setattr(model, name, NodeDropout(child.p, owned, num_nodes, mode))
        else:
            localize_dropout(child, owned, num_nodes, mode)
    return model
