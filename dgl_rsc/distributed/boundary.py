"""The forward boundary sample (BNS-GCN style): a rank sends only some of the boundary rows a
peer needs, scaled so the aggregation stays unbiased, and the backward follows the same set.

For one message of ``n`` boundary rows at rate ``p``, ``k = max(1, round(p n))`` rows are drawn
uniformly without replacement and sent times ``n / k``; the receiver's halo block holds those
rows and zeros elsewhere. Each row travels with probability ``k / n``, so ``E[halo] = X_halo``
and the forward product ``A_local [X_own; halo]`` is unbiased. Its gradient with respect to
the owner's rows is ``n / k`` times the halo gradient on the sampled rows and 0 on the others:
the backward sends nothing for a row the forward left out (:class:`ForwardSample`, kept by
the autograd function for its backward).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

__all__ = ["ForwardSample", "boundary_rows", "boundary_count"]


def boundary_count(n: int, rate: float) -> int:
    """Rows sent of a message of ``n`` rows at ``rate`` (``n`` itself at rate 1 or above).

    >>> boundary_count(10, 0.25), boundary_count(3, 0.01), boundary_count(7, 1.0)
    (2, 1, 7)
    """
    if rate >= 1.0 or n == 0:
        return n
    return min(max(1, int(round(rate * n))), n)


def boundary_rows(n: int, k: int, generator: Optional[torch.Generator] = None,
                  device=None) -> torch.Tensor:  # fmt: skip
    """``(k,)`` ascending ``int64`` positions among ``n`` rows, uniform without replacement."""
    if k >= n:
        return torch.arange(n, device=device)
    keys = torch.rand(n, generator=generator, device=generator.device if generator else device)
    return torch.sort(torch.topk(keys, k).indices).values.to(device)


@dataclasses.dataclass
class ForwardSample:
    """The boundary sample of one training forward exchange, for its backward.

    Attributes:
        layer: the exchange's slot (the n-th training forward exchange of a step).
        picked: ``{peer: (rows (k,) int64 positions in the halo block of that peer, n / k)}``
            for every peer whose block was sampled; a block not listed arrived whole.
    """

    layer: int
    picked: dict

    def restrict(self, peer: int, block: torch.Tensor):
        """``(rows, values)`` of the gradient ``block (n, D)`` of ``peer``'s halo rows that
        the owner receives: the sampled rows times ``n / k``, or ``None`` when the block
        arrived whole."""
        got = self.picked.get(peer)
        if got is None:
            return None
        rows, scale = got
        return rows, block[rows] * scale
