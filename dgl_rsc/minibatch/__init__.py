"""Mini-batch (subgraph) training: Cluster-GCN and GraphSAINT samplers for both engines.

Modules are imported on use; importing this package imports none of them.
"""

__all__: list = []
