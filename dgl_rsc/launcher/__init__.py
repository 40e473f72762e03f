"""The ``dgl-rsc`` launcher: YAML config -> full-graph training runs (exact and/or RSC) ->
results.json, metrics.csv, summary.png and a table.

Modules: :mod:`.schema` (validation), :mod:`.train` (the runs), :mod:`.checkpoint`,
:mod:`.report`, :mod:`.cli`. Importing this package imports none of them (and no DGL).
"""

__all__ = ["main"]


def main(argv=None, prog=None) -> int:
    """Run the command line (see :func:`dgl_rsc.launcher.cli.main`)."""
    from .cli import main as _main

    return _main(argv, prog)
