"""Slow distributed tests (``make test-dist``): 4 processes, real graphs, GCN and SAGE, faults
and resume. Each compares against a single process or checks a bounded failure."""

import json
import os
import time

import pytest
import torch

from ..conftest import SHARED_DATA
from ..proc import group as proc_group
from ..proc import run as run_cmd
from .test_distributed import ROOT, dgl_rsc, losses, torchrun, write_config

pytestmark = pytest.mark.slow

CORA = os.path.join(SHARED_DATA, "cora.npz")


def graphs():
    out = [pytest.param({"name": "synthetic", "num_nodes": 800, "avg_degree": 10.0,
                         "num_classes": 4, "feat_dim": 16, "seed": 2}, id="synthetic")]  # fmt: skip
    if os.path.exists(CORA):
        out.append(pytest.param({"name": "npz", "path": CORA, "normalize_features": True},
                                id="cora"))  # fmt: skip
    return out


@pytest.mark.parametrize("nproc", [2, 4])
@pytest.mark.parametrize("model", ["gcn", "sage"])
@pytest.mark.parametrize("dataset", graphs())
def test_distributed_equals_single_process(tmp_path, dataset, model, nproc):
    if dataset["name"] == "npz" and not os.path.exists(dataset["path"]):
        pytest.skip(f"{dataset['path']} is not here (the shared data folder)")
    cfg = write_config(tmp_path, dataset=dataset, model={"name": model},
                       train={"epochs": 5})  # fmt: skip
    one, many = tmp_path / "one", tmp_path / "many"
    assert dgl_rsc(cfg, "--out", str(one)).returncode == 0
    proc = dgl_rsc(cfg, "--out", str(many), "--nproc", str(nproc), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, _ = losses(one)
    b, _ = losses(many)
    for method in ("exact", "rsc"):  # RSC at budget 1.0 is exact
        torch.testing.assert_close(b[method], a[method], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("how", ["raise", "die"])
def test_a_failing_worker_stops_the_others_in_bounded_time(how):
    start = time.monotonic()
    proc = torchrun(2, str(ROOT / "tests" / "workers" / "worker_fault.py"), how, timeout=180)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0 and elapsed < 120
    text = proc.stdout + proc.stderr
    assert "rank: 1" in text or "local_rank: 1" in text  # the launcher names the rank
    if how == "raise":
        assert "rank 1 fails on purpose" in text


def test_resumed_distributed_run_equals_an_uninterrupted_one(tmp_path):
    cfg = write_config(tmp_path, rsc={"budget": 0.3}, train={"epochs": 8, "checkpoint_every": 2})
    crashed, clean = tmp_path / "crashed", tmp_path / "clean"
    script = str(ROOT / "tests" / "workers" / "worker_interrupt.py")
    args = ["run", cfg, "--out", str(crashed), "--no-progress", "--set",
            "distributed.partitions=2"]  # fmt: skip
    proc = torchrun(2, script, "rsc-seed0", "5", "--", *args, timeout=600)
    assert proc.returncode != 0  # interrupted
    assert (crashed / "checkpoints" / "rsc-seed0.rank0.pt").exists()
    assert (crashed / "checkpoints" / "rsc-seed0.rank1.pt").exists()
    assert not (crashed / "results.json").exists()
    proc = dgl_rsc(cfg, "--resume", str(crashed), "--nproc", "2", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = dgl_rsc(cfg, "--out", str(clean), "--nproc", "2", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a = json.loads((crashed / "results.json").read_text())["runs"]
    b = json.loads((clean / "results.json").read_text())["runs"]
    for ra, rb in zip(a, b):
        la = torch.tensor([h["loss"] for h in ra["history"]])
        lb = torch.tensor([h["loss"] for h in rb["history"]])
        torch.testing.assert_close(la, lb, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bits", [8, 4, 2, "adaptive"])
def test_quantized_halo_messages_train_and_send_fewer_bytes(tmp_path, bits):
    cfg = write_config(tmp_path, rsc={"budget": 0.3}, train={"epochs": 6})
    base, quant = tmp_path / "fp32", tmp_path / f"q{bits}"
    assert dgl_rsc(cfg, "--out", str(base), "--nproc", "2").returncode == 0
    proc = dgl_rsc(cfg, "--out", str(quant), "--nproc", "2", "--set",
                   f"distributed.forward_bits={bits}", "--set",
                   f"distributed.backward_bits={bits}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, a = losses(base)
    b_losses, b = losses(quant)
    assert all(bool(torch.isfinite(v).all()) for v in b_losses.values())

    def fwd(runs):
        return sum(r["forward_halo"]["sent"] for run in runs for h in run["history"]
                   for r in h["dist"]["bytes"])  # fmt: skip

    assert fwd(b) < 0.6 * fwd(a)
    report = b[0]["distributed"]["forward_bits"]
    assert report["histogram"] and report["error"] is not None and report["error"] < 1.0


def test_the_api_example_trains(tmp_path):
    """tools/dist_example.py (the README's distributed API walk-through) runs on 2 ranks:
    the approximate phase, then the switch to exact, and the loss goes down."""
    proc = torchrun(2, str(ROOT / "tools" / "dist_example.py"), "--epochs", "10",
                    "--nodes", "1200", "--partitions", str(tmp_path / "parts"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [x.split() for x in proc.stdout.splitlines() if x.startswith("epoch")]
    assert len(lines) == 10  # rank 0 alone prints
    loss = [float(x[3]) for x in lines]
    phases = [x[5] for x in lines]
    assert "approx" in phases and phases[-1] == "exact" and loss[-1] < loss[0]
    assert any(name.endswith(".npz") for name in os.listdir(tmp_path / "parts"))  # cached


# -- issue 23: distributed errors read like single-process ones, checkpoint sets ------------
def _workers(nproc: int) -> dict:
    """``{rank: pid}`` of the running ``dgl-rsc --nproc`` workers (Linux ``/proc``)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if (
            b"DGL_RSC_STATUS_DIR" in env
            and b"RANK" in env
            and b"torch.distributed.run" not in (cmdline)
        ):
            found[int(env[b"RANK"])] = int(pid)
    return found


@pytest.mark.parametrize("nproc, victim", [(2, 1), (4, 2), (4, 0)])
def test_a_killed_worker_is_named_not_a_bystander(tmp_path, nproc, victim):
    import signal
    import sys

    from .test_distributed import ENV

    cfg = write_config(tmp_path, train={"epochs": 2000, "checkpoint_every": 1})
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "dgl_rsc", "run", cfg, "--out", str(out), "--no-progress",
           "--nproc", str(nproc)]  # fmt: skip
    with proc_group(cmd, env=ENV) as proc:  # the launcher and every worker end with the test
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # every worker up and training
            workers = _workers(nproc)
            if len(workers) == nproc and (out / "checkpoints").is_dir():
                break
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        os.kill(workers[victim], signal.SIGKILL)
        start = time.monotonic()
        _, err = proc.communicate(timeout=240)
    assert time.monotonic() - start < 60
    assert proc.returncode == 1
    lines = err.strip().splitlines()
    assert "Traceback" not in err and "ChildFailedError" not in err
    assert lines[-1].startswith("python -m dgl_rsc run: error: rank %d was killed by SIGKILL"
                                % victim), err[-2000:]  # fmt: skip


def test_a_crash_in_a_worker_names_the_rank_and_the_log(tmp_path):
    import sys

    from .test_distributed import ENV

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(  # a bug in rank 1's optimizer step
        "import os\nif os.environ.get('RANK') == '1':\n"
        "    import torch\n    def step(self, *a, **k):\n"
        "        raise ZeroDivisionError('a bug on purpose')\n"
        "    torch.optim.Adam.step = step\n"
    )  # fmt: skip
    cfg = write_config(tmp_path)
    env = {**ENV, "PYTHONPATH": f"{hook}{os.pathsep}{ROOT}"}
    cmd = [sys.executable, "-m", "dgl_rsc", "run", cfg, "--out", str(tmp_path / "out"),
           "--no-progress", "--nproc", "2"]  # fmt: skip
    proc = run_cmd(cmd, env=env, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "ChildFailedError" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "rank 1 crashed (ZeroDivisionError: a bug on purpose)" in line
    log = line.rsplit(" ", 1)[-1]
    assert log.endswith("rank1.log") and "ZeroDivisionError" in open(log).read()


def _set_of_two(tmp_path, name):
    """A finished 2-rank run whose rsc run is made unfinished again (its record removed):
    its checkpoints (epoch 4 on both ranks) are a set to resume from."""
    cfg = write_config(tmp_path, rsc={"budget": 0.5}, train={"epochs": 4, "checkpoint_every": 2})
    out = tmp_path / name
    proc = dgl_rsc(cfg, "--out", str(out), "--nproc", "2", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    os.remove(out / "runs" / "rsc-seed0.json")
    return cfg, out


def test_resume_verifies_every_ranks_checkpoint_before_training(tmp_path):
    cfg, out = _set_of_two(tmp_path, "base")
    ck = out / "checkpoints"
    cases = {}
    import shutil

    for name in ("missing", "swapped", "single", "epochs", "other_run"):
        shutil.copytree(out, tmp_path / name)
        cases[name] = tmp_path / name / "checkpoints"
    os.remove(cases["missing"] / "rsc-seed0.rank1.pt")  # and its previous one: nothing to
    os.remove(cases["missing"] / "rsc-seed0.rank1.prev.pt")  # go back to
    a, b = cases["swapped"] / "rsc-seed0.rank0.pt", cases["swapped"] / "rsc-seed0.rank1.pt"
    a.rename(tmp_path / "tmp.pt")
    b.rename(a)
    (tmp_path / "tmp.pt").rename(b)
    one = write_config(tmp_path, rsc={"budget": 0.5}, train={"epochs": 4, "checkpoint_every": 2},
                       distributed=None)  # fmt: skip
    assert dgl_rsc(one, "--out", str(tmp_path / "one")).returncode == 0
    for r in (0, 1):
        shutil.copy(tmp_path / "one" / "checkpoints" / "rsc-seed0.pt",
                    cases["single"] / f"rsc-seed0.rank{r}.pt")  # fmt: skip
    state = torch.load(ck / "rsc-seed0.rank1.pt", weights_only=True)
    state["epoch"] = 2
    torch.save(state, cases["epochs"] / "rsc-seed0.rank1.pt")
    for r in (0, 1):  # without the previous files there is no epoch to go back to
        os.remove(cases["epochs"] / f"rsc-seed0.rank{r}.prev.pt")
    (tmp_path / "other_run" / "run.json").write_text('{"run_id": "0123456789abcdef"}')
    words = {
        "missing": "are not a complete set: rank(s) [1] have none",
        "swapped": "for rank 0 of 2 processes was written by rank 1 of 2 processes",
        "single": "was written by one process",
        "epochs": "are from different epochs (rank 0: 4, rank 1: 2)",
        "other_run": "were written by another run",
    }
    for name, text in words.items():
        proc = dgl_rsc(cfg, "--resume", str(tmp_path / name), "--nproc", "2", timeout=600)
        assert proc.returncode == 2, (name, proc.stderr[-3000:])
        assert proc.stderr.count(text) == 1, (name, proc.stderr[-3000:])
        assert "Traceback" not in proc.stderr
        assert not (tmp_path / name / "runs" / "rsc-seed0.json").exists()  # nothing trained
    proc = dgl_rsc(cfg, "--resume", str(out), "--nproc", "2", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_set_stopped_during_a_save_resumes_from_the_newest_common_epoch(tmp_path):
    """Rank 1 stopped before its save of the last epoch (rank 0 had saved it): the resume
    goes back to the epoch both ranks hold and trains the same epochs again."""
    cfg, out = _set_of_two(tmp_path, "base")
    ck = out / "checkpoints"
    assert torch.load(ck / "rsc-seed0.rank1.prev.pt", weights_only=True)["epoch"] == 2
    full = torch.load(ck / "rsc-seed0.rank0.pt", weights_only=True)["extra"]["history"]
    os.replace(ck / "rsc-seed0.rank1.prev.pt", ck / "rsc-seed0.rank1.pt")  # rank 1 at epoch 2
    proc = dgl_rsc(cfg, "--resume", str(out), "--nproc", "2", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "saved at different epochs (rank 0: 4, rank 1: 2)" in proc.stderr
    assert "every rank resumes from epoch 2" in proc.stderr
    rec = json.loads((out / "runs" / "rsc-seed0.json").read_text())
    assert [h["epoch"] for h in rec["history"]] == [1, 2, 3, 4]
    again = [h["loss"] for h in rec["history"][2:]]  # epochs 3 and 4, trained twice
    assert again == pytest.approx([h["loss"] for h in full[2:]], rel=1e-5)


def test_ctrl_c_of_a_distributed_run_prints_a_continue_command_that_works(tmp_path):
    import shlex
    import signal
    import sys

    from .test_distributed import ENV

    cfg = write_config(tmp_path, train={"epochs": 60, "checkpoint_every": 1})
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "dgl_rsc", "run", cfg, "--out", str(out), "--no-progress",
           "--nproc", "2"]  # fmt: skip
    with proc_group(cmd, env=ENV) as proc:
        deadline = time.monotonic() + 240
        while not list((out / "checkpoints").glob("exact-seed0.rank1.pt")):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        _, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, err[-3000:]
    line = [ln for ln in err.splitlines() if "continue with:" in ln][-1]
    words = shlex.split(line.split("continue with:", 1)[1])
    assert words[words.index("--nproc") + 1] == "2" and words[words.index("--resume") + 1] == str(
        out
    )
    words = [*words[3:]]  # drop "python -m dgl_rsc": run it with this interpreter
    cont = run_cmd([sys.executable, "-m", "dgl_rsc", *words], env=ENV, timeout=900)
    assert cont.returncode == 0, cont.stderr[-3000:]
    assert (out / "results.json").exists()
