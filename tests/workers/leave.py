"""How a test worker ends: output flushed, then ``os._exit``, so that no C++ destructor runs
at interpreter teardown (gloo's threads torn down there have aborted finished workers:
``terminate called without an active exception``; destroying the process group first can
block on a peer that has already left)."""

import os
import sys


def leave(code: int = 0) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
