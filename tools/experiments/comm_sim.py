"""Communication volume of distributed full-graph GCN training, computed from a partition.

No processes are started: for each graph, partition method and number of ranks ``P``, the
bytes each rank receives per epoch (fp32) are counted for an ``L``-layer GCN whose layer
``l`` aggregates rows of width ``widths[l]`` (aggregate, then transform, as CAGNET does).

Message kinds (bytes received per rank and epoch; ``max`` and ``mean`` over ranks):

- ``halo_fwd_input``: layer 1's forward halo (input features; constant, so it can be
  exchanged once and cached);
- ``halo_fwd_hidden``: the forward halo of layers 2..L;
- ``halo_bwd``: the exact backward, halo gradients returned to their owners, layers 2..L
  (layer 1's input needs no gradient);
- ``halo_bwd_rsc``: the same when RSC keeps a fraction of each rank's rows: only halo
  columns touched by a kept row carry a gradient. Rows are chosen per rank, ``random`` or
  the top in-degree rows (``degree``, a stand-in for RSC's score);
- totals ``halo_exact`` (all of the above but RSC), ``halo_exact_cached`` (without
  ``halo_fwd_input``), ``halo_rsc_cached`` (``halo_fwd_hidden + halo_bwd_rsc``);
- ``halo_exact_cached_q{b}``, ``halo_rsc_cached_q{b}``: the same with the halo rows quantized
  to ``b`` bits (``--bits``; each row's packed codes plus its 16-bit offset and scale);
- ``cagnet_1d``, ``cagnet_1.5d`` (replication ``c``), ``cagnet_2d``: the leading-order
  formulas ``n*f``, ``n*f/c``, ``n*f/sqrt(P)`` words per layer, forward (all layers) and
  backward (layers 2..L); see ``shared/docs/DISTRIBUTED.md``.

Examples (small: the full Reddit and ogbn-products scales need 18-20 GB of memory with METIS):

    python tools/experiments/comm_sim.py --graph products --scale 0.01 --parts 2,4,8 \
        --out results/cs.json
    python tools/experiments/comm_sim.py --graph npz:../shared/data/cora.npz --kept 0.2 \
        --select random
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import time

import torch

from dgl_rsc.base.atomic import atomic_write, atomic_write_text
from dgl_rsc.distributed.halo import halo_rows
from dgl_rsc.distributed.partition import PARTITIONERS, load_or_partition

TOOL = "dgl_rsc tools/comm_sim.py"  # marks the JSON and PNG files this tool writes
BYTES = 4  # fp32
#: synthetic stand-ins: published node counts, directed edges / nodes
PRESETS = {
    "reddit": {"num_nodes": 232_965, "avg_degree": 492.0, "num_classes": 41},  # 114.6M edges
    "products": {"num_nodes": 2_449_029, "avg_degree": 50.5, "num_classes": 47},  # 123.7M
}
# peak resident memory of this tool per directed edge, measured on synthetic graphs of 6M
# edges (2-core machine, torch 2.2.1): building the graph, and partitioning it with METIS
# (symmetrizing the edge list dominates); the interpreter and libraries add BASE_BYTES
GRAPH_BYTES_PER_EDGE = 110
METIS_BYTES_PER_EDGE = 150
BASE_BYTES = 0.5e9


def load_graph(spec: str, scale: float = 1.0, seed: int = 0, mem_limit: float = math.inf):
    """``(name, src, dst, N)`` for ``reddit``, ``products``, ``synthetic:N:DEG`` or
    ``npz:PATH``; ``scale`` multiplies the preset's node count (the degree is kept)."""
    from dgl_rsc.data import load_npz, synthetic_graph

    if spec.startswith("npz:"):
        d = load_npz(spec[4:])
        return d.name, d.src, d.dst, d.num_nodes
    if spec.startswith("synthetic:"):
        try:
            n, deg = spec.split(":")[1:]
            preset, name = {"num_nodes": int(n), "avg_degree": float(deg)}, spec
        except ValueError:
            raise ValueError(f"--graph {spec!r}: write synthetic:NODES:AVG_DEGREE") from None
    elif spec in PRESETS:
        preset = dict(PRESETS[spec], num_nodes=int(PRESETS[spec]["num_nodes"] * scale))
        name = spec if scale == 1.0 else f"{spec}x{scale:g}"
    else:
        raise ValueError(f"--graph {spec!r}: use reddit, products, synthetic:N:DEG or npz:PATH")
    need = GRAPH_BYTES_PER_EDGE * preset["num_nodes"] * preset["avg_degree"] + BASE_BYTES
    if need > mem_limit:
        raise ValueError(
            f"--graph {spec}: building it needs about {need / 1e9:.1f} GB, more "
            f"than {mem_limit / 1e9:.1f} GB; lower --scale or --mem-limit-gb."
        )
    d = synthetic_graph(**preset, feat_dim=1, seed=seed)
    return name, d.src, d.dst, d.num_nodes


