"""Saved outputs of the native engine on a fixed seed: the same numbers on every torch.

``tests/test_numerics_ref.py`` recomputes what this tool saved and compares, in both test
environments (``make test``: torch 2.2.1 with DGL; ``make test-modern``: torch 2.15 without
DGL), so a change of torch, NumPy or Numba that moves RSC's numbers shows up as a failure.

The file holds its own inputs (a 240-node power-law graph, features, labels and every model's
initial weights), so nothing depends on a random generator staying the same across versions.
For each case (model x CPU sampling backend) it holds what a small model does with RSC at
budget 0.3 (no dropout, plain SGD):

- ``logits``: the first forward output ``(N, C)`` (exact);
- ``grad.<param>``: the gradients of the last step (approximated backward);
- ``loss``: the training loss of each of ``STEPS`` steps;
- ``kept``: ``(STEPS, layers)`` rows each product kept (0 on an exact step): integers, equal.

Usage::

    python tools/experiments/numerics_ref.py                 # write tests/data/numerics_ref.npz
    python tools/experiments/numerics_ref.py --check  # compare with it; exit 1 on a difference
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from dgl_rsc.models import build_model  # noqa: E402
from dgl_rsc.nn import attach, cache_input_aggregation  # noqa: E402
from dgl_rsc.sparse.graph import Graph  # noqa: E402

__all__ = ["CASES", "DEFAULT_PATH", "RSC", "STEPS", "TOL", "compare", "make_inputs", "run_case"]

DEFAULT_PATH = os.path.join(ROOT, "tests", "data", "numerics_ref.npz")
STEPS = 8
#: RSC settings: budget 0.3; short cache and tuning periods so that 8 steps re-sample and
#: re-solve several times
# min_width 0: the saved outputs approximate every product, the narrow last one included
RSC = {"budget": 0.3, "cache_interval": 2, "tune_interval": 2, "warmup_steps": 1, "min_k": 4,
       "min_width": 0}  # fmt: skip
#: ``(name, model, sampling backend)``
CASES = [
    ("gcn-numba", "gcn", "numba-cpu"),
    ("gcn-torch", "gcn", "torch"),
    ("sage-numba", "sage", "numba-cpu"),
]
#: largest difference allowed, relative to the largest magnitude of the saved array
TOL = 1e-5
N, FEATS, CLASSES, HIDDEN, LAYERS = 240, 24, 4, 16, 2


def make_inputs(seed: int = 0) -> dict[str, np.ndarray]:
    """A small homophilous power-law graph (symmetric, no self-loops), features and labels.

    Returns ``src (E,)``, ``dst (E,)`` int64, ``feat (N, FEATS)`` float32, ``label (N,)``
    int64. Drawn with NumPy's ``RandomState`` once; the file keeps the result.
    """
    rs = np.random.RandomState(seed)
    label = rs.randint(0, CLASSES, N)
    weight = rs.pareto(1.5, N) + 1.0
    p = weight / weight.sum()
    src = rs.choice(N, 6 * N, p=p)
    dst = rs.choice(N, 6 * N, p=p)
    same = rs.rand(6 * N) < 0.7
    for c in range(CLASSES):
        members = np.flatnonzero(label == c)
        pick = same & (label[src] == c)
        dst[pick] = rs.choice(members, int(pick.sum()))
    keep = src != dst
    key = np.unique(np.concatenate([src[keep] * N + dst[keep], dst[keep] * N + src[keep]]))
    means = rs.randn(CLASSES, FEATS)
    feat = means[label] + 2.0 * rs.randn(N, FEATS)
    return {
        "src": (key // N).astype(np.int64),
        "dst": (key % N).astype(np.int64),
        "feat": feat.astype(np.float32),
        "label": label.astype(np.int64),
    }


def _model(name: str):
    model = build_model(name, in_feats=FEATS, num_classes=CLASSES, hidden=HIDDEN, layers=LAYERS,
                        dropout=0.0, engine="native")  # fmt: skip
    # op by op, DGL's order: the first layer's product keeps a sampled backward to pin down
    # (the one-pass path aggregates this input first, which needs no backward product)
    model.fused_epilogue = False
    return model


def initial_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """Every model's initial parameters, keyed ``<model>.<parameter>``."""
    out = {}
    for model in sorted({m for _, m, _ in CASES}):
        torch.manual_seed(seed)
        for key, value in _model(model).state_dict().items():
            out[f"{model}.{key}"] = value.numpy().copy()
    return out


