"""End-to-end full-graph training: exact vs RSC (and PyG when installed), same graph, same seed.

Runs on the package's DGL-free path (``dgl_rsc.Graph`` + ``dgl_rsc.nn`` layers), so it
works where no DGL wheel exists. For every model and precision it trains the exact baseline
(same layers, exact backward, same sparse engine) and RSC, and reports mean epoch time over
the approximate phase and over the whole run, the speedups and the test accuracy; PyG's
GCNConv/SAGEConv are timed on the same graph as a reference baseline. Time to accuracy: the
training time (evaluation excluded) until validation first reaches exact's best minus
``--tolerance`` points, and exact's over RSC's ("not reached" where RSC never gets there).
With ``--profile`` (CUDA) one step of each method, RSC's in its approximate phase, is profiled
untimed and its GPU time split into forward product, backward product, dense matmuls,
selection/slicing and the rest. Results go to a JSON file with the machine and the date.

Example (on a GPU machine)::

    python tools/bench_e2e.py --device cuda --preset reddit --out results/e2e_reddit.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))

from bench_common import machine, sync, write_json

import dgl_rsc.nn as rnn
from dgl_rsc import RSCConfig
from dgl_rsc.base import _deps
from dgl_rsc.data import load_dataset
from dgl_rsc.launcher.tta import first_crossing
from dgl_rsc.models import build_model
from dgl_rsc.sparse.graph import Graph

# The scale of the RSC paper's graphs, made by the synthetic generator. Homophily is lowered
# from the generator's default so that accuracy stays well under 100% at these degrees
# (measured on 20k-node versions: GCN test accuracy ~83% at degree 400, homophily 0.35).
PRESETS = {
    "reddit": dict(
        num_nodes=233_000, avg_degree=490.0, feat_dim=602, num_classes=41, homophily=0.35
    ),
    "products": dict(
        num_nodes=2_400_000, avg_degree=51.0, feat_dim=100, num_classes=47, homophily=0.3
    ),
    "small": dict(num_nodes=20_000, avg_degree=50.0, feat_dim=64, num_classes=10, homophily=0.3),
    # a smoke test's size: the whole tool in seconds on a CPU
    "tiny": dict(num_nodes=2_000, avg_degree=10.0, feat_dim=16, num_classes=4, homophily=0.5),
}


def accuracy(logits, label, mask):
    return float((logits[mask].argmax(1) == label[mask]).float().mean())


def train(model, graph, data, epochs, lr, amp, device, rsc=None, eval_every=2, profile_at=None):
    """Train ``epochs`` full-batch steps, evaluating every ``eval_every`` (not timed); returns
    per-epoch seconds, the best validation and test at it, the last loss, the history
    (``{"epoch", "epoch_s", "val"}`` per epoch, ``val`` None where not evaluated) and the
    profile of the step before epoch ``profile_at`` (untimed; None without one)."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    dtype = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}[amp]
    scaler = None
    if dtype is torch.float16:  # torch.cuda.amp.GradScaler is deprecated from torch 2.3 on
        new_api = _deps.TORCH_VERSION >= (2, 3)
        scaler = torch.amp.GradScaler("cuda") if new_api else torch.cuda.amp.GradScaler()
    times, history, best_val, test_at_best, prof = [], [], -1.0, 0.0, None
    y, tr = data.label, data.train_mask
    for epoch in range(epochs):
        model.train()
        if epoch == profile_at:
            prof = profile_step(model, graph, data, device, rsc)
        sync(device)
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = F.cross_entropy(model(graph, data.feat)[tr], y[tr])
        opt.zero_grad(set_to_none=True)
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        if rsc is not None:
            rsc.step()
        sync(device)
        times.append(time.perf_counter() - t0)
        history.append({"epoch": epoch + 1, "epoch_s": times[-1], "val": None})
        if (epoch + 1) % eval_every == 0 or epoch == epochs - 1:
            model.eval()
            with torch.no_grad():
                logits = model(graph, data.feat).float()
            val = history[-1]["val"] = accuracy(logits, y, data.val_mask)
            if val > best_val:
                best_val, test_at_best = val, accuracy(logits, y, data.test_mask)
    return times, best_val, test_at_best, float(loss.detach()), history, prof


def pyg_model(kind, in_feats, hidden, classes):
    from torch_geometric.nn import GCNConv, SAGEConv

    dims = [in_feats, hidden, hidden, classes]
    if kind == "gcn":
        convs = [GCNConv(a, b, cached=True) for a, b in zip(dims[:-1], dims[1:])]
    else:
        convs = [SAGEConv(a, b, aggr="mean") for a, b in zip(dims[:-1], dims[1:])]

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = torch.nn.ModuleList(convs)

        def forward(self, edge_index, x):
            for i, conv in enumerate(self.convs):
                x = conv(x, edge_index)
                if i < len(self.convs) - 1:
                    x = F.dropout(F.relu(x), 0.5, self.training)
            return x

    return Net()


