"""INT8 categories of a profiled epoch (``tools/profile_run.py``): where the work around the
int8 arithmetic goes.

:func:`label` wraps the package's INT8 functions in ``torch.profiler.record_function`` ranges
(this tool's process only; a name a version of the package lacks is skipped, so the same
labels apply to older and newer code), and :func:`category` names the category of a profiled
event inside one of those ranges:

- ``int8_scales``: the maxima and scales (``amax``, ``bf16_scale_up``, the column-maxima
  kernels); ``int8_draws``: stochastic rounding's random numbers where they are tensors of
  their own (the torch reference's ``hash_uniform``; the Numba and fused kernels hash inside
  the code pass, counted as ``int8_quantize``); ``int8_quantize``: the code passes;
- ``int8_products``: the integer products (the INT8 sparse kernels, whose dequantize and row
  scale are fused into their last loop, and the ``int_mm`` engines);
- ``int8_dequantize``: a dense product's scaling of its int32 result; ``int8_convert``:
  dtype conversions (int32 to float, codes to float32 for the BLAS engine); ``int8_copies``:
  contiguous copies, padding, zero fills;
- ``int8_other``: the rest inside the INT8 ranges (Python, small ops).
"""

from __future__ import annotations

import functools
import importlib

import torch

__all__ = ["INT8_SPLIT", "label", "category"]

INT8_SPLIT = ("int8_quantize", "int8_scales", "int8_draws", "int8_dequantize", "int8_convert",
              "int8_copies", "int8_products", "int8_other")  # fmt: skip

#: range name -> its own category; every INT8 range starts with "int8::"
RANGE_CATEGORY = {
    "int8::quantize": "int8_quantize",
    "int8::scales": "int8_scales",
    "int8::draws": "int8_draws",
    "int8::product": "int8_products",
    "int8::gemm": "int8_other",
    "int8::sparse": "int8_other",
    "int8::fused_codes": "int8_quantize",
}
#: (module, attribute, range) wrapped by :func:`label`; missing ones are skipped
TARGETS = (
    ("dgl_rsc.int8.spmm", "int8_csr_mm", "int8::sparse"),
    ("dgl_rsc.int8.gemm", "int8_mm", "int8::gemm"),
    ("dgl_rsc.int8.quantize", "quantize", "int8::quantize"),
    ("dgl_rsc.int8.quantize", "bf16_scale_up", "int8::scales"),
    ("dgl_rsc.quant.rounding", "hash_uniform", "int8::draws"),
    ("dgl_rsc.backends.int8_cpu", "_column_amax", "int8::scales"),
    ("dgl_rsc.backends.int8_cpu", "bf16_scale_up", "int8::scales"),
    ("dgl_rsc.backends.int8_cpu", "_scaled_codes", "int8::quantize"),
    ("dgl_rsc.backends.int8_cpu", "_codes", "int8::quantize"),
    ("dgl_rsc.backends.int8_cpu", "_run", "int8::product"),
    ("dgl_rsc.backends.int8_ref", "int8_spmm", "int8::product"),
    ("dgl_rsc.int8.codes", "epilogue_codes", "int8::fused_codes"),
    ("dgl_rsc.int8.codes", "column_scales", "int8::scales"),
)
#: aten ops inside an INT8 range that name their own category
OPS = {
    "aten::amax": "int8_scales", "aten::abs": "int8_scales", "aten::max": "int8_scales",
    "aten::to": "int8_convert", "aten::_to_copy": "int8_convert",
    "aten::copy_": "int8_convert", "aten::mul_": "int8_dequantize",
    "aten::mul": "int8_dequantize", "aten::contiguous": "int8_copies",
    "aten::clone": "int8_copies", "aten::zeros": "int8_copies",
    "aten::new_zeros": "int8_copies", "aten::zero_": "int8_copies",
    "aten::fill_": "int8_copies", "aten::constant_pad_nd": "int8_copies",
    "aten::slice": "int8_copies", "aten::empty": "int8_copies",
}  # fmt: skip


def _wrap(fn, name: str):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with torch.profiler.record_function(name):
            return fn(*args, **kwargs)

    return run


def label() -> list:
    """Wrap :data:`TARGETS` in profiler ranges; returns the ``module.attribute`` names
    wrapped. The INT_MM engines of :mod:`dgl_rsc.int8.gemm` are wrapped as products."""
    done = []
    for mod_name, attr, rng in TARGETS:
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            continue
        fn = getattr(mod, attr, None)
        if fn is None:
            continue
        setattr(mod, attr, _wrap(fn, rng))
        done.append(f"{mod_name}.{attr}")
    gemm = importlib.import_module("dgl_rsc.int8.gemm")
    for key, fn in list(gemm.INT_MM.items()):
        gemm.INT_MM[key] = _wrap(fn, "int8::product")
    return done


def category(range_name: str, event_name: str):
    """The INT8 category of event ``event_name`` whose nearest enclosing range (itself
    included) is ``range_name``, or ``None`` where that range is not an INT8 one."""
    own = RANGE_CATEGORY.get(range_name)
    if own is None:
        return None
    if event_name == range_name or own == "int8_draws":
        return own
    return OPS.get(event_name, own)


def main(argv=None) -> int:
    """Print the INT8 categories and the functions each labelled range covers."""
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.parse_args(argv)
    print("\n".join(INT8_SPLIT))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
