"""Models and engines: the GCN, GraphSAGE and GCNII of the paper's runs (:mod:`.paper`), built
through ``MODELS``, and which convolutions run on which graph (:mod:`.engines`).

``from dgl_rsc.models import build_model`` is the public path.
"""

from .paper import *  # noqa: F403
from .paper import __all__  # noqa: F401