def warm_kernels(graph, feat, cfg):
    """One throwaway RSC step, so kernel compilation is not timed as part of an epoch."""
    from dgl_rsc import RSCController, spmm_matrix

    x = feat[:, :8].detach().clone().requires_grad_()
    rsc = RSCController(cfg.replace(warmup_steps=0, total_steps=None))
    spmm_matrix(graph.adj, x, rsc).sum().backward()
    sync(feat.device)


def pyg_row(kind, data, args, device, rows):
    """Time PyG's convs on the same graph: the edge-index (gather/scatter) path and the
    sparse-adjacency path (``torch.sparse`` CSR ``adj_t``). Out of memory is a result."""
    exact_s = next(
        r["exact_epoch_s_all"] for r in rows if r["model"] == kind and r["amp"] == "none"
    )
    n = data.num_nodes
    csr = Graph(data.src, data.dst, n).adj  # rows = destinations: PyG's adj_t
    adj_t = torch.sparse_csr_tensor(
        csr.indptr, csr.indices, csr.values_or_ones(torch.float32), (n, n)
    )
    out = dict(model=kind, amp="none", exact_epoch_s=exact_s)
    for name, edges in (("edge_index", torch.stack([data.src, data.dst])), ("adj_t", adj_t)):
        torch.manual_seed(args.seed)
        net = pyg_model(kind, data.feat.shape[1], args.hidden, data.num_classes).to(device)
        opt = torch.optim.Adam(net.parameters(), lr=args.lr)
        times = []
        try:
            for _ in range(10):
                sync(device)
                t1 = time.perf_counter()
                loss = F.cross_entropy(
                    net(edges, data.feat)[data.train_mask], data.label[data.train_mask]
                )
                opt.zero_grad()
                loss.backward()
                opt.step()
                sync(device)
                times.append(time.perf_counter() - t1)
            out[f"pyg_{name}_epoch_s"] = statistics.mean(times[1:])
            out[f"exact_over_pyg_{name}"] = exact_s / out[f"pyg_{name}_epoch_s"]
        except torch.OutOfMemoryError as err:
            out[f"pyg_{name}_epoch_s"] = None
            out[f"pyg_{name}_error"] = f"out of memory: {str(err)[:120]}"
        del net, opt
        if device.type == "cuda":
            torch.cuda.empty_cache()
        ms = (out[f"pyg_{name}_epoch_s"] or float("nan")) * 1e3
        print(
            f"  {kind:4s} pyg {name:10s} epoch {ms:8.1f} ms (ours exact {exact_s * 1e3:.1f} ms)",
            flush=True,
        )
    return out


