"""The codec's CUDA kernels against the torch reference (``dgl_rsc.distributed.quant``).

* nvcc builds ``cuda/quant_kernels.cu`` with every instantiation the CuPy launcher uses.
* ``cudasim``: the Numba kernels under Numba's CPU simulator equal the torch reference bit for
  bit (payload bytes and decoded values) for the same random numbers. The simulator must be
  switched on before Numba is imported, so this file runs itself as a script in a
  subprocess (``python tests/distributed/test_quant_cuda.py``, with ``NUMBA_ENABLE_CUDASIM=1``).
* ``gpu``: CuPy and Numba on CUDA tensors, the same comparison at larger sizes.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dgl_rsc.backends import _cuda_source
from dgl_rsc.distributed import quant

ROOT = Path(__file__).resolve().parents[2]
CU = ROOT / "cuda" / "quant_kernels.cu"


def expressions():
    """The launcher's name expressions and compile options (importing it imports no CuPy)."""
    from dgl_rsc.distributed.quant_cupy import NAME_EXPRESSIONS, OPTIONS

    return NAME_EXPRESSIONS, OPTIONS


def cases(gen):
    """``(name, x)`` inputs covering the corner cases, small enough for the simulator."""
    x = torch.randn(11, 13, generator=gen) * 3
    x[2], x[3] = 3.0, 0.0  # constant, zero
    x[4, 5], x[4, 6], x[4, 7] = float("nan"), float("inf"), -float("inf")
    x[5, 1], x[5, 2], x[5, 3] = 1e38, 3.4e38, -3.4e38  # beyond HUGE; beyond bf16's largest
    x[6], x[6, 2] = -0.0, 0.0  # signed zeros
    x[7] *= 1e-30
    x[8] = torch.rand(13, generator=gen) * 1e-40  # subnormal
    x[9] = 1000 + torch.rand(13, generator=gen)  # |min| >> range
    x[10] = float("nan")  # no ordinary entry
    yield "mixed", x
    yield "one entry", torch.tensor([[2.5]])
    yield "wide rows", torch.randn(3, 70, generator=gen)
    yield "fp16", (torch.randn(5, 9, generator=gen) * 100).half()
    yield "bf16", (torch.randn(5, 9, generator=gen) * 1e20).bfloat16()
    yield "fp64", torch.randn(5, 9, generator=gen, dtype=torch.float64) * 1e-20
    yield "no rows", torch.zeros(0, 6)


def same_bits(a, b, what):
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{tuple(a.shape)}"
    if a.is_floating_point():  # NaN == NaN by bits
        a, b = a.float().view(torch.int32), b.float().view(torch.int32)
    assert torch.equal(a, b), f"{what}: values differ"


