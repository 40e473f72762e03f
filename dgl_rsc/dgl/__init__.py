"""The DGL front end: the global patch (:mod:`.patch`), the drop-in convolutions (:mod:`.nn`,
public as ``dgl_rsc.nn``), conversions from DGL graphs (:mod:`.interop`), DGL's own CPU kernel
as an exact engine (:mod:`.kernels`) and every private DGL call behind one version gate
(:mod:`.private`). DGL itself is imported lazily; this ``__init__`` imports nothing."""
