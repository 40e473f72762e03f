"""Conformance of dgl_rsc.pyg with PyTorch Geometric's own tests of the three convs.

Reads ``test/nn/conv/test_{gcn,sage,gcn2}_conv.py`` (and PyG's ``test/conftest.py``) from a
PyG source tree -- a checkout, or a git directory plus ``--rev`` -- into a temporary folder
(PyG's test code is not stored in this repository), then runs them three times with pytest
(plugin: ``tools/plugins/pyg_conformance_plugin.py``):

- ``stock``: PyG as installed;
- ``swapped``: the classes replaced by the drop-ins (attached, budget 1.0);
- ``patched``: stock classes inside ``dgl_rsc.pyg.patch(budget=1.0)``.

Every test that passes stock must pass swapped and patched, except those listed in
:data:`UNSUPPORTED` (documented in docs/pyg_conformance.md); the tool exits 1 otherwise.
Example (the modern environment, with torch-geometric)::

    python tools/pyg_conformance.py PATH/TO/pytorch_geometric \\
        --rev 2.8.0.post1 --out docs/results/pyg_conformance.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FILES = ("test_gcn_conv.py", "test_sage_conv.py", "test_gcn2_conv.py")
MODES = ("stock", "swapped", "patched")

#: (mode, test id pattern) -> why it is expected to differ from stock
UNSUPPORTED = {
    ("swapped", "test_sage_conv.py::test_sage_conv[sum-*]"): (
        "SAGEConv(aggr='sum'): the drop-in supports aggr='mean' only and refuses others "
        "with a ValueError (keep torch_geometric.nn.SAGEConv)"
    ),
    ("swapped", "test_sage_conv.py::test_lstm_aggr_sage_conv"): "SAGEConv(aggr='lstm')",
    ("swapped", "test_sage_conv.py::test_mlp_sage_conv"): "SAGEConv(aggr=MLPAggregation)",
    ("swapped", "test_sage_conv.py::test_multi_aggr_sage_conv*"): "SAGEConv multi-aggregation",
    ("swapped", "test_sage_conv.py::test_compile_multi_aggr_sage_conv*"): (
        "SAGEConv multi-aggregation (torch.compile)"
    ),
    ("swapped", "test_gcn_conv.py::test_gcn_conv_with_decomposed_layers"): (
        "torch.jit.script of a drop-in: its forward calls the RSC operator (Python), which "
        "TorchScript cannot compile; decomposed layers themselves run (through PyG)"
    ),
    ("patched", "test_gcn_conv.py::test_gcn_conv_with_decomposed_layers"): (
        "torch.jit.script of a covered conv inside the patch: the patched forward is a Python "
        "wrapper TorchScript cannot compile (script the model outside the block)"
    ),
}


def read_tests(src: str, rev: str | None, dest: str) -> str:
    """Copy PyG's test files into ``dest``; returns the revision they came from."""
    names = [f"test/nn/conv/{f}" for f in FILES] + ["test/conftest.py"]
    git_dir = src if os.path.isfile(os.path.join(src, "HEAD")) else os.path.join(src, ".git")
    for name in names:
        target = os.path.join(dest, os.path.basename(name))
        if rev is not None:
            text = subprocess.run(["git", "--git-dir", git_dir, "show", f"{rev}:{name}"],
                                  check=True, capture_output=True, text=True).stdout  # fmt: skip
        else:
            with open(os.path.join(src, name)) as f:
                text = f.read()
        with open(target, "w") as f:
            f.write(text)
    if rev is None:
        return "working tree"
    out = subprocess.run(["git", "--git-dir", git_dir, "rev-parse", f"{rev}^{{commit}}"],
                         check=True, capture_output=True, text=True)  # fmt: skip
    return f"{rev} ({out.stdout.strip()})"


