"""Every ``cuda/*.cu`` builds with nvcc for sm_80 and sm_90, with every instantiation the CuPy
backend asks NVRTC for; and ``dgl_rsc.backends._cuda_source`` finds the sources."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from dgl_rsc.backends import _cuda_source, int8_cupy, spmm_cupy
from dgl_rsc.backends.cupy_backend import COMPILE_OPTIONS, NAME_EXPRESSIONS
from dgl_rsc.distributed import quant_cupy

ROOT = Path(__file__).resolve().parents[2]
CU_FILES = sorted((ROOT / "cuda").glob("*.cu"))
# the name expressions and compile options of each source file
INSTANTIATIONS = {
    "rsc_kernels.cu": NAME_EXPRESSIONS,
    "quant_kernels.cu": quant_cupy.NAME_EXPRESSIONS,
    "int8_spmm.cu": int8_cupy.NAME_EXPRESSIONS,
    "spmm_forward.cu": spmm_cupy.NAME_EXPRESSIONS,
}
OPTIONS = {
    "rsc_kernels.cu": COMPILE_OPTIONS,
    "quant_kernels.cu": quant_cupy.OPTIONS,
    "int8_spmm.cu": int8_cupy.OPTIONS,
    "spmm_forward.cu": spmm_cupy.OPTIONS,
}


def test_sources_found():
    names = _cuda_source.cu_files()
    assert names == [p.name for p in CU_FILES]
    assert "rsc_kernels.cu" in names
    text = _cuda_source.read_source("rsc_kernels.cu")
    assert text == (ROOT / "cuda" / "rsc_kernels.cu").read_text(encoding="utf-8")
    for expr in NAME_EXPRESSIONS:
        assert expr.split("<")[0] in text, f"{expr} is not defined in rsc_kernels.cu"
    with pytest.raises(FileNotFoundError, match="no kernel source"):
        _cuda_source.read_source("missing.cu")


def _wrapper(cu: Path, exprs) -> str:
    """A translation unit that includes ``cu`` and instantiates every name expression (taking
    a kernel's address instantiates it, as NVRTC's name expressions do)."""
    lines = [f'#include "{cu}"', "void rsc_compile_test_instantiate() {"]
    lines += [f"  (void)&{e};" for e in exprs]
    lines.append("}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("cu", CU_FILES, ids=lambda p: p.name)
def test_nvcc_compiles(cu, arch, tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    src = tmp_path / f"instantiate_{cu.stem}.cu"
    src.write_text(_wrapper(cu, INSTANTIATIONS.get(cu.name, [])))
    out = tmp_path / f"{cu.stem}_{arch}.cubin"
    opts = OPTIONS.get(cu.name, ("-std=c++17",))
    cmd = [nvcc, *opts, f"-arch={arch}", "-cubin", "-Xptxas=-warn-spills", "-o", str(out)]
    proc = subprocess.run([*cmd, str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"nvcc failed for {cu.name} ({arch}):\n{proc.stderr}"
    assert "warning" not in proc.stderr.lower(), proc.stderr
    assert out.stat().st_size > 0
    # every kernel the backend launches is in the cubin's symbol table (as a mangled name)
    blob = out.read_bytes()
    for expr in INSTANTIATIONS.get(cu.name, []):
        assert expr.split("<")[0].encode() in blob, f"{expr} missing from the {arch} cubin"
