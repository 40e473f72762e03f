"""The one CuPy loader of every kernel family (``dgl_rsc.backends._cuda_source``): each kernel
source is compiled once per device with its options and instantiations, and a launch runs on
torch's current stream of the tensor's device. Checked on the CPU with a stand-in for CuPy
that records what it is asked; the real compile is tests/backends/test_cuda_compile.py (nvcc)
and the lent GPU."""

from __future__ import annotations

import contextlib
import itertools
import types

import pytest
import torch

from dgl_rsc.backends import _cuda_source, cupy_backend, int8_cupy
from dgl_rsc.backends.compile_watch import CompileWatch
from dgl_rsc.base import _deps, progress
from dgl_rsc.distributed import quant_cupy


class FakeCupy:
    """Records compiles and launches."""

    def __init__(self):
        self.compiled, self.launched, self.devices, self.built = [], [], [], []
        fake = self

        class Module:
            def __init__(self, code, options, name_expressions):
                fake.compiled.append((code, options, tuple(name_expressions)))

            def compile(self):
                fake.built.append(self)

            def get_function(self, name):
                return lambda grid, block, args: fake.launched.append((name, grid, block, args))

        @contextlib.contextmanager
        def device(index):
            fake.devices.append(index)
            yield

        self.RawModule = Module
        stream = lambda ptr, index: contextlib.nullcontext()  # noqa: E731
        self.cuda = types.SimpleNamespace(Device=device, ExternalStream=stream)


@pytest.fixture
def cupy(monkeypatch):
    fake = FakeCupy()
    monkeypatch.setattr(_deps, "require_cupy", lambda: fake)
    for cache in (_cuda_source.cupy_module, _cuda_source._external_stream):
        cache.cache_clear()
    yield fake
    for cache in (_cuda_source.cupy_module, _cuda_source._external_stream):
        cache.cache_clear()


@pytest.mark.parametrize("family", [cupy_backend, int8_cupy, quant_cupy], ids=lambda m: m.__name__)
def test_each_source_compiles_once_per_device_with_its_instantiations(cupy, family):
    source = family._SOURCE
    options = getattr(family, "COMPILE_OPTIONS", None) or family.OPTIONS
    names = tuple(family.NAME_EXPRESSIONS)
    first = _cuda_source.cupy_module(source, options, names, 0)
    assert _cuda_source.cupy_module(source, options, names, 0) is first
    _cuda_source.cupy_module(source, options, names, 1)
    assert len(cupy.compiled) == 2 and cupy.devices == [0, 1] and len(cupy.built) == 2
    code, opts, exprs = cupy.compiled[0]
    assert code == _cuda_source.read_source(source) and opts == tuple(options)
    assert exprs == names and all(f"{n.split('<')[0]}" in code for n in names)


def test_a_compile_is_timed_by_an_entered_watch_and_announced_when_slow(cupy, monkeypatch):
    ticks = itertools.count()
    monkeypatch.setattr(progress, "clock", lambda: 5.0 * next(ticks))  # a 5 s compile
    said = []
    family = cupy_backend
    with CompileWatch(said.append) as watch:
        _cuda_source.cupy_module(family._SOURCE, family.COMPILE_OPTIONS,
                                 tuple(family.NAME_EXPRESSIONS), 0)  # fmt: skip
        watch.flush()
    assert watch.seconds == {"CUDA": 5.0} and len(cupy.built) == 1
    assert said[0] == "compiling CUDA kernels (first run only) ..."
    assert said[1] == "compiled kernels: done in 5.0 s (CUDA 5.0 s)"


def test_a_launch_runs_the_named_kernel_on_the_tensors_device(cupy, monkeypatch):
    class Stream:
        cuda_stream = 1234

    monkeypatch.setattr(torch.cuda, "current_stream", lambda index: Stream())
    module = (quant_cupy._SOURCE, quant_cupy.OPTIONS, tuple(quant_cupy.NAME_EXPRESSIONS))
    fake_t = types.SimpleNamespace(device=torch.device("cuda", 3))  # a tensor on cuda:3
    _cuda_source.launch(module, fake_t, "qz_decode_bf16", (2,), (32,), 7)
    assert cupy.launched == [("qz_decode_bf16", (2,), (32,), (7,))]
    assert cupy.devices == [3, 3]  # compiled for device 3, launched there
