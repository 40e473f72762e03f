"""The guide's multi-host and SLURM launches stay runnable: every ``torchrun`` line of
docs/guide/distributed.md parses with torch's own launcher and its worker command with
``dgl-rsc`` (the config loads), and the sbatch script is valid bash."""

import re
import shlex
import subprocess
from pathlib import Path

from dgl_rsc.launcher.cli import _sets, build_parser, load_config

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guide" / "distributed.md"


def _blocks():
    return re.findall(r"```bash\n(.*?)```", GUIDE.read_text(), re.S)


def _torchrun_lines():
    for block in _blocks():
        for line in block.splitlines():
            line = line.strip()
            if line.startswith(("torchrun ", "srun torchrun ")) and "-m dgl_rsc" in line:
                yield line.removeprefix("srun ")


def test_every_torchrun_line_parses_and_its_config_loads():
    from torch.distributed.run import get_args_parser

    lines = list(_torchrun_lines())
    assert len(lines) >= 3  # two hosts and the SLURM script
    env = {"SLURM_NNODES": "2", "SLURM_NODEID": "1", "NPROC": "4", "MASTER_ADDR": "n0",
           "SLURM_JOB_ID": "7"}  # fmt: skip
    for line in lines:
        words = shlex.split(re.sub(r"\$\(\((.*?)\)\)", "8", line))
        words = [re.sub(r"\$\{?(\w+)\}?", lambda m: env[m.group(1)], w) for w in words]
        args = get_args_parser().parse_args(words[1:])
        assert args.nnodes == "2" and args.module and args.training_script == "dgl_rsc"
        worker = build_parser().parse_args(args.training_script_args)
        cfg = load_config(str(ROOT / worker.config), _sets(worker))
        assert cfg.distributed is not None and cfg.distributed.partitions == 8


def test_the_sbatch_script_is_valid_bash():
    script = next(b for b in _blocks() if "#SBATCH" in b)
    assert "scontrol show hostnames" in script and "srun torchrun" in script
    done = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert done.returncode == 0, done.stderr