def profile_step(model, graph, data, device, rsc=None):
    """GPU milliseconds of one training step's forward and backward (not applied: no
    optimizer step), split by kernel family. The profiled backward used a step's sample (and
    remainder group), so it counts as a step of ``rsc`` (when given), as the controller would
    count it on its own, with a warning, at the next forward."""
    from torch.profiler import ProfilerActivity, profile

    y, tr = data.label, data.train_mask
    split = {}
    for phase in ("forward", "backward"):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            loss = F.cross_entropy(model(graph, data.feat)[tr], y[tr])
            if phase == "backward":
                loss.backward()
            sync(device)
        fam = {"sparse": 0.0, "dense": 0.0, "select": 0.0, "other": 0.0}
        for ev in prof.key_averages():
            us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
            if not us:
                continue
            name = ev.key.lower()
            if "spmm" in name or "cusparse" in name or "csrmm" in name:
                fam["sparse"] += us
            elif "gemm" in name or "xmma" in name or "cutlass" in name or "matmul" in name:
                fam["dense"] += us
            elif "rsc_" in name or "sort" in name or "radix" in name or "scan" in name:
                fam["select"] += us
            else:
                fam["other"] += us
        split[phase] = {k: v / 1e3 for k, v in fam.items()}
    model.zero_grad(set_to_none=True)
    if rsc is not None:
        rsc.step()
    f, s = split["forward"], split["backward"]
    return {
        "forward_product_ms": f["sparse"],
        "backward_product_ms": s["sparse"] - f["sparse"],
        "dense_matmul_ms": s["dense"],
        "selection_slicing_ms": s["select"],
        "other_ms": s["other"],
        "total_ms": sum(s.values()),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="small")
    ap.add_argument("--models", default="gcn,sage")
    ap.add_argument("--amp", default="none,bf16", help="comma list of none | bf16 | fp16")
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--budget", type=float, default=0.1)
    ap.add_argument("--rule", default="cost")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=2, help="epochs between evaluations")
    ap.add_argument(
        "--tolerance",
        type=float,
        default=0.3,
        help="time to target: exact's best validation minus this many points",
    )
    ap.add_argument("--pyg", action="store_true", help="also time PyG's convs")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="profile one step of exact and of RSC's approximate phase",
    )
    ap.add_argument("--out", default="results/bench_e2e.json")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if args.profile and device.type != "cuda":
        ap.error("--profile times CUDA kernels and needs --device cuda; on the CPU, "
                 "tools/profile_run.py splits a launcher config's epoch.")  # fmt: skip

    # the package's defaults for the refresh and tune intervals, the switch and the groups
    cfg = RSCConfig(budget=args.budget, total_steps=args.epochs, rule=args.rule)
    approx_epochs = slice(cfg.warmup_steps + 1, cfg.switch_step)
    if not range(args.epochs)[approx_epochs]:
        ap.error(f"--epochs {args.epochs} leaves no approximate epoch to time (warm-up "
                 f"{cfg.warmup_steps}, exact again from epoch {cfg.switch_step}); give more "
                 "epochs.")  # fmt: skip

    t0 = time.perf_counter()
    data = load_dataset("synthetic", device=device, seed=args.seed, **PRESETS[args.preset])
    gen_s = time.perf_counter() - t0
    graph = Graph(data.src, data.dst, data.num_nodes)
    looped = graph.add_self_loop()
    print(
        f"graph: {data.num_nodes} nodes, {data.src.numel()} edges, F={data.feat.shape[1]}, "
        f"C={data.num_classes}, generated in {gen_s:.1f}s on {device}",
        flush=True,
    )
    warm_kernels(looped, data.feat, cfg)  # compile the sampling kernels outside the timings
    # a step of the approximate phase between two refreshes of the cached sample
    profile_at = (cfg.warmup_steps + cfg.switch_step) // 2 + cfg.cache_interval // 2
    rows = []
    for kind in args.models.split(","):
        g = looped if kind == "gcn" else graph
        for amp in args.amp.split(","):
            res = {}
            for method in ("exact", "rsc"):
                torch.manual_seed(args.seed)
                model = build_model(
                    kind,
                    data.feat.shape[1],
                    data.num_classes,
                    hidden=args.hidden,
                    layers=3,
                    dropout=0.5,
                ).to(device)
                rsc = rnn.attach(model, cfg) if method == "rsc" else None
                if rsc is None:
                    rnn.exact(model)
                times, val, test, loss, history, prof = train(
                    model,
                    g,
                    data,
                    args.epochs,
                    args.lr,
                    amp,
                    device,
                    rsc,
                    args.eval_every,
                    profile_at if args.profile and amp == "none" else None,
                )
                res[method] = dict(
                    epoch_s_approx_phase=statistics.mean(times[approx_epochs]),
                    epoch_s_all=statistics.mean(times[1:]),
                    val=val,
                    test=test,
                    final_loss=loss,
                    visited_fraction=rsc.stats()["visited_fraction"] if rsc else 1.0,
                    history=history,
                )
                if prof is not None:
                    res[method]["profile"] = prof
                    print("  profile (ms): " + ", ".join(
                        f"{k[:-3]} {v:.2f}" for k, v in prof.items()), flush=True)  # fmt: skip
                print(
                    f"  {kind:4s} {amp:4s} {method:5s} epoch {res[method]['epoch_s_all']*1e3:8.1f}"
                    f" ms (approx phase {res[method]['epoch_s_approx_phase']*1e3:8.1f}) "
                    f"test {100 * test:5.2f}",
                    flush=True,
                )
            e, r = res["exact"], res["rsc"]
            target = e["val"] - args.tolerance / 100
            for m in (e, r):
                m["tta"] = first_crossing(m["history"], target)
            row = dict(
                model=kind,
                amp=amp,
                **{f"exact_{k}": v for k, v in e.items()},
                **{f"rsc_{k}": v for k, v in r.items()},
                speedup_approx_phase=e["epoch_s_approx_phase"] / r["epoch_s_approx_phase"],
                speedup_all=e["epoch_s_all"] / r["epoch_s_all"],
                test_delta_points=100 * (r["test"] - e["test"]),
                target_val=target,
                tta_speedup=(e["tta"]["time_s"] / r["tta"]["time_s"]
                             if e["tta"] and r["tta"] else None),
            )  # fmt: skip
            rows.append(row)
        if args.pyg:
            rows.append(pyg_row(kind, data, args, device, rows))
        write_json(
            args.out,
            dict(
                machine=machine(device),
                preset=args.preset,
                rows=rows,
                partial=True,
                command=" ".join(sys.argv),
            ),
        )
    print(
        f"\n{'model':5s} {'amp':4s} {'exact ms':>9s} {'rsc ms':>8s} {'x approx':>8s} "
        f"{'x all':>6s} {'exact acc':>9s} {'rsc acc':>8s} {'x to target':>11s}"
    )
    for r in rows:
        if "speedup_all" in r:
            tta = "not reached" if r["tta_speedup"] is None else f"{r['tta_speedup']:.2f}"
            print(
                f"{r['model']:5s} {r['amp']:4s} {r['exact_epoch_s_all'] * 1e3:9.1f} "
                f"{r['rsc_epoch_s_all'] * 1e3:8.1f} {r['speedup_approx_phase']:8.2f} "
                f"{r['speedup_all']:6.2f} {100 * r['exact_test']:9.2f} {100 * r['rsc_test']:8.2f}"
                f" {tta:>11s}"
            )
    write_json(
        args.out,
        dict(
            machine=machine(device),
            preset=args.preset,
            graph=dict(nodes=data.num_nodes, edges=int(data.src.numel()), generate_s=gen_s),
            config=cfg.to_dict(),
            epochs=args.epochs,
            rows=rows,
            command=" ".join(sys.argv),
        ),
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