def _score_random(part, in_degree, seed):
    return torch.rand(part.numel(), generator=torch.Generator().manual_seed(seed))


def _score_degree(part, in_degree, seed):
    return in_degree.double()


SELECTORS = {"random": _score_random, "degree": _score_degree}


def kept_rows(part, parts: int, fraction: float, in_degree, how: str = "degree", seed: int = 0):
    """``(N,)`` bool: on each rank ``r``, the ``ceil(fraction * n_r)`` owned rows with the
    highest score (``how``: a key of :data:`SELECTORS`; ties go to the lower node id)."""
    score = SELECTORS[how](part, in_degree, seed)
    order = torch.argsort(score, descending=True, stable=True)
    order = order[torch.argsort(part[order], stable=True)]  # by rank, then by score
    sizes = torch.bincount(part, minlength=parts)
    start = torch.cumsum(sizes, 0) - sizes
    position = torch.arange(part.numel()) - start[part[order]]
    k = torch.ceil(sizes.double() * fraction).long()
    keep = torch.zeros(part.numel(), dtype=torch.bool)
    keep[order] = position < k[part[order]]
    return keep


def row_bytes(width: int, bits: int) -> int:
    """Bytes of one halo row of ``width`` values at ``bits``: fp32/bf16 raw, or the packed
    codes plus the row's bf16 offset and scale (the codec of
    :mod:`dgl_rsc.distributed.quant`; message headers and row indices are not counted)."""
    if bits >= 16:
        return width * bits // 8
    return 4 + -(-width * bits // 8)


def halo_bytes(src, dst, n, part, parts, widths, kept, bits=()) -> dict:
    """Per-rank received bytes ``{kind: (P,) float64}``; ``kept[l]`` is the ``(N,)`` mask of
    rows RSC keeps in layer ``l`` (``kept[0]`` is unused: layer 1 has no halo gradient).
    For every width ``b`` in ``bits`` (quantized messages) the cached totals are also given
    as ``halo_exact_cached_q{b}`` and ``halo_rsc_cached_q{b}``."""
    exact = halo_rows(src, dst, n, part, parts).double()  # [q, r]: rows q sends to r
    fwd_rows, bwd_rows = exact.sum(0), exact.sum(1)  # r receives features / gradients
    out = {
        "halo_fwd_input": fwd_rows * widths[0] * BYTES,
        "halo_fwd_hidden": fwd_rows * sum(widths[1:]) * BYTES,
        "halo_bwd": bwd_rows * sum(widths[1:]) * BYTES,
        "halo_bwd_rsc": torch.zeros(parts, dtype=torch.float64),
    }
    rsc_rows = []  # per layer 2..L: (P,) gradient rows received under RSC
    for mask in kept[1:]:
        rsc_rows.append(halo_rows(src, dst, n, part, parts, rows=mask).double().sum(1))
    for width, rows in zip(widths[1:], rsc_rows):
        out["halo_bwd_rsc"] += rows * width * BYTES
    out["halo_exact"] = out["halo_fwd_input"] + out["halo_fwd_hidden"] + out["halo_bwd"]
    out["halo_exact_cached"] = out["halo_fwd_hidden"] + out["halo_bwd"]
    out["halo_rsc_cached"] = out["halo_fwd_hidden"] + out["halo_bwd_rsc"]
    for b in bits:
        per_row = [row_bytes(w, b) for w in widths[1:]]
        fwd = sum(fwd_rows * c for c in per_row)
        out[f"halo_exact_cached_q{b}"] = fwd + sum(bwd_rows * c for c in per_row)
        out[f"halo_rsc_cached_q{b}"] = fwd + sum(r * c for r, c in zip(rsc_rows, per_row))
    return out


def cagnet_bytes(n: int, parts: int, widths, c: int = 2) -> dict:
    """Bytes per rank and epoch of CAGNET's 1D, 1.5D (when ``c`` divides ``P``) and 2D."""
    words = n * (sum(widths) + sum(widths[1:]))  # forward: every layer; backward: 2..L
    out = {"cagnet_1d": words * BYTES, "cagnet_2d": words / math.sqrt(parts) * BYTES}
    if parts % c == 0:
        out["cagnet_1.5d"] = words / c * BYTES
    return out


def _summary(per_rank: dict) -> dict:
    return {k: {"max": float(v.max()), "mean": float(v.mean())} for k, v in per_rank.items()}


def _peak_gb() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def _mem_limit() -> float:
    """Bytes of memory available now (``/proc/meminfo``), or 24 GB where unreadable."""
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return float(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return 24e9


def simulate(args, graph, record) -> None:
    """Append one result per (method, P) of one graph to ``record``."""
    name, src, dst, n = graph
    e = src.numel()
    in_degree = torch.bincount(dst, minlength=n)
    for method in args.methods:
        need = METIS_BYTES_PER_EDGE * e + BASE_BYTES
        if method.startswith("metis") and need > args.mem_limit_gb * 1e9:
            why = f"estimated {need / 1e9:.1f} GB > --mem-limit-gb {args.mem_limit_gb:.1f}"
            print(f"[{name}] {method} skipped: {why}; random partitions still run", file=sys.stderr)
            record["skipped"].append({"graph": name, "method": method, "reason": why})
            continue
        for p in (p for p in args.parts if p <= n):
            t0 = time.perf_counter()
            part, q, _ = load_or_partition(src, dst, n, p, method, args.seed, args.cache_dir)
            t1 = time.perf_counter()
            kept = [None] + [
                kept_rows(part, p, f, in_degree, args.select, args.seed + layer)
                for layer, f in enumerate(args.kept_fractions[1:], start=1)
            ]
            per_rank = halo_bytes(src, dst, n, part, p, args.widths, kept, args.bits)
            record["results"].append(
                {
                    "graph": name,
                    "num_nodes": n,
                    "num_edges": e,
                    "method": method,
                    "parts": p,
                    "edge_cut_fraction": q["edge_cut_fraction"],
                    "node_balance": q["node_balance"],
                    "edge_balance": q["edge_balance"],
                    "halo_nodes_max": max(q["halo_nodes"]),
                    "partition_seconds": t1 - t0,
                    "count_seconds": time.perf_counter() - t1,
                    "bytes": _summary(per_rank),
                }
            )
            print(
                f"[{name}] {method} P={p}: cut {q['edge_cut_fraction']:.3f}, exact max "
                f"{per_rank['halo_exact'].max() / 1e6:.1f} MB/rank, {t1 - t0:.1f}s + "
                f"{time.perf_counter() - t1:.1f}s, peak memory {_peak_gb():.1f} GB",
                file=sys.stderr,
            )
    for p in (p for p in args.parts if p <= n):
        scheme = cagnet_bytes(n, p, args.widths, args.replication)
        record["results"].append(
            {
                "graph": name,
                "num_nodes": n,
                "num_edges": e,
                "method": "cagnet",
                "parts": p,
                "bytes": {k: {"max": v, "mean": v} for k, v in scheme.items()},
            }
        )


def _kept_fractions(kept: str, layers: int) -> list:
    """``--kept``: one fraction for every layer, or a JSON file: a list (``L`` values, or
    ``L - 1`` for layers 2..L), ``{"kept": list}``, or RSC stats ``{"layers": [{"k", "rows"}]}``."""
    need = f"{layers} (or {layers - 1}) fractions in (0, 1]"
    try:
        fracs = [float(kept)] * layers
    except ValueError:
        try:
            with open(kept, encoding="utf-8") as f:
                data = json.load(f)
            if isinstance(data, dict) and "layers" in data:
                data = [x["k"] / x["rows"] if x.get("k") else 1.0 for x in data["layers"]]
            fracs = [float(x) for x in (data["kept"] if isinstance(data, dict) else data)]
        except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError) as exc:
            raise ValueError(
                f"--kept {kept}: not a number nor a readable JSON of {need} "
                f"({type(exc).__name__}: {exc})"
            ) from None
        fracs = [1.0, *fracs] if len(fracs) == layers - 1 else fracs
    if len(fracs) != layers or not all(0 < f <= 1 for f in fracs):
        raise ValueError(f"--kept {kept}: need {need}, got {fracs}")
    return fracs


def plot(record, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    graphs = list(dict.fromkeys(r["graph"] for r in record["results"]))
    fig, axes = plt.subplots(1, len(graphs), figsize=(6 * len(graphs), 4.5), squeeze=False)
    styles = {
        "halo_exact": "C0",
        "halo_exact_cached": "C1",
        "halo_rsc_cached": "C2",
        "cagnet_1d": "C3",
        "cagnet_1.5d": "C4",
        "cagnet_2d": "C5",
        "halo_rsc_cached_q8": "C6",
        "halo_rsc_cached_q2": "C7",
    }
    dashes = {"metis": "-", "metis-dgl": "-.", "random": "--", "contiguous": "-.", "cagnet": ":"}
    for ax, graph in zip(axes[0], graphs):
        rows = [r for r in record["results"] if r["graph"] == graph]
        for method in dict.fromkeys(r["method"] for r in rows):
            for kind, color in styles.items():
                pts = [
                    (r["parts"], r["bytes"][kind]["max"])
                    for r in rows
                    if r["method"] == method and kind in r["bytes"]
                ]
                if pts:
                    x, y = zip(*pts)
                    ax.plot(
                        x,
                        y,
                        dashes.get(method, "-"),
                        color=color,
                        marker=".",
                        label=kind if method == "cagnet" else f"{kind} ({method})",
                    )
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="ranks P",
            title=graph,
            ylabel="max bytes received per rank per epoch",
        )
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=6)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", metadata={"Software": TOOL}))
    plt.close(fig)


