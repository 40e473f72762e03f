"""INT8 training (the ideas of Tango, SC'23): the dense and sparse products of the
convolutions on int8 operands with int32 accumulation, dequantized once.

Python API: :func:`quantize_model` (``train.precision: int8`` in the launcher). The pieces:
:mod:`.quantize` (codes and scales), :mod:`.gemm` (dense products), :mod:`.spmm` (sparse
products, kernels in :mod:`dgl_rsc.backends`, their torch reference
:mod:`dgl_rsc.backends.int8_ref`), :mod:`.model` (which layers and what stays in fp32).
"""

from __future__ import annotations

from .gemm import Int8Matmul, int8_matmul, int8_mm, int_mm
from .model import dequantize_model, int8_layers, quantize_model
from .quantize import QMAX, dequantize, quantize
from .spec import PRECISIONS, ROUNDINGS, Int8Spec, Int8State
from .spmm import int8_csr_mm

__all__ = [
    "quantize_model",
    "dequantize_model",
    "int8_layers",
    "Int8Spec",
    "Int8State",
    "PRECISIONS",
    "ROUNDINGS",
    "QMAX",
    "quantize",
    "dequantize",
    "int_mm",
    "int8_mm",
    "int8_matmul",
    "Int8Matmul",
    "int8_csr_mm",
]
