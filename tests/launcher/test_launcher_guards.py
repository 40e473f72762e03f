"""Issue 23, items 2-5, the quick single-process cases: a ``--nproc`` run is validated in the
parent before anything is written or started; the minibatch settings are checked against the
mode and the graph; a worker's end is turned into one line; checkpoint sets carry a run id
and a config; one run writes an output directory at a time; a full disk is one line.
The multi-process cases are in tests/distributed/test_distributed_slow.py."""

from __future__ import annotations

import errno
import json
import os
import shlex
import shutil
import subprocess
import sys
import types

import pytest
import torch

from dgl_rsc.core.config import ConfigError
from dgl_rsc.launcher import cli, supervise
from dgl_rsc.launcher.checkpoint import MANIFEST, TMP_PREFIX
from dgl_rsc.launcher.cli import load_config
from dgl_rsc.launcher.lock import LOCK, OutputLock
from dgl_rsc.launcher.outputs import resume_command

from ..proc import group as proc_group
from ..proc import run as run_cmd
from .test_launcher import REPO, run_cli, write_config

pytestmark = pytest.mark.usefixtures("one_thread")
FAST = {"epochs": 2, "eval_every": 1}


def err_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err, "no message on stderr"
    assert "Traceback" not in "\n".join(err)
    return err[-1]


# -- item 2: validated before any work -----------------------------------------------------
@pytest.mark.parametrize(
    "key, value, words",
    [
        ("distributed.halo_bits", "8.0", "bit width is an integer"),
        ("distributed.forward_bits", "true", "is not one of"),
        ("distributed.adaptive_bits", "[2, 8.0]", "adaptive_bits"),
        ("distributed.timeout_s", "1e20", "out of range"),
        ("distributed.timeout_s", ".inf", "distributed.timeout_s"),
        ("distributed.cost_beta", "5", "out of range"),
    ],
)
def test_distributed_values_are_refused_with_key_and_value(tmp_path, key, value, words):
    cfg = write_config(tmp_path)
    with pytest.raises(ConfigError, match=key.split(".")[1]) as info:
        load_config(cfg, [f"{key}={value}"])
    assert words in str(info.value)


def test_cost_alpha_zero_is_honoured_not_replaced_by_the_default(tmp_path):
    from dgl_rsc.distributed.codecs import DEFAULT_COST
    from dgl_rsc.launcher.dist_run import policies_for

    cfg = load_config(write_config(tmp_path), ["distributed.cost_alpha=0"])
    ctx = types.SimpleNamespace(device=torch.device("cpu"), rank=0)
    fwd, bwd = policies_for(cfg.distributed, ctx)
    assert fwd.cost.alpha == 0.0 and bwd.cost.alpha == 0.0
    assert fwd.cost.beta == DEFAULT_COST.beta
    cfg = load_config(write_config(tmp_path), ["distributed.cost_beta=0"])
    assert policies_for(cfg.distributed, ctx)[0].cost.beta == 0.0


def _nproc_refused(tmp_path, capsys, *extra, out="out"):
    cfg = write_config(tmp_path, train=FAST)
    target = tmp_path / out
    assert cli.main(["run", cfg, "--out", str(target), "--no-progress", *extra]) == 2
    assert not target.exists()  # refused before anything was written or started
    return err_line(capsys)


@pytest.mark.parametrize(
    "extra, words",
    [
        (
            ["--nproc", "2", "--set", "distributed.partitions=3"],
            "--nproc 2 but distributed.partitions=3",
        ),
        (["--nproc", "2", "--set", "distributed.backend=nccl"], "distributed.backend=nccl"),
        (["--nproc", "2", "--set", "distributed.halo_bits=8.0"], "distributed.halo_bits=8.0"),
        (["--nproc", "400"], "exceeds the graph's 300 nodes"),
        (
            ["--nproc", "2", "--set", "dataset={name: npz, path: /nowhere/x.npz}"],
            "could not be loaded",
        ),
    ],
)
def test_nproc_runs_are_checked_in_the_parent(tmp_path, capsys, extra, words):
    line = _nproc_refused(tmp_path, capsys, *extra)
    assert words in line and line.count("error:") == 1