def run_case(data, model_name: str, backend: str) -> dict[str, np.ndarray]:
    """Train ``model_name`` for :data:`STEPS` steps from the saved inputs and weights.

    ``data``: a mapping holding the arrays of :func:`make_inputs` and :func:`initial_weights`
    (the saved file). Returns ``logits``, ``loss``, ``kept`` and ``grad.<param>`` arrays.
    """
    src, dst = torch.from_numpy(data["src"]), torch.from_numpy(data["dst"])
    feat, label = torch.from_numpy(data["feat"]), torch.from_numpy(data["label"])
    graph = Graph(src, dst, int(feat.shape[0])).add_self_loop()
    model = _model(model_name)
    prefix = f"{model_name}."
    state = {k[len(prefix) :]: torch.from_numpy(np.array(data[k])) for k in data
             if k.startswith(prefix)}  # fmt: skip
    model.load_state_dict(state)
    rsc = attach(model, backend=backend, **RSC)
    # every product approximated, the first layer's too: its input aggregation is not reused
    # (which would leave that layer without a sparse product from the second step on)
    cache_input_aggregation(model, enabled=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    losses, kept, logits = [], [], None
    for _ in range(STEPS):
        opt.zero_grad()
        out = model(graph, feat)
        if logits is None:
            logits = out.detach().numpy().copy()
        loss = F.cross_entropy(out, label)
        loss.backward()
        losses.append(loss.item())
        kept.append([layer["k"] or 0 for layer in rsc.stats()["layers"]])
        opt.step()
        rsc.step()
    result = {"logits": logits, "loss": np.array(losses), "kept": np.array(kept, np.int64)}
    for name, p in model.named_parameters():
        result[f"grad.{name}"] = p.grad.numpy().copy()
    return result


def compute(inputs) -> dict[str, np.ndarray]:
    """Every case's results, keyed ``<case>/<array>``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = {}
        for case, model, backend in CASES:
            for key, value in run_case(inputs, model, backend).items():
                out[f"{case}/{key}"] = value
        return out
    finally:
        torch.set_num_threads(before)


def compare(saved, fresh, tol: float = TOL) -> list[str]:
    """One line per array of ``saved`` that ``fresh`` misses or does not match.

    Integer arrays must be equal; float arrays may differ by ``tol`` times the saved array's
    largest magnitude (all of them are of order 1 at most).
    """
    problems = []
    for key in sorted(saved):
        if "/" not in key:
            continue  # an input
        ref = np.asarray(saved[key])
        if key not in fresh:
            problems.append(f"{key}: not computed")
            continue
        got = np.asarray(fresh[key])
        if got.shape != ref.shape:
            problems.append(f"{key}: shape {got.shape}, saved {ref.shape}")
        elif ref.dtype.kind in "iu":
            if not np.array_equal(got, ref):
                problems.append(f"{key}: {got.tolist()} != saved {ref.tolist()}")
        else:
            diff = float(np.max(np.abs(got.astype(np.float64) - ref))) if ref.size else 0.0
            scale = max(float(np.max(np.abs(ref))) if ref.size else 0.0, 1e-12)
            if not diff <= tol * scale:  # NaN fails too
                problems.append(f"{key}: max difference {diff:.3g} > {tol:g} x {scale:.3g}")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=DEFAULT_PATH, help="the .npz to write or check")
    ap.add_argument("--check", action="store_true", help="compare with --out, write nothing")
    args = ap.parse_args(argv)
    if args.check:
        with np.load(args.out) as f:
            saved = dict(f)
        problems = compare(saved, compute(saved))
        for line in problems:
            print(line)
        print(f"torch {torch.__version__}: {'differs' if problems else 'matches'} {args.out}")
        return 1 if problems else 0
    inputs = {**make_inputs(), **initial_weights()}
    results = compute(inputs)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    np.savez_compressed(args.out, **inputs, **results)
    print(f"wrote {args.out} ({len(results)} arrays, torch {torch.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
