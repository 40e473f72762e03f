"""What makes per-rank training equal to training on the whole graph: the loss normalized by
the *global* number of training nodes, the gradients summed over ranks, the metrics computed
over all ranks' nodes.

The launcher's training loop calls a reducer at these points; :class:`LocalReducer` is the
single-process one, :class:`DistReducer` the distributed one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..data.metrics import evaluate
from .controller import gather_rows
from .runtime import DistContext

__all__ = ["LocalReducer", "DistReducer", "loss_sum"]


def loss_sum(task: str, logits: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """The summed loss of the rows given (cross-entropy, or BCE summed over tasks)."""
    if task == "multilabel":
        return F.binary_cross_entropy_with_logits(logits, label.to(logits.dtype), reduction="sum")
    return F.cross_entropy(logits, label, reduction="sum")


class LocalReducer:
    """One process: the mean loss, gradients as they are, metrics on the local nodes."""

    dist = None

    def loss(self, task, logits, label) -> torch.Tensor:
        if task == "multilabel":
            return F.binary_cross_entropy_with_logits(logits, label.to(logits.dtype))
        return F.cross_entropy(logits, label)

    def value(self, loss: torch.Tensor) -> float:
        return float(loss.detach())

    def after_backward(self, model) -> None:
        pass

    def metrics(self, metric, logits, label, masks) -> dict:
        return {s: float(evaluate(metric, logits, label, m)) for s, m in masks.items()}


class DistReducer:
    """Per-rank pieces of the whole-graph loss, gradients and metrics.

    Args:
        ctx: the :class:`~dgl_rsc.distributed.runtime.DistContext`.
        train_total: training nodes over all ranks (times the task count for multilabel).
    """

    def __init__(self, ctx: DistContext, train_total: int):
        self.ctx, self.dist = ctx, ctx
        self.train_total = max(int(train_total), 1)

    def loss(self, task, logits, label) -> torch.Tensor:
        """This rank's share of the whole-graph mean loss (the shares add up to it)."""
        return loss_sum(task, logits, label) / self.train_total

    def value(self, loss: torch.Tensor) -> float:
        """The whole-graph loss: the sum of the ranks' shares."""
        t = loss.detach().double().reshape(1).clone()
        return float(self.ctx.all_reduce_(t))

    def after_backward(self, model) -> None:
        """Sum the gradients over ranks (one all-reduce of a flat buffer)."""
        params = [p for p in model.parameters() if p.grad is not None]
        if not params or self._grad_peers() == 1:
            return
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        self._sum_grads_(flat)
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n

    def _grad_peers(self) -> int:
        """How many ranks the gradients are summed over."""
        return self.ctx.world_size

    def _sum_grads_(self, flat: torch.Tensor) -> None:
        """Sum the flat gradient buffer over the ranks in place."""
        self.ctx.all_reduce_(flat, kind="allreduce")

    def metrics(self, metric, logits, label, masks) -> dict:
        """The metric of each split over the nodes of all ranks."""
        out = {}
        for split, mask in masks.items():
            if metric == "accuracy":
                hits = (logits[mask].argmax(1) == label[mask]).sum().double()
                t = torch.stack([hits, mask.sum().double()])
                self.ctx.all_reduce_(t)
                out[split] = float(t[0] / t[1]) if float(t[1]) else float("nan")
                continue
            lg, lb = logits[mask].double(), label[mask].double()
            lb = lb.unsqueeze(1) if lb.dim() == 1 else lb
            rows, _ = gather_rows(torch.cat([lg, lb], dim=1), self.ctx)
            all_logits, all_label = rows[:, : lg.shape[1]], rows[:, lg.shape[1] :]
            if label.dim() == 1:
                all_label = all_label.squeeze(1).long()
            out[split] = float(evaluate(metric, all_logits.float(), all_label))
        return out
