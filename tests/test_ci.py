"""The commands the README gives and CI runs exist, and the modern lock file is what it says."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*):", text, re.M))


def test_readme_make_commands_are_makefile_targets():
    first_block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    commands = re.findall(r"^make ([\w-]+)", first_block.group(1), re.M)
    assert {"demo", "test"} <= set(commands)
    assert set(commands) <= make_targets()


def test_ci_runs_lint_then_both_test_environments():
    steps = re.findall(r"^step ([\w-]+)$", (ROOT / ".ci" / "run").read_text(), re.M)
    assert steps == ["venv", "lint", "test", "test-heavy", "docs", "test-dist", "venv-modern",
                     "test-modern"]  # fmt: skip
    assert set(steps) <= make_targets()


def test_test_modern_deselects_the_dgl_marker():
    text = (ROOT / "Makefile").read_text()
    markers = re.search(r"^MODERN_MARKERS := (.+)$", text, re.M).group(1)
    assert markers.split(" and ") == ["not dgl", "not gpu", "not slow", "not heavy"]
    recipe = re.search(r"^test-modern:.*\n\t(.+)$", text, re.M).group(1)
    assert recipe == '$(PY_MODERN) -m pytest -m "$(MODERN_MARKERS)"'


def test_make_test_leaves_out_the_heavy_and_slow_cases_which_have_their_own_targets():
    cfg = (ROOT / "setup.cfg").read_text()
    addopts = re.search(r"^addopts = .*-m \"([^\"]+)\"", cfg, re.M).group(1)
    assert addopts.split(" and ") == ["not gpu", "not slow", "not heavy"]
    text = (ROOT / "Makefile").read_text()
    assert re.search(r"^test-heavy:.*\n\t\$\(PY\) -m pytest -m heavy$", text, re.M)
    assert re.search(r"^test-dist:.*\n\t\$\(PY\) -m pytest -m slow tests/distributed$", text, re.M)


def test_modern_lock_pins_everything_and_has_no_dgl():
    lines = [
        line.strip()
        for line in (ROOT / "requirements" / "lock-modern.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    pins = dict(line.split("==", 1) for line in lines)
    assert len(pins) == len(lines), "every requirement is pinned with =="
    names = {name.lower().replace("_", "-") for name in pins}
    assert pins["torch"] == "2.15.0" and pins["torch-geometric"] == "2.8.1"
    assert {"numba", "cupy-cuda13x", "pymetis", "pytest", "pyyaml"} <= names
    assert not any(name == "dgl" or name.startswith("dgl-") for name in names)


def test_modern_source_builds_are_pinned_and_built_against_the_installed_torch():
    """torch_sparse and torch_scatter have no wheels for torch 2.15 on the registry: `make
    venv-modern` builds the pinned source releases without build isolation (against the torch of
    lock-modern.txt), and editing their list rebuilds the environment."""
    lines = [line.strip() for line in (ROOT / "requirements" / "source-modern.txt").read_text()
             .splitlines() if line.strip() and not line.startswith("#")]  # fmt: skip
    pins = dict(line.split("==", 1) for line in lines)
    assert set(pins) == {"torch-scatter", "torch-sparse"}
    text = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^\$\(STAMP_MODERN\):(.*?)\n\n", text, re.M | re.S).group(1)
    assert "requirements/source-modern.txt" in recipe.splitlines()[0]
    build = [line for line in recipe.splitlines() if "source-modern.txt" in line][-1]
    assert "--no-build-isolation" in recipe and "-r requirements/source-modern.txt" in build
    hash_line = re.search(r"^HASH_MODERN := (.+?)\n(?!\t)", text, re.M | re.S).group(1)
    assert "requirements/source-modern.txt" in hash_line
