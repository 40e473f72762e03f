"""The docstring examples of every package module run (modules whose optional dependency is
missing here are skipped with the reason)."""

import doctest
import importlib
import pkgutil

import pytest

import dgl_rsc

OPTIONAL = {  # modules that import an optional dependency at import time
    "dgl_rsc.backends.cupy_backend": "cupy with a CUDA device",
    "dgl_rsc.backends.numba_backend": "numba's CUDA target (a GPU or the simulator)",
    "dgl_rsc.distributed.quant_numba": "numba's CUDA target (a GPU or the simulator)",
}


def modules():
    names = ["dgl_rsc"]
    for info in pkgutil.walk_packages(dgl_rsc.__path__, "dgl_rsc."):
        names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", modules())
def test_docstring_examples_run(name):
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        if name in OPTIONAL:
            pytest.skip(f"{name} needs {OPTIONAL[name]}: {exc}")
        raise
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