def compare(backend, device, gen_seed=0):
    """Encode/decode every case at every width with ``backend`` and with torch, same ``u``."""
    gen = torch.Generator().manual_seed(gen_seed)
    for name, x in cases(gen):
        x = x.to(device)
        for bits in quant.BITS:
            g1 = torch.Generator(device=device).manual_seed(7)
            g2 = torch.Generator(device=device).manual_seed(7)
            ref = quant.encode(x, bits, generator=g1, backend="torch")
            got = quant.encode(x, bits, generator=g2, backend=backend)
            same_bits(got.payload, ref.payload, f"payload [{backend}, {name}, {bits} bits]")
            same_bits(
                quant.decode(ref, backend=backend),
                quant.decode(ref, backend="torch"),
                f"decoded [{backend}, {name}, {bits} bits]",
            )
        rows = (x.shape[0] // 2, x.shape[0] - x.shape[0] // 2)
        g1 = torch.Generator(device=device).manual_seed(3)
        g2 = torch.Generator(device=device).manual_seed(3)
        ref = quant.encode_groups(x, rows, (4, 16), generator=g1, backend="torch")
        got = quant.encode_groups(x, rows, (4, 16), generator=g2, backend=backend)
        same_bits(got.payload, ref.payload, f"groups [{backend}, {name}]")


# -- nvcc ---------------------------------------------------------------------------------------
def test_source_found_and_complete():
    assert "quant_kernels.cu" in _cuda_source.cu_files()
    text = _cuda_source.read_source("quant_kernels.cu")
    assert text == CU.read_text(encoding="utf-8")
    names, _ = expressions()
    for expr in names:
        assert expr.split("<")[0] in text, f"{expr} is not defined in quant_kernels.cu"
    # one instantiation per input dtype x quantized width, decode per width, bf16 per dtype
    assert len(names) == 4 * len(quant.QUANT_BITS) + len(quant.QUANT_BITS) + 4 + 1
    for b in quant.QUANT_BITS:  # the reserved code counts come from quant.RESERVED
        assert f"qz_decode<{b}, {quant.RESERVED[b]}>" in names


def _instantiations(tmp_path, names) -> Path:
    """A source that includes ``quant_kernels.cu`` and takes the address of every
    instantiation in ``names``, so nvcc builds each one."""
    src = tmp_path / "instantiate_quant.cu"
    body = "".join(f"  (void)&{e};\n" for e in names)
    src.write_text(f'#include "{CU}"\nvoid qz_compile_test() {{\n{body}}}\n')
    return src


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvcc_compiles_every_instantiation(arch, tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    names, options = expressions()
    src = _instantiations(tmp_path, names)
    out = tmp_path / f"quant_{arch}.cubin"
    cmd = [nvcc, *options, f"-arch={arch}", "-cubin", "-Xptxas=-warn-spills", "-o", str(out)]
    proc = subprocess.run([*cmd, str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"nvcc failed ({arch}):\n{proc.stderr}"
    assert "warning" not in proc.stderr.lower(), proc.stderr
    blob = out.read_bytes()
    for expr in names:
        assert expr.split("<")[0].encode() in blob, f"{expr} missing from the {arch} cubin"


def _entries(ptx: str, prefix: str) -> dict:
    """The bodies of the PTX ``.entry`` functions whose mangled name starts with ``prefix``."""
    parts = re.split(r"\.visible \.entry ", ptx)[1:]
    return {p.split("(")[0]: p for p in parts if p.startswith(prefix)}


def test_encode_keeps_subnormals_under_cupys_ftz(tmp_path):
    """CuPy appends ``-ftz=true`` to the options it is given, which makes the compiler flush
    subnormal operands and results of its single-precision instructions. The arithmetic of the
    quantizing kernels must not depend on it (the reference keeps subnormals; seen on an H200:
    a row of subnormals was encoded as a constant row): no ``.ftz`` add, sub, mul, div or fp64
    conversion in them, built exactly as CuPy builds them."""
    nvcc = shutil.which("nvcc")
    assert nvcc is not None, "nvcc is installed on the development and CI machines"
    from ..proc import run as run_cmd  # here: this file also runs as a script (simulator check)

    names, options = expressions()
    src = _instantiations(tmp_path, names)
    out = tmp_path / "quant.ptx"
    cmd = [nvcc, *options, "-ftz=true", "-arch=sm_90", "-ptx", "-o", str(out), str(src)]
    proc = run_cmd(cmd, timeout=300)
    assert proc.returncode == 0, f"nvcc failed:\n{proc.stderr}"
    ptx = out.read_text()
    kernels = {**_entries(ptx, "_Z9qz_encode"), **_entries(ptx, "_Z9qz_decode")}
    assert len(kernels) == 4 * len(quant.QUANT_BITS) + len(quant.QUANT_BITS), sorted(kernels)
    flushing = re.compile(r"\b(add|sub|mul|div)(\.\w+)*\.ftz(\.\w+)*\.f32\b|cvt\.rn\.ftz\.f32\.f64")
    for name, text in kernels.items():
        found = flushing.findall(text)
        assert not found, f"{name}: flushing arithmetic {found[:3]} under -ftz=true"
    # the check itself can fail: the same source's plain C++ arithmetic does flush
    assert re.search(r"\bmul(\.\w+)*\.ftz\.f32", ptx), "the bf16 kernel's u * 65536 flushes"


# -- Numba simulator ----------------------------------------------------------------------------
@pytest.mark.heavy
@pytest.mark.cudasim
def test_numba_kernels_under_simulator():
    if importlib.util.find_spec("numba") is None:
        pytest.skip("numba is not installed")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, __file__], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"simulator check failed:\n{proc.stdout}\n{proc.stderr}"
    assert "bit for bit" in proc.stdout


def simulator_main() -> int:
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        sys.exit("set NUMBA_ENABLE_CUDASIM=1 before running this check")
    from dgl_rsc.distributed import quant_numba

    assert quant_numba.SIMULATOR, "quant_numba did not see the simulator"
    assert quant.resolve_backend("numba", "cpu") is quant_numba
    compare("numba", torch.device("cpu"))
    print("cudasim: the numba codec matches the torch reference bit for bit")
    return 0


# -- GPU ----------------------------------------------------------------------------------------
@pytest.fixture
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch.device("cuda", torch.cuda.current_device())


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cupy", "numba"])
def test_kernels_on_gpu(backend, cuda):
    quant.resolve_backend(backend, cuda)  # raises if the backend cannot run here
    compare(backend, cuda, gen_seed=1)
    g = torch.Generator(device=cuda).manual_seed(0)
    x = torch.randn(20000, 257, device=cuda, generator=g)
    for bits in quant.BITS:
        seeds = [torch.Generator(device=cuda).manual_seed(5) for _ in range(2)]
        ref = quant.encode(x, bits, generator=seeds[0], backend="torch")
        side = torch.cuda.Stream(cuda)  # kernels run on torch's current stream
        side.wait_stream(torch.cuda.current_stream(cuda))
        with torch.cuda.stream(side):
            got = quant.encode(x, bits, generator=seeds[1], backend=backend)
            dec = quant.decode(got, backend=backend)
        torch.cuda.current_stream(cuda).wait_stream(side)
        same_bits(got.payload, ref.payload, f"payload [{backend}, {bits} bits, large]")
        same_bits(dec, quant.decode(ref, backend="torch"), f"decoded [{backend}, {bits} bits]")


@pytest.mark.gpu
def test_auto_backend_on_gpu(cuda):
    from dgl_rsc.base import _deps

    got = quant.resolve_backend("auto", cuda)
    if _deps.cupy_available():
        from dgl_rsc.distributed import quant_cupy

        assert got is quant_cupy
    assert quant.resolve_backend("auto", "cpu") is quant.resolve_backend("torch", "cpu")


if __name__ == "__main__":
    sys.exit(simulator_main())
