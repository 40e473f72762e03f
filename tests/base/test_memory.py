"""``dgl_rsc.keep_freed_memory``: glibc's settings change only when asked, never at import.

The probe is glibc's own count of blocks served by ``mmap`` (``mallinfo2().hblks``): a 64 MiB
``malloc`` is mmapped with glibc's defaults and comes from the heap once freed blocks are kept.
It runs in a subprocess, so that the settings of the test process stay as they were.
"""

import subprocess
import sys
import textwrap
import warnings

import pytest

from dgl_rsc.base import memory

PROBE = textwrap.dedent(
    """
    import ctypes, json, sys

    class Info(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                    "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Info
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def mmapped_by_malloc():
        before = libc.mallinfo2().hblks
        p = libc.malloc(64 << 20)
        grew = libc.mallinfo2().hblks - before
        libc.free(p)
        return grew

    import dgl_rsc, dgl_rsc.nn, dgl_rsc.launcher.train  # everything a user or the launcher imports
    out = {"after_import": mmapped_by_malloc()}
    out["applied"] = dgl_rsc.keep_freed_memory()
    out["kept"] = mmapped_by_malloc()
    out["restored"] = dgl_rsc.keep_freed_memory(keep=False)
    out["after_restore"] = mmapped_by_malloc()
    print(json.dumps(out))
    """
)


def _glibc_with_mallinfo2() -> bool:
    libc = memory.glibc()
    return libc is not None and hasattr(libc, "mallinfo2")


@pytest.mark.heavy
def test_import_leaves_malloc_alone_and_the_call_changes_it():
    if not _glibc_with_mallinfo2():
        pytest.skip("needs glibc >= 2.33 (mallinfo2) to probe the allocator's settings")
    import json

    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=300, check=True)  # fmt: skip
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["after_import"] == 1, "importing dgl_rsc changed glibc's mmap setting"
    assert out["applied"] is True
    assert out["kept"] == 0, "keep_freed_memory() left large blocks on mmap"
    assert out["restored"] is True
    assert out["after_restore"] == 1


def test_without_glibc_it_warns_and_changes_nothing(monkeypatch):
    monkeypatch.setattr(memory, "glibc", lambda: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert memory.keep_freed_memory() is False
    assert any("not glibc" in str(w.message) for w in caught)


def test_fault_and_rss_counters_count():
    import mmap

    size = 8 << 20
    before = memory.minor_faults()
    with mmap.mmap(-1, size) as m:  # fresh anonymous pages, whatever malloc's settings
        for i in range(0, size, mmap.PAGESIZE):
            m[i] = 1  # first touch of each page
    assert memory.minor_faults() - before >= size // mmap.PAGESIZE // 2
    assert memory.peak_rss_bytes() >= size


def test_block_keeps_freed_memory_and_restores_on_exit(fake_glibc):
    with memory.freed_memory_kept() as changed:
        assert changed is True and memory._KEPT[0] is True
    assert fake_glibc == [True, False] and memory._KEPT[0] is False


def test_block_restores_after_an_exception(fake_glibc):
    with pytest.raises(ValueError):
        with memory.freed_memory_kept():
            raise ValueError("training failed")
    assert fake_glibc == [True, False]


@pytest.mark.parametrize("case", ["disabled", "already kept", "env var", "tunables",
                                  "preload", "not glibc"])  # fmt: skip
def test_block_leaves_what_it_did_not_set(monkeypatch, fake_glibc, case):
    enabled = case != "disabled"
    if case == "already kept":
        memory._KEPT[0] = True  # the launcher or the user kept them before
    elif case == "env var":
        monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1048576")
    elif case == "tunables":
        monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0")
    elif case == "preload":
        monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    elif case == "not glibc":
        monkeypatch.setattr(memory, "glibc", lambda: None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an optimization the block skips: no warning
        with memory.freed_memory_kept(enabled) as changed:
            assert changed is False
    assert fake_glibc == []
    assert memory._KEPT[0] is (case == "already kept")


PATCH_PROBE = PROBE.split("import dgl_rsc, dgl_rsc.nn")[0] + textwrap.dedent(
    """
    import dgl, torch, dgl_rsc
    from dgl.nn import GraphConv
    g = dgl.add_self_loop(dgl.rand_graph(50, 300))
    conv = GraphConv(8, 8)
    x = torch.randn(50, 8)
    out = {"before": mmapped_by_malloc()}
    with dgl_rsc.patch(budget=1.0) as rsc:
        conv(g, x).sum().backward()
        out["inside"] = mmapped_by_malloc()
    out["after"] = mmapped_by_malloc()
    with dgl_rsc.patch(budget=1.0, keep_freed_memory=False):
        out["inside_off"] = mmapped_by_malloc()
    print(json.dumps(out))
    """
)


@pytest.mark.dgl
def test_dgl_patch_keeps_freed_memory_inside_its_block_only():
    pytest.importorskip("dgl")
    if not _glibc_with_mallinfo2():
        pytest.skip("needs glibc >= 2.33 (mallinfo2) to probe the allocator's settings")
    import json
    import os

    env = {k: v for k, v in os.environ.items() if k not in memory._USER_ENV}
    res = subprocess.run([sys.executable, "-c", PATCH_PROBE], capture_output=True, text=True,
                         timeout=300, check=True, env=env)  # fmt: skip
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out == {"before": 1, "inside": 0, "after": 1, "inside_off": 1}
