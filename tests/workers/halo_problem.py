"""The random aggregation that the halo-product workers and their tests share: 300 nodes, 2400
random edges, an input, an output gradient and a row scale, drawn from one generator (seed 0).
"""

import torch


def halo_problem(width: int):
    """``(src, dst, n, x (n, width), gy (n, width), row (n,))``."""
    g = torch.Generator().manual_seed(0)
    n = 300
    src = torch.randint(0, n, (2400,), generator=g)
    dst = torch.randint(0, n, (2400,), generator=g)
    x, gy = torch.randn(n, width, generator=g), torch.randn(n, width, generator=g)
    row = torch.rand(n, generator=g) + 0.5
    return src, dst, n, x, gy, row
