"""What one training run trains with (model, graph, optimizer, controller, AMP), and the one
code path of its autocast, backward and optimizer step, shared by full-graph and mini-batch
epochs."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Optional

import torch

from ..controller import RSCController

__all__ = ["RunState"]


@dataclasses.dataclass
class RunState:
    """What one run trains with; ``ctl`` is ``None`` for the stock baseline."""

    model: torch.nn.Module
    graph: object
    opt: torch.optim.Optimizer
    ctl: Optional[RSCController]
    ctx: contextlib.AbstractContextManager
    amp: str
    scaler: Optional[torch.cuda.amp.GradScaler]
    batches: object = None  # the BatchSource of mini-batch training, or None

    def autocast(self):
        """The forward's autocast context (``train.amp``; a no-op for ``"none"``)."""
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.amp)
        return torch.autocast("cuda", dtype=dtype) if dtype else contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        """Gradients of ``loss`` (scaled under fp16 AMP), the previous ones cleared."""
        self.opt.zero_grad(set_to_none=True)
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def step(self, loss=None) -> None:
        """The optimizer step (through the fp16 scaler when there is one), then RSC's;
        ``loss`` (a float, optional) feeds the controller's guard."""
        if self.scaler:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()
        if self.ctl is not None:
            self.ctl.step(loss)