def test_nproc_refuses_a_partition_cache_under_a_file(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    line = _nproc_refused(tmp_path, capsys, "--nproc", "2", "--set",
                          f"distributed.partition_cache={tmp_path / 'file' / 'cache'}")  # fmt: skip
    assert "distributed.partition_cache" in line and "not a directory" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_nproc_with_device_cuda_without_cuda_is_refused(tmp_path, capsys):
    line = _nproc_refused(tmp_path, capsys, "--nproc", "2", "--device", "cuda")
    assert "CUDA is not available" in line


def test_nproc_refuses_the_environment_of_another_launcher(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    line = _nproc_refused(tmp_path, capsys, "--nproc", "2")
    assert "RANK=0" in line and "WORLD_SIZE=2" in line and "unset" in line


@pytest.mark.parametrize(
    "sets, words",
    [
        (
            ["train.mode=cluster", "minibatch.sampler=node"],
            "minibatch.sampler is not used by train.mode=cluster",
        ),
        (["train.mode=saint", "minibatch.num_parts=4"], "minibatch.num_parts is not used"),
        (
            ["train.mode=cluster", "minibatch.num_parts=400", "minibatch.batch_size=1"],
            "num_parts=400 exceeds",
        ),
        (["train.mode=saint", "minibatch.budget=1"], "budget=1 is too small"),
        (
            ["train.mode=saint", "minibatch.sampler=edge", "minibatch.budget=1"],
            "budget=1 is too small",
        ),
        (["train.mode=saint", "minibatch.budget=1000000000"], "larger than the graph"),
        (
            ["train.mode=saint", "minibatch.sampler=edge", "minibatch.budget=1000000000"],
            "larger than the graph",
        ),
        (["train.mode=saint", "minibatch.sampler=walk", "minibatch.budget=[1, 1]"], "too small"),
        (
            ["train.mode=saint", "minibatch.sampler=walk", "minibatch.budget=[10, 100000]"],
            "walk length",
        ),
    ],
)
def test_minibatch_settings_are_checked_against_mode_and_graph(tmp_path, capsys, sets, words):
    cfg = write_config(tmp_path, train=FAST)
    out = tmp_path / "out"
    args = ["run", cfg, "--out", str(out), "--no-progress"]
    for s in sets:
        args += ["--set", s]
    assert cli.main(args) == 2
    line = err_line(capsys)
    assert words in line
    assert not out.exists()  # before anything was written


def test_a_useful_saint_budget_still_trains(tmp_path, capsys):
    cfg = write_config(tmp_path, train=FAST)
    out = tmp_path / "out"
    args = ["run", cfg, "--out", str(out), "--no-progress", "--set", "train.mode=saint",
            "--set", "minibatch.budget=60", "--set", "train.batches_per_epoch=2"]  # fmt: skip
    assert cli.main(args) == 0
    assert (out / "results.json").exists()


# -- item 3: the parent's verdict on the workers' records ----------------------------------
def _records(folder, log="", **ranks):
    for key, (kind, t, pid) in ranks.items():
        rank = int(key[1:])
        rec = {"rank": rank, "pid": pid, "time": t, "kind": kind, "message": f"m{rank} {kind}"}
        (folder / f"rank{rank}.json").write_text(json.dumps(rec))
    (folder / "launcher.log").write_text(log)
    return str(folder)


def test_verdict_puts_a_config_error_first_as_it_is(tmp_path):
    f = _records(tmp_path, r0=("peer", 1.0, 10), r1=("config", 2.0, 11))
    out = supervise.verdict(f, 2, 1)
    assert (out.code, out.message, out.rank) == (2, "m1 config", 1)


def test_verdict_names_a_crash_with_its_rank_and_log(tmp_path):
    f = _records(tmp_path, r0=("crash", 3.0, 10), r1=("peer", 2.0, 11))
    out = supervise.verdict(f, 2, 1)
    assert out.code == 1 and out.rank == 0
    assert "rank 0 crashed" in out.message and os.path.join(f, "rank0.log") in out.message


@pytest.mark.parametrize("victim", [0, 2, 3])
def test_verdict_names_the_killed_rank_not_the_ranks_the_launcher_stopped(tmp_path, victim):
    pids = {r: 100 + r for r in range(4)}
    log = "".join(f"[x] torch.distributed.elastic: Sending process {pids[r]} closing signal "
                  "SIGTERM\n" for r in range(4) if r != victim)  # fmt: skip
    log += f"[x] failed (exitcode: -9) local_rank: {(victim + 1) % 4} (pid: 1) of binary\n"
    f = _records(tmp_path, log, **{f"r{r}": ("running", 1.0, pids[r]) for r in range(4)})
    out = supervise.verdict(f, 4, 1)
    assert out.code == 1 and out.rank == victim
    assert out.message.startswith(f"rank {victim} ")


def test_verdict_of_a_clean_run_is_zero(tmp_path):
    f = _records(tmp_path, r0=("ok", 1.0, 10), r1=("ok", 1.0, 11))
    assert supervise.verdict(f, 2, 0).code == 0


def test_guard_reports_and_prints_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")

    def bad():
        raise ConfigError("distributed.x=1 is wrong; use 2.")

    assert supervise.guard(str(tmp_path), bad, cli._kind) == 2
    rec = json.loads((tmp_path / "rank1.json").read_text())
    assert rec["kind"] == "config" and rec["message"] == "distributed.x=1 is wrong; use 2."

    def boom():
        raise TypeError("a bug")

    assert supervise.guard(str(tmp_path), boom, cli._kind) == 1
    assert json.loads((tmp_path / "rank1.json").read_text())["kind"] == "crash"
    assert "TypeError: a bug" in (tmp_path / "rank1.log").read_text()
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


# -- item 4: checkpoints as a set, the continue command ------------------------------------
def _interrupted(tmp_path, name, lr=0.02, stop=4):
    cfg = write_config(tmp_path, name=f"{name}.yaml",
                       train={"epochs": 6, "checkpoint_every": 2, "lr": lr})  # fmt: skip
    out = tmp_path / name

    def stop_at(run, epoch):
        if run == "rsc-seed0" and epoch == stop:
            raise KeyboardInterrupt

    assert cli.main(["run", cfg, "--out", str(out), "--no-progress"], on_epoch_end=stop_at) == 130
    assert (out / "checkpoints" / "rsc-seed0.pt").exists()
    return cfg, out


def test_a_checkpoint_of_another_run_is_refused(tmp_path, capsys):
    cfg, out = _interrupted(tmp_path, "a")
    _, other = _interrupted(tmp_path, "b")
    capsys.readouterr()
    shutil.copy(other / "checkpoints" / "rsc-seed0.pt", out / "checkpoints" / "rsc-seed0.pt")
    assert cli.main(["run", cfg, "--resume", str(out), "--no-progress"]) == 2
    assert "another run" in err_line(capsys)
    assert not (out / "results.json").exists()


def test_a_checkpoint_under_another_learning_rate_is_refused_unless_resume_anyway(tmp_path, capsys):
    cfg, out = _interrupted(tmp_path, "a", lr=0.02)
    _, other = _interrupted(tmp_path, "b", lr=0.05)
    shutil.copy(other / "checkpoints" / "rsc-seed0.pt", out / "checkpoints" / "rsc-seed0.pt")
    shutil.copy(other / "run.json", out / "run.json")  # even claiming the same run
    capsys.readouterr()
    assert cli.main(["run", cfg, "--resume", str(out), "--no-progress"]) == 2
    line = err_line(capsys)
    assert "train.lr: 0.05 then, 0.02 now" in line and "--resume-anyway" in line
    args = ["run", cfg, "--resume", str(out), "--no-progress", "--resume-anyway"]
    assert cli.main(args) == 0
    assert (out / "results.json").exists()


def test_a_rank_checkpoint_is_not_a_single_process_one(tmp_path, capsys):
    cfg, out = _interrupted(tmp_path, "a")
    path = out / "checkpoints" / "rsc-seed0.pt"
    state = torch.load(path, weights_only=True)
    state["extra"]["rank"], state["extra"]["world_size"] = 1, 2
    torch.save(state, path)
    capsys.readouterr()
    assert cli.main(["run", cfg, "--resume", str(out), "--no-progress"]) == 2
    assert "written by rank 1 of 2 processes" in err_line(capsys)


def test_the_continue_command_keeps_nproc_and_the_other_flags():
    args = types.SimpleNamespace(config="c.yaml", sets=["train.lr=0.1"], device="cpu", nproc=2,
                                 no_progress=True, verbose=False)  # fmt: skip
    words = shlex.split(resume_command("dgl-rsc", args, "runs/x"))
    assert words[:5] == ["dgl-rsc", "run", "c.yaml", "--resume", "runs/x"]
    assert words[words.index("--nproc") + 1] == "2" and "--no-progress" in words
    assert words[words.index("--set") + 1] == "train.lr=0.1"


@pytest.mark.heavy
def test_the_continue_command_works_when_pasted(tmp_path):
    cfg = write_config(tmp_path, train={"epochs": 4, "checkpoint_every": 1})
    script = tmp_path / "stop.py"
    script.write_text(
        "import sys\nfrom dgl_rsc.launcher.cli import main\n"
        "def stop(run, epoch):\n    if run == 'rsc-seed0' and epoch == 2:\n"
        "        raise KeyboardInterrupt\n"
        "sys.exit(main(sys.argv[1:], prog='python -m dgl_rsc', on_epoch_end=stop))\n"
    )  # fmt: skip
    env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1", "CI": "1"}
    out = tmp_path / "out"
    proc = run_cmd([sys.executable, str(script), "run", cfg, "--out", str(out), "--set",
                    "train.lr=0.03", "--no-progress"], env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 130, proc.stderr[-2000:]
    line = [ln for ln in proc.stderr.splitlines() if "continue with:" in ln][-1]
    words = shlex.split(line.split("continue with:", 1)[1])
    assert words[:3] == ["python", "-m", "dgl_rsc"] and "train.lr=0.03" in words
    proc = run_cmd([sys.executable, *words[1:]], env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "results.json").exists()


# -- item 5: one writer per output directory, a full disk ----------------------------------
def test_a_held_directory_is_refused_and_released_after(tmp_path, capsys):
    cfg = write_config(tmp_path, train=FAST)
    out = tmp_path / "out"
    with OutputLock(str(out)):
        assert cli.main(["run", cfg, "--out", str(out), "--no-progress", "--force"]) == 2
        line = err_line(capsys)
        assert f"pid {os.getpid()}" in line and "in use" in line
    assert (out / LOCK).read_text() == ""  # released
    assert cli.main(["run", cfg, "--out", str(out), "--no-progress"]) == 0
    assert (out / LOCK).read_text() == ""


def test_a_stale_lock_is_taken_over_and_a_live_holder_respected(tmp_path, capsys):
    cfg = write_config(tmp_path, train=FAST)
    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / LOCK).write_text(f"{dead.pid} {os.uname().nodename} 2026-01-01T00:00:00\n")
    assert cli.main(["run", cfg, "--out", str(out), "--no-progress"]) == 0
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (out / LOCK).write_text(f"{live.pid} {os.uname().nodename} 2026-01-01T00:00:00\n")
        capsys.readouterr()
        assert cli.main(["run", cfg, "--out", str(out), "--no-progress", "--force"]) == 2
        assert f"pid {live.pid}" in err_line(capsys)
    finally:
        live.kill()
        live.wait()


@pytest.mark.heavy
@pytest.mark.parametrize("force", [False, True])
def test_two_runs_into_one_new_folder(tmp_path, force):
    cfg = write_config(tmp_path, train={"epochs": 30})
    out = tmp_path / "new"
    args = [sys.executable, "-m", "dgl_rsc", "run", cfg, "--out", str(out), "--no-progress"]
    args += ["--force"] if force else []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CI": "1", "PYTHONPATH": REPO}
    with proc_group(args, env=env, cwd=REPO) as one, proc_group(args, env=env, cwd=REPO) as two:
        results = [p.communicate(timeout=300) + (p.returncode,) for p in (one, two)]
    codes = sorted(r[2] for r in results)
    for _, err, _ in results:
        assert "FileNotFoundError" not in err and "Traceback" not in err
    # one wins; the other is refused as the folder is in use (or, if the first had already
    # finished, as holding a run: without --force; with --force it replaces it cleanly)
    assert codes[0] == 0 and codes[1] in ((0, 2) if force else (2,))
    if codes[1] == 2:
        loser = next(err for _, err, code in results if code == 2)
        assert "in use by another dgl-rsc run" in loser or "exists and is not empty" in loser
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert len(runs) == 2 and all(len(r["history"]) == 30 for r in runs)


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("manifest", [False, True])
def test_a_failed_distributed_start_leaves_a_folder_the_same_command_reuses(
    tmp_path, capsys, force, manifest
):
    """A distributed run that failed after partitioning left ``partitions/`` (and, started
    by this version's parent, its lock and an empty manifest); running again works."""
    cfg = write_config(tmp_path, train=FAST)
    out = tmp_path / "out"
    (out / "partitions").mkdir(parents=True)
    cache = out / "partitions" / "part-metis-p2-s0-0123456789abcdef.npz"
    cache.write_bytes(b"x")
    if manifest:
        (out / MANIFEST).write_text(json.dumps({"tool": "dgl-rsc", "format": 1, "files": []}))
        (out / LOCK).write_text("")
    args = ["run", cfg, "--out", str(out), "--no-progress"] + (["--force"] if force else [])
    assert cli.main(args) == 0, capsys.readouterr().err
    assert (out / "results.json").exists() and cache.read_bytes() == b"x"


def test_a_full_disk_is_one_line_and_leaves_nothing_half_written(tmp_path, capsys, monkeypatch):
    cfg = write_config(tmp_path, train={"epochs": 4, "checkpoint_every": 1})
    out = tmp_path / "out"
    assert cli.main(["run", cfg, "--out", str(out), "--no-progress"]) == 0
    before = {p: (out / p).read_bytes() for p in ("results.json", "config.yaml", MANIFEST)}
    real_fsync, calls = os.fsync, []

    def full(fd):
        calls.append(fd)
        if len(calls) > 3:  # the manifest, config.yaml and run.json go through, then full
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full)
    capsys.readouterr()
    assert cli.main(["run", cfg, "--out", str(out), "--no-progress", "--force"]) == 2
    line = err_line(capsys)
    assert "cannot write" in line and str(out) in line and "ENOSPC" in line
    leftovers = [n for _, _, names in os.walk(out) for n in names if n.startswith(TMP_PREFIX)]
    assert leftovers == []
    assert before["results.json"] != b""  # the earlier run's report was removed, not torn
    assert not (out / "results.json").exists()
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert cli.main(["run", cfg, "--out", str(out), "--no-progress", "--force"]) == 0
    assert json.loads((out / "results.json").read_text())["runs"]


def test_run_cli_full_disk_message_is_one_line(tmp_path):
    """The same through ``python -m dgl_rsc``: no traceback, exit 2."""
    cfg = write_config(tmp_path, train=FAST)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import errno, os\n"
        "def _full(fd):\n    raise OSError(errno.ENOSPC, 'No space left on device')\n"
        "os.fsync = _full\n"
    )
    proc = run_cli(["run", cfg, "--out", str(tmp_path / "out"), "--no-progress"],
                   env={"PYTHONPATH": f"{hook}{os.pathsep}{REPO}"})  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot write" in lines[0] and "Traceback" not in proc.stderr


