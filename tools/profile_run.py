"""Where a launcher config's epoch goes, per method: stock DGL, dgl_rsc's exact path and RSC.

Each method trains the config's model (the first seed; ``--set`` overrides as in ``dgl-rsc
run``) in its own process, so that its peak resident memory is its own, and ``--profiled``
consecutive epochs (3) are profiled with ``torch.profiler`` (for RSC, epochs of its approximate
phase; no evaluation in them). Their mean epoch is split into (``split_ms``, self CPU time
attributed through the profiler's event tree):

- ``sparse_forward``: the forward sparse products (``RSCSpMM``, DGL's ``GSpMM``) with
  everything they run inside;
- ``sparse_backward_sampled`` / ``sparse_backward_exact``: the backward products ``A^T dY``,
  sampled by RSC or exact (DGL's ``GSpMMBackward``; RSC's warm-up, narrow and switched ones);
- ``rsc_own``: RSC's row selection inside the backward (scores, sorts, cumulative sums,
  norms) and the controller's ``step()`` (the budget solver);
- ``dense``: GEMMs (``mm``, ``addmm``, ``bmm``); ``elementwise``: scaling, bias, activation,
  dropout and their backwards, copies and fills; ``optimizer``: ``Adam.step`` and
  ``zero_grad``; ``other``: the rest (loss, indexing, autograd's bookkeeping).

Allocation is measured by its effect: ``minor_faults_per_epoch`` (``getrusage``'s
``ru_minflt`` over each timed epoch; a page touched for the first time after a fresh ``mmap``
costs one, so zero means freed blocks were reused) and ``peak_rss_mb`` (the method's
process, data included, over the epochs before the profiler starts: on the 200k preset the
profiler's own records took stock DGL's process from 7.8 to 22 GB; ``peak_rss_mb_profiled``
is the whole process's). ``profile_ms`` keeps the earlier coarse categories (``sparse``,
``dense``, ``elementwise``, ``selection``, ``other``) for ``render_benchmarks.py``.

Example::

    python tools/profile_run.py yaml_configs/quickstart.yaml --epochs 20 \\
        --out docs/results/epoch_profile_quickstart.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(1, os.path.join(os.path.dirname(__file__), "experiments"))

from bench_common import machine, write_json
from bench_cpu_e2e import categorize
from profile_int8 import INT8_SPLIT, category, label

import dgl_rsc.core.ops as core_ops
import dgl_rsc.core.spmm as core_spmm
from dgl_rsc.base.memory import peak_rss_bytes
from dgl_rsc.core.controller import RSCController
from dgl_rsc.dgl.nn.input_cache import InputAggregationCache
from dgl_rsc.launcher.prepare import methods as config_methods
from dgl_rsc.launcher.train import prepare, train_one
from dgl_rsc.launcher.yaml_io import load_config
from dgl_rsc.sparse.products import NO_SCALES

SPLIT = ("sparse_forward", "sparse_backward_sampled", "sparse_backward_exact", "rsc_own",
         "dense", "elementwise", "optimizer", "other", *INT8_SPLIT)  # fmt: skip
#: methods beyond the launcher's: ``name -> (launcher method, train.precision)``
VARIANTS = {"int8": ("exact", "int8"), "int8-rsc": ("rsc", "int8")}
#: ranges whose whole subtree is one category (the nearest enclosing range wins)
RANGES = {
    "RSCSpMM": "sparse_forward", "GSpMM": "sparse_forward",
    "rsc::sampled_product": "sparse_backward_sampled",
    "rsc::exact_product": "sparse_backward_exact",
    "RSCSpMMBackward": "sparse_backward_exact", "GSpMMBackward": "sparse_backward_exact",
    "rsc::controller_step": "rsc_own",
    "_BiasActDropout": "elementwise", "_BiasActDropoutBackward": "elementwise",
    "_BiasReluDropoutBits": "elementwise", "_BiasReluDropoutBitsBackward": "elementwise",
}  # fmt: skip
SELECTION = {"aten::sort", "aten::cumsum", "aten::nonzero", "aten::linalg_vector_norm",
             "aten::topk", "aten::argsort", "aten::searchsorted", "aten::bincount"}  # fmt: skip
DENSE = {"aten::mm", "aten::addmm", "aten::bmm"}
ELEMENTWISE = {
    "aten::mul", "aten::add", "aten::div", "aten::sub", "aten::clamp_min", "aten::relu",
    "aten::threshold_backward", "aten::bernoulli_", "aten::native_dropout",
    "aten::native_dropout_backward", "aten::fill_", "aten::add_", "aten::mul_", "aten::div_",
    "aten::pow", "aten::copy_", "aten::zero_", "aten::clone", "aten::where", "aten::empty",
    "aten::empty_strided", "aten::sum", "aten::masked_fill", "aten::mm_backward",
}  # fmt: skip


def _label_products() -> None:
    """Name each backward product ``rsc::sampled_product`` / ``rsc::exact_product`` and the
    controller's step ``rsc::controller_step`` in the profile (this tool's process only)."""
    orig_grad, orig_step = core_spmm.feature_grad, RSCController.step

    def feature_grad(sampler, A, dY, scales=NO_SCALES):
        step = getattr(sampler, "step", None)
        sampled = step is not None and step.phase == "approx"
        name = "rsc::sampled_product" if sampled else "rsc::exact_product"
        with torch.profiler.record_function(name):
            return orig_grad(sampler, A, dY, scales)

    def step(self, loss=None):
        with torch.profiler.record_function("rsc::controller_step"):
            return orig_step(self, loss)

    for module in (core_spmm, core_ops):  # each calls the name it imported
        module.feature_grad = feature_grad
    RSCController.step = step


def split(prof) -> dict:
    """Self CPU milliseconds per category of :data:`SPLIT`."""
    out = dict.fromkeys(SPLIT, 0.0)
    for ev in prof.events():
        name, cat, node = ev.name, None, ev
        while node is not None and cat is None:
            cat = category(node.name, name)  # an INT8 range (tools/experiments/profile_int8.py)
            if cat is None:
                cat = "optimizer" if node.name.startswith("Optimizer.") else RANGES.get(node.name)
            node = node.cpu_parent
        if cat is not None and cat.startswith("sparse_backward") and name in SELECTION:
            cat = "rsc_own"
        if cat is None:
            if name in DENSE:
                cat = "dense"
            elif name in ELEMENTWISE:
                cat = "elementwise"
            else:
                cat = "other"
        out[cat] += ev.self_cpu_time_total / 1e3
    return {k: round(v, 2) for k, v in out.items()}


def window(epochs: int, profiled: int) -> tuple[int, int]:
    """The first and last epoch profiled: after two warm-up epochs, inside RSC's approximate
    phase (before ``switch_at`` 0.8 of the run)."""
    last = max(4, int(0.8 * epochs) - 2)
    return max(3, last - profiled + 1), last


def child(cfg, method: str, profiled: tuple[int, int]) -> dict:
    """One method in this process: its timed epochs, the profiled epochs' mean split, faults
    (``method``: the launcher's, or one of :data:`VARIANTS`)."""
    _label_products()
    label()
    if method in VARIANTS:
        method, precision = VARIANTS[method]
        train = dataclasses.replace(cfg.train, precision=precision)
        cfg = dataclasses.replace(cfg, train=train)
    prep = prepare(cfg)
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    seen = {}
    first, last = profiled
    n = last - first + 1

    def on_epoch_end(name, epoch):
        if epoch == first - 1:
            seen["peak"] = peak_rss_bytes() / 2**20  # the profiler's records add to it
            prof.start()
        elif epoch == last:
            prof.stop()
            seen["split"] = {k: round(v / n, 2) for k, v in split(prof).items()}
            seen["coarse"] = {k: v / n for k, v in categorize(prof).items()}

    rec = train_one(cfg, prep, method, cfg.train.seeds[0], progress=False,
                    on_epoch_end=on_epoch_end)  # fmt: skip
    hist = rec["history"]
    timed = [h for h in hist if h["phase"] == "approx"][1:] if method == "rsc" else hist[2:]
    timed = [h for h in timed if h["val"] is None and not first <= h["epoch"] <= last] or timed
    coarse = seen["coarse"]
    total = sum(coarse.values())
    stats = rec["rsc_stats"] or {}
    return {
        "epoch_ms": 1e3 * statistics.mean(h["epoch_s"] for h in timed),
        "epoch_ms_median": 1e3 * statistics.median(h["epoch_s"] for h in timed),
        "timed_epochs": len(timed),
        "epoch_s": [h["epoch_s"] for h in hist],
        "split_ms": seen["split"],
        "profile_ms": coarse,
        "sparse_share": coarse["sparse"] / total if total else None,
        "minor_faults_per_epoch": statistics.median(h["minor_faults"] for h in timed),
        "peak_rss_mb": seen["peak"],
        "peak_rss_mb_profiled": peak_rss_bytes() / 2**20,
        "allocator": prep.allocator,
        "test": rec["best"]["test"],
        "cache_hits": stats.get("cache_hits"),
        "cache_misses": stats.get("cache_misses"),
        "cached_input_aggregation": stats.get("cached_input_aggregation"),
    }


def _run_child(args, method: str) -> dict:
    """One process training ``method``: its :func:`child` record."""
    with tempfile.TemporaryDirectory() as tmp:
        res = os.path.join(tmp, "child.json")
        cmd = [sys.executable, *sys.argv[:1], args.config, "--epochs", str(args.epochs),
               "--child", method, "--out", res, "--levers", args.levers,
               "--profiled", str(args.profiled)]  # fmt: skip
        cmd += [x for s in args.sets for x in ("--set", s)]
        if args.threads is not None:
            cmd += ["--threads", str(args.threads)]
        subprocess.run(cmd, check=True)
        with open(res) as f:
            return json.load(f)


def merge(rows: list) -> dict:
    """One method's processes as one record: medians over the processes (of their median
    epoch, each category, the faults), the largest peak memory; ``runs`` keeps each."""
    med = statistics.median
    out = dict(rows[0])
    out["epoch_ms"] = med(r["epoch_ms"] for r in rows)
    out["epoch_ms_median"] = med(r["epoch_ms_median"] for r in rows)
    out["split_ms"] = {k: round(med(r["split_ms"][k] for r in rows), 2) for k in SPLIT}
    out["profile_ms"] = {k: med(r["profile_ms"][k] for r in rows) for k in rows[0]["profile_ms"]}
    total = sum(out["profile_ms"].values())
    out["sparse_share"] = out["profile_ms"]["sparse"] / total if total else None
    out["minor_faults_per_epoch"] = med(r["minor_faults_per_epoch"] for r in rows)
    out["peak_rss_mb"] = max(r["peak_rss_mb"] for r in rows)
    out["runs"] = rows
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("--set", dest="sets", action="append", default=[])
    p.add_argument("--epochs", type=int, default=20, help="epochs per run (shorter than the "
                   "config's: this measures time, not accuracy)")  # fmt: skip
    p.add_argument("--methods", nargs="+", default=None,
                   help="of stock, exact, rsc, int8 (exact in INT8), int8-rsc (default: "
                   "those the config compares)")  # fmt: skip
    p.add_argument("--profiled", type=int, default=3, help="epochs profiled; the split is "
                   "their mean (fewer where the run is too short)")  # fmt: skip
    p.add_argument("--repeat", type=int, default=1, help="processes per method, the methods "
                   "taking turns; the record is their median (a machine whose speed drifts "
                   "otherwise decides the comparison)")  # fmt: skip
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--levers", choices=("on", "off"), default="on", help="off: the epoch "
                   "before issue 45's levers (glibc's allocator defaults, no reuse of the "
                   "input aggregation)")  # fmt: skip
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # method, JSON to stdout
    p.add_argument("--out", required=False)
    args = p.parse_args()
    if args.epochs < 5:
        p.error(
            f"--epochs {args.epochs}: at least 5 (two warm-up epochs, the profiled one "
            "inside RSC's approximate phase, and timed ones around it)"
        )
    if args.repeat < 1 or args.profiled < 1:
        p.error(f"--repeat {args.repeat} --profiled {args.profiled}: at least 1 process per "
                "method and 1 profiled epoch")  # fmt: skip
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    sets = [*args.sets, f"train.epochs={args.epochs}", f"train.eval_every={args.epochs}",
            "train.checkpoint_every=0"]  # fmt: skip
    if args.levers == "off":
        sets.append("train.keep_freed_memory=false")
    cfg = load_config(args.config, sets)
    profiled = window(args.epochs, args.profiled)
    if args.child:
        if args.levers == "off":  # every layer built in this process reuses nothing
            real_init = InputAggregationCache.__init__

            def init(self):
                real_init(self)
                self.enabled = False

            InputAggregationCache.__init__ = init
        with open(args.out, "w") as f:
            json.dump(child(cfg, args.child, profiled), f)
        return
    if args.out is None:
        p.error("--out is required")
    todo = args.methods or list(config_methods(cfg))
    out = {"machine": machine("cpu"), "command": " ".join(sys.argv), "config": args.config,
           "sets": args.sets, "mode": cfg.train.mode, "threads": torch.get_num_threads(),
           "profiled_epochs": list(profiled), "levers": args.levers,
           "repeat": args.repeat,
           "note": "each method in its own processes, the methods taking turns; the "
                   "interleaved tables compare methods epoch by epoch", "methods": {}}  # fmt: skip
    runs = {m: [] for m in todo}
    for r in range(args.repeat):  # the methods in turn, each turn starting one further on
        k = r % len(todo)
        for method in todo[k:] + todo[:k]:
            runs[method].append(_run_child(args, method))
    for method in todo:
        row = merge(runs[method])
        out["methods"][method] = row
        cats = "  ".join(f"{k} {v:.0f}" for k, v in row["split_ms"].items())
        print(f"{os.path.basename(args.config)} {method:<5} median epoch "
              f"{row['epoch_ms_median']:8.1f} ms  "
              f"faults/epoch {row['minor_faults_per_epoch']:.0f}  peak RSS "
              f"{row['peak_rss_mb']:.0f} MB  [{cats}]", flush=True)  # fmt: skip
    ms = {m: r["epoch_ms_median"] for m, r in out["methods"].items()}
    for base in ("stock", "exact"):
        if base in ms:
            out[f"speedup_vs_{base}"] = {m: ms[base] / v for m, v in ms.items()}
            print(f"speedup vs {base}: " + "  ".join(
                f"{m} {ms[base] / v:.2f}x" for m, v in ms.items()))  # fmt: skip
    write_json(args.out, out)


if __name__ == "__main__":
    main()
