"""``dgl-rsc``: the command line (``run`` trains from a YAML config, ``show`` prints it).

Exit codes: 0 done; 2 bad command line, config, data, output directory or checkpoint, or an
output that cannot be written (a full disk) (one line on stderr, no traceback; checked before
any training where possible); 3 a run diverged (its training loss became NaN or infinite;
what was written is kept); 130 interrupted (the message prints the full command that
continues the run); 1 a crash of dgl-rsc itself (with ``--nproc``: the rank and its log), or
a lost peer (one line naming the rank and the node that went away).

With ``--nproc N`` the same holds: the parent checks the config, the environment, the device,
the backend and the graph before it starts a worker, and turns the workers' end into one of
the lines above (:mod:`~dgl_rsc.launcher.supervise`). One run writes an output directory at a
time (:mod:`~dgl_rsc.launcher.lock`); a resume checks every rank's checkpoint as a set
(:mod:`~dgl_rsc.launcher.runid`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Callable, Optional, Sequence

from ..core.config import ConfigError
from . import yaml_io
from .checkpoint import OutputWriteError
from .outputs import PARTITION_CACHE, output_dir, output_path, resume_command, some
from .supervise import guard, managed_worker
from .yaml_io import (  # noqa: F401 (re-exported)
    StrictLoader,
    apply_overrides,
    dump_yaml,
    load_config,
    load_yaml,
    parse_yaml,
)

__all__ = ["main", "build_parser", *yaml_io.__all__]  # the YAML helpers, re-exported

log = logging.getLogger(__name__)

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
files stay; a directory without it is refused). A directory another live run writes is
refused (its .dgl-rsc-lock names the pid). --resume checks the checkpoints (every rank's, one
run, one epoch, the same config) before training; --resume-anyway accepts another config.
Relative paths in the config (dataset.root, dataset.path) are resolved against the current
directory."""


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
        "--nproc", type=_positive, metavar="N",
        help="train one graph across N processes on this machine (torch.distributed; the "
        "config's distributed section, or its defaults)",
    )  # fmt: skip
    run.add_argument(
        "--force", action="store_true",
        help="replace the run in --out (removes only the files dgl-rsc wrote there)",
    )  # fmt: skip
    run.add_argument(
        "--resume-anyway", action="store_true",
        help="with --resume: continue even though the checkpoints were written under another "
        "config (train.lr, ...) or run; the differences are logged",
    )  # fmt: skip
    run.add_argument("--no-progress", action="store_true", help="no progress bars")
    run.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    show = sub.add_parser(
        "show", help="print the resolved config (defaults filled in) as YAML",
        description="Validate CONFIG.yaml and print it with every default filled in.",
    )  # fmt: skip
    common(show)
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"--nproc takes a positive integer, got {text!r}")
    return value


def _sets(args, nproc: bool = True) -> list:
    """The ``--set`` values with ``--device`` (and ``--nproc`` unless ``nproc=False``)."""
    sets = list(args.sets) if nproc else []
    if getattr(args, "device", None):
        sets.append(f"train.device={args.device}")
    if nproc and getattr(args, "nproc", None):
        sets.append(f"distributed.partitions={args.nproc}")
    return sets


def _run(args, prog: str, on_epoch_end) -> int:
    """``dgl-rsc run``; ``train.threads`` holds for the experiment and is restored after it
    (``null``: torch's default, one thread per core). On a CPU shared with other busy
    processes one thread can be several times faster than two: OpenMP threads wait for a
    descheduled sibling."""
    import torch

    if args.nproc:
        return _run_parent(args, prog)
    cfg = load_config(args.config, _sets(args))
    before = torch.get_num_threads()
    if cfg.train.threads is not None:
        torch.set_num_threads(cfg.train.threads)
    try:
        return _run_config(args, cfg, prog, on_epoch_end)
    finally:
        torch.set_num_threads(before)


def _run_parent(args, prog: str) -> int:
    """``--nproc N``: check everything a worker would (nothing written, nothing started),
    hold the output directory's lock, start the workers and report their end as one line."""
    from .checkpoint import claim
    from .dist_launch import worker_command
    from .lock import HELD_ENV, OutputLock
    from .preflight import check_distributed, check_environment, check_nproc
    from .supervise import supervise

    check_environment(args.nproc)
    given = load_config(args.config, [*args.sets, *_sets(args, nproc=False)])
    check_nproc(args.nproc, given.distributed and given.distributed.partitions)
    cfg = load_config(args.config, _sets(args))
    check_distributed(cfg, args.nproc, progress=not args.no_progress)
    out = output_dir(args, cfg)
    with OutputLock(out):
        out = output_dir(args, cfg)  # again under the lock: another run may have finished
        if not args.resume:
            claim(out)  # an (empty) manifest now: whatever the workers leave, --force cleans
        cmd = worker_command(args.argv, args.nproc, out)
        print(f"# dgl-rsc: starting {args.nproc} workers: {' '.join(cmd[1:])}", flush=True)
        outcome, _ = supervise(cmd, {HELD_ENV: os.path.abspath(out)}, args.nproc, args.verbose)
    if outcome.code == 130:
        print(f"\ninterrupted; continue with: {resume_command(prog, args, out)}",
              file=sys.stderr)  # fmt: skip
    elif outcome.code:
        print(f"{prog} run: error: {outcome.message}", file=sys.stderr)
    return outcome.code


