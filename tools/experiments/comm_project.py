"""Projected epoch time and bytes of distributed full-graph GCN training at 8-256 ranks on
10, 25 and 100 Gb/s networks, for graphs the size of ogbn-products and ogbn-papers100M:
1D and CAGNET's sparsity-aware 1.5D, each exact, with RSC, with 8-bit halos and under the
byte budget (``comm_model.py`` is the cost model; this applies it where nothing was run).

Per rank (every rank alike; a partitioner's imbalance is not modelled):

- compute: the cost model's counted work at ``n / P`` owned nodes and ``E / P`` local edges
  (1.5D: the same edges, the dense work of a whole block, ``c n / P`` rows: replicas repeat
  it), at the rates of a *profile*: ``gpu`` (fitted to the package's single-process H100
  epochs of the products-scale graph, ``e2e_products_h100_folded.json``) or ``cpu`` (this
  machine's fitted rates, one core per rank);
- communication: :data:`ALPHA_S` per message sent or received, :data:`ROUND_S` per exchange
  round (a layer's halo, a backward count round, a replica-sum step, a step of the
  parameters' tree all-reduce; a backward index travels with its rows, and the budget's
  forward header round runs on the steps after a re-allocation, one in :data:`REPLAN`), and
  the larger of the bytes sent and received over the link's bandwidth (full duplex, line
  rate); no overlap with compute; every rank exchanges with every other rank of its group
  (true of these halos from 8 ranks on);
- the halo: :func:`comm_halo.halo_per_rank` with the edge-cut fraction METIS gave at ``P``
  parts on a synthetic stand-in of the graph (``comm_halo.py``: the package's DC-SBM generator
  with the graph's average degree and class count, homophily 0.8, 1/10 or fewer of its
  nodes), its degree sequence scaled to the graph's nodes, and the clump that makes the
  formula give the stand-in's measured halo at that ``P`` (the halo per node is then the
  stand-in's: a DC-SBM's cut does not depend on its size); backward, only rows in the
  gradient's support (the training nodes and their in-neighbours, layer by layer);
- RSC: the backward sparse work times its measured visited share, and the backward halo of
  the kept rows only; 8-bit: the codec's row size and its work; budget ``F``: halo bytes ``F``
  times exact fp32 1D's (the byte budget's definition), RSC's compute plus the codec on every
  halo row;
- 1.5D as ``docs/guide/distributed.md`` describes it: ``q = P / c`` blocks, the halo of
  ``q`` parts over ``c`` replicas for a receiver, but the whole block's rows for its sender
  (replica ``j % c`` of block ``j`` serves every block); the replica all-reduces (a ring,
  fp32, not budgeted). ``--deal balanced`` deals column blocks by ``(i + j) % c`` instead,
  spreading the sends.

Example::

    python tools/experiments/comm_project.py --halo docs/results/comm_halo.json \\
        --fit docs/results/comm_model_fit.json --out docs/results/comm_projection.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import machine, write_json
from comm_halo import degree_law, halo_per_rank

RESULTS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "results")
#: sizes from OGB's tables (nodes, edges as listed: products undirected, stored both ways;
#: papers100M directed, symmetrized for training), features, classes, training nodes
GRAPHS = {
    "ogbn-products": {"nodes": 2_449_029, "edges": 2 * 61_859_140, "features": 100,
                      "classes": 47, "train": 196_615, "stand_in": "synthetic:244902:50.5:0.8:47"},
    "ogbn-papers100M": {"nodes": 111_059_956, "edges": 2 * 1_615_685_872, "features": 128,
                        "classes": 172, "train": 1_207_179,
                        "stand_in": "synthetic:250000:29.1:0.8:172"},
}  # fmt: skip
#: METIS's total communication volume (halo rows over all parts) on the real ogbn-products at
#: 10 parts, edge-cut objective: 2,108,759 (dmlc/dgl pull request 3821, by BNS-GCN's author)
PUBLISHED = {"graph": "ogbn-products", "parts": 10, "halo_total": 2_108_759,
             "source": "https://github.com/dmlc/dgl/pull/3821"}  # fmt: skip
NETWORKS_GBPS = (10, 25, 100)
RANKS = (8, 16, 32, 64, 128, 256)
REPLICATION = (2, 4, 8)
#: a network's per-message software cost (posting and completing one send or receive) and
#: per-round latency (the messages of one exchange are posted together: one wait each round);
#: assumptions of the order of NCCL's and of RoCE/TCP's
ALPHA_S, ROUND_S = 5e-6, 20e-6
#: the model the projections train: GCN, 3 layers, hidden 256 (CAGNET's and AdaQP's setting)
HIDDEN, LAYERS = 256, 3
#: steps between the byte budget's re-allocations (``distributed.adaptive_interval``'s
#: default): its forward header round runs on one step in REPLAN
REPLAN = 10
POWER_LAW = 2.5  # the degree law's exponent (the generator's default; an assumption)
MODES = ("exact", "rsc", "bits8", "budget")


def gpu_profile(path: str) -> dict:
    """Rates of one H100 from the package's products-scale single-process epochs (the
    profiler's forward/backward products, dense GEMMs and the rest; RSC's visited share)."""
    from dgl_rsc.distributed.traffic import model_shape
    from dgl_rsc.models.paper import build_model

    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    row = d["rows"][0]
    n, e = d["graph"]["nodes"], d["graph"]["edges"]
    shape = model_shape(build_model("gcn", 100, 47, hidden=HIDDEN, layers=LAYERS), 100)
    fwd, bwd = sum(shape.widths), sum(w for w, g in zip(shape.widths, shape.grads) if g)
    ex, rs = row["exact_profile"], row["rsc_profile"]
    return {
        "sparse_s": 1e-3 * (ex["forward_product_ms"] + ex["backward_product_ms"])
        / (e * (fwd + bwd)),
        "dense_s": 1e-3 * ex["dense_matmul_ms"] / (3 * n * shape.dense_macs),
        "elem_s": 1e-3 * ex["other_ms"] / (n * fwd),
        "score_s": 1e-3 * max(rs["other_ms"] + rs["selection_slicing_ms"] - ex["other_ms"], 0)
        / (n * bwd),
        "codec_s": 2e-12,  # an assumption: a memory-bound pass of a few bytes per value
        "fixed_s": 0.0,
        "visited": rs["backward_product_ms"] / ex["backward_product_ms"],
        "source": os.path.basename(path),
    }  # fmt: skip


def cpu_profile(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    rates = dict(d["params"])
    rsc = [r for r in d["rows"] if r["method"] == "rsc"]
    rates["visited"] = sum(r["nnz_fraction"] for r in rsc) / len(rsc)
    rates["source"] = os.path.basename(path)
    return rates


def _support(degrees: torch.Tensor, train_frac: float, layers: int) -> list:
    """Fraction of rows in each aggregation's gradient support, forward order (random graph
    with the degree law: a row joins when one of its out-edges reaches the rows above)."""
    t = [train_frac]
    for _ in range(layers - 1):
        stay = float(((1 - t[-1]) ** degrees.double()).mean())
        t.append(1 - (1 - t[-1]) * stay)
    return t[::-1]


def _row_bytes(width: int, bits: int) -> float:
    return 4.0 * width if bits == 32 else 4 + math.ceil(width * bits / 8)


class Graph:
    """One projected graph: its model shape, degrees, gradient support and METIS cut.

    ``cut[P]`` and ``clump[P]``: the edge-cut fraction and the clump at ``P`` parts (a number:
    the same at every ``P``); ``degrees``: an out-degree sequence of the graph's law (the
    stand-in's, scaled up by ``nodes / len(degrees)``; default :func:`degree_law`)."""

    def __init__(self, g: dict, cut: dict, clump, degrees=None):
        from dgl_rsc.distributed.traffic import model_shape
        from dgl_rsc.models.paper import build_model

        self.g, self.cut = g, cut
        self.clump = clump if isinstance(clump, dict) else dict.fromkeys(cut, float(clump))
        self.n, self.e = g["nodes"], g["edges"] + g["nodes"]  # GCN's self-loops
        if degrees is None:
            degrees = degree_law(g["edges"] / g["nodes"], POWER_LAW, g["nodes"])
        self.degrees = degrees
        self.scale = self.n / self.degrees.numel()
        model = build_model("gcn", g["features"], g["classes"], hidden=HIDDEN, layers=LAYERS)
        self.shape = model_shape(model, g["features"])
        self.support = _support(self.degrees, g["train"] / self.n, len(self.shape.widths))

    #: the real graph's cut over the stand-in's (``fit_locality``; 1.0: the stand-in's)
    locality = 1.0

    def kappa(self, parts: float) -> float:
        """The edge-cut fraction at ``parts`` (log-interpolated between measured counts)."""
        return min(self.locality * _interp(self.cut, parts), 1 - 1 / parts)

    def halo(self, parts: float, support: float = 1.0) -> float:
        """Mean halo rows per rank at ``parts`` parts (rows whose gradient is non-zero, for
        a ``support`` share of destination rows)."""
        return halo_per_rank(self.degrees, parts, self.kappa(parts), support,
                             _interp(self.clump, parts), self.scale)  # fmt: skip

    def fit_locality(self, parts: int, halo_total: float) -> float:
        """Scale the stand-in's cut so that the model gives ``halo_total`` rows over all
        ``parts`` parts (a published METIS communication volume); returns the scale."""
        lo, hi = 1e-4, 1.0 / _interp(self.cut, parts)
        for _ in range(60):
            self.locality = (lo * hi) ** 0.5
            if self.halo(parts) * parts > halo_total:
                hi = self.locality
            else:
                lo = self.locality
        return self.locality

    def halo_bytes(self, parts: int, bits: int = 32, keep: float = 1.0) -> tuple:
        """``(forward, backward)`` halo bytes a rank receives per epoch at ``parts`` parts,
        and the halo rows that travel (for the codec's work)."""
        fwd_rows = self.halo(parts)
        fwd = sum(fwd_rows * _row_bytes(w, bits) for w in self.shape.widths)
        bwd = rows = 0.0
        for w, grad, t in zip(self.shape.widths, self.shape.grads, self.support):
            if grad:
                r = self.halo(parts, t * keep)
                bwd += r * (4 + _row_bytes(w, bits))
                rows += r
        return fwd, bwd, fwd_rows * len(self.shape.widths) + rows


