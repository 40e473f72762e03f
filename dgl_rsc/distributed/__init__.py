"""Partition-parallel full-graph training on ``torch.distributed`` (halo exchange, quantized
messages, RSC's sparse backward messages).

Modules are imported on use; importing this package imports none of them.
"""

__all__: list = []