def _run_config(args, cfg, prog, on_epoch_end) -> int:
    from .lock import OutputLock, held_for_me
    from .prepare import prepare

    rank = int(os.environ.get("RANK", "0")) if cfg.distributed is not None else 0
    main = rank == 0  # in a distributed run rank 0 writes the shared files and prints
    # only the writer checks the directory: another rank checking it could see what rank 0
    # has started writing there and refuse the run (rank 0's check is the run's check)
    out = output_dir(args, cfg) if main else output_path(args)
    text = dump_yaml(cfg)
    if main:
        print(f"# dgl-rsc: resolved config of {args.config}\n{text}", flush=True)
    start = time.perf_counter()
    # device, backend, data: may still reject; nothing written yet. Setup phases that run past
    # a few seconds show their progress on stderr (rank 0's; none with --no-progress)
    prep = prepare(cfg, out, progress=main and not args.no_progress)
    lock = None
    if main and not held_for_me(out):  # one writer per directory (a --nproc parent holds it)
        lock = OutputLock(out)
        lock.acquire()
    try:
        return _write_run(args, cfg, prog, on_epoch_end, prep, out, text, start)
    finally:
        if lock is not None:
            lock.release()


def _write_run(args, cfg, prog, on_epoch_end, prep, out, text, start) -> int:
    """Prepare ``out`` (this process holds its lock, or rank 0's does), train, report."""
    from .checkpoint import (
        atomic_write_text,
        claim,
        foreign_entries,
        remove_owned,
        remove_stale_temps,
    )
    from .report import environment, format_partition, format_setup, format_table, write_report
    from .runid import start_run_id
    from .train import run_experiment

    main = prep.dist is None or prep.dist.is_main
    if main:
        output_dir(args, cfg)  # again under the lock: another run may have finished since
    if not main:
        pass
    elif args.resume:
        remove_stale_temps(out)
    else:
        os.makedirs(out, exist_ok=True)
        remove_owned(out)
        kept = [e for e in foreign_entries(out) if e != PARTITION_CACHE]
        if kept:
            log.warning("%s: kept %d entries dgl-rsc did not write: %s", out, len(kept),
                        some(kept))  # fmt: skip
        claim(out, os.path.join(out, "config.yaml"))
        atomic_write_text(os.path.join(out, "config.yaml"), text)
    if main:
        start_run_id(out, resume=bool(args.resume))
    try:
        if prep.dist is not None:
            prep.dist.barrier("rank 0 preparing the output directory")
        records = run_experiment(
            cfg, prep, out, progress=not args.no_progress, on_epoch_end=on_epoch_end,
            resume_anyway=args.resume_anyway,
        )  # fmt: skip
    except KeyboardInterrupt:
        if main and not managed_worker():  # a --nproc parent prints it with --nproc
            print(f"\ninterrupted; continue with: {resume_command(prog, args, out)}",
                  file=sys.stderr)  # fmt: skip
        return 130
    if not main:
        return 0
    env = environment(prep.device)
    env["setup_s"] = dict(prep.setup_s)  # seconds of each setup phase, shared by the runs
    if prep.int8_pick is not None:  # train.int8_pick: the precision the runs trained in
        env["int8_pick"] = prep.int8_pick
    summary = write_report(out, cfg.to_dict(), records, env, prep.data.metric)
    print()
    print(format_table(summary, prep.data.metric))
    print(f"\n{format_setup(env['setup_s'])}")
    if prep.partition is not None:
        print(format_partition(prep.partition))
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
    from ..distributed.runtime import DistributedError
    from .prepare import TrainingDiverged

    name = build_parser(prog).prog
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(prog).parse_args(argv)
    args.argv = argv
    level = logging.INFO if getattr(args, "verbose", False) else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")

    def body() -> int:
        return _run(args, name, on_epoch_end) if args.command == "run" else _show(args)

    folder = managed_worker() if args.command == "run" else None
    if folder is not None:  # a worker of `--nproc`: its parent prints what went wrong
        return guard(folder, body, _kind)
    try:
        return body()
    except (ConfigError, OutputWriteError) as exc:
        print(f"{name} {args.command}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except TrainingDiverged as exc:
        print(f"{name} {args.command}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 3
    except DistributedError as exc:  # a worker under a plain torchrun: a peer went away
        print(f"{name} {args.command}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\n{name} {args.command}: interrupted before training started", file=sys.stderr)
        return 130


def _kind(exc: BaseException) -> str:
    """How a worker's exception is reported (see :func:`~dgl_rsc.launcher.supervise.guard`)."""
    from .prepare import TrainingDiverged

    if isinstance(exc, (ConfigError, OutputWriteError)):
        return "config"
    return "diverged" if isinstance(exc, TrainingDiverged) else "crash"
