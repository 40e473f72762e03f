"""Whether ``torch.compile`` is tracing the current call, on a torch whose custom operators
(``torch.library.custom_op``, torch >= 2.4) the package's compiled paths use."""

from __future__ import annotations

import torch

from . import _deps

__all__ = ["HAS_OPS", "compiling"]

#: ``torch.library.custom_op`` and ``register_fake`` exist (torch >= 2.4)
HAS_OPS = _deps.TORCH_VERSION >= (2, 4)

_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)


def compiling() -> bool:
    """``True`` while dynamo traces (then the package's operators run as custom operators)."""
    return HAS_OPS and _is_compiling is not None and bool(_is_compiling())
