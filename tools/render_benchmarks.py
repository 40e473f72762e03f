"""Render the tables of docs/benchmarks.md from the JSON results in docs/results/.

    python tools/render_benchmarks.py > /tmp/tables.md        # every table, by section
    python tools/render_benchmarks.py collect runs/cora launcher_cora "dgl-rsc run ..."
        (keeps the environment, summary and table of a launcher run as docs/results/NAME.json)

Each renderer reads one kind of result file (the tool that wrote it is named in its
docstring); a file that is not there is left out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _where(m: dict) -> str:
    return m.get("gpu") or f"{m['host_cpu']} ({m['cpus']} cores)"


def _cmd(d: dict) -> str:
    return f"`python {d['command']}`"


def _mb(x) -> str:
    return "-" if x is None else f"{x / 1e6:.2f}"


def spmm(name: str) -> str:
    """tools/bench_spmm.py"""
    d = _load(name)
    g, m = d["graph"], d["machine"]
    eng = "; ".join(f"{k} {v * 1e3:.1f} ms" for k, v in d["exact_engines_s"].items())
    fwd = d.get("forward_engines_s") or {"dgl_rsc": d.get("forward_s", 0.0)}
    fwd_s = "; ".join(f"{k} {v * 1e3:.1f} ms" for k, v in fwd.items())
    out = [
        f"Graph {g['nodes']} x {g['nodes']}, {g['nnz']} non-zeros, d = {g['dim']}, "
        f"{d.get('threads', '?')} thread(s); {_where(m)}, torch {m['torch']}, {m['date']}. "
        f"Command: {_cmd(d)}",
        "",
        f"Exact `A^T @ dY`: {eng}. Forward `A @ X`: {fwd_s}.",
        "",
        "| budget | nnz kept | score+select ms | slice ms | product ms | product x (fastest exact) "
        "| product x (DGL) | target (1/b)/2 | step x, cache 10 | rel. error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in d["rows"]:
        vs = r.get("product_speedup_vs_dgl")
        out.append(
            f"| {r['budget']} | {100 * r['nnz_fraction']:.1f}% | {r['select_s'] * 1e3:.1f} "
            f"| {r['slice_s'] * 1e3:.1f} | {r['product_s'] * 1e3:.2f} "
            f"| {r['product_speedup']:.2f} | {'-' if vs is None else f'{vs:.2f}'} "
            f"| {r.get('target_vs_dgl', 0.5 / r['budget']):.2f} "
            f"| {r['step_speedup_cache10']:.2f} | {r['rel_error']:.3f} |"
        )
    return "\n".join(out)


E2E_ENGINES = ("stock", "patch-exact", "patch-rsc", "dgl-exact", "dgl-rsc", "native-exact",
               "native-rsc")  # fmt: skip


def e2e_cpu(name: str) -> str:
    """tools/bench_cpu_e2e.py"""
    d = _load(name)
    m = d["machine"]
    out = [
        f"{_where(m)}, torch {m['torch']}, {m['date']}; exact CPU engine `{d.get('cpu_engine')}`. "
        f"Command: {_cmd(d)}. Mean epoch ms over the timed "
        "epochs (RSC: its approximate phase) and the ratio to stock DGL in the same process.",
        "",
        "| graph | model | threads | " + " | ".join(E2E_ENGINES) + " |",
        "|---|---|---|" + "---|" * len(E2E_ENGINES),
    ]
    for c in d["cases"]:
        cells = []
        for e in E2E_ENGINES:
            ms = c["epoch_ms"].get(e)
            x = (c.get("vs_stock") or {}).get(e)
            cells.append("-" if ms is None else f"{ms:.1f} ({x:.2f}x)" if x else f"{ms:.1f}")
        out.append(f"| {c['graph']} | {c['model']} | {c['threads']} | " + " | ".join(cells) + " |")
    prof = [c for c in d["cases"] if c.get("profile_ms")]
    if prof:
        cats = list(next(iter(prof[0]["profile_ms"].values())))
        out += ["", "Profile of one epoch (self CPU ms by category):", "",
                "| graph | model | threads | engine | " + " | ".join(cats) + " |",
                "|---|---|---|---|" + "---|" * len(cats)]  # fmt: skip
        for c in prof:
            for e in ("stock", "native-exact", "native-rsc", "patch-rsc"):
                p = c["profile_ms"].get(e)
                if p:
                    out.append(f"| {c['graph']} | {c['model']} | {c['threads']} | {e} | "
                               + " | ".join(f"{p[k]:.1f}" for k in cats) + " |")  # fmt: skip
    return "\n".join(out)


def launcher(name: str) -> str:
    """a launcher run, kept by ``collect``"""
    d = _load(name)
    env = d["environment"]
    return (
        f"{env['device_name']} ({env['cpu_count']} cores, {env['torch_threads']} torch threads), "
        f"torch {env['torch']}, {env['date']}. Command: `{d['command']}`\n\n```\n{d['table']}\n```"
    )


def _tta(r: dict, m: str) -> str:
    t = r[f"{m}_tta_s"]
    return r[f"{m}_tta_status"] if t is None else f"{t:.1f} s (epoch {r[f'{m}_tta_epoch']:.0f})"


def parity(name: str) -> str:
    """tools/accuracy_parity.py (time to accuracy first, in files that have it)"""
    d = _load(name)
    m = d["machine"]
    tta = all("exact_tta_s" in r for r in d["rows"])
    lead = "exact to target | RSC to target | TTA speedup | " if tta else ""
    out = [
        f"{_where(m)}, {m['date']}. Command: {_cmd(d)}",
        "",
        f"| config | budget | seeds | {lead}exact | RSC | RSC - exact | loss jump at switch, RSC "
        "(exact) | backward nnz visited | epoch ms exact / RSC |",
        "|---|---|---|" + ("---|---|---|" if tta else "") + "---|---|---|---|---|---|",
    ]
    for r in d["rows"]:
        cells = ""
        if tta:
            speed = r["tta_speedup"]
            cells = (f"{_tta(r, 'exact')} | {_tta(r, 'rsc')} | "
                     f"{'-' if speed is None else f'{speed:.2f}x'} | ")  # fmt: skip
        out.append(
            f"| {Path(r['config']).name} | {r['budget']} | {len(r['seeds'])} | {cells}"
            f"{r['exact_mean']:.2f} ± {r['exact_std']:.2f} | {r['rsc_mean']:.2f} ± "
            f"{r['rsc_std']:.2f} | {r['delta']:+.2f} | {r['loss_jump_rsc']:.2f} "
            f"({r['loss_jump_exact']:.2f}) | {100 * r['nnz_fraction']:.1f}% "
            f"| {r['epoch_ms_exact']:.0f} / {r['epoch_ms_rsc']:.0f} |"
        )
    return "\n".join(out)


def fidelity(name: str) -> str:
    """tools/fidelity.py"""
    d = _load(name)
    m = d["machine"]
    mean = statistics.mean
    out = [
        f"{d['nodes']} nodes, {d['nnz']} non-zeros of Â; {_where(m)}, {m['date']}. Command: "
        f"{_cmd(d)}. Mean over seeds; error "
        "`||Ĝ - G|| / ||G||`, random / coherent dY.",
        "",
        "Selection at equal work (no scale):",
        "",
        "| budget | variant | error | work / nnz |",
        "|---|---|---|---|",
    ]
    sel = d["selection"]
    for b in sorted({r["budget"] for r in sel}):
        for v in dict.fromkeys(r["variant"] for r in sel):
            rows = [r for r in sel if r["variant"] == v and r["budget"] == b]
            e = [mean(r["error"] for r in rows if r["dy"] == k) for k in ("random", "coherent")]
            out.append(f"| {b} | {v} | {e[0]:.3f} / {e[1]:.3f} | "
                       f"{mean(r['work_fraction'] for r in rows):.3f} |")  # fmt: skip
    out += ["", "Scale of the sampled product (cost rule, diagonal sampled: the defaults):", "",
            "| budget | scale | factor | error | norm ratio |",
            "|---|---|---|---|---|"]  # fmt: skip
    sc = [r for r in d["scale"] if r["rule"] == "cost" and r["diagonal"] == "sample"]
    for b in sorted({r["budget"] for r in sc}):
        for s in dict.fromkeys(r["scale"] for r in sc):
            rows = [r for r in sc if r["scale"] == s and r["budget"] == b]
            cell = {k: [r for r in rows if r["dy"] == k] for k in ("random", "coherent")}
            f, e, n = (" / ".join(f"{mean(r[key] for r in cell[k]):.3f}" for k in cell)
                       for key in ("factor", "error", "norm_ratio"))  # fmt: skip
            out.append(f"| {b} | {s} | {f} | {e} | {n} |")
    return "\n".join(out)


def grad_ratio(name: str) -> str:
    """tools/grad_ratio.py"""
    d = _load(name)
    out = [
        f"Command: {_cmd(d)} ({d['machine']['date']}). "
        "Per layer, mean over the approximate phase: ||sampled|| / ||exact|| and the relative "
        "error of the backward product; the training loss before and after the switch.",
        "",
        "| rescale | per layer: norm ratio, error | loss before / after switch |",
        "|---|---|---|",
    ]
    for r in d["runs"]:
        layers = "; ".join(f"L{i}: {v['norm_ratio']:.2f}, {v['error']:.2f}"
                           for i, v in r["layers"].items())  # fmt: skip
        out.append(f"| {r['rescale']} | {layers} | {r['loss_before_switch']:.4f} / "
                   f"{r['loss_after_switch']:.4f} |")  # fmt: skip
    return "\n".join(out)


def _bits(b: dict) -> str:
    if not b:
        return "-"
    parts = []
    for side in ("forward", "backward"):
        h = b[side]["histogram"]
        total = sum(h.values()) or 1
        hist = ", ".join(f"{k}b {100 * v / total:.0f}%" for k, v in h.items())
        err = b[side]["error"]
        parts.append(
            f"{side[:3].replace('bac', 'bwd').replace('for', 'fwd')} {hist or '-'}"
            + ("" if err is None else f" (err {err:.3f})")
        )
    return "; ".join(parts)


def _size(x) -> str:
    if x is None:
        return "-"
    return f"{x / 1e6:.1f} MB" if x >= 1e6 else f"{x / 1e3:.1f} kB"


def _halo(x: dict) -> float:
    return (x.get("forward_halo_bytes") or 0) + (x.get("backward_halo_bytes") or 0)


def dist(name: str) -> str:
    """tools/dist_sweep.py"""
    d = _load(name)
    m = d["machine"]
    out = [
        f"{_where(m)}, {m['date']}, gloo over loopback. Command: "
        f"{_cmd(d)}. Bytes per epoch summed over ranks (RSC: its approximate phase); "
        "metric mean ± std over seeds. Last column: forward + backward halo bytes over those of "
        "the fp32 exact exchange of the same partition.",
        "",
        "| config | P | partition | bits | budget | method | test | epoch ms | fwd halo "
        "| bwd halo | all-reduce | halo vs fp32 exact | bit widths (codec error) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = {(r["config"], r["nproc"], r["method"], r["budget"], r.get("label", "")): r["exact"]
            for r in d["rows"] if str(r["bits"]) == "32" and r["exact"]}  # fmt: skip
    for r in d["rows"]:
        key = (r["config"], r["nproc"], r["method"], r["budget"])
        ref = base.get((*key, r.get("label", ""))) or base.get((*key, ""))
        for meth in ("exact", "rsc"):
            x = r[meth]
            if not x:
                continue
            ratio = f"{_halo(x) / _halo(ref):.2f}" if ref and _halo(ref) else "-"
            out.append(
                f"| {Path(r['config']).name} | {r['nproc']} | {r['method'] or '-'} "
                f"| {r['bits'] or '-'}{f' ({lab})' if (lab := r.get('label')) else ''} "
                f"| {r['budget']} | {meth} "
                f"| {x['test_mean']:.2f} ± {x['test_std']:.2f} "
                f"| {x['epoch_ms']:.0f} | {_size(x.get('forward_halo_bytes'))} "
                f"| {_size(x.get('backward_halo_bytes'))} | {_size(x.get('allreduce_bytes'))} "
                f"| {ratio} | {_bits(x.get('bits'))} |"
            )
    return "\n".join(out)


def dist_timings(name: str) -> str:
    """tools/dist_sweep.py: the exchange's per-phase ms per epoch (mean over ranks)"""
    d = _load(name)
    rows = [(r, m) for r in d["rows"] for m in ("exact", "rsc") if r[m].get("timings_ms")]
    if not rows:
        return ""
    phases = list(rows[0][0][rows[0][1]]["timings_ms"])
    out = ["| config | P | bits | run | method | epoch ms | " + " | ".join(phases) + " |",
           "|---|---|---|---|---|---|" + "---|" * len(phases)]  # fmt: skip
    for r, m in rows:
        t = r[m]["timings_ms"]
        out.append(f"| {Path(r['config']).name} | {r['nproc']} | {r['bits']} "
                   f"| {r.get('label') or 'overlap on'} | {m} "
                   f"| {r[m]['epoch_ms']:.0f} | " + " | ".join(f"{t[p]:.1f}" for p in phases)
                   + " |")  # fmt: skip
    return "\n".join(out)


