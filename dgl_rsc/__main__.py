"""``python -m dgl_rsc``: the ``dgl-rsc`` command line.

A worker of ``dgl-rsc run --nproc`` (started by torchrun as ``python -m dgl_rsc``) has
reported how it ended to its parent's status folder when ``main`` returns; it then leaves
with ``os._exit`` after flushing its output, so that no C++ destructor runs at interpreter
teardown (gloo's and the kernels' threads, torn down by static destructors, have aborted a
worker that had already finished and reported success: ``terminate called without an active
exception``, SIGABRT).
"""

import logging
import os
import sys

from .launcher.cli import main
from .launcher.supervise import managed_worker

if __name__ == "__main__":
    code = main(prog="python -m dgl_rsc")
    if managed_worker() is not None:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(code or 0))
    raise SystemExit(code)