def _ours(path: str) -> bool:
    """Whether ``path`` is a JSON or PNG this tool wrote (its marker is inside)."""
    try:
        if path.endswith(".png"):
            from PIL import Image

            with Image.open(path) as im:
                return im.text.get("Software") == TOOL
        with open(path, encoding="utf-8") as f:
            return json.load(f).get("tool") == TOOL
    except Exception:  # unreadable or another format: not ours
        return False


def _ints(text: str) -> list:
    return [int(x) for x in text.split(",") if x]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--graph",
        action="append",
        help="reddit, products, synthetic:N:DEG, "
        "npz:PATH (repeatable; default reddit and products)",
    )
    ap.add_argument("--scale", type=float, default=1.0, help="node-count factor of presets")
    ap.add_argument("--parts", type=_ints, default=[2**i for i in range(1, 9)])
    ap.add_argument("--methods", default="metis,random", help=f"of {', '.join(PARTITIONERS)}")
    ap.add_argument("--widths", type=_ints, default=[128, 256, 256], help="layer input widths")
    ap.add_argument("--kept", default="0.1", help="RSC kept-row fraction or a JSON file")
    ap.add_argument("--select", choices=sorted(SELECTORS), default="degree")
    ap.add_argument(
        "--bits",
        type=_ints,
        default=[8, 4, 2],
        help="quantized halo widths to add (empty: fp32 only)",
    )
    ap.add_argument("--replication", type=int, default=2, help="CAGNET 1.5D factor c")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", default=None, help="partition cache folder")
    ap.add_argument("--mem-limit-gb", type=float, default=_mem_limit() / 1e9)
    ap.add_argument("--out", default="results/comm_sim.json")
    ap.add_argument("--force", action="store_true", help="overwrite outputs not written here")
    args = ap.parse_args(argv)
    args.methods = [m for m in args.methods.split(",") if m]
    for m in args.methods:
        if m not in PARTITIONERS:
            ap.error(f"--methods: unknown {m!r}; known: {', '.join(PARTITIONERS)}")
    try:
        args.kept_fractions = _kept_fractions(args.kept, len(args.widths))
    except ValueError as exc:
        ap.error(str(exc))
    png = os.path.splitext(args.out)[0] + ".png"
    for path in (args.out, png):
        if os.path.exists(path) and not args.force and not _ours(path):
            ap.error(f"{path} exists and was not written by this tool; pass --force to replace it")
    record = {
        "tool": TOOL,
        "command": " ".join(sys.argv if argv is None else ["tools/experiments/comm_sim.py", *argv]),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        "settings": {
            "widths": args.widths,
            "kept": args.kept,
            "select": args.select,
            "replication": args.replication,
            "seed": args.seed,
            "scale": args.scale,
            "bytes_per_value": BYTES,
        },
        "results": [],
        "skipped": [],
    }
    for spec in args.graph or ["reddit", "products"]:
        t0 = time.perf_counter()
        try:
            graph = load_graph(spec, args.scale, args.seed, args.mem_limit_gb * 1e9)
        except (ValueError, FileNotFoundError) as exc:
            ap.error(str(exc))
        print(
            f"[{graph[0]}] N={graph[3]} E={graph[1].numel()} built in "
            f"{time.perf_counter() - t0:.1f}s",
            file=sys.stderr,
        )
        simulate(args, graph, record)
        del graph
    atomic_write_text(args.out, json.dumps(record, indent=1))
    plot(record, png)
    print(f"wrote {args.out} and {png}", file=sys.stderr)
    return record


if __name__ == "__main__":
    main()
