"""``python -m dgl_rsc``: the ``dgl-rsc`` command line."""

from .launcher.cli import main

if __name__ == "__main__":
    raise SystemExit(main(prog="python -m dgl_rsc"))
