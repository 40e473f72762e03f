"""``dgl-rsc``: the command line (``run`` trains from a YAML config, ``show`` prints it).

Exit codes: 0 done, 2 bad command line or config (one paragraph on stderr, no traceback),
130 interrupted (continue with ``--resume DIR``).
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import shutil
import sys
import time
from typing import Optional, Sequence

import yaml

from ..config import ConfigError
from .schema import RunConfig, resolve

__all__ = [
    "main",
    "build_parser",
    "load_yaml",
    "apply_overrides",
    "load_config",
    "dump_yaml",
    "ARTIFACTS",
]

#: What a run writes into its output directory (and what ``--force`` removes).
ARTIFACTS = (
    "config.yaml", "results.json", "metrics.csv", "summary.png", "table.txt", "runs",
    "checkpoints",
)  # fmt: skip

DESCRIPTION = """\
Full-graph GNN training with RSC (Randomized Sparse Computations, ICML 2023): exact forward,
approximated backward sparse product, per-layer budget, cached samples, exact last epochs."""

RUN_EPILOG = """\
examples:
  dgl-rsc run yaml_configs/quickstart.yaml --out runs/qs --force
  dgl-rsc run yaml_configs/cora_gcn.yaml --set train.seeds=[0,1] --set rsc.budget=0.2
  dgl-rsc run yaml_configs/cora_gcn.yaml --resume runs/cora_gcn   # after an interruption

The output directory (default runs/<config name>) receives config.yaml, results.json,
metrics.csv, summary.png and table.txt; it is never overwritten without --force. Relative
paths in the config (dataset.root, dataset.path) are resolved against the current directory."""


def load_yaml(path: str) -> dict:
    """Parse a YAML file with ``yaml.safe_load``; errors become :class:`ConfigError`."""
    if not os.path.isfile(path):
        _fail(f"config file '{path}' does not exist.")
    with open(path, encoding="utf-8") as f:
        try:
            data = yaml.safe_load(f)
        except yaml.YAMLError as exc:
            raise ConfigError(f"'{path}' is not valid YAML: {exc}") from None
    return {} if data is None else data


def apply_overrides(raw: dict, sets=()) -> dict:
    """A copy of ``raw`` with ``"section.key=value"`` overrides (value read as YAML)."""
    raw = copy.deepcopy(raw)
    for item in sets:
        key, eq, text = item.partition("=")
        parts = key.strip().split(".")
        if not eq or not all(parts):
            _fail(f"--set takes section.key=value (for example train.lr=0.01), got {item!r}.")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item!r}: the value is not valid YAML: {exc}") from None
        node = raw
        for i, part in enumerate(parts[:-1]):
            if node.get(part) is None:
                node[part] = {}
            if not isinstance(node[part], dict):
                _fail(f"--set {item!r}: {'.'.join(parts[: i + 1])} is not a section.")
            node = node[part]
        node[parts[-1]] = value
    return raw


def load_config(path: str, sets=()) -> RunConfig:
    """:func:`load_yaml`, :func:`apply_overrides`, then :func:`resolve`."""
    return resolve(apply_overrides(load_yaml(path), sets))


def dump_yaml(cfg: RunConfig) -> str:
    """The resolved config as YAML text (sections in the documented order)."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False, default_flow_style=False)


def _fail(msg: str):
    raise ConfigError(msg)


