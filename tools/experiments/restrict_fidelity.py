"""Gradient fidelity of ``restrict: weights`` against today's RSC, along a training run.

Three copies of a config's model take the same weights and the same dropout draws at every
step: ``exact`` (the exact backward), ``rsc`` (today's sampled backward) and ``weights``
(``restrict: weights``: the backward before each sampled product on the rows it reads, the
bias and aggregate-first weight gradients estimated from them). The ``weights`` copy trains
(Adam, the config's learning rate); the others are reset to its weights before each step. Per
parameter and step of the approximate phase: the relative error ``||g - g_exact|| /
||g_exact||`` and the norm ratio ``||g|| / ||g_exact||`` of ``rsc`` and ``weights``; the
medians over the steps go to the JSON::

    python tools/experiments/restrict_fidelity.py yaml_configs/cora_gcn.yaml --steps 100 \
        --out docs/results/restrict_fidelity_cora.json
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_common import machine, write_json

from dgl_rsc.launcher.train import _setup, prepare
from dgl_rsc.launcher.yaml_io import load_config
from dgl_rsc.nn import exact as use_exact


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--set", dest="sets", action="append", default=[])
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    cfg = load_config(args.config, ["train.checkpoint_every=0", *args.sets])
    prep = prepare(cfg)
    rsc = cfg.rsc.replace(total_steps=10**9)
    runs = {}
    for name, mode in (("exact", "off"), ("rsc", "off"), ("weights", "weights")):
        torch.manual_seed(0)
        c = dataclasses.replace(cfg, rsc=rsc.replace(restrict=mode))
        runs[name] = _setup(c, prep, "rsc")
    use_exact(runs["exact"].model)
    mask = prep.masks["train"]
    drive = runs["weights"]
    errs = {k: {} for k in ("rsc", "weights")}
    ratios = {k: {} for k in ("rsc", "weights")}
    for step in range(args.steps):
        grads = {}
        for name, run in runs.items():
            if run is not drive:
                run.model.load_state_dict(drive.model.state_dict())
            run.model.train()
            run.model.zero_grad(set_to_none=True)
            torch.manual_seed(1000 + step)
            logits = run.model(run.graph, prep.feat)
            torch.nn.functional.cross_entropy(logits[mask], prep.label[mask]).backward()
            grads[name] = {n: q.grad.detach().clone() for n, q in run.model.named_parameters()
                           if q.grad is not None}  # fmt: skip
            if run.ctl is not None:
                run.ctl.step()
        drive.opt.step()
        if drive.ctl.phase() != "approx" or step < 2:
            continue
        for k in ("rsc", "weights"):
            for n, g in grads[k].items():
                e = grads["exact"][n]
                norm = float(e.norm())
                if norm > 0:
                    errs[k].setdefault(n, []).append(float((g - e).norm()) / norm)
                    ratios[k].setdefault(n, []).append(float(g.norm()) / norm)
    med = {k: {n: round(statistics.median(v), 4) for n, v in d.items()} for k, d in errs.items()}
    rat = {k: {n: round(statistics.median(v), 4) for n, v in d.items()} for k, d in ratios.items()}
    rows = {k: [d["backward_rows_fraction"] for d in runs[k].ctl.stats()["layers"]]
            for k in ("rsc", "weights")}  # fmt: skip
    result = {"config": args.config, "steps": args.steps, "machine": machine(prep.device),
              "median_relative_error": med, "median_norm_ratio": rat,
              "backward_rows_fraction": rows}  # fmt: skip
    write_json(args.out, result)
    print(f"{'parameter':28s} {'rsc err':>8s} {'weights err':>11s} {'rsc ratio':>9s} "
          f"{'weights ratio':>13s}")  # fmt: skip
    for n in med["weights"]:
        print(f"{n:28s} {med['rsc'][n]:8.4f} {med['weights'][n]:11.4f} {rat['rsc'][n]:9.4f} "
              f"{rat['weights'][n]:13.4f}")  # fmt: skip
    print("rows computed per product:", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
