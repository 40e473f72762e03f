"""Render the tables and plots of docs/benchmarks.md from the JSON results in docs/results/.

    python tools/render_benchmarks.py                              # print every block
    python tools/render_benchmarks.py --write docs/benchmarks.md   # refresh the page's blocks
    python tools/render_benchmarks.py --check docs/benchmarks.md   # exit 1 when one is stale
    python tools/render_benchmarks.py collect runs/cora launcher_cora "dgl-rsc run ..."
        (keeps the environment, summary and table of a launcher run as docs/results/NAME.json)

The page holds each block between ``<!-- render: NAME -->`` and ``<!-- end -->``; ``--write``
replaces what is between them, the prose around them is the page's own. Each renderer reads one
kind of result file (the tool that wrote it is named in its docstring).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from dgl_rsc.launcher.report import ratio_cell

TOOLS = Path(__file__).resolve().parent
RESULTS = TOOLS.parent / "docs" / "results"


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _where(m: dict) -> str:
    return m.get("gpu") or f"{m['host_cpu']} ({m['cpus']} cores)"


def _cmd(d: dict) -> str:
    """The command that wrote ``d``, with the script's path of today (drivers of past
    experiments moved to tools/experiments/)."""
    cmd = d["command"].removeprefix("python ")
    script = re.match(r"tools/(\w+\.py)", cmd)
    if script and not (TOOLS / script.group(1)).exists():
        cmd = cmd.replace(script.group(0), f"tools/experiments/{script.group(1)}", 1)
    return f"`python {cmd}`"


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
    """tools/experiments/accuracy_parity.py (time to accuracy first, in files that have it)"""
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
    """tools/experiments/fidelity.py"""
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
    """tools/experiments/grad_ratio.py"""
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


def dist(name: str, keep=lambda row: True) -> str:
    """tools/experiments/dist_sweep.py (the rows ``keep`` accepts)"""
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
            for r in d["rows"] if str(r["bits"]) == "32" and r["exact"]
            and (r.get("comm_budget") or 1.0) >= 1.0}  # fmt: skip
    for r in filter(keep, d["rows"]):
        key = (r["config"], r["nproc"], r["method"], r["budget"])
        ref = base.get((*key, r.get("label", ""))) or base.get((*key, ""))
        for meth in ("exact", "rsc"):
            x = r[meth]
            if not x:
                continue
            ratio = f"{_halo(x) / _halo(ref):.2f}" if ref and _halo(ref) else "-"
            out.append(
                f"| {Path(r['config']).name} | {r['nproc']} | {r['method'] or '-'} "
                f"| {_bits_cell(r)}{f' ({lab})' if (lab := r.get('label')) else ''} "
                f"| {r['budget']} | {meth} "
                f"| {x['test_mean']:.2f} ± {x['test_std']:.2f} "
                f"| {x['epoch_ms']:.0f} | {_size(x.get('forward_halo_bytes'))} "
                f"| {_size(x.get('backward_halo_bytes'))} | {_size(x.get('allreduce_bytes'))} "
                f"| {ratio} | {_bits(x.get('bits'))} |"
            )
    return "\n".join(out)


def _bits_cell(row: dict) -> str:
    """The bits a row ran at, or its byte budget (``comm_budget`` below 1 picks the widths)."""
    comm = row.get("comm_budget") or 1.0
    return f"comm_budget {comm}" if comm < 1 else str(row["bits"] or "-")


def family_table(name: str) -> str:
    """tools/validation_family.py: RSC's defaults against exact training, every run to
    convergence"""
    d = _load(name)
    cmd = d["command"].replace(d["command"].split("--out ")[-1], f"docs/results/{name}")
    return (f"{d['cpu']} ({d['cores']} cores), {d['date'][:10]}; patience {d['patience']} "
            f"evaluations, at most {d['cap']} epochs. Command: `{cmd}`.\n\n"
            f"{_experiment('validation_family', '').table(d)}")  # fmt: skip


def family_variants(names: list) -> str:
    """tools/validation_family.py --compare: per graph, each variant's test gap, seeds that
    reached exact's target and time to accuracy against exact"""
    paths = [str(RESULTS / n) for n in names]
    return (
        _experiment("validation_family", "").compare(paths)
        + "\n\nJSON: "
        + ", ".join(f"`{n}`" for n in names)
        + "."
    )


