"""Models and engines: the GCN, GraphSAGE and GCNII of the paper's runs (:mod:`.paper`), built
through ``MODELS``, and which convolutions run on which graph (:mod:`.engines`).

``from dgl_rsc.models import build_model`` is the public path.
"""

from .paper import GCN, GCNII, MODELS, SAGE, ResGCN, build_model, model_params

__all__ = ["GCN", "SAGE", "GCNII", "ResGCN", "MODELS", "build_model", "model_params"]
