"""A torch.distributed worker for tests/distributed/test_bitwidth.py: every rank runs the alpha-beta
calibration over gloo and writes the model it got (``alpha beta``) to OUT_DIR/rank<r>.txt.

Usage (through torch's launcher): worker_calibrate.py OUT_DIR
"""

import os
import sys

import torch
import torch.distributed as dist
from leave import leave

from dgl_rsc.distributed import calibrate
from dgl_rsc.distributed.runtime import init_from_env

out_dir = sys.argv[1]
torch.set_num_threads(1)
ctx = init_from_env("gloo", "cpu", 60)
# sizes up to 32 MB: the slope stands out of the noise of a busy machine
model = calibrate.calibrate(sizes=(1 << 10, 1 << 23, 1 << 25), repeats=5, timeout=60)
with open(os.path.join(out_dir, f"rank{ctx.rank}.txt"), "w") as f:
    f.write(f"{model.alpha!r} {model.beta!r}")
dist.barrier()  # no rank leaves while another still talks to it
leave()
