"""The kernel sources are package data: found in the editable install and in a wheel."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import dgl_rsc

from .conftest import BLOCK_DGL

ROOT = Path(__file__).resolve().parents[1]


def cu_files(pkg_files):
    return sorted(p.name for p in pkg_files.iterdir() if p.name.endswith(".cu"))


def test_cuda_sources_found_in_this_install():
    # an editable install maps dgl_rsc.cuda to a folder without __init__.py (a package
    # there would shadow NVIDIA's `cuda` namespace), which setuptools' editable finder does
    # not import; the locator then reads <repo>/cuda. A wheel has real package data (below).
    from dgl_rsc.backends import _cuda_source

    names = _cuda_source.cu_files()
    assert names, "no .cu file found"
    assert names == sorted(p.name for p in (ROOT / "cuda").glob("*.cu"))
    assert "extern" in _cuda_source.read_source(names[0]) or "__global__" in (
        _cuda_source.read_source(names[0])
    )


def test_import_without_dgl_in_a_clean_interpreter():
    code = BLOCK_DGL + (
        "import sys\n"
        "import torch, dgl_rsc, dgl_rsc.nn\n"
        "from dgl_rsc.sparse.graph import Graph\n"
        "g = Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]))\n"
        "x = torch.randn(3, 4, requires_grad=True)\n"
        "conv = dgl_rsc.nn.GraphConv(4, 2)\n"
        "conv(g, x).sum().backward()\n"
        "assert x.grad is not None and not dgl_rsc.base._deps.dgl_available()\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr


def test_wheel_install_ships_kernel_sources(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "dgl_rsc", src / "dgl_rsc", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "cuda", src / "cuda", ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = wheels.glob("*.whl")
    # every subpackage of the source tree is in the wheel (an editable install of the repo
    # would otherwise serve a missing one to the import below)
    with zipfile.ZipFile(wheel) as zf:
        shipped = {os.path.dirname(n) for n in zf.namelist() if n.endswith("/__init__.py")}
    source = {
        str(p.parent.relative_to(ROOT))
        for p in (ROOT / "dgl_rsc").rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    assert source <= shipped, f"missing from setup.cfg's packages: {sorted(source - shipped)}"
    site = tmp_path / "site"
    subprocess.run(pip + ["install", "--no-deps", "--target", str(site), str(wheel)], check=True)
    code = (
        "import dgl_rsc, importlib.resources as r\n"
        "print(dgl_rsc.__file__)\n"
        "print(','.join(sorted(p.name for p in r.files('dgl_rsc.cuda').iterdir()"
        " if p.name.endswith('.cu'))))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    where, names = out.stdout.strip().splitlines()
    assert where.startswith(str(site)), where
    assert names.split(",") == sorted(p.name for p in (ROOT / "cuda").glob("*.cu"))
    assert dgl_rsc.__file__.startswith(str(ROOT))
