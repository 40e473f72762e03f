"""The package's architecture, read from its source: the import graph has no circles and no
arrow from a lower layer up to a higher one, every module sits in a declared layer, no module
is over 400 lines, and one helper (``dgl_rsc.base.names``) words every unknown-name error.

Imports are read with ``ast`` from every ``import`` statement, those inside functions and
``TYPE_CHECKING`` blocks included: a lazy import is still a dependency. The package's
``__init__`` (the public API facade) may import from every layer.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "dgl_rsc"
MAX_LINES = 400

#: bottom to top: a module may import its own layer and the layers below it. A name is a folder
#: (or top-level module) of the package, or one module inside a folder where a folder holds more
#: than one layer (the most specific name wins): the CPU kernels of ``sparse`` and the rules of
#: ``sampling`` sit below the backends that run them, and DGL's private interface below the
#: front end that keeps it. The sparse products import neither the DGL front end nor INT8: the
#: package's ``__init__`` plugs DGL's kernel and the INT8 product into
#: :data:`dgl_rsc.sparse.products.ENGINES`.
LAYERS = (
    ("base", ("base",)),
    ("kernels", ("quant", "backends", "sparse.cpu_spmm", "sampling.rules", "dgl.private",
                 "models.engines")),
    ("sparse formats and products", ("sparse",)),
    ("INT8 products and row sampling", ("int8", "sampling")),
    ("the RSC algorithm", ("core", "dgl.interop")),
    ("front ends and training modes", ("dgl", "nn", "pyg", "models", "data", "distributed",
                                       "minibatch", "graph", "csr", "controller", "config")),
    ("launcher", ("launcher", "__main__")),
)  # fmt: skip
LEVEL = {top: i for i, (_, tops) in enumerate(LAYERS) for top in tops}


def modules() -> dict[str, pathlib.Path]:
    """``dotted name -> path`` of every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports(name: str, path: pathlib.Path, known) -> set[str]:
    """The package modules ``name`` imports (the most specific known module of each)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            named = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
            found.update(named or ([target] if target in known else []))
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
    found.discard(name)
    return found


@pytest.fixture(scope="module")
def graph():
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def circles(edges: dict[str, set]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def top(name: str) -> str:
    """The most specific name of ``LAYERS`` that holds module ``name`` (``""`` for the root)."""
    parts = name.split(".")[1:]
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LEVEL:
            return ".".join(parts[:n])
    return parts[0] if parts else ""


def test_the_reader_finds_imports_and_circles(tmp_path):
    """The checks below can fail: a lazy relative import and a circle, made up, are found."""
    pkg = tmp_path / "dgl_rsc"
    for sub in ("launcher", "sparse", "base"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "launcher" / "io.py").write_text("def f():\n    from ..sparse.csr import CSR\n")
    (pkg / "sparse" / "csr.py").write_text(
        "from ..base import _deps\nfrom ..launcher.io import f\n"
    )
    (pkg / "base" / "_deps.py").write_text("")
    known = {
        "dgl_rsc",
        "dgl_rsc.launcher",
        "dgl_rsc.launcher.io",
        "dgl_rsc.sparse",
        "dgl_rsc.sparse.csr",
        "dgl_rsc.base",
        "dgl_rsc.base._deps",
    }
    io_imports = imports("dgl_rsc.launcher.io", pkg / "launcher" / "io.py", known)
    csr_imports = imports("dgl_rsc.sparse.csr", pkg / "sparse" / "csr.py", known)
    assert io_imports == {"dgl_rsc.sparse.csr"}
    assert csr_imports == {"dgl_rsc.base._deps", "dgl_rsc.launcher.io"}
    edges = {"dgl_rsc.sparse.csr": csr_imports, "dgl_rsc.launcher.io": io_imports}
    assert circles(edges) == [["dgl_rsc.launcher.io", "dgl_rsc.sparse.csr"]]
    assert LEVEL[top("dgl_rsc.launcher.io")] > LEVEL[top("dgl_rsc.sparse.csr")]  # csr -> io is up
    # a module named inside a folder outranks its folder
    assert top("dgl_rsc.dgl.private") == "dgl.private" and top("dgl_rsc.dgl.patch") == "dgl"


def test_the_import_graph_has_no_circles(graph):
    assert sum(len(v) for v in graph.values()) > 200  # the reader reads imports at all
    assert circles(graph) == []


def test_every_module_sits_in_a_layer(graph):
    missing = sorted({top(m) for m in graph if top(m) and top(m) not in LEVEL})
    assert missing == [], f"add {missing} to LAYERS in {__file__}"


def test_no_import_points_up_a_layer(graph):
    up = [
        f"{a} ({LAYERS[LEVEL[top(a)]][0]}) -> {b} ({LAYERS[LEVEL[top(b)]][0]})"
        for a, targets in graph.items()
        for b in targets
        if top(a) in LEVEL and top(b) in LEVEL and LEVEL[top(b)] > LEVEL[top(a)]
    ]
    assert up == []


def test_no_module_is_over_400_lines():
    long = {p.relative_to(PACKAGE.parent).as_posix(): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}  # fmt: skip
    assert long == {}


def test_one_helper_words_unknown_names():
    users = sorted(p.relative_to(PACKAGE.parent).as_posix() for p in PACKAGE.rglob("*.py")
                   if "get_close_matches" in p.read_text())  # fmt: skip
    assert users == ["dgl_rsc/base/names.py"]


def test_the_sparse_layer_runs_the_engines_the_package_plugs_in():
    """``sparse.products`` imports no front end and no INT8 module, yet runs both engines."""
    import dgl_rsc
    from dgl_rsc.dgl import kernels
    from dgl_rsc.int8.spmm import quantized_product
    from dgl_rsc.sparse import products

    source = (PACKAGE / "sparse" / "products.py").read_text()
    assert "..dgl" not in source and "..int8" not in source
    assert products.ENGINES == {"exact_cpu": kernels, "quantized": quantized_product}
    assert dgl_rsc.sparse.products is products
    with pytest.raises(ValueError, match="unknown engine kind 'fast'"):
        products.register("fast", None)
