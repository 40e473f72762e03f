"""The README's first example runs as written."""

import re
from pathlib import Path

import pytest

from .conftest import requires_dgl

README = Path(__file__).resolve().parents[1] / "README.md"


@requires_dgl
@pytest.mark.dgl
def test_context_manager_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    code = blocks[0]
    assert "dgl_rsc.patch" in code
    scope = {}
    exec(compile(code, str(README), "exec"), scope)
    rsc = scope["rsc"]
    assert 0 < rsc.stats()["visited_fraction"] < 1
    import dgl_rsc

    assert not dgl_rsc.is_patched()