def _interp(table: dict, parts: float) -> float:
    """``table[parts]``, log-linear between the measured part counts."""
    if parts in table:
        return table[parts]
    keys = sorted(table)
    lo = max(k for k in keys if k < parts)
    hi = min(k for k in keys if k > parts)
    w = (math.log(parts) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return table[lo] + w * (table[hi] - table[lo])


def project_one(gr: Graph, p: int, c: int, mode: str, rates: dict, gbps: float,
                deal: str = "spec", budget: float = 0.2) -> dict:  # fmt: skip
    """Per-rank seconds and bytes of one epoch (see the module docstring)."""
    shape, q = gr.shape, p // c
    widths, grads = shape.widths, shape.grads
    keep = rates["visited"] if mode in ("rsc", "budget") else 1.0
    fwd, bwd, rows = gr.halo_bytes(q, 8 if mode == "bits8" else 32, keep)
    if mode == "budget":  # F x exact fp32 1D bytes at P ranks: the budget's definition
        f1, b1, _ = gr.halo_bytes(p)
        share = budget * (f1 + b1) * c / (fwd + bwd)  # x c: a 1.5D receiver gets 1/c below
        fwd, bwd = fwd * share, bwd * share
    recv = (fwd + bwd) / c  # a 1.5D receiver gets 1/c of its block's halo
    sent = fwd + bwd if (c > 1 and deal == "spec") else recv  # the spec's sender: all of it
    block = gr.n / q  # rows each rank holds (1D: n / P)
    bwd_w = sum(w for w, g in zip(widths, grads) if g)
    replica = 4.0 * block * 2 * (c - 1) / c * (sum(widths) + bwd_w)
    group = q if c > 1 else p  # the parameters' all-reduce: over a process column in 1.5D
    allreduce = 4.0 * shape.params * 2 * (group - 1) / group
    layers_b = sum(1 for g in grads if g)
    peers = (q - 1) if (c > 1 and deal == "spec") else (q - 1) / c
    # halo: a message to and from each peer per forward layer (the budget's header round on
    # one step in REPLAN); backward a count round and one message of index and rows; replica
    # sums 2 (c - 1) steps each way; the all-reduce a tree
    heads = len(widths) / REPLAN if mode == "budget" else 0.0
    messages = peers * (2 * len(widths) + 2 * heads + 4 * layers_b) + 4 * math.log2(group)
    messages += 4 * (c - 1) * (len(widths) + layers_b)
    rounds = len(widths) + heads + 2 * layers_b + 2 * math.log2(group)
    rounds += 2 * (c - 1) * (len(widths) + layers_b)
    comm = (ALPHA_S * messages + ROUND_S * rounds
            + 8.0 / (gbps * 1e9) * (max(sent, recv) + replica + allreduce))  # fmt: skip
    work = {"fixed": 1.0, "sparse": gr.e / p * (sum(widths) + bwd_w * keep),
            "dense": 3.0 * block * shape.dense_macs, "elem": block * sum(widths),
            "score": block * bwd_w if mode in ("rsc", "budget") else 0.0,
            "codec": rows / c * sum(widths) / len(widths) if mode in ("bits8", "budget")
            else 0.0}  # fmt: skip
    compute = sum(rates[f"{k}_s"] * v for k, v in work.items())
    return {"epoch_s": compute + comm, "compute_s": compute, "comm_s": comm,
            "halo_bytes": recv, "sent_bytes": sent, "replica_bytes": replica,
            "allreduce_bytes": allreduce, "messages": messages}  # fmt: skip


def _stand_in(halo: dict, name: str) -> tuple:
    """``(cut, clump, degrees)`` measured on the stand-in of graph ``name``."""
    spec = GRAPHS[name]["stand_in"]
    mine = [r for r in halo["rows"] if r["graph"] == spec]
    cut = {r["parts"]: r["edge_cut_fraction"] for r in mine}
    clump = {r["parts"]: r["clump_at_p"] for r in mine}
    hist = torch.tensor(halo["degrees"][spec], dtype=torch.float64)
    return cut, clump, torch.repeat_interleave(hist[:, 0], hist[:, 1].long())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--halo", required=True, help="comm_halo.py's JSON (the stand-ins' cut)")
    ap.add_argument("--fit", help="comm_model.py's JSON (this machine's rates: the cpu profile)")
    ap.add_argument("--gpu", default=os.path.join(RESULTS, "e2e_products_h100_folded.json"))
    ap.add_argument("--deal", choices=("spec", "balanced"), default="spec")
    ap.add_argument("--locality", choices=("published", "stand-in"), default="published",
                    help="the cut of real ogbn-products (METIS's published volume at 10 parts "
                    "scales the stand-in's cut) or the stand-in's own (no locality beyond its "
                    "classes)")  # fmt: skip
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    with open(args.halo, encoding="utf-8") as f:
        halo = json.load(f)
    profiles = {"gpu": gpu_profile(args.gpu)}
    if args.fit:
        profiles["cpu"] = cpu_profile(args.fit)
    rows, localities = [], {}
    for name, g in GRAPHS.items():
        gr = Graph(g, *_stand_in(halo, name))
        if args.locality == "published":  # both graphs take the products' measured locality
            ref = Graph(GRAPHS[PUBLISHED["graph"]], *_stand_in(halo, PUBLISHED["graph"]))
            gr.locality = ref.fit_locality(PUBLISHED["parts"], PUBLISHED["halo_total"])
        localities[name] = gr.locality
        for prof, rates in profiles.items():
            for gbps in NETWORKS_GBPS:
                for p in RANKS:
                    for c in (1, *[c for c in REPLICATION if p % c == 0 and p // c >= 2]):
                        for mode in MODES:
                            r = project_one(gr, p, c, mode, rates, gbps, args.deal)
                            rows.append({"graph": name, "profile": prof, "gbps": gbps, "ranks": p,
                                         "replication": c, "mode": mode, **r})  # fmt: skip
    write_json(args.out, {"machine": machine("cpu"), "command": " ".join(sys.argv),
                          "graphs": GRAPHS, "alpha_s": ALPHA_S, "round_s": ROUND_S,
                          "hidden": HIDDEN,
                          "layers": LAYERS, "power_law": POWER_LAW, "deal": args.deal,
                          "profiles": profiles, "locality": args.locality,
                          "published": PUBLISHED, "locality_scale": localities,
                          "rows": rows})  # fmt: skip


if __name__ == "__main__":
    main()


# -- the tables of docs/benchmarks.md (tools/render_benchmarks.py) ---------------------------
def best(rows: list, graph: str, profile: str, gbps: int, p: int, mode: str, algo: str) -> dict:
    """The row of 1D (``algo="1d"``) or of the fastest 1.5D replication at ``p`` ranks."""
    sel = [r for r in rows if (r["graph"], r["profile"], r["gbps"], r["ranks"], r["mode"])
           == (graph, profile, gbps, p, mode)]  # fmt: skip
    if algo == "1d":
        return next(r for r in sel if r["replication"] == 1)
    return min((r for r in sel if r["replication"] > 1), key=lambda r: r["epoch_s"])


def summary(d: dict, profile: str = "gpu") -> dict:
    """Per graph and network: the 1D/1.5D crossover (the first rank count at which the best
    1.5D exact epoch beats 1D's), 1.5D's gain at 64 and 256 ranks, and the budget's gain over
    exact fp32 1D at each rank count."""
    out = {}
    rows = d["rows"]
    for graph in d["graphs"]:
        for gbps in NETWORKS_GBPS:
            key, ranks = f"{graph} {gbps}", sorted({r["ranks"] for r in rows})
            ex = {p: best(rows, graph, profile, gbps, p, "exact", "1d") for p in ranks}
            one5 = {p: best(rows, graph, profile, gbps, p, "exact", "1.5d") for p in ranks}
            bud = {p: best(rows, graph, profile, gbps, p, "budget", "1d") for p in ranks}
            cross = next((p for p in ranks if one5[p]["epoch_s"] < ex[p]["epoch_s"]), None)
            out[key] = {"crossover": cross,
                        "gain_15d": {p: ex[p]["epoch_s"] / one5[p]["epoch_s"] for p in ranks},
                        "c_15d": {p: one5[p]["replication"] for p in ranks},
                        "budget_gain": {p: ex[p]["epoch_s"] / bud[p]["epoch_s"] for p in ranks},
                        "exact": ex, "budget": bud}  # fmt: skip
    return out


def table(d: dict, ranks=(8, 64, 256), profile: str = "gpu") -> str:
    """Per graph and network: exact fp32 1D's epoch and the byte budget's (RSC, F = 0.2) at a
    few rank counts, and where 1.5D pays."""
    s = summary(d, profile)
    head = " | ".join(f"{p} ranks: 1D exact -> budget" for p in ranks)
    out = [f"| graph | Gb/s | {head} | 1.5D vs 1D at 64 / 256 (c) | 1.5D pays from |",
           "|---|---|" + "---|" * len(ranks) + "---|---|"]  # fmt: skip
    for key, v in s.items():
        graph, gbps = key.rsplit(" ", 1)
        cells = [f"{1e3 * v['exact'][p]['epoch_s']:.0f} -> {1e3 * v['budget'][p]['epoch_s']:.0f}"
                 f" ms ({v['budget_gain'][p]:.1f}x)" for p in ranks]  # fmt: skip
        gain = " / ".join(f"{v['gain_15d'][p]:.2f}x ({v['c_15d'][p]})" for p in (64, 256))
        cross = "-" if v["crossover"] is None else f"{v['crossover']} ranks"
        out.append(f"| {graph} | {gbps} | " + " | ".join(cells) + f" | {gain} | {cross} |")
    return "\n".join(out)


def modes_table(d: dict, graph="ogbn-products", gbps=25, p=64, profile="gpu") -> str:
    """Every mode at one point: epoch, compute and bytes received per rank, 1D and 1.5D."""
    rows = d["rows"]
    out = [
        f"| {graph}, {p} ranks, {gbps} Gb/s | 1D epoch | compute | halo MB/rank "
        "| 1.5D epoch (c) | 1.5D halo + replica MB/rank |",
        "|---|---|---|---|---|---|",
    ]
    names = {"exact": "exact fp32", "rsc": "RSC (rows sampled)", "bits8": "8-bit halos",
             "budget": "byte budget 0.2 (RSC)"}  # fmt: skip
    for mode in MODES:
        a = best(rows, graph, profile, gbps, p, mode, "1d")
        b = best(rows, graph, profile, gbps, p, mode, "1.5d")
        ms = {k: f"{1e3 * x:.1f} ms" for k, x in (("a", a["epoch_s"]), ("ac", a["compute_s"]),
                                                   ("b", b["epoch_s"]))}  # fmt: skip
        out.append(f"| {names[mode]} | {ms['a']} | {ms['ac']} | {a['halo_bytes'] / 1e6:.0f} "
                   f"| {ms['b']} ({b['replication']}) "
                   f"| {(b['halo_bytes'] + b['replica_bytes']) / 1e6:.0f} |")  # fmt: skip
    return "\n".join(out)
