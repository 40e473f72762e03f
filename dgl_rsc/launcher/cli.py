"""``dgl-rsc``: the command line (``run`` trains from a YAML config, ``show`` prints it).

Exit codes: 0 done; 2 bad command line, config, data, output directory or checkpoint (one
line on stderr, no traceback; checked before any training where possible); 3 a run diverged
(its training loss became NaN or infinite; what was written is kept); 130 interrupted (the
message prints the full command that continues the run).
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import shlex
import sys
import tempfile
import time
from typing import Callable, Optional, Sequence

import yaml

from ..config import ConfigError
from .schema import RunConfig, resolve

__all__ = [
    "main",
    "build_parser",
    "StrictLoader",
    "parse_yaml",
    "load_yaml",
    "apply_overrides",
    "load_config",
    "dump_yaml",
]

log = logging.getLogger(__name__)
_SUBDIRS = ("runs", "checkpoints")

DESCRIPTION = """\
Full-graph GNN training with RSC (Randomized Sparse Computations, ICML 2023): exact forward,
approximated backward sparse product, per-layer budget, cached samples, exact last epochs."""

RUN_EPILOG = """\
examples:
  dgl-rsc run yaml_configs/quickstart.yaml --out runs/qs --force
  dgl-rsc run yaml_configs/cora_gcn.yaml --set train.seeds=[0,1] --set rsc.budget=0.2
  dgl-rsc run yaml_configs/cora_gcn.yaml --resume runs/cora_gcn   # after an interruption

The output directory (default runs/<config name>) receives config.yaml, results.json,
metrics.csv, summary.png and table.txt, listed in its .dgl-rsc-manifest.json. A non-empty
directory is refused unless --force, which removes only the files that manifest lists (other
files stay; a directory without it is refused). Relative paths in the config (dataset.root,
dataset.path) are resolved against the current directory."""


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` (the same types, nothing executable) that refuses a key given
    twice in one mapping; plain PyYAML keeps the last value silently."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # '<<: *base' entries may be overridden, as YAML intends
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            line = key_node.start_mark.line + 1
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice in one mapping (lines {first} and "
                    f"{line}); keep one of them", key_node.start_mark,
                )  # fmt: skip
            seen[key] = line
        return super().construct_mapping(node, deep)


def _yaml_message(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    if mark is None:
        return " ".join(str(exc).split())
    text = "; ".join(p for p in (getattr(exc, "context", None), exc.problem) if p)
    return f"{text} (line {mark.line + 1}, column {mark.column + 1})"


def parse_yaml(data, where: str):
    """Parse YAML ``data`` (bytes in UTF-8, or str) with :class:`StrictLoader`; errors
    become a :class:`ConfigError` that starts with ``where``."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{where} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                f"{exc.start}); save it with UTF-8 encoding."
            ) from None
    try:
        return yaml.load(data, Loader=StrictLoader)  # a SafeLoader: no Python objects
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not valid YAML: {_yaml_message(exc)}.") from None


def load_yaml(path: str) -> dict:
    """Read a YAML file with :func:`parse_yaml`; errors become :class:`ConfigError`."""
    if not os.path.exists(path):
        _fail(f"config file '{path}' does not exist.")
    if not os.path.isfile(path):
        _fail(f"config file '{path}' is not a file; give the path of a .yaml config.")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ConfigError(f"config file '{path}' cannot be read: {exc.strerror}.") from None
    data = parse_yaml(data, f"'{path}'")
    return {} if data is None else data


def apply_overrides(raw: dict, sets=()) -> dict:
    """A copy of ``raw`` with ``"section.key=value"`` overrides (value read as YAML)."""
    raw = copy.deepcopy(raw)
    for item in sets:
        key, eq, text = item.partition("=")
        parts = key.strip().split(".")
        if not eq or not all(parts):
            _fail(f"--set takes section.key=value (for example train.lr=0.01), got {item!r}.")
        value = parse_yaml(text, f"--set {item!r}: the value") if text.strip() else None
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
    run.add_argument(
        "--force", action="store_true",
        help="replace the run in --out (removes only the files dgl-rsc wrote there)",
    )  # fmt: skip
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


def _check_location(out: str, flag: str) -> None:
    """``out`` is (or can become) a directory this process can write in."""
    path = os.path.abspath(out)
    if os.path.lexists(path) and not os.path.isdir(path):
        _fail(f"{flag} {out} exists and is not a directory; choose a directory path.")
    base = path
    while not os.path.lexists(base):
        base = os.path.dirname(base)
    if not os.path.isdir(base):
        _fail(f"{flag} {out} lies under {base}, which is not a directory; choose another path.")
    try:
        fd, probe = tempfile.mkstemp(prefix=".dgl-rsc-probe-", dir=base)
        os.close(fd)
        os.remove(probe)
    except OSError as exc:
        _fail(f"{flag} {out}: cannot write in {base} ({exc.strerror}); choose a writable path.")


