"""``dgl_rsc.nn``: the drop-in approximate graph convolutions with DGL's signatures.

The public path of :mod:`dgl_rsc.dgl.nn` (the layers live with the rest of the DGL front end);
see there for the layers, :func:`convert` and :func:`attach`.
"""

from ..dgl.nn import *  # noqa: F403
from ..dgl.nn import __all__  # noqa: F401