def run_mode(mode: str, tests: str, timeout: int) -> dict:
    """``{test id: "passed" | "failed" | "skipped"}`` of one pytest run."""
    report = os.path.join(tests, f"{mode}.xml")
    ini = os.path.join(tests, "pytest.ini")
    with open(ini, "w") as f:
        f.write("[pytest]\n")
    env = dict(os.environ, DGL_RSC_PYG_MODE=mode)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(HERE, "plugins"), ROOT, env.get("PYTHONPATH", "")]
    )
    cmd = [sys.executable, "-m", "pytest", "-q", "-c", ini, "--rootdir", tests,
           "-p", "pyg_conformance_plugin", "-p", "no:cacheprovider", f"--junitxml={report}",
           *FILES]  # fmt: skip
    subprocess.run(cmd, cwd=tests, env=env, timeout=timeout, capture_output=True, text=True)
    results = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").rsplit(".", 1)[-1]
        name = f"{module}.py::{case.get('name')}"
        if case.find("skipped") is not None:
            results[name] = "skipped"
        elif case.find("failure") is not None or case.find("error") is not None:
            node = case.find("failure") if case.find("failure") is not None else case.find("error")
            results[name] = "failed: " + (node.get("message") or "")[:200]
        else:
            results[name] = "passed"
    return results


def _matches(pattern: str, test: str) -> bool:
    """``pattern`` with ``*`` as the only wildcard (test ids hold brackets)."""
    return re.fullmatch(".*".join(re.escape(p) for p in pattern.split("*")), test) is not None


def expected(mode: str, test: str):
    for (m, pattern), why in UNSUPPORTED.items():
        if m == mode and _matches(pattern, test):
            return why
    return None


def compare(results: dict) -> dict:
    """Per test: its status in every mode and, where a mode fails a test that passes stock,
    whether that is a documented unsupported option."""
    tests, unexplained = {}, []
    for test in sorted(results["stock"]):
        row = {mode: results[mode].get(test, "missing") for mode in MODES}
        if row["stock"] == "passed":
            for mode in MODES[1:]:
                if row[mode] != "passed":
                    why = expected(mode, test)
                    if why is None:
                        unexplained.append(f"{mode}: {test}: {row[mode]}")
                    else:
                        row[f"{mode}_unsupported"] = why
        tests[test] = row
    counts = {
        mode: {
            status: sum(1 for r in tests.values() if r[mode].split(":")[0] == status)
            for status in ("passed", "failed", "skipped")
        }
        for mode in MODES
    }
    return {"counts": counts, "unexplained": unexplained, "tests": tests}


def _torch_sparse_version() -> str:
    """torch_sparse's version, or why the SparseTensor branches of PyG's tests did not run."""
    from importlib.metadata import version

    from dgl_rsc.base import _deps

    if not _deps.torch_sparse_available():
        return "not installed: the SparseTensor branches of PyG's tests did not run"
    return version("torch-sparse")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", help="a PyG checkout, or its git directory (with --rev)")
    ap.add_argument("--rev", default=None, help="tag or commit to read the tests from")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "results", "pyg_conformance.json"))
    ap.add_argument("--timeout", type=int, default=900, help="seconds per pytest run")
    args = ap.parse_args(argv)
    import torch
    import torch_geometric

    with tempfile.TemporaryDirectory(prefix="pyg_conformance_") as tests:
        source = read_tests(args.src, args.rev, tests)
        results = {mode: run_mode(mode, tests, args.timeout) for mode in MODES}
    summary = compare(results)
    doc = {
        "command": "python tools/pyg_conformance.py " + " ".join(argv or sys.argv[1:]),
        "tests_from": f"pyg-team/pytorch_geometric {source}: " + ", ".join(FILES),
        "torch": torch.__version__,
        "torch_geometric": torch_geometric.__version__,
        "python": platform.python_version(),
        # PyG's tests take their SparseTensor branches only where torch_sparse imports
        "torch_sparse": _torch_sparse_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "date": datetime.date.today().isoformat(),
        "unsupported": {f"{m}: {p}": why for (m, p), why in UNSUPPORTED.items()},
        **summary,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    sys.stdout.write(json.dumps(summary["counts"]) + "\n")
    for line in summary["unexplained"]:
        sys.stdout.write(f"UNEXPLAINED {line}\n")
    return 1 if summary["unexplained"] else 0


if __name__ == "__main__":
    sys.exit(main())
