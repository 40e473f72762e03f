"""The rows of the distributed solve test: two layers' scores and non-zeros per rank."""

import torch

WIDTHS = (64, 16)


def rank_rows(rank: int, layer: int) -> tuple:
    """``(scores (M_r,), row_nnz (M_r,))`` of ``rank``'s rows of ``layer``."""
    g = torch.Generator().manual_seed(100 * layer + rank)
    m = 150 + 40 * rank + 7 * layer
    scores = torch.rand(m, generator=g).pow(3)
    scores[torch.rand(m, generator=g) < 0.1] = 0.0
    return scores, torch.randint(1, 30, (m,), generator=g)


def fill_layers(ctl, ranks: list) -> None:
    """Give ``ctl`` two layers holding the rows of ``ranks`` (concatenated in rank order)."""
    for layer, width in enumerate(WIDTHS):
        parts = [rank_rows(r, layer) for r in ranks]
        s = ctl.layer(layer)
        s.ema = torch.cat([p[0] for p in parts])
        s.row_nnz = torch.cat([p[1] for p in parts])
        s.generation, s.stats.width = 1, width
