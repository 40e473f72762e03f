"""A stock PyG GCN on Cora, eager and compiled, stock and inside ``dgl_rsc.pyg.patch``: the
median epoch of each (one process; the stock pair interleaved, each RSC variant after them
in its own patch) and the test accuracy after ``--epochs``.

    python tools/experiments/compile_pyg_cora.py --epochs 200 \\
        --out docs/results/compile_pyg_cora.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench_common import machine, write_json

import dgl_rsc.pyg as rp

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "cora.npz")


class GCN(torch.nn.Module):
    def __init__(self, d, c):
        from torch_geometric.nn import GCNConv

        super().__init__()
        self.c1, self.c2 = GCNConv(d, 16), GCNConv(16, c)

    def forward(self, x, ei):
        x = F.dropout(x, 0.5, self.training)
        return self.c2(F.dropout(self.c1(x, ei).relu(), 0.5, self.training), ei)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--budget", type=float, default=0.3)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    z = np.load(DATA)
    ei = torch.from_numpy(np.stack([z["src"], z["dst"]])).long()
    x, y = torch.from_numpy(z["feat"]).float(), torch.from_numpy(z["label"]).long()
    train, test = torch.from_numpy(z["train_mask"]), torch.from_numpy(z["test_mask"])
    classes = int(y.max()) + 1
    variants = {}

    def make(name):
        torch.manual_seed(0)
        net = GCN(x.shape[1], classes)
        opt = torch.optim.Adam(net.parameters(), lr=0.01, weight_decay=5e-4)
        fn = torch.compile(net) if name.endswith("compiled") else net
        variants[name] = dict(net=net, opt=opt, fn=fn, times=[])

    def epochs(names, ctl=None):
        for epoch in range(args.epochs):
            for name in names[epoch % len(names) :] + names[: epoch % len(names)]:
                v = variants[name]
                t = time.perf_counter()
                v["net"].train()
                loss = F.cross_entropy(v["fn"](x, ei)[train], y[train])
                v["opt"].zero_grad()
                loss.backward()
                v["opt"].step()
                if ctl is not None:
                    ctl.step()
                v["times"].append(time.perf_counter() - t)

    # stock PyG, eager and compiled, interleaved; then each RSC variant in its own patch (one
    # patch holds one controller, and re-entering it per epoch would re-trace the model)
    for name in ("stock", "stock-compiled"):
        make(name)
    epochs(["stock", "stock-compiled"])
    for name in ("rsc-compiled", "rsc"):
        make(name)
        with rp.patch(budget=args.budget, total_steps=args.epochs) as ctl:
            epochs([name], ctl)
    rows = {}
    for name, v in variants.items():
        v["net"].eval()
        with torch.no_grad():
            acc = float((v["net"](x, ei).argmax(1)[test] == y[test]).float().mean())
        times = v["times"]
        rows[name] = {"median_ms": statistics.median(times[5:]) * 1e3,
                      "first_s": times[0], "test_acc": acc}  # fmt: skip
    ref = rows["stock-compiled"]["median_ms"]
    for name, row in rows.items():
        row["speedup_vs_stock_compiled"] = ref / row["median_ms"]
        print(f"{name:>15}: {row['median_ms']:7.2f} ms  x{row['speedup_vs_stock_compiled']:.2f}"
              f" vs stock compiled  test {row['test_acc']:.3f}")  # fmt: skip
    write_json(args.out, {
        "tool": "tools/experiments/compile_pyg_cora.py",
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "epochs": args.epochs, "budget": args.budget, "machine": machine("cpu"),
        "note": "stock eager/compiled interleaved, each RSC variant run after them in its "
                "own patch (not interleaved)",
        "variants": rows,
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
