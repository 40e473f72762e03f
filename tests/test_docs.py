"""What a newcomer reads stays true: every Python snippet of the README and the user guide
runs (on tiny graphs), every command they name exists and parses, every YAML snippet is a valid
config section, the quoted error messages are still the package's, the benchmarks page is what
its JSON renders, local links resolve, and the pages stay short."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: the pages a user reads (the lab notebook is history, kept as written)
PAGES = [ROOT / "README.md", ROOT / "tools" / "README.md", *sorted(DOCS.glob("*.md")),
         *sorted((DOCS / "guide").glob("*.md"))]  # fmt: skip


def _rel(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def blocks(lang: str):
    """``(page, index, code)`` of every fenced ``lang`` block of the pages."""
    for page in PAGES:
        for i, code in enumerate(re.findall(rf"```{lang}\n(.*?)```", page.read_text(), re.S)):
            yield page, i, code


def _marks(code: str) -> list:
    needs = []
    if re.search(r"^import dgl\b|^import dgl,|^from dgl\b|dgl_rsc\.patch\(", code, re.M):
        needs.append(pytest.mark.dgl)
    if "torch_geometric" in code or "dgl_rsc.pyg" in code:
        needs.append(pytest.mark.pyg)
    return needs


PYTHON = [pytest.param(code, id=f"{_rel(page)}-{i}", marks=_marks(code))
          for page, i, code in blocks("python")]  # fmt: skip


@pytest.mark.parametrize("code", PYTHON)
def test_python_snippets_run(code, one_thread):
    scope = {"__name__": "snippet"}
    exec(compile(code, "snippet", "exec"), scope)
    rsc = scope.get("rsc")
    if rsc is not None and "visited_fraction" in code:  # the training loops did sample
        assert 0 < rsc.stats()["visited_fraction"] < 1


def test_there_are_snippets_of_every_way_in():
    codes = "\n".join(code for _, _, code in blocks("python"))
    for way in ("dgl_rsc.patch(", "rpyg.patch(", "rnn.attach(", "spmm_csr(", "quantize_model("):
        assert way in codes


def _commands() -> list[str]:
    """Every command line the pages give, in bash blocks or inline code."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for code in re.findall(r"```bash\n(.*?)```", text, re.S):
            for line in code.splitlines():
                line = line.split("  #")[0].strip()
                if line:
                    found.append(line)
        found += re.findall(r"`((?:python|bash|dgl-rsc|torchrun) [^`]+)`", text)
    return found


def _tool_paths() -> set[str]:
    names = set()
    for cmd in _commands():
        names.update(re.findall(r"(tools/[\w/]+\.(?:py|sh))", cmd))
    for page in PAGES:  # scripts named in prose, such as tools/profile_run.py
        names.update(re.findall(r"`(tools/[\w/]+\.(?:py|sh))", page.read_text()))
    return names


def test_every_tool_a_page_names_exists_and_its_help_is_tested():
    from .test_tools_bench_e2e import COMMANDS

    named = _tool_paths()
    assert "tools/profile_run.py" in named and "tools/validation_family.py" in named
    for path in sorted(named):
        assert (ROOT / path).is_file(), f"a page names {path}, which does not exist"
        if path.endswith(".py"):
            assert path.removeprefix("tools/") in COMMANDS  # its --help runs in that test


def test_the_gpu_suite_prints_its_stages_on_help(tmp_path):
    from .proc import run as run_cmd

    done = run_cmd(["bash", str(ROOT / "tools" / "gpu_suite.sh"), "--help"], cwd=tmp_path,
                   timeout=60)  # fmt: skip
    assert done.returncode == 0 and "RESULTS_DIR [STAGE ...]" in done.stdout
    assert list(tmp_path.iterdir()) == []  # --help made no results folder


def test_every_launcher_command_a_page_names_parses_and_its_config_loads():
    from dgl_rsc.launcher.cli import _sets, build_parser, load_config

    parser = build_parser()
    lines = [c for c in _commands() if c.startswith("dgl-rsc ")]
    assert len(lines) >= 5
    for line in lines:
        argv = [a for a in shlex.split(line)[1:] if a not in ("...",)]
        if "CONFIG.yaml" in argv or "DIR" in argv:
            continue  # a placeholder, shown with a real config elsewhere on the page
        args = parser.parse_args(argv)
        load_config(str(ROOT / args.config), _sets(args))


def test_every_make_command_is_a_target():
    from .test_ci import make_targets

    named = {m for c in _commands() for m in re.findall(r"^make ([\w-]+)", c)}
    for page in PAGES:
        named.update(re.findall(r"`make ([\w-]+)`", page.read_text()))
    assert {"demo", "test", "docs"} <= named <= make_targets()


def test_every_yaml_snippet_is_a_valid_config_section(tmp_path):
    from dgl_rsc.launcher.cli import load_config

    base = yaml.safe_load((ROOT / "yaml_configs" / "cora_gcn.yaml").read_text())
    base["dataset"]["path"] = str(ROOT / "tests" / "data" / "missing.npz")  # not read here
    checked = 0
    for page, i, code in blocks("yaml"):
        raw = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
        for section, value in yaml.safe_load(code).items():
            merged = raw.get(section)
            raw[section] = {**merged, **value} if isinstance(merged, dict) else value
        path = tmp_path / f"{page.stem}-{i}.yaml"
        path.write_text(yaml.safe_dump(raw))
        load_config(str(path), [])
        checked += 1
    assert checked >= 4


def test_the_quoted_error_messages_are_the_packages():
    source = " ".join(p.read_text() for p in (ROOT / "dgl_rsc").rglob("*.py"))
    source = re.sub(r'"\s+f?"', "", source)  # join implicitly concatenated string literals
    page = (DOCS / "guide" / "troubleshooting.md").read_text()
    quotes = [q for row in re.findall(r"^\| (`.*?) \|", page, re.M)
              for q in re.findall(r"`([^`]+)`", row.split(" | ")[0])]  # fmt: skip
    assert len(quotes) >= 25
    missing = [q for q in quotes if q not in source]
    assert missing == []


def test_the_benchmarks_page_is_what_its_json_renders():
    sys.path.insert(0, str(ROOT / "tools"))
    import render_benchmarks

    text = (DOCS / "benchmarks.md").read_text()
    assert len(render_benchmarks.MARK.findall(text)) >= 10
    assert render_benchmarks.render_page(text) == text
    for name in re.findall(r"`([\w.-]+\.json)`", text):  # every JSON the page cites is there
        assert (DOCS / "results" / name).is_file(), name


def test_local_links_resolve():
    broken = []
    for page in [*PAGES, DOCS / "journal" / "README.md"]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not target.startswith(("http://", "https://")):
                if not (page.parent / target).exists():
                    broken.append(f"{_rel(page)} -> {target}")
    assert broken == []


def test_the_pages_stay_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
    assert len((DOCS / "benchmarks.md").read_text().splitlines()) <= 400
    top = [p for p in (ROOT / "tools").iterdir() if p.is_file() and p.suffix in (".py", ".sh")]
    assert len(top) <= 12


def test_the_journal_index_lists_every_entry_newest_first():
    index = (DOCS / "journal" / "README.md").read_text()
    listed = re.findall(r"^- (\d{4}-\d\d-\d\d): \[.*?\]\((.*?)\)$", index, re.M)
    entries = {p.name for p in (DOCS / "journal").glob("2*.md")}
    assert {name for _, name in listed} == entries
    dates = [d for d, _ in listed]
    assert dates == sorted(dates, reverse=True)
