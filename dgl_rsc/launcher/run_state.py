"""What one training run trains with (model, graph, optimizer, controller, AMP), and the one
training step of every mode: full-graph, distributed and mini-batch epochs differ only in the
forward they hand to :meth:`RunState.train_step` and in the loop around it."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from typing import Callable, Optional

import torch

from ..base.memory import minor_faults
from ..core.controller import RSCController

__all__ = ["RunState", "sync"]


def sync(device: torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA), so that a timer measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    forward: Optional[Callable] = None  # the compiled model (train.compile), or None

    def __call__(self, *args):
        """The training forward: the compiled model where there is one, else the model."""
        return (self.model if self.forward is None else self.forward)(*args)

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

    def train_step(self, forward_loss: Callable[[], torch.Tensor], reducer, device,
                   feed_guard: bool = True, start: Optional[float] = None) -> dict:  # fmt: skip
        """One optimizer step: ``forward_loss()`` under the run's autocast, the loss's value
        through ``reducer`` (summed over ranks in a distributed run), the backward, the
        reducer's gradient sum, the optimizer step and RSC's ``step`` (given the loss when
        ``feed_guard``, for the guard's loss trend).

        A non-finite loss stops before the backward and returns ``{"loss": value}`` (the
        caller stops the run). Otherwise returns the loss and the step's seconds:
        ``epoch_s`` (from ``start``, default the call), ``forward_s``, ``backward_s``,
        ``step_s``, and ``minor_faults``, the pages the process faulted in during the call
        (fresh allocations touched first: what :func:`dgl_rsc.keep_freed_memory` removes).
        """
        self.model.train()
        faults = minor_faults()
        t0 = time.perf_counter() if start is None else start
        with self.autocast():
            loss = forward_loss()
        sync(device)
        t1 = time.perf_counter()
        value = reducer.value(loss)
        if not math.isfinite(value):
            return {"loss": value}
        self.backward(loss)
        reducer.after_backward(self.model)
        sync(device)
        t2 = time.perf_counter()
        self.step(value if feed_guard else None)
        sync(device)
        t3 = time.perf_counter()
        return {"loss": value, "epoch_s": t3 - t0, "forward_s": t1 - t0,
                "backward_s": t2 - t1, "step_s": t3 - t2,
                "minor_faults": minor_faults() - faults}  # fmt: skip
