"""Per-layer gradient fidelity over a training run: the sampled backward product against the
exact one, at every approximate step, for each scale of the sampled product.

A controller subclass hands out slots that also compute the exact ``A^T dY`` of the same
step (tool only: the training itself uses the sampled product) and record, per layer, the norm
ratio ``||approx|| / ||exact||`` and the relative error. The model, graph and schedule are
those of a launcher config; ``--rescale`` lists the scales to compare (``none`` is the paper,
``mass`` the total/kept score mass, ``ls`` the least-squares estimate, the default). Also
reported: the training loss just before and after the switch to exact.

Example::

    python tools/experiments/grad_ratio.py yaml_configs/quickstart.yaml --epochs 60 \\
        --out docs/results/grad_ratio_quickstart.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_common import machine, write_json

import dgl_rsc.nn as rnn
from dgl_rsc import RSCController
from dgl_rsc.core.slot import LayerSlot
from dgl_rsc.launcher.train import prepare
from dgl_rsc.launcher.yaml_io import load_config
from dgl_rsc.models import build_model
from dgl_rsc.sparse.products import csr_t_mm


class _SpySlot(LayerSlot):
    __slots__ = ("log",)

    def backward_product(self, A, dY, scales=None):
        from dgl_rsc.sparse.products import NO_SCALES

        scales = NO_SCALES if scales is None else scales
        out = super().backward_product(A, dY, scales)
        if self.step.phase == "approx":
            exact = csr_t_mm(A, dY, scales)
            ratio = float(out.norm() / exact.norm().clamp(min=1e-30))
            error = float((out - exact).norm() / exact.norm().clamp(min=1e-30))
            self.log.setdefault(self.state.index, []).append((ratio, error))
        return out


class SpyController(RSCController):
    """A controller whose slots also record the exact product's norm and the error."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.log = {}

    def slot(self, index):
        base = super().slot(index)
        spy = _SpySlot(base.state, base.step)
        spy.log = self.log
        return spy


def train(cfg, prep, rescale, epochs, seed):
    torch.manual_seed(seed)
    params = {k: v for k, v in cfg.model.items() if k != "name"}
    model = build_model(cfg.model["name"], prep.feat.shape[1], prep.data.num_classes,
                        engine="native", **params)  # fmt: skip
    rsc_cfg = cfg.rsc.replace(rescale=rescale, total_steps=epochs)
    ctl = SpyController(rsc_cfg)
    rnn.attach(model, ctl)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.train.lr)
    graph, mask = prep.graph("native"), prep.masks["train"]
    losses = []
    for _ in range(epochs):
        model.train()
        loss = F.cross_entropy(model(graph, prep.feat)[mask], prep.label[mask])
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctl.step()
        losses.append(float(loss))
    switch = rsc_cfg.switch_step
    layers = {
        str(i): {"norm_ratio": statistics.mean(r for r, _ in v),
                 "error": statistics.mean(e for _, e in v), "steps": len(v)}
        for i, v in sorted(ctl.log.items())
    }  # fmt: skip
    return {"rescale": rescale, "layers": layers, "losses": losses, "switch_step": switch,
            "loss_before_switch": losses[switch - 1],
            "loss_after_switch": losses[switch]}  # fmt: skip


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("--epochs", type=int, default=None, help="default: the config's")
    p.add_argument("--rescale", nargs="+", default=["none", "mass", "ls"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", dest="sets", action="append", default=[])
    p.add_argument("--out", required=True)
    args = p.parse_args()
    cfg = load_config(args.config, args.sets + ["train.engine=native"])
    epochs = args.epochs or cfg.train.epochs
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    prep = prepare(cfg)
    result = {"machine": machine("cpu"), "command": " ".join(sys.argv), "runs": []}
    for rescale in args.rescale:
        run = train(cfg, prep, rescale, epochs, args.seed)
        result["runs"].append(run)
        write_json(args.out, result)
        per_layer = "  ".join(f"L{i}: ratio {v['norm_ratio']:.2f} err {v['error']:.2f}"
                              for i, v in run["layers"].items())  # fmt: skip
        print(f"{rescale:<5} {per_layer}  loss {run['loss_before_switch']:.3f} -> "
              f"{run['loss_after_switch']:.3f} at the switch", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
