"""The one-pass epilogue's kernels of an earlier revision against the current ones, interleaved.

Runs :mod:`epoch_levers_ab` (same options) with one change: a variant whose name starts with
``old`` runs the bias/ReLU/dropout kernels of ``--old-rev`` (read with ``git show`` from
``dgl_rsc/backends/cpu_fused.py``; before 2026-11-28 22:30 UTC they widened the dropout hash
to 64-bit lanes, read rows through views and summed the bias gradient in float64 per row),
every other variant the current ones. The same dropout masks either way.

    python tools/experiments/epilogue_kernels_ab.py yaml_configs/quickstart.yaml --rounds 30 \\
        --variant new:method=rsc --variant old:method=rsc --out /tmp/epilogue_ab.json
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))

import epoch_levers_ab as AB

from dgl_rsc.sparse import epilogue as E

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_kernels(rev: str):
    """The module ``dgl_rsc/backends/cpu_fused.py`` of git revision ``rev``."""
    text = subprocess.run(["git", "show", f"{rev}:dgl_rsc/backends/cpu_fused.py"], cwd=ROOT,
                          check=True, capture_output=True, text=True).stdout  # fmt: skip
    path = os.path.join(tempfile.mkdtemp(), "cpu_fused_old.py")
    with open(path, "w") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location("cpu_fused_old", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def old_engine(K):
    """``(forward, backward)`` of :data:`dgl_rsc.sparse.epilogue.ENGINES` on the kernels
    ``K`` of a revision whose backward took float64 column sums (the bias gradient)."""

    def params(p, seed):
        thr = E._threshold(p) if p > 0 else 0
        scale = np.float32(1.0 / (1.0 - p)) if p > 0 else np.float32(1)
        return thr, scale, np.uint32(seed[0]), np.uint32(seed[1])

    def forward(x, other, bias, seed, p, relu):
        y = torch.empty_like(x)
        xn, yn = x.detach().numpy(), y.numpy()
        on = (other.detach().numpy() if other is not None
              else np.zeros((x.shape[0], 0), np.float32))  # fmt: skip
        bn = (bias.detach().contiguous().numpy() if bias is not None
              else np.zeros(x.shape[1], np.float32))  # fmt: skip
        thr, scale, lo, hi = params(p, seed)
        E._run(
            E._row_ranges(x.shape[0], x.shape[1], torch.get_num_threads()),
            lambda a, b, _k: K.forward_rows(xn, on, bn, yn, a, b, lo, hi, thr, scale, relu),
        )
        return y

    def backward(dy, y, seed, p, relu, want_bias):
        dx = torch.empty_like(dy)
        ranges = E._row_ranges(dy.shape[0], dy.shape[1], torch.get_num_threads())
        colsum = np.zeros((len(ranges), dy.shape[1] if want_bias else 0), np.float64)
        dyn, yn, dxn = dy.detach().numpy(), y.detach().numpy(), dx.numpy()
        thr, scale, lo, hi = params(p, seed)
        E._run(ranges, lambda a, b, k: K.backward_rows(dyn, yn, dxn, colsum, a, b, k, lo, hi,
                                                       thr, scale, relu))  # fmt: skip
        db = torch.from_numpy(colsum.sum(0)).to(dy.dtype) if want_bias else None
        return dx, db

    return forward, backward


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], add_help=False)
    p.add_argument("--old-rev", default="5a54447", help="git revision of the old kernels")
    args, rest = p.parse_known_args(argv)
    engines = {"new": E.ENGINES["numba"], "old": old_engine(load_kernels(args.old_rev))}
    real_parse, real_setup, real_step = AB.parse, AB._setup, AB._train_step
    parsed, names = [], {}

    def parse(text):  # the names as epoch_levers_ab reads them, in --variant order
        name, opts = real_parse(text)
        parsed.append(name)
        return name, opts

    def setup(cfg, prep, method):  # one run per distinct name, in that order
        run = real_setup(cfg, prep, method)
        names[id(run)] = list(dict.fromkeys(parsed))[len(names)]
        return run

    def step(run, prep):
        E.ENGINES["numba"] = engines["old" if names[id(run)].startswith("old") else "new"]
        try:
            return real_step(run, prep)
        finally:
            E.ENGINES["numba"] = engines["new"]

    AB.parse, AB._setup, AB._train_step = parse, setup, step
    return AB.main(rest)


if __name__ == "__main__":
    sys.exit(main())
