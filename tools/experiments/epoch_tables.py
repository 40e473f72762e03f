"""Markdown tables of issue 45's JSONs: ``epoch_levers_*.json`` (epoch_levers_ab.py) and
``epoch_profile_*.json`` (profile_run.py), for docs/journal/2026-11-28-whole-epoch.md.

    python tools/experiments/epoch_tables.py docs/results/epoch_levers_quickstart.json \\
        docs/results/epoch_profile_quickstart_levers_off.json ...
"""

from __future__ import annotations

import argparse
import json
import sys


def _load_average(m: dict) -> str:
    """The load average the record was made under, where it was recorded."""
    load = m.get("load_average")
    return "" if load is None else f"; load average {load[0]:.1f}"


def levers(d: dict) -> str:
    m = d["machine"]
    ref = d["variants"][d["reference"]] if "reference" in d else None
    stock = d["variants"].get("stock/default")
    out = [f"`{d['command']}` ({m['date']}, {m['cpu']}, {m['cpus']} CPUs, torch {m['torch']}, "
           f"{m['torch_threads']} threads{_load_average(m)})", "",
           "| variant | allocator | median epoch ms | mean ms | epochs | faults/epoch "
           "| x exact (default alloc) | x stock (default alloc) | kept / default |",
           "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, v in d["variants"].items():
        vs_ref = ref["median_epoch_ms"] / v["median_epoch_ms"] if ref else float("nan")
        vs_stock = stock["median_epoch_ms"] / v["median_epoch_ms"] if stock else float("nan")
        kept = v.get("speedup_kept_vs_default")
        out.append(
            f"| {name.split('/')[0]} | {v['alloc']} | {v['median_epoch_ms']:.0f} "
            f"| {v['mean_epoch_ms']:.0f} | {v['epochs_timed']} | {v['minor_faults_per_epoch']:.0f} "
            f"| {vs_ref:.2f}x | {vs_stock:.2f}x | {'' if kept is None else f'{kept:.2f}x'} |"
        )
    out.append(f"\nPeak RSS of the process (all variants together): {d['peak_rss_mb']:.0f} MB.")
    return "\n".join(out)


def profile(d: dict) -> str:
    m = d["machine"]
    cats = ("sparse_forward", "sparse_backward_sampled", "sparse_backward_exact", "rsc_own",
            "dense", "elementwise", "optimizer", "other")  # fmt: skip
    short = ("fwd sparse", "bwd sparse sampled", "bwd sparse exact", "RSC own", "dense",
             "elementwise", "optimizer", "other")  # fmt: skip
    out = [f"`{d['command']}` ({m['date']}; levers {d.get('levers', 'on')}; each method in its "
           f"own process{_load_average(m)})", "",
           "| method | epoch ms (mean) | " + " | ".join(short) + " | faults/epoch | peak RSS MB |",
           "|---|---|" + "---|" * len(cats) + "---|---|"]  # fmt: skip
    for meth, r in d["methods"].items():
        s = r["split_ms"]
        cells = " | ".join(f"{s[c]:.0f}" for c in cats)
        out.append(f"| {meth} | {r['epoch_ms']:.0f} | {cells} "
                   f"| {r['minor_faults_per_epoch']:.0f} | {r['peak_rss_mb']:.0f} |")  # fmt: skip
    return "\n".join(out)


def main(argv) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="+", help="epoch_levers_*.json or epoch_profile_*.json")
    for path in p.parse_args(argv).paths:
        with open(path) as f:
            d = json.load(f)
        print(f"**{path}**\n")
        print(profile(d) if "methods" in d else levers(d))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
