"""Optional dependencies: one probe point, errors that name the fix, and no effect on the
process at import (warnings filters, the environment, NumPy's namespace)."""

import sys

import pytest

from dgl_rsc.base import _deps

from ..proc import run as run_cmd


def test_require_messages_name_the_fix(monkeypatch):
    monkeypatch.setattr(_deps, "cupy_available", lambda: False)
    with pytest.raises(ImportError, match=r"pip install cupy-cuda12x.*backend='torch'"):
        _deps.require_cupy()
    monkeypatch.setattr(_deps, "numba_cuda_available", lambda: False)
    with pytest.raises(ImportError, match="NUMBA_ENABLE_CUDASIM=1"):
        _deps.require_numba_cuda()
    monkeypatch.setattr(_deps, "dgl_available", lambda: False)
    with pytest.raises(ImportError, match="dgl_rsc.spmm_csr and dgl_rsc.Graph"):
        _deps.require_dgl()


@pytest.mark.heavy
def test_importing_dgl_rsc_changes_nothing_in_the_process():
    """No warnings filter installed by dgl_rsc's own code, DGLBACKEND set only while DGL is
    imported, NumPy's namespace untouched (the numba-cuda alias comes with require_numba_cuda)."""
    script = """
import os, sys, warnings
import numpy as np
ours = []
def spy(original):
    def wrapped(*a, **k):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith("dgl_rsc"):
            ours.append(caller)
        return original(*a, **k)
    return wrapped
warnings.filterwarnings = spy(warnings.filterwarnings)
warnings.simplefilter = spy(warnings.simplefilter)
had_row_stack, had_backend = hasattr(np, "row_stack"), "DGLBACKEND" in os.environ
import dgl_rsc, dgl_rsc.nn, dgl_rsc.launcher, dgl_rsc.data, dgl_rsc.sampling
import dgl_rsc.sparse.products
from dgl_rsc.base import _deps
_deps.dgl_available()  # probing DGL sets DGLBACKEND for its import only
assert not ours, f"warnings filters installed by {ours}"
assert ("DGLBACKEND" in os.environ) == had_backend, "DGLBACKEND left in the environment"
assert hasattr(np, "row_stack") == had_row_stack, "numpy namespace changed"
print("clean")
"""
    env = {k: v for k, v in __import__("os").environ.items() if k != "DGLBACKEND"}
    proc = run_cmd([sys.executable, "-c", script], env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "clean" in proc.stdout


def test_every_numba_cuda_user_gets_numpys_alias(monkeypatch):
    """numba-cuda 0.68 calls ``np.row_stack``, gone in NumPy 2.5: ``require_numba_cuda``, the
    one way in for the sampling, codec and INT8 kernels, restores it (on the H200 the codec's
    kernels, imported without the sampling backend, failed to compile before it did)."""
    import numpy as np

    monkeypatch.setattr(np, "__version__", "2.5.2")
    monkeypatch.delattr(np, "row_stack", raising=False)
    monkeypatch.setattr(_deps, "numba_cuda_available", lambda: True)
    monkeypatch.setattr(_deps, "_probe", lambda name: (object(), None))
    _deps.require_numba_cuda()
    assert np.row_stack is np.vstack  # noqa: NPY201 (the alias under test)
