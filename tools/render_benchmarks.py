"""Render the tables of docs/benchmarks.md from the JSON results in docs/results/.

python tools/render_benchmarks.py > /tmp/tables.md
python tools/render_benchmarks.py collect runs/cora launcher_cora "dgl-rsc run ..."
    (keeps the environment, summary and table of a launcher run as docs/results/NAME.json)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


def spmm(name: str) -> str:
    d = json.loads((RESULTS / name).read_text())
    g, m = d["graph"], d["machine"]
    eng = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in d["exact_engines_s"].items())
    where = m.get("gpu") or f"{m['host_cpu']} ({m['cpus']} cores)"
    alloc = m.get("allocator_env")
    if alloc:
        where += ", allocator " + " ".join(f"{k}={v}" for k, v in alloc.items() if v)
    out = [
        f"Graph {g['nodes']} x {g['nodes']}, {g['nnz']} non-zeros, d = {g['dim']}, "
        f"{g['index_dtype']} indices; {where}, "
        f"torch {m['torch']}, {m['date']}.",
        f"Exact A^T@dY: {eng}. Forward A@X: {d['forward_s'] * 1e3:.1f} ms.",
        f"Command: `python {d['command']}`",
        "",
        "| rule | budget | rows kept | nnz kept | score+select ms | slice ms | product ms "
        "| product x | refresh/10 of exact | step x, cache 1 | step x, cache 10 | rel. error |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in d["rows"]:
        out.append(
            f"| {r['rule']} | {r['budget']} | {r['k']} | {100 * r['nnz_fraction']:.1f}% "
            f"| {r['select_s'] * 1e3:.1f} | {r['slice_s'] * 1e3:.1f} | {r['product_s'] * 1e3:.1f} "
            f"| {r['product_speedup']:.2f} | {100 * r['amortized_refresh_10_over_exact']:.1f}% "
            f"| {r['step_speedup_cache1']:.2f} | {r['step_speedup_cache10']:.2f} "
            f"| {r['rel_error']:.3f} |"
        )
    return "\n".join(out)


def e2e(name: str) -> str:
    d = json.loads((RESULTS / name).read_text())
    m = d["machine"]
    out = [
        f"{m.get('gpu', m['host_cpu'])}, torch {m['torch']}, {m['date']}; "
        f"{d.get('graph', {}).get('nodes', '?')} nodes, {d.get('graph', {}).get('edges', '?')} "
        f"edges; {d.get('epochs', '?')} epochs. Command: `python {d['command']}`",
        "",
        "| model | amp | exact ms/epoch | RSC ms/epoch | RSC ms/epoch, approx phase "
        "| speedup, approx phase | speedup, whole run | exact test acc | RSC test acc |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in d["rows"]:
        if "speedup_all" in r:
            out.append(
                f"| {r['model']} | {r['amp']} | {r['exact_epoch_s_all'] * 1e3:.1f} "
                f"| {r['rsc_epoch_s_all'] * 1e3:.1f} | {r['rsc_epoch_s_approx_phase'] * 1e3:.1f} "
                f"| {r['speedup_approx_phase']:.2f} | {r['speedup_all']:.2f} "
                f"| {100 * r['exact_test']:.2f} | {100 * r['rsc_test']:.2f} |"
            )
    for r in d["rows"]:
        if "pyg_adj_t_epoch_s" in r:
            pyg = r["pyg_adj_t_epoch_s"]
            ei = r.get("pyg_edge_index_epoch_s")
            out.append(
                f"\nPyG {r['model']}: adj_t (torch.sparse) {pyg * 1e3:.1f} ms/epoch, edge_index "
                f"{'out of memory' if ei is None else f'{ei * 1e3:.1f} ms'}; ours exact "
                f"{r['exact_epoch_s'] * 1e3:.1f} ms/epoch."
            )
    return "\n".join(out)


def rules(name: str) -> str:
    d = json.loads((RESULTS / name).read_text())
    m = d["machine"]
    out = [
        f"{m['host_cpu']} ({m['cpus']} cores), {m['date']}. Command: `python {d['command']}`",
        "",
    ]
    for g, r in d["graphs"].items():
        e = ", ".join(f"{k} {v:.3f}" for k, v in r["grad_rel_error"].items())
        a = ", ".join(f"{k} {100 * v:.2f}" for k, v in r["test_metric"].items())
        out.append(f"- {g}: gradient rel. error {e}; test metric {a}")
    return "\n".join(out)


def launcher(name: str) -> str:
    d = json.loads((RESULTS / name).read_text())
    env = d["environment"]
    return (
        f"{env['device_name']} ({env['cpu_count']} cores, {env['torch_threads']} torch threads), "
        f"torch {env['torch']}, {env['date']}. Command: `{d['command']}`\n\n```\n{d['table']}\n```"
    )


def collect(run_dir: str, name: str, command: str) -> None:
    """Keep the small part of a launcher run's results.json under docs/results/NAME.json."""
    res = json.loads((Path(run_dir) / "results.json").read_text())
    keep = {k: res[k] for k in ("environment", "summary", "table", "metric", "config")}
    keep["command"] = command
    (RESULTS / f"{name}.json").write_text(json.dumps(keep, indent=2) + "\n")


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "collect":
        collect(*sys.argv[2:])
        return
    parts = []
    for title, fn, name in [
        ("CPU, single operation", spmm, "spmm_cpu.json"),
        ("CPU, single operation, default allocator", spmm, "spmm_cpu_default_malloc.json"),
        ("H100, single operation, Reddit scale", spmm, "spmm_reddit.json"),
        ("H100, single operation, ogbn-products scale", spmm, "spmm_products.json"),
        ("H100, end to end, Reddit scale", e2e, "e2e_reddit.json"),
        ("H100, end to end, ogbn-products scale", e2e, "e2e_products.json"),
        ("Selection rules on real graphs (CPU)", rules, "rules.json"),
        ("Launcher, quickstart (CPU)", launcher, "launcher_quickstart.json"),
        (
            "Launcher, quickstart, rescale false (CPU)",
            launcher,
            "launcher_quickstart_norescale.json",
        ),
        ("Launcher, Cora, 10 seeds (CPU)", launcher, "launcher_cora.json"),
        ("Launcher, CiteSeer, 10 seeds (CPU)", launcher, "launcher_citeseer.json"),
        ("Launcher, synthetic 200k, 150 epochs (CPU)", launcher, "launcher_synthetic_200k.json"),
        (
            "Launcher, synthetic 200k, 150 epochs, rescale false (CPU)",
            launcher,
            "launcher_synthetic_200k_norescale.json",
        ),
        (
            "Launcher, synthetic 200k, 60 epochs, rescale false (CPU)",
            launcher,
            "launcher_synthetic_200k_60ep.json",
        ),
    ]:
        if (RESULTS / name).exists():
            parts.append(f"### {title}\n\n{fn(name)}")
    sys.stdout.write("\n\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