def build_parser(prog: Optional[str] = None) -> argparse.ArgumentParser:
    """The argument parser of ``dgl-rsc``."""
    parser = argparse.ArgumentParser(prog=prog or "dgl-rsc", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", metavar="{run,show}", required=True)
    fmt = argparse.RawDescriptionHelpFormatter

    def common(p):
        p.add_argument("config", metavar="CONFIG.yaml", help="the experiment's YAML config")
        p.add_argument(
            "--set", dest="sets", action="append", default=[], metavar="KEY.SUB=VALUE",
            help="override one config value, read as YAML (repeatable), e.g. train.lr=0.005",
        )  # fmt: skip

    run = sub.add_parser(
        "run", help="train (exact and/or RSC) and write the report", epilog=RUN_EPILOG,
        formatter_class=fmt, description="Train the runs of CONFIG.yaml and write the report.",
    )  # fmt: skip
    common(run)
    run.add_argument("--out", metavar="DIR", help="output directory (default runs/<config>)")
    run.add_argument(
        "--resume", metavar="DIR",
        help="continue the interrupted run in DIR from its checkpoints (same config)",
    )  # fmt: skip
    run.add_argument("--device", choices=("cpu", "cuda"), help="override train.device")
    run.add_argument("--force", action="store_true", help="replace the output directory's run")
    run.add_argument("--no-progress", action="store_true", help="no progress bars")
    run.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    show = sub.add_parser(
        "show", help="print the resolved config (defaults filled in) as YAML",
        description="Validate CONFIG.yaml and print it with every default filled in.",
    )  # fmt: skip
    common(show)
    return parser


def _sets(args) -> list:
    sets = list(args.sets)
    if getattr(args, "device", None):
        sets.append(f"train.device={args.device}")
    return sets


def _output_dir(args, cfg) -> str:
    """Where the run writes; refuses an existing run directory unless --force/--resume."""
    if args.resume:
        out = args.resume
        if args.out and os.path.abspath(args.out) != os.path.abspath(out):
            raise ConfigError(f"--out {args.out} and --resume {out} name different directories.")
        saved = os.path.join(out, "config.yaml")
        if not os.path.isfile(saved):
            raise ConfigError(f"--resume {out}: no config.yaml there, so no run to resume.")
        with open(saved, encoding="utf-8") as f:
            before = yaml.safe_load(f)
        before, now = _flatten(before), _flatten(cfg.to_dict())
        diff = [k for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k)]
        if diff:
            raise ConfigError(
                f"--resume {out}: the config differs from the one the run started with at "
                f"{', '.join(diff)}; resume with the same config and --set values."
            )
        return out
    out = args.out or os.path.join("runs", os.path.splitext(os.path.basename(args.config))[0])
    if os.path.isdir(out) and os.listdir(out) and not args.force:
        raise ConfigError(
            f"output directory '{out}' exists and is not empty; pass --force to replace its "
            f"run, --resume {out} to continue it, or --out to choose another directory."
        )
    return out


def _flatten(d, prefix="") -> dict:
    """``{"train.lr": 0.01, ...}`` of a nested dict (lists compared as lists)."""
    if not isinstance(d, dict):
        return {prefix: d}
    out = {}
    for key, value in d.items():
        out.update(
            _flatten(value, f"{prefix}{key}." if isinstance(value, dict) else f"{prefix}{key}")
        )
    return out


def _clear(out: str) -> None:
    """Remove a previous run's files (only those dgl-rsc writes) from ``out``."""
    for name in ARTIFACTS:
        path = os.path.join(out, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)


def _run(args) -> int:
    """``dgl-rsc run``; ``train.threads`` holds for the experiment and is restored after it
    (``null``: torch's default, one thread per core). On a CPU shared with other busy
    processes one thread can be several times faster than two: OpenMP threads wait for a
    descheduled sibling."""
    import torch

    cfg = load_config(args.config, _sets(args))
    before = torch.get_num_threads()
    if cfg.train.threads is not None:
        torch.set_num_threads(cfg.train.threads)
    try:
        return _run_config(args, cfg)
    finally:
        torch.set_num_threads(before)


def _run_config(args, cfg) -> int:
    from .checkpoint import atomic_write_text
    from .report import environment, format_table, write_report
    from .train import prepare, run_experiment

    out = _output_dir(args, cfg)
    text = dump_yaml(cfg)
    print(f"# dgl-rsc: resolved config of {args.config}\n{text}", flush=True)
    start = time.perf_counter()
    prep = prepare(cfg)  # may still reject the config (data, device): nothing written yet
    if not args.resume:
        os.makedirs(out, exist_ok=True)
        _clear(out)
        atomic_write_text(os.path.join(out, "config.yaml"), text)
    try:
        records = run_experiment(cfg, prep, out, progress=not args.no_progress)
    except KeyboardInterrupt:
        print(f"\ninterrupted; continue with: dgl-rsc run {args.config} --resume {out}",
              file=sys.stderr)  # fmt: skip
        return 130
    env = environment(prep.device)
    summary = write_report(out, cfg.to_dict(), records, env, prep.data.metric)
    print()
    print(format_table(summary, prep.data.metric))
    print(f"\nwall time {time.perf_counter() - start:.1f} s on {env['device_name']}; "
          f"results in {out}/ (results.json, metrics.csv, summary.png)")  # fmt: skip
    return 0


def _show(args) -> int:
    print(dump_yaml(load_config(args.config, _sets(args))), end="")
    return 0


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """Entry point of ``dgl-rsc`` and ``python -m dgl_rsc``; returns the exit code."""
    args = build_parser(prog).parse_args(argv)
    level = logging.INFO if getattr(args, "verbose", False) else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return _run(args) if args.command == "run" else _show(args)
    except ConfigError as exc:
        print(f"{build_parser(prog).prog} {args.command}: error: {exc}", file=sys.stderr)
        return 2
