"""The docstring examples of every package module run. Modules that import Numba's CUDA
target run in a subprocess under Numba's CUDA simulator; a module whose optional dependency is
missing is skipped with the reason."""

import doctest
import importlib
import os
import pkgutil
import sys

import pytest

import dgl_rsc

from .proc import run as run_cmd

OPTIONAL = {  # modules that import an optional dependency at import time
    "dgl_rsc.backends.cupy_backend": "cupy with a CUDA device",
}
SIMULATED = (
    "dgl_rsc.backends.numba_backend",
    "dgl_rsc.backends.int8_numba",
    "dgl_rsc.distributed.quant_numba",
)
_RUN = (
    "import doctest, importlib, sys; "
    "r = doctest.testmod(importlib.import_module(sys.argv[1]), optionflags=doctest.ELLIPSIS); "
    "print(r.failed, r.attempted); sys.exit(1 if r.failed else 0)"
)


def modules():
    names = ["dgl_rsc"]
    for info in pkgutil.walk_packages(dgl_rsc.__path__, "dgl_rsc."):
        names.append(info.name)
    return sorted(names)


#: modules that need torch_geometric: collected as ``pyg`` tests (the modern environment's leg)
PYG = ("dgl_rsc.pyg.convs",)


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=[pytest.mark.pyg] if n in PYG else []) for n in modules()]
)
def test_docstring_examples_run(name):
    if name in SIMULATED:  # the simulator must be on before Numba is imported: a new process
        env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
        done = run_cmd([sys.executable, "-c", _RUN, name], env=env, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        return
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        if name in OPTIONAL:
            pytest.skip(f"{name} needs {OPTIONAL[name]}: {exc}")
        raise
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
