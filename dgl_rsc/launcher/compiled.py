"""``train.compile: true``: the training forward through ``torch.compile``, and what the
compile cost.

Each run compiles afresh (``torch._dynamo.reset()`` first), so every run pays its own compile
in its first epochs, counted in its ``train_time_s`` and so in the time to accuracy. The
epoch means of the report leave the first epoch out; the record's ``compile`` entry says what
the compile cost: ``seconds``, the first epoch's time beyond the median of the others (the
compile, and the first call's one-off work that an eager run pays too, a small part), and
``frames``, the frames dynamo compiled (1 + recompiles).
"""

from __future__ import annotations

import statistics
from typing import Callable, Optional, Sequence

import torch

__all__ = ["CompiledForward", "compiled_forward", "compile_summary"]


class CompiledForward:
    """``torch.compile(model)`` and the count of frames dynamo had compiled before it."""

    def __init__(self, model: torch.nn.Module):
        torch._dynamo.reset()  # the run pays its own compile
        self.frames_before = _frames()
        self.fn: Callable = torch.compile(model)

    def __call__(self, *args):
        return self.fn(*args)

    def frames(self) -> Optional[int]:
        """Frames compiled since (1 + recompiles, for one compiled model)."""
        now = _frames()
        return None if now is None else now - self.frames_before


def compiled_forward(model: torch.nn.Module) -> CompiledForward:
    """The run's compiled forward, dynamo's caches cleared first."""
    return CompiledForward(model)


def _frames() -> Optional[int]:
    counters = getattr(torch._dynamo.utils, "counters", None)
    if counters is None:
        return None
    return int(counters["stats"].get("unique_graphs", 0))


def compile_summary(history: Sequence[dict], forward: CompiledForward) -> dict:
    """``{"seconds", "frames"}`` of a compiled run from its epoch records (see the module)."""
    times = [h["epoch_s"] for h in history]
    rest = times[1:]
    seconds = max(times[0] - statistics.median(rest), 0.0) if rest else None
    return {"seconds": seconds, "frames": forward.frames()}