def test_the_relay_passes_warnings_and_keeps_the_launcher_talk_in_the_log(capsys):
    import io

    text = (
        "WARNING dgl_rsc.launcher.cli: kept 1 entries dgl-rsc did not write: notes.txt\n"
        "[2026-11-25 06:20:10,501] torch.distributed.elastic.multiprocessing.api: [WARNING] x\n"
        "W1125 06:20:10.501000 11416 torch/distributed/elastic/multiprocessing/api.py:897] x\n"
        "[rank1]:[E1125 06:41:30.885223055 ProcessGroupGloo.cpp:69] Rank 1 reached\n"
        "*****************************************\n"
        "Traceback (most recent call last):\n"
        '  File "run.py", line 1\n'
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
    )
    log = io.StringIO()
    supervise._relay(io.StringIO(text), log)
    assert log.getvalue() == text  # everything is kept in the log
    assert capsys.readouterr().err == text.splitlines(keepends=True)[0]  # only the warning


def test_verdict_names_a_rank_killed_before_it_wrote_a_record(tmp_path):
    """Killed while importing: no record at all; the launcher's log (torch >= 2.4 format)
    still tells the stopped bystanders from the rank that died."""
    head = "W1125 06:42:36.301000 18280 torch/distributed/elastic/multiprocessing/api.py:1028]"
    log = "".join(f"{head} Sending process {p} closing signal SIGTERM\n" for p in (50, 51, 53))
    log += ("E1125 06:42:36.392000 18280 torch/distributed/elastic/multiprocessing/api.py:1002] "
            "failed (exitcode: -9) local_rank: 2 (pid: 52) of binary: python\n")  # fmt: skip
    log += "".join(f"  rank      : {r} (local_rank: {r})\n  exitcode  : -15 (pid: {50 + r})\n"
                   for r in (0, 1, 3))  # fmt: skip
    (tmp_path / "launcher.log").write_text(log)
    out = supervise.verdict(str(tmp_path), 4, 1)
    assert (out.code, out.rank) == (1, 2) and "was killed by SIGKILL" in out.message