def _some(names: list, limit: int = 8) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _output_dir(args, cfg) -> str:
    """Where the run writes; refuses an existing run directory unless --force/--resume,
    and a non-empty directory that dgl-rsc did not write even with --force."""
    from .checkpoint import MANIFEST, OUTPUTS, foreign_entries, manifest_files

    if args.resume:
        out = args.resume
        if args.out and os.path.abspath(args.out) != os.path.abspath(out):
            _fail(f"--out {args.out} and --resume {out} name different directories.")
        _check_location(out, "--resume")
        saved = os.path.join(out, "config.yaml")
        if not os.path.isfile(saved):
            _fail(f"--resume {out}: no config.yaml there, so no run to resume.")
        try:
            before = load_yaml(saved)
        except ConfigError as exc:
            raise ConfigError(
                f"--resume {out}: the run's config.yaml is damaged ({exc}); it cannot be "
                "resumed: start it again with --force or --out."
            ) from None
        before, now = _flatten(before), _flatten(cfg.to_dict())
        diff = [k for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k)]
        if diff:
            _fail(
                f"--resume {out}: the config differs from the one the run started with at "
                f"{', '.join(map(str, diff))}; resume with the same config and --set values."
            )
        return out
    out = args.out or os.path.join("runs", os.path.splitext(os.path.basename(args.config))[0])
    _check_location(out, "--out")
    if os.path.isdir(out) and os.listdir(out):
        if not args.force:
            _fail(
                f"output directory '{out}' exists and is not empty; pass --force to replace "
                f"its run, --resume {out} to continue it, or --out to choose another directory."
            )
        if manifest_files(out) is None:
            _fail(
                f"--force: '{out}' is not empty and has no readable {MANIFEST}, so it is not a "
                f"directory dgl-rsc wrote (or an older version wrote it), and --force only "
                f"removes dgl-rsc's own files. It holds {_some(sorted(os.listdir(out)))}. "
                "Choose a new or empty --out, or delete what you no longer need yourself."
            )
        clash = [e for e in foreign_entries(out) if OUTPUTS.fullmatch(e) or e in _SUBDIRS]
        if clash:
            _fail(
                f"--force: '{out}' holds {_some(clash)}, which its {MANIFEST} does not list "
                "(dgl-rsc did not write them) and which this run would replace or read. Move "
                "them away or choose another --out."
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


def _resume_command(prog: str, args, out: str) -> str:
    """The full command that continues this run (the same config, --set and --device)."""
    words = ["run", args.config, "--resume", out]
    for item in args.sets:
        words += ["--set", item]
    if args.device:
        words += ["--device", args.device]
    return f"{prog} {shlex.join(words)}"


def _run(args, prog: str, on_epoch_end) -> int:
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
        return _run_config(args, cfg, prog, on_epoch_end)
    finally:
        torch.set_num_threads(before)


def _run_config(args, cfg, prog, on_epoch_end) -> int:
    from .checkpoint import (
        atomic_write_text,
        claim,
        foreign_entries,
        remove_owned,
        remove_stale_temps,
    )
    from .report import environment, format_table, write_report
    from .train import prepare, run_experiment

    out = _output_dir(args, cfg)
    text = dump_yaml(cfg)
    print(f"# dgl-rsc: resolved config of {args.config}\n{text}", flush=True)
    start = time.perf_counter()
    prep = prepare(cfg)  # device, backend, then data: may still reject; nothing written yet
    if args.resume:
        remove_stale_temps(out)
    else:
        os.makedirs(out, exist_ok=True)
        remove_owned(out)
        kept = foreign_entries(out)
        if kept:
            log.warning("%s: kept %d entries dgl-rsc did not write: %s", out, len(kept),
                        _some(kept))  # fmt: skip
        claim(out, os.path.join(out, "config.yaml"))
        atomic_write_text(os.path.join(out, "config.yaml"), text)
    try:
        records = run_experiment(
            cfg, prep, out, progress=not args.no_progress, on_epoch_end=on_epoch_end
        )
    except KeyboardInterrupt:
        print(f"\ninterrupted; continue with: {_resume_command(prog, args, out)}",
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


def main(
    argv: Optional[Sequence[str]] = None,
    prog: Optional[str] = None,
    *,
    on_epoch_end: Optional[Callable[[str, int], None]] = None,
) -> int:
    """Entry point of ``dgl-rsc`` and ``python -m dgl_rsc``; returns the exit code.
    ``on_epoch_end(run, epoch)`` (``run`` like ``"rsc-seed0"``) is called after each
    training epoch and its checkpoint (see :func:`dgl_rsc.launcher.train.run_experiment`)."""
    from .train import TrainingDiverged

    name = build_parser(prog).prog
    args = build_parser(prog).parse_args(argv)
    level = logging.INFO if getattr(args, "verbose", False) else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return _run(args, name, on_epoch_end) if args.command == "run" else _show(args)
    except ConfigError as exc:
        print(f"{name} {args.command}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except TrainingDiverged as exc:
        print(f"{name} {args.command}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print(f"\n{name} {args.command}: interrupted before training started", file=sys.stderr)
        return 130
