"""Where a run writes: the output directory checks (--out, --force, --resume) made before any
data are loaded, and the command that continues an interrupted run."""

from __future__ import annotations

import logging
import os
import shlex
import tempfile

from ..core.config import ConfigError
from .checkpoint import LOCK, MANIFEST, OUTPUTS, foreign_entries, manifest_files
from .yaml_io import load_yaml

__all__ = [
    "check_location",
    "output_dir",
    "output_path",
    "resume_command",
    "some",
    "PARTITION_CACHE",
]

log = logging.getLogger(__name__)

_SUBDIRS = ("runs", "checkpoints")
#: the partition cache of distributed runs: reused across runs, kept by --force (each file is
#: checked on reuse, see dgl_rsc.distributed.partition.load_or_partition)
PARTITION_CACHE = "partitions"
#: keys that change no run's numbers: the report's (written again at the end) and the untimed
#: warm-up before the timed runs. A resume may change them, e.g. to read the time to accuracy
#: of finished runs against another target, and a run started before a key existed resumes
NO_RESULT_KEYS = ("report.", "train.warmup_epochs")

#: the prefix of the file check_location writes and removes at once; another process checking
#: the same directory (a distributed run's other rank, a second run) may see one for a moment
PROBE_PREFIX = ".dgl-rsc-probe-"


def changes_results(key: str) -> bool:
    """Whether a flattened config key (``"train.lr"``) can change a run's numbers."""
    return not key.startswith(NO_RESULT_KEYS)


def _fail(msg: str):
    raise ConfigError(msg)


def check_location(out: str, flag: str) -> None:
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
        fd, probe = tempfile.mkstemp(prefix=PROBE_PREFIX, dir=base)
        os.close(fd)
        os.remove(probe)
    except OSError as exc:
        _fail(f"{flag} {out}: cannot write in {base} ({exc.strerror}); choose a writable path.")


def some(names: list, limit: int = 8) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def output_path(args) -> str:
    """The directory a run writes, with no checks: ``--resume``, else ``--out``, else
    ``runs/<config name>``. What a distributed run's other ranks use: rank 0 checks the
    directory (:func:`output_dir`) and writes it; they only read from it."""
    if args.resume:
        return args.resume
    return args.out or os.path.join("runs", os.path.splitext(os.path.basename(args.config))[0])


def output_dir(args, cfg) -> str:
    """Where the run writes; refuses an existing run directory unless --force/--resume,
    and a non-empty directory that dgl-rsc did not write even with --force. A resume must
    have the config the run started with, except the ``report`` section."""
    if args.resume:
        out = args.resume
        if args.out and os.path.abspath(args.out) != os.path.abspath(out):
            _fail(f"--out {args.out} and --resume {out} name different directories.")
        check_location(out, "--resume")
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
        diff = [k for k in sorted(set(before) | set(now))
                if before.get(k) != now.get(k) and changes_results(k)]  # fmt: skip
        if diff and getattr(args, "resume_anyway", False):
            log.warning("--resume-anyway: the config differs from the one %s started with at %s",
                        out, ", ".join(map(str, diff)))  # fmt: skip
        elif diff:
            _fail(
                f"--resume {out}: the config differs from the one the run started with at "
                f"{', '.join(map(str, diff))}; resume with the same config and --set values."
            )
        return out
    out = output_path(args)
    check_location(out, "--out")
    if os.path.isdir(out) and not _only_leftovers(out):
        if not args.force:
            _fail(
                f"output directory '{out}' exists and is not empty; pass --force to replace "
                f"its run, --resume {out} to continue it, or --out to choose another directory."
            )
        if manifest_files(out) is None:
            _fail(
                f"--force: '{out}' is not empty and has no readable {MANIFEST}, so it is not a "
                f"directory dgl-rsc wrote (or an older version wrote it), and --force only "
                f"removes dgl-rsc's own files. It holds {some(sorted(os.listdir(out)))}. "
                "Choose a new or empty --out, or delete what you no longer need yourself."
            )
        clash = [e for e in foreign_entries(out) if OUTPUTS.fullmatch(e) or e in _SUBDIRS]
        if clash:
            _fail(
                f"--force: '{out}' holds {some(clash)}, which its {MANIFEST} does not list "
                "(dgl-rsc did not write them) and which this run would replace or read. Move "
                "them away or choose another --out."
            )
    return out


def _only_leftovers(out: str) -> bool:
    """``out`` holds nothing of a run: at most its lock, an empty manifest and the partition
    cache (what a run that failed before writing its config leaves; all reusable), and the
    probe file another process's :func:`check_location` is writing at this moment."""
    for name in os.listdir(out):
        path = os.path.join(out, name)
        if name.startswith(PROBE_PREFIX):
            continue
        if name == LOCK and os.path.isfile(path):
            continue
        if name == MANIFEST and manifest_files(out) == []:
            continue
        if name == PARTITION_CACHE and os.path.isdir(path) and not os.path.islink(path):
            continue
        return False
    return True


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


def resume_command(prog: str, args, out: str) -> str:
    """The full command that continues this run: the original command line with ``--resume
    out`` in place of ``--out``/``--force`` (the same config, --set, --device and --nproc)."""
    words = ["run", args.config, "--resume", out]
    for item in args.sets:
        words += ["--set", item]
    if args.device:
        words += ["--device", args.device]
    if getattr(args, "nproc", None):
        words += ["--nproc", str(args.nproc)]
    if getattr(args, "no_progress", False):
        words.append("--no-progress")
    if getattr(args, "verbose", False):
        words.append("--verbose")
    return f"{prog} {shlex.join(words)}"