def dist_budget(name: str) -> str:
    """tools/experiments/budget_bytes.py: launcher runs under ``distributed.comm_budget``
    against an exact fp32 1D run of the same partition"""
    d = _load(name)
    m, ref = d["machine"], d["reference"]
    out = [
        f"{_where(m)}, {m['date']}, gloo over loopback. Runs: {d['run_commands']} Table: "
        f"{_cmd(d)}. Halo bytes per epoch summed over ranks, mean over the run's epochs; worst "
        "epoch: the largest epoch's halo bytes over exact fp32's. Test: best validation "
        "epoch's, per seed.",
        "",
        "| run | epochs | fwd halo | bwd halo | halo vs exact fp32 | bwd vs exact fp32 "
        "| worst epoch | test (seeds) |",
        "|---|---|---|---|---|---|---|---|",
        f"| exact fp32 1D | {ref['runs'][0]['epochs']} | {_size(ref['forward_bytes'])} "
        f"| {_size(ref['backward_bytes'])} | 1.00 | 1.00 | 1.00 | "
        + ", ".join(f"{100 * r['test']:.2f}" for r in ref["runs"] if r.get("test") is not None)
        + " |",
    ]
    groups: dict = {}
    for r in d["rows"]:
        groups.setdefault((r["label"], r["epochs"]), []).append(r)
    for (label, epochs), rows in groups.items():
        v = [r["vs_exact"] for r in rows]
        tests = ", ".join(f"{100 * r['test']:.2f}" for r in rows if r.get("test") is not None)
        out.append(
            f"| {label} | {epochs} | {_size(statistics.mean(r['forward_bytes'] for r in rows))} "
            f"| {_size(statistics.mean(r['backward_bytes'] for r in rows))} "
            f"| {max(x['halo'] for x in v):.3f} | {max(x['backward'] for x in v):.3f} "
            f"| {max(x['halo_worst_epoch'] for x in v):.3f} | {tests or '-'} |"
        )
    return "\n".join(out)


def dist_timings(name: str) -> str:
    """tools/experiments/dist_sweep.py: the exchange's per-phase ms per epoch (mean over ranks)"""
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
    """tools/experiments/comm_sim.py: max MB received per rank per epoch"""
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
    # per run what an interval over seeds needs (the histories stay in the run directory)
    keep["runs"] = [{k: r.get(k) for k in ("method", "seed", "best", "final", "stop")}
                    for r in res["runs"]]  # fmt: skip
    (RESULTS / f"{name}.json").write_text(json.dumps(keep, indent=2) + "\n")


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.2f}"


