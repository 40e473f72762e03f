"""What every other part of the package stands on and nothing of its own: the optional
dependency probe (``_deps``), the nearest-name helper, atomic writes, the cache format and
warnings that point at the user's line. Imports nothing from the rest of ``dgl_rsc``."""
