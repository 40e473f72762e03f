"""A distributed launcher run that every rank interrupts after epoch K of run RUN (as Ctrl-C
would), for the resume test. Usage: worker_interrupt.py RUN EPOCH -- dgl-rsc run arguments"""

import sys

from dgl_rsc.launcher.cli import main

run, epoch = sys.argv[1], int(sys.argv[2])
args = sys.argv[sys.argv.index("--") + 1 :]


def stop(name, done):
    if (name, done) == (run, epoch):
        raise KeyboardInterrupt


sys.exit(main(args, prog="dgl-rsc", on_epoch_end=stop))
