"""Where INT8 pays, decided by measurement (:data:`dgl_rsc.base.pick.PICKS`).

Three choices, each once per run and per shape:

* ``"int_mm"``: which engine computes an integer product ``qa @ qb``: ``torch._int_mm`` where
  this torch has it for the device, the exact fp32-BLAS engine (``"float32"``, or
  ``"float64"`` where fp32 products may round lower) elsewhere too (:mod:`.gemm`). All give
  the same integers. Probed on a slice of the operands (:data:`PROBE`), never at full size:
  ``_int_mm`` on a CPU without int8 dot products is 19x an fp32 GEMM (AVX2 EPYC, torch
  2.15).
* ``"int8_dense"``: whether a weight product runs in fp32 or in INT8 (and on which integer
  engine), its quantization and dequantization included: ``Int8Spec.dense`` ``"auto"`` keeps
  the fastest of fp32 and every integer engine, ``"int8"`` the fastest integer engine.
* ``"int8_sparse"``: whether a sparse product runs in INT8 (its operand's quantization
  included) or on the exact fp32 engine: ``Int8Spec.sparse`` ``"auto"`` times both on the
  real product (their costs are of one order) and keeps the faster.

So INT8 on a CPU without fast int8 arithmetic uses only what pays there, and is never slower
than fp32 by more than the first products' measurements. Tests inject a fake timer
(``PICKS.timer``).
"""

from __future__ import annotations

from typing import Callable

import torch

from ..base import _deps
from ..base.pick import PICKS, TRIALS, fingerprint

__all__ = ["PROBE", "int8_engines", "int_mm_engine", "dense_engine", "sparse_choice",
           "sparse_kept", "sparse_measuring"]  # fmt: skip

#: the largest rows and contraction of a probe of a dense product
PROBE = 4096


def int8_engines(device) -> tuple:
    """The engines of :data:`dgl_rsc.int8.gemm.INT_MM` worth timing on ``device``:
    ``torch._int_mm`` where it runs there, and on the CPU the exact BLAS engine (``float32``
    while fp32 products are computed in fp32, else ``float64``)."""
    if torch.device(device).type == "cuda":
        return ("int_mm",)
    blas = "float32" if torch.get_float32_matmul_precision() == "highest" else "float64"
    return (("int_mm",) if _deps.int_mm_on_cpu() else ()) + (blas,)


def _probe(a: torch.Tensor, b: torch.Tensor) -> tuple:
    """Slices of ``a (M, K)`` and ``b (K, N)`` of at most :data:`PROBE` rows and contraction."""
    k = min(a.shape[1], PROBE)
    return a[: min(a.shape[0], PROBE), :k].contiguous(), b[:k].contiguous()


def _key(a: torch.Tensor, b: torch.Tensor, *labels) -> tuple:
    return fingerprint(a.device.type, a.shape[0], a.shape[1], b.shape[1], *labels, exact=False)


def int_mm_engine(qa: torch.Tensor, qb: torch.Tensor, run: Callable) -> str:
    """The fastest engine of :func:`int8_engines` for ``qa (M, K) @ qb (K, N)`` (int8), timed
    on a probe; ``run(qa, qb, engine)`` computes one."""
    pa, pb = _probe(qa, qb)
    probes = {e: (lambda e=e: run(pa, pb, e)) for e in int8_engines(qa.device)}
    return PICKS.decide("int_mm", _key(qa, qb, torch.get_float32_matmul_precision()), probes)


def dense_engine(a: torch.Tensor, b: torch.Tensor, mode: str, int8_mm: Callable,
                 *labels) -> str:  # fmt: skip
    """``"fp32"`` or the integer engine that runs ``a (M, K) @ b (K, N)`` (fp32 operands)
    for ``Int8Spec.dense`` ``mode``; ``int8_mm(a, b, engine)`` is the whole INT8 product
    (quantize both operands, integer product, dequantize), timed on a probe beside fp32's
    ``a @ b``. ``labels`` join the key (a product known by a probe of its operand)."""
    if mode == "fp32":
        return "fp32"
    pa, pb = _probe(a.detach(), b.detach())
    probes = {e: (lambda e=e: int8_mm(pa, pb, e)) for e in int8_engines(a.device)}
    if mode == "auto":
        probes = {"fp32": lambda: torch.matmul(pa, pb), **probes}
    key = _key(a, b, mode, torch.get_float32_matmul_precision(), *labels)
    return PICKS.decide("int8_dense", key, probes)


def sparse_choice(A, X: torch.Tensor, mode: str, int8: Callable, fp32: Callable):
    """The product ``A (M, N) @ X (N, D)`` in INT8 (``int8()``) or fp32 (``fp32()``) per
    ``Int8Spec.sparse`` ``mode``; ``"auto"`` times both on the first products of each shape
    (after the fp32 product's own engine choice, :mod:`dgl_rsc.sparse.engine_pick`, has
    settled: its trials run both of its engines) and keeps the faster, returning the INT8
    result while measuring."""
    if mode == "int8":
        return int8()
    if mode == "fp32":
        return fp32()
    return PICKS.run("int8_sparse", _sparse_key(A, X.shape[1], X.device), {"int8": int8,
                     "fp32": fp32}, keep="int8", trials=2 * TRIALS)  # fmt: skip


def _sparse_key(A, width: int, device) -> tuple:
    return fingerprint(torch.device(device).type, A.shape[0], A.shape[1], A.nnz, width,
                       A.values is not None, exact=False)  # fmt: skip


def sparse_measuring(A, width: int, mode: str, device) -> bool:
    """Whether the INT8 and fp32 products ``A @ X`` are still being timed (``"auto"``)."""
    return mode == "auto" and PICKS.chosen("int8_sparse", _sparse_key(A, width, device)) is None


def sparse_kept(A, width: int, mode: str, device) -> bool:
    """Whether the product ``A @ X`` (``X`` ``width`` wide) runs in INT8 from now on:
    ``mode`` ``"int8"``, or ``"auto"`` with the choice made and INT8 kept (while it is
    measured: ``False``)."""
    if mode != "auto":
        return mode == "int8"
    return PICKS.chosen("int8_sparse", _sparse_key(A, width, device)) == "int8"
