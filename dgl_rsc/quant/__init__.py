"""Rounding rules shared by every quantizer of the package: the halo codec of
:mod:`dgl_rsc.distributed.quant` and the INT8 training products of :mod:`dgl_rsc.int8`."""

from __future__ import annotations

from .rounding import (
    MASK32,
    bf16_grid,
    bf16_scale_up,
    hash_uniform,
    lowbias32,
    stream_seed,
)

__all__ = ["MASK32", "bf16_grid", "bf16_scale_up", "hash_uniform", "lowbias32", "stream_seed"]
