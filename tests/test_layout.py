"""The layout users see: the public paths of the README work, the old module paths warn and
give the same objects, and the tests mirror the package's folders."""

from __future__ import annotations

import importlib
import pathlib
import sys

import pytest

from .proc import run as run_cmd

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: ``old module path -> (new module path, the class a user imported from it)``
MOVED = {
    "dgl_rsc.graph": ("dgl_rsc.sparse.graph", "Graph"),
    "dgl_rsc.csr": ("dgl_rsc.sparse.csr", "CSR"),
    "dgl_rsc.controller": ("dgl_rsc.core.controller", "RSCController"),
    "dgl_rsc.config": ("dgl_rsc.core.config", "RSCConfig"),
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_warns_and_gives_the_same_class(old):
    new, cls = MOVED[old]
    code = (
        "import warnings\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        f"    from {old} import {cls} as Old\n"
        f"from {new} import {cls} as New\n"
        "import dgl_rsc\n"
        f"assert Old is New is dgl_rsc.{cls}\n"
        "dep = [x for x in w if issubclass(x.category, DeprecationWarning)]\n"
        "print(len(dep), dep[0].message if dep else '')\n"
    )
    out = run_cmd([sys.executable, "-c", code], cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    count, _, message = out.stdout.strip().partition(" ")
    assert count == "1"
    assert f"from dgl_rsc import {cls}" in message and new in message


def test_the_public_paths_stay_and_importing_a_module_does_not_shadow_a_function():
    import dgl_rsc
    import dgl_rsc.core.spmm
    import dgl_rsc.dgl.patch
    import dgl_rsc.nn

    # the modules patch and spmm live in folders now: dgl_rsc.patch stays the function
    assert callable(dgl_rsc.patch) and dgl_rsc.patch is dgl_rsc.dgl.patch.patch
    assert dgl_rsc.spmm is dgl_rsc.core.spmm.spmm
    dgl_nn = importlib.import_module("dgl_rsc.dgl.nn")
    assert set(dgl_rsc.nn.__all__) == set(dgl_nn.__all__)
    assert all(getattr(dgl_rsc.nn, n) is getattr(dgl_nn, n) for n in dgl_nn.__all__)
    from dgl_rsc.models import build_model

    assert build_model is importlib.import_module("dgl_rsc.models.paper").build_model


def test_the_tests_mirror_the_package_folders():
    package = {p.name for p in (ROOT / "dgl_rsc").iterdir()
               if p.is_dir() and (p / "__init__.py").exists()}  # fmt: skip
    tests = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and list(p.glob("test_*.py"))}
    assert tests and tests <= package, f"test folders with no package folder: {tests - package}"
    # every folder has its tests: nn is the public alias of dgl/nn; quant (one rounding module)
    # is tested through its users, int8 and the distributed codecs
    untested = package - tests - {"nn", "quant"}
    assert untested == set(), f"package folders without a test folder: {sorted(untested)}"