def profile(names: list) -> str:
    """tools/profile_run.py, several files in one table"""
    out = ["| config | threads | method | epoch ms | sparse share | sparse | dense | elementwise "
           "| selection | other | cache hits / misses |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name in names:
        if not (RESULTS / name).exists():
            continue
        d = _load(name)
        for meth, r in d["methods"].items():
            p = r["profile_ms"]
            hits = (
                "-" if r.get("cache_hits") is None else f"{r['cache_hits']} / {r['cache_misses']}"
            )
            out.append(
                f"| {Path(d['config']).name} | {d['threads']} | {meth} | {r['epoch_ms']:.1f} "
                f"| {100 * r['sparse_share']:.0f}% | {p['sparse']:.1f} | {p['dense']:.1f} "
                f"| {p['elementwise']:.1f} | {p['selection']:.1f} | {p['other']:.1f} | {hits} |"
            )
    return "\n".join(out)


def comm_sim(name: str, kinds=("halo_exact", "halo_exact_cached", "halo_rsc_cached",
                               "halo_rsc_cached_q8", "halo_rsc_cached_q2", "cagnet_1d",
                               "cagnet_1.5d")) -> str:  # fmt: skip
    """tools/comm_sim.py: max MB received per rank per epoch"""
    d = _load(name)
    out = [f"Command: `{d.get('command', '')}` ({d.get('date', '')}). Max MB received per "
           "rank per epoch; METIS where it fits in memory, random otherwise.", ""]  # fmt: skip
    res = d["results"]
    for graph in dict.fromkeys(r["graph"] for r in res):
        rows = [r for r in res if r["graph"] == graph]
        parts = sorted({r["parts"] for r in rows})
        out += [f"{graph} ({rows[0]['num_nodes']} nodes, {rows[0]['num_edges']} edges):", "",
                "| method | kind | " + " | ".join(f"P={p}" for p in parts) + " |",
                "|---|---|" + "---|" * len(parts)]  # fmt: skip
        for method in dict.fromkeys(r["method"] for r in rows):
            for kind in kinds:
                by_p = {r["parts"]: r["bytes"].get(kind) for r in rows if r["method"] == method}
                if not any(by_p.values()):
                    continue
                cells = [_mb(by_p[p]["max"]) if by_p.get(p) else "-" for p in parts]
                out.append(f"| {method} | {kind} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def collect(run_dir: str, name: str, command: str) -> None:
    """Keep the small part of a launcher run's results.json under docs/results/NAME.json."""
    res = json.loads((Path(run_dir) / "results.json").read_text())
    keep = {k: res[k] for k in ("environment", "summary", "table", "metric", "config")}
    keep["command"] = command
    (RESULTS / f"{name}.json").write_text(json.dumps(keep, indent=2) + "\n")


SECTIONS = [
    ("CPU single operation: quickstart graph, 2 threads", spmm, "spmm_cpu_quickstart_t2.json"),
    ("CPU single operation: quickstart graph, 1 thread", spmm, "spmm_cpu_quickstart_t1.json"),
    ("CPU single operation: 200k graph, 2 threads", spmm, "spmm_cpu_g200k_t2.json"),
    ("CPU single operation: 200k graph, 1 thread", spmm, "spmm_cpu_g200k_t1.json"),
    ("CPU end to end against stock DGL", e2e_cpu, "e2e_cpu.json"),
    ("Launcher: quickstart", launcher, "launcher_quickstart.json"),
    ("Launcher: synthetic 200k", launcher, "launcher_synthetic_200k.json"),
    ("Estimator fidelity, 2k nodes", fidelity, "fidelity_2k.json"),
    ("Estimator fidelity, 20k nodes", fidelity, "fidelity.json"),
    ("Gradient norm ratio over training (Cora)", grad_ratio, "grad_ratio_cora.json"),
    ("Accuracy parity: Cora, CiteSeer", parity, "parity_cora_citeseer.json"),
    ("Accuracy parity: tolokers", parity, "parity_tolokers.json"),
    ("Accuracy parity: quickstart", parity, "parity_quickstart.json"),
    ("Distributed: Cora, 4 partitions", dist, "dist_small.json"),
    ("Distributed: CiteSeer, 4 partitions", dist, "dist_citeseer.json"),
    ("Distributed: tolokers, 4 partitions", dist, "dist_tolokers.json"),
    ("Distributed: bytes on the 200k graph", dist, "dist_200k_bytes.json"),
    ("Distributed: quantized messages on the 200k graph", dist, "dist_200k_quant.json"),
    ("Distributed: overlap on the 200k graph", dist_timings, "dist_200k_overlap.json"),
    ("Distributed: 200k nodes at 10 edges per node, 4 partitions", dist, "dist_200k_d10.json"),
    ("Distributed: overlap at 10 edges per node", dist_timings, "dist_200k_d10.json"),
    ("Communication volume at scale (simulated)", comm_sim, "comm_sim.json"),
    ("Mini-batch accuracy: Cora, CiteSeer", parity, "minibatch_small.json"),
    ("Mini-batch accuracy: tolokers", parity, "minibatch_tolokers.json"),
    ("Mini-batch accuracy: 200k graph", parity, "minibatch_200k.json"),
    ("Mini-batch accuracy: Cora, fixed Cluster-GCN batches", parity, "minibatch_fixed.json"),
]
PROFILES = [f"profile_{g}_{s}.json" for g in ("cora", "tolokers", "synthetic_200k")
            for s in ("cluster", "saint")]  # fmt: skip


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s [collect RUN_DIR NAME COMMAND]",
    )  # fmt: skip
    p.add_argument("words", nargs="*", help=argparse.SUPPRESS)
    words = p.parse_args(argv).words
    if words:
        if len(words) != 4 or words[0] != "collect":
            p.error("give no arguments (render every table) or: collect RUN_DIR NAME COMMAND")
        collect(*words[1:])
        return
    parts = []
    for title, fn, name in SECTIONS:
        if (RESULTS / name).exists():
            parts.append(f"### {title}\n\n{fn(name)}")
    if any((RESULTS / p).exists() for p in PROFILES):
        parts.append(f"### Mini-batch epoch profile\n\n{profile(PROFILES)}")
    sys.stdout.write("\n\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
