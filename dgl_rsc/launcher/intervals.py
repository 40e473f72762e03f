"""Intervals over seeds for the report's figures: a t-interval of a mean (test metrics, paired
gaps) and a bootstrap interval of a ratio of times (time to accuracy against a baseline).

Both take one value (or pair) per seed. With 3 seeds a 95% interval is wide; it is stated
beside the figure so that two figures are compared with their spread, not by their means.

>>> mean, half = t_interval([1.0, 2.0, 3.0])
>>> round(mean, 3), round(half, 3)
(2.0, 2.484)
>>> bootstrap_ratio([(2.0, 1.0), (4.0, 2.0)])
(2.0, 2.0, 2.0)
"""

from __future__ import annotations

import math
import random
from typing import Optional, Sequence

__all__ = ["t_interval", "bootstrap_ratio", "ratio_interval"]

#: two-sided 95% quantiles of Student's t by degrees of freedom (n - 1)
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262}  # fmt: skip


def t_interval(values: Sequence[float]) -> tuple:
    """``(mean, half-width)`` of the 95% t-interval of ``values`` (half-width ``None`` for
    fewer than two values; the normal quantile from 11 values on)."""
    n = len(values)
    if n == 0:
        raise ValueError("t_interval needs at least one value.")
    mean = sum(values) / n
    if n < 2:
        return mean, None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, _T95.get(n - 1, 1.96) * sd / math.sqrt(n)


def bootstrap_ratio(pairs: Sequence[tuple], draws: int = 4000, seed: int = 0) -> tuple:
    """``(ratio, low, high)``: the sum of the first members of ``pairs`` over the sum of the
    second (one ``(baseline_s, method_s)`` per seed: the baseline's time over the method's),
    with the 2.5 and 97.5 percentiles of that ratio over the seeds resampled with
    replacement (``draws`` resamples from ``random.Random(seed)``: the same pairs give the
    same interval)."""
    if not pairs or any(b <= 0 or m <= 0 for b, m in pairs):
        raise ValueError(f"bootstrap_ratio needs positive (baseline, method) times, got {pairs}.")
    ratio = sum(b for b, _ in pairs) / sum(m for _, m in pairs)
    rng = random.Random(seed)
    boot = []
    for _ in range(draws):
        pick = [rng.choice(pairs) for _ in pairs]
        boot.append(sum(b for b, _ in pick) / sum(m for _, m in pick))
    boot.sort()
    return ratio, boot[int(0.025 * draws)], boot[int(0.975 * draws) - 1]


def ratio_interval(pairs: Sequence[tuple]) -> Optional[list]:
    """``[low, high]`` of :func:`bootstrap_ratio` from two seeds on, else ``None``."""
    if len(pairs) < 2:
        return None
    _, low, high = bootstrap_ratio(pairs)
    return [low, high]
