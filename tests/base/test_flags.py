"""On/off arguments of the public API take True or False and nothing else: a string such as
``"false"`` would otherwise switch on what the user meant to switch off."""

import numpy as np
import pytest
import torch

from dgl_rsc.base import memory
from dgl_rsc.base.flags import require_flag
from dgl_rsc.dgl.nn.input_cache import cache_input_aggregation


@pytest.mark.parametrize("value", [True, False, np.bool_(True), np.bool_(False)])
def test_booleans_pass_as_bools(value):
    out = require_flag(value, "f(x=...)")
    assert type(out) is bool and out == bool(value)


@pytest.mark.parametrize("value", ["false", "no", 0, 1, None, 1.0, torch.tensor(True)])
def test_anything_else_is_refused_naming_the_argument(value):
    with pytest.raises(TypeError, match=r"f\(x=\.\.\.\) takes True or False, got"):
        require_flag(value, "f(x=...)")


def test_public_switches_refuse_a_string_before_changing_anything(monkeypatch):
    calls = []
    monkeypatch.setattr(memory, "glibc", lambda: calls.append("glibc"))
    with pytest.raises(TypeError, match=r"keep_freed_memory\(keep\) takes True or False"):
        memory.keep_freed_memory("false")
    assert calls == []  # refused before the allocator was looked at
    with pytest.raises(TypeError, match=r"cache_input_aggregation\(model, enabled\)"):
        cache_input_aggregation(torch.nn.Linear(2, 2), "off")


@pytest.mark.dgl
@pytest.mark.parametrize("arg", ["enabled", "keep_freed_memory"])
def test_dgl_patch_refuses_a_string_switch(arg):
    pytest.importorskip("dgl")
    import dgl_rsc

    with pytest.raises(TypeError, match=rf"dgl_rsc.patch\({arg}=\.\.\.\) takes True or False"):
        with dgl_rsc.patch(**{arg: "False"}):
            pass
    assert not dgl_rsc.is_patched()
