"""The homophily to tune a synthetic preset to, from ``tta_sweep.py --exact-only`` runs.

Each argument is one sweep's JSON at one ``dataset.homophily`` (in its ``sets``); printed is the
largest homophily whose exact test accuracy (seed 0, at the best validation epoch) is at most
``--ceiling``, so that the preset does not saturate (issue 22 asks for 70% to 95%), or the
smallest given when every one is above it.

    python tools/experiments/pick_homophily.py results/grid_h*.json --ceiling 0.94
"""

from __future__ import annotations

import argparse
import json
import sys


def _point(path: str) -> tuple[float, float]:
    """``(homophily, exact test accuracy)`` of one sweep file."""
    with open(path) as f:
        sweep = json.load(f)
    sets = dict(s.split("=", 1) for s in sweep["sets"])
    if "dataset.homophily" not in sets:
        raise SystemExit(f"{path}: the sweep sets no dataset.homophily; run it with --set")
    tests = [r["best"]["test"] for k, r in sweep["runs"].items() if k.startswith("exact-")]
    if not tests:
        raise SystemExit(f"{path}: no exact run in it (the sweep was cut short?)")
    return float(sets["dataset.homophily"]), min(tests)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweeps", nargs="+")
    p.add_argument("--ceiling", type=float, default=0.94)
    args = p.parse_args(argv)
    points = sorted(_point(path) for path in args.sweeps)
    for h, test in points:
        print(f"homophily {h}: exact test {test:.4f}", file=sys.stderr)
    below = [h for h, test in points if test <= args.ceiling]
    print(max(below) if below else points[0][0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