def ceiling(names: list) -> str:
    """tools/experiments/step_costs.py: what a free sampled product would save per epoch"""
    out = ["| graph, model | exact epoch ms | sampled products ms (share) | epoch speedup if free "
           "| at RSC's visited fraction | RSC measured | date |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip
    for label, name in names:
        d = _load(name)
        c = d["ceiling"]
        out.append(
            f"| {label} | {c['exact_epoch_ms']:.1f} "
            f"| {c['sampled_ms_per_epoch']:.1f} ({100 * c['sampled_share']:.0f}%) "
            f"| {c['free']:.2f}x | {c['at_visited']:.2f}x ({c['visited']:.2f}) "
            f"| {c['measured_mean']:.2f}x | {d['machine']['date'][:10]} |"
        )
    return "\n".join(out)


def e2e_gpu(names: list) -> str:
    """tools/bench_e2e.py: exact against RSC per epoch (their single-seed, fixed-length time to
    target stays in the JSON)"""
    out = ["| graph | model | precision | exact epoch ms | RSC epoch ms (approx. phase) "
           "| epoch speedup | test exact / RSC | GPU, date |",
           "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name in names:
        d = _load(name)
        g, m = d["graph"], d["machine"]
        for r in d["rows"]:
            if "speedup_approx_phase" not in r:
                continue
            out.append(
                f"| {d['preset']} ({g['nodes']} nodes, {g['edges']} edges) | {r['model']} "
                f"| {'fp32' if r['amp'] == 'none' else r['amp']} "
                f"| {1e3 * r['exact_epoch_s_approx_phase']:.1f} "
                f"| {1e3 * r['rsc_epoch_s_approx_phase']:.1f} | {r['speedup_approx_phase']:.2f}x "
                f"| {_pct(r['exact_test'])} / {_pct(r['rsc_test'])} "
                f"| {m.get('gpu')}, {m['date'][:10]} |"
            )
    return "\n".join(out)


def kernels_gpu(name: str, budgets=(0.1, 0.2)) -> str:
    """tools/bench_kernels.py: one backward step's pieces on CuPy against the exact product"""
    d = _load(name)
    info = d["info"]
    out = [f"{info['device']}, torch {info['torch']}, CuPy {info['cupy']}, {info['date'][:10]}. "
           f"Command: `python {info['command'].split('python3 ', 1)[-1]}`. Median ms.", "",
           "| graph | rows, nnz, d | budget | exact product | score | select | slice | "
           "sampled product | sampled product x |",
           "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for g, r in d["results"].items():
        ms = r["ms"]
        exact = ms["product_exact/torch.sparse"]
        for b in budgets:
            prod = ms[f"product_b{b}/torch.sparse"]
            out.append(
                f"| {g} | {r['rows']}, {r['nnz']}, {r['d']} | {b} | {exact:.2f} "
                f"| {ms['scores_fp32/cupy']:.2f} | {ms[f'select_b{b}/cupy']:.2f} "
                f"| {ms[f'slice_t_b{b}/cupy']:.2f} | {prod:.2f} | {exact / prod:.2f}x |"
            )
    return "\n".join(out)


def forward_gpu(name: str) -> str:
    """tools/experiments/bench_forward.py: the forward product, the INT8 kernels and GEMMs"""
    d = _load(name)
    out = [f"{d['device']}, torch {d['torch']}, CUDA {d['cuda']}, {d['date'][:10]}. Command: "
           f"`{d['command']}`. Median ms; x: against cuSPARSE in fp32.", "",
           "| graph | cuSPARSE fp32 | cuSPARSE bf16 | dgl_rsc fp32 | dgl_rsc bf16 | gather "
           "| plan |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in d["forward"]:
        base = r["cusparse_fp32_ms"]
        out.append(
            f"| {r['graph']} ({r['rows']} rows, {r['nnz']} nnz, d {r['dim']}) | {base:.2f} "
            f"| {r['cusparse_bf16_ms']:.2f} | {r['ours_fp32_ms']:.2f} "
            f"({base / r['ours_fp32_ms']:.2f}x) | {r['ours_bf16_ms']:.2f} "
            f"({base / r['ours_bf16_ms']:.2f}x) | {r['gather_fp32_ms']:.1f} | {r['plan_ms']:.1f} |"
        )
    out += ["", "| graph | INT8 CuPy | INT8 Numba-CUDA | cuSPARSE fp32 | cuSPARSE bf16 | "
            "bit-equal |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in d["int8"]:
        same = r["int8_cupy_bit_equal"] and r["int8_numba_bit_equal"]
        out.append(
            f"| {r['graph']} | {r['int8_cupy_ms']:.2f} | {r['int8_numba_ms']:.2f} "
            f"| {r['cusparse_fp32_ms']:.2f} | {r['cusparse_bf16_ms']:.2f} "
            f"| {'yes' if same else 'no'} |"
        )
    out += ["", "| M x K x N | fp32 | tf32 | bf16 | `torch._int_mm` |", "|---|---|---|---|---|"]
    for r in d["gemm"]:
        mm = f"{r['int_mm_ms']:.2f}" if "int_mm_ms" in r else "refused by cuBLASLt"
        shape = " x ".join(map(str, r["shape"]))
        out.append(f"| {shape} | {r['fp32_ms']:.2f} | {r['tf32_ms']:.2f} | {r['bf16_ms']:.2f} "
                   f"| {mm} |")  # fmt: skip
    return "\n".join(out)


def _vs_stock(m: dict) -> str:
    """A method's time to target against stock's (``-`` where it or stock missed the target
    on a seed), its interval over seeds, and the seeds that reached it."""
    ratio = ratio_cell(m["tta_vs_stock"], m.get("tta_vs_stock_ci"))
    return f"{ratio} ({m['tta_reached']}/{m['runs']})"


def stock_tta(rows: list) -> str:
    """launcher reports of ``tools/experiments/interleaved_tta.py`` (stock, exact and RSC side
    by side, every run to convergence): one row per graph, time to target against stock with
    its 95% bootstrap interval over seeds, the test gap with its t-interval, epochs"""
    out = ["| graph, model | seeds | test: stock / exact / RSC | RSC - exact (95% CI) | time to "
           "target vs stock: exact, RSC | RSC vs exact | epoch vs stock: exact, RSC | converged "
           "| date |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for label, name in rows:
        d = _load(name)
        s, env = d["summary"], d["environment"]
        test = " / ".join(f"{100 * s[m]['test_mean']:.2f}" for m in ("stock", "exact", "rsc"))
        r = s["rsc"]
        half, delta = r.get("test_delta_ci"), r.get("test_delta")
        gap = "-" if delta is None else f"{100 * delta:+.2f}"
        gap += "" if half is None else f" ± {100 * half:.2f}"
        conv = ", ".join(f"{s[m].get('converged', '-')}/{s[m]['runs']}"
                         for m in ("stock", "exact", "rsc"))  # fmt: skip
        out.append(
            f"| {label} | {r['runs']} | {test} | {gap} | {_vs_stock(s['exact'])}, "
            f"{_vs_stock(r)} | {ratio_cell(r['tta_speedup'], r.get('tta_speedup_ci'))} "
            f"| {s['exact']['vs_stock']:.2f}x, {r['vs_stock']:.2f}x | {conv} "
            f"| {env['date'][:10]} |"
        )
    out.append("\nJSON: " + ", ".join(f"`{n}`" for _, n in rows) + ".")
    return "\n".join(out)


def int8_epochs(names: list) -> str:
    """tools/experiments/compile_int8_epochs.py: median epochs, interleaved, against fp32"""
    out = ["| config | variant | median epoch | vs fp32 | machine, date |", "|---|---|---|---|---|"]
    for name in names:
        d = _load(name)
        m = d["machine"]
        where = f"{m['cpus']} CPUs, torch {m['torch'].split('+')[0]}, {m['date'][:10]}"
        for variant, row in d["variants"].items():
            out.append(f"| {Path(d['config']).name} | {variant} | {row['median_ms']:.0f} ms "
                       f"| {row['speedup_vs_fp32']:.2f}x | {where} |")  # fmt: skip
    return "\n".join(out)


def int8_split(name: str) -> str:
    """tools/profile_run.py with the INT8 categories: each method's profiled epoch (ms)"""
    d = _load(name)
    cats = ("sparse_forward", "sparse_backward_exact", "dense", "elementwise", "other",
            "int8_quantize", "int8_scales", "int8_convert", "int8_products")  # fmt: skip
    out = ["| config | method | median epoch ms | " + " | ".join(c.replace("_", " ") for c in cats)
           + " |", "|---|---|---|" + "---|" * len(cats)]  # fmt: skip
    for method, r in d["methods"].items():
        split = r["split_ms"]
        out.append(f"| {_profiled(d)} | {method} | {r['epoch_ms_median']:.0f} | "
                   + " | ".join(f"{split.get(c, 0):.0f}" for c in cats) + " |")  # fmt: skip
    m = d["machine"]
    return "\n".join(out) + f"\n\n{m['cpu']}, torch {m['torch'].split('+')[0]}, {m['date'][:10]}."


def int8_memory(name: str) -> str:
    """tools/experiments/memory_epochs.py: peak resident memory per method and size, one
    process each, and the largest graph each fits in the machine's memory (linear fit)"""
    d = _load(name)
    m, fits = d["machine"], d["fits"]
    sizes = sorted({r["nodes"] for r in d["rows"]})
    peak = {(r["method"], r["nodes"]): r["peak_rss_mb"] for r in d["rows"]}
    out = ["| method | " + " | ".join(f"peak at {n // 1000}k nodes (vs exact)" for n in sizes)
           + f" | largest graph in {d['memory_gb']:.0f} GB (fit) |",
           "|---|" + "---|" * (len(sizes) + 1)]  # fmt: skip
    for method, fit in fits.items():
        cells = [f"{peak[method, n] / 1e3:.2f} GB ({peak[method, n] / peak['exact', n]:.2f}x)"
                 for n in sizes]  # fmt: skip
        out.append(f"| {method} | " + " | ".join(cells) + f" | {fit['limit_nodes'] / 1e6:.2f}M |")
    return ("\n".join(out) + f"\n\n{m['cpu']} ({m['cpus']} cores), torch "
            f"{m['torch'].split('+')[0]}, {m['date'][:10]}. Command: {_cmd(d)}.")  # fmt: skip


#: the blocks of the page: name -> () -> markdown
def _profiled(d: dict) -> str:
    """A profile's config with the settings it changed (``model.name=sage``)."""
    sets = [s.split(".", 1)[-1] for s in d.get("sets", [])]
    return Path(d["config"]).name + (f" ({', '.join(sets)})" if sets else "")


def epoch_split(names: list) -> str:
    """tools/profile_run.py: each method's profiled epoch split into categories (ms)"""
    cats = ("sparse_forward", "sparse_backward_sampled", "sparse_backward_exact", "rsc_own",
            "dense", "elementwise", "optimizer", "other")  # fmt: skip
    heads = ("forward sparse", "sampled bwd sparse", "exact bwd sparse", "RSC's own", "dense",
             "elementwise", "optimizer", "other")  # fmt: skip
    out = ["| config | method | median epoch ms | " + " | ".join(heads)
           + " | faults / epoch | peak RSS MB | date |",
           "|---" * (len(heads) + 6) + "|"]  # fmt: skip
    for name in names:
        d = _load(name)
        for meth, r in d["methods"].items():
            split = " | ".join(f"{r['split_ms'][c]:.0f}" for c in cats)
            out.append(
                f"| {_profiled(d)} | {meth} | {r['epoch_ms_median']:.0f} "
                f"| {split} | {r['minor_faults_per_epoch']:.0f} | {r['peak_rss_mb']:.0f} "
                f"| {d['machine']['date'][:10]} |"
            )
    out.append("\nJSON: " + ", ".join(f"`{n}`" for n in names) + ".")
    return "\n".join(out)


def epoch_levers(names: list) -> str:
    """tools/experiments/epoch_levers_ab.py: variants' epochs, interleaved, against the first"""
    out = ["| config | variant | method | fused epilogue | CPU engine | allocator | median "
           "epoch ms | against the first | rounds | date |",
           "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name in names:
        d = _load(name)
        patched = "train.engine=patch" in d.get("sets", [])  # stock dgl.nn model in the patch
        config = Path(d["config"]).name + (" (stock GCN, patch)" if patched else "")
        for label, v in d["variants"].items():
            stock = v["method"] == "stock"
            fused = "-" if stock or patched else v.get("fused", "on")
            engine = "DGL" if stock else v.get("engine", "dgl")
            out.append(
                f"| {config} | {label} | {v['method']} | {fused} | {engine} | {v['alloc']} "
                f"| {v['median_epoch_ms']:.0f} | {v['speedup_vs_reference_median']:.2f}x "
                f"| {v['epochs_timed']} | {d['machine']['date'][:10]} |"
            )
    out.append("\nJSON: " + ", ".join(f"`{n}`" for n in names) + ".")
    return "\n".join(out)


def _experiment(name: str, sub: str = "experiments"):
    """A driver of tools/experiments/ (or of tools/ with ``sub=""``), for the tables it renders
    (imported by path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, TOOLS / sub / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def dist_projection(name: str) -> str:
    """tools/experiments/comm_project.py: exact fp32 1D against the byte budget, and 1.5D"""
    d = _load(name)
    cp = _experiment("comm_project")
    return (f"{cp.table(d)}\n\nGPU ranks, METIS locality of the real ogbn-products; "
            f"{d['machine']['date'][:10]}. JSON: `{name}`; assumptions: "
            "[the cost model](scaling.md).")  # fmt: skip


def dist_calibration(fit: str, check: str) -> str:
    """tools/experiments/comm_model.py (the fit) and comm_bytes_check.py (bytes per rank)"""
    f, c = _load(fit), _load(check)
    m = f["machine"]
    worst = 100 * max(r["max_deviation"] for r in c["rows"])
    return (f"{_experiment('comm_model').table(f)}\n\n{m['cpu']} ({m['cpus']} cores), "
            f"{m['date'][:10]}, load average {m['load_average'][0]:.0f} when fitted. JSON: "
            f"`{fit}`, `{f['calibration']}`. Bytes per rank and message kind, measured against "
            f"predicted, 1D and 1.5D: within {worst:.2f}% (`{check}`).")  # fmt: skip


def dist_scenarios(names: dict) -> str:
    """comm_project.py under other assumptions: locality and 1.5D's dealing of columns"""
    cp = _experiment("comm_project")
    out = ["| halo locality | 1.5D columns dealt | budget vs exact 1D, products, 64 ranks, "
           "25 Gb/s | 1.5D vs 1D at 64 / 256 ranks (products, 25 Gb/s) | JSON |",
           "|---|---|---|---|---|"]  # fmt: skip
    for (loc, deal), name in names.items():
        s = cp.summary(_load(name))["ogbn-products 25"]
        g = s["gain_15d"]
        out.append(f"| {loc} | {deal} | {s['budget_gain'][64]:.2f}x | {g[64]:.2f}x / "
                   f"{g[256]:.2f}x | `{name}` |")  # fmt: skip
    return "\n".join(out)


#: launcher reports against stock DGL: (label, file); 3 seeds or more (single seeds and
#: unconverged runs: docs/journal/2026-12-07-fixed-length-tta-figures.md)
#: the validation family under each default tried (the package's first)
FAMILY_VARIANTS = ["family_defaults.json", "family_switch_returns.json", "family_no_switch.json"]
STOCK_DGL = [
    ("quickstart GCN", "tta_quickstart_vs_stock_plateau.json"),
    ("quickstart SAGE", "tta_quickstart_sage_vs_stock_plateau.json"),
    ("tolokers GCN", "tta_tolokers_vs_stock_plateau.json"),
]
CEILINGS = [(label, f"step_costs_ceiling_{g}.json") for label, g in
            (("quickstart GCN", "quickstart"), ("quickstart SAGE", "quickstart_sage"),
             ("Cora GCN", "cora"), ("CiteSeer GCN", "citeseer"), ("tolokers ResGCN", "tolokers"),
             ("sparse-heavy GCN", "sparse_heavy"), ("200k preset GCN", "200k"))]  # fmt: skip


BLOCKS = {
    "validation-family": lambda: family_table("family_defaults.json"),
    "validation-family-variants": lambda: family_variants(FAMILY_VARIANTS),
    "ceiling": lambda: ceiling(CEILINGS),
    "epoch-split": lambda: epoch_split(EPOCH_SPLITS),
    "epoch-levers": lambda: epoch_levers(
        [
            "epoch_fused_quickstart.json",
            "epoch_engine_200k.json",
            "epoch_engine_tolokers.json",
        ]
    ),
    "stock-dgl": lambda: stock_tta(STOCK_DGL),
    "kernels-cpu": lambda: spmm("spmm_cpu_g200k_t2.json"),
    "gpu": lambda: e2e_gpu(["e2e_reddit_h100_folded.json", "e2e_products_h100_folded.json"]),
    "distributed": lambda: dist(
        "dist_200k_bytes.json", lambda r: r["nproc"] == 4 and r["method"] == "metis"
    ),
    "distributed-small": lambda: dist(
        "dist_small.json", lambda r: str(r["bits"]) == "32" or r.get("label") == "weight-0.1"
    ),
    "distributed-budget": lambda: dist_budget("dist_budget_200k.json"),
    "distributed-projection": lambda: dist_projection("comm_projection.json"),
    "distributed-calibration": lambda: dist_calibration(
        "comm_model_fit.json", "comm_bytes_check.json"
    ),
    "distributed-modes": lambda: _experiment("comm_project").modes_table(
        _load("comm_projection.json")
    ),
    "distributed-scenarios": lambda: dist_scenarios(
        {
            ("real products (METIS, published)", "spec (j mod c)"): "comm_projection.json",
            (
                "real products (METIS, published)",
                "balanced ((i + j) mod c)",
            ): "comm_projection_balanced.json",
            ("stand-in (DC-SBM)", "spec (j mod c)"): "comm_projection_standin.json",
        }
    ),
    "kernels-gpu": lambda: kernels_gpu("bench_kernels_h200.json"),
    "forward-gpu": lambda: forward_gpu("h100_forward_int8.json"),
    "int8-split": lambda: int8_split("int8_split_quickstart.json"),
    "int8-memory": lambda: int8_memory("memory_int8_degree50.json"),
    "int8-cpu-epochs": lambda: int8_epochs(
        [
            "int8_epochs_200k_t221.json",
            "int8_epochs_quickstart_t221.json",
        ]
    ),
    "minibatch": lambda: parity("minibatch_small.json"),
}
#: tools/profile_run.py results, one table
EPOCH_SPLITS = [
    "epoch_split_quickstart.json",
    "epoch_split_quickstart_sage.json",
    "epoch_split_200k.json",
]
MARK = re.compile(r"(<!-- render: ([\w-]+) -->\n)(.*?)(<!-- end -->)", re.S)


def render_page(text: str) -> str:
    """The page with every block rendered again (an unknown block name is an error)."""

    def fill(m):
        if m.group(2) not in BLOCKS:
            raise SystemExit(f"unknown block {m.group(2)!r}; known: {', '.join(BLOCKS)}")
        return f"{m.group(1)}{BLOCKS[m.group(2)]()}\n{m.group(4)}"

    return MARK.sub(fill, text)


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s [--write PAGE | --check PAGE | collect RUN_DIR NAME COMMAND]",
    )  # fmt: skip
    p.add_argument("--write", metavar="PAGE", help="render the blocks of PAGE in place")
    p.add_argument("--check", metavar="PAGE", help="exit 1 when a block of PAGE is stale")
    p.add_argument("words", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.words:
        if len(args.words) != 4 or args.words[0] != "collect":
            p.error("give no arguments, --write/--check PAGE, or: collect RUN_DIR NAME COMMAND")
        collect(*args.words[1:])
        return 0
    page = args.write or args.check
    if page is None:
        for name, fn in BLOCKS.items():
            sys.stdout.write(f"<!-- render: {name} -->\n{fn()}\n<!-- end -->\n\n")
        return 0
    text = Path(page).read_text()
    new = render_page(text)
    if args.check:
        stale = [m.group(2) for m, n in zip(MARK.finditer(text), MARK.finditer(new))
                 if m.group(3) != n.group(3)]  # fmt: skip
        for name in stale:
            sys.stdout.write(f"stale block {name!r}: run {Path(__file__).name} --write {page}\n")
        return 1 if stale else 0
    Path(page).write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
