"""Comparing two rankings of the same layouts: Kendall's tau, and each layout's rank."""
from __future__ import annotations

import math
from typing import Sequence


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b of ``x`` and ``y`` (ties counted as ``scipy.stats.kendalltau`` counts them by default);
    NaN with fewer than two pairs untied in both. Written out here because scipy is not among accel-kit's
    dependencies, and over the handful of layouts a tune measures the exact count of pairs is instant."""
    if len(x) != len(y):
        raise ValueError(f"rankings of different lengths: {len(x)} and {len(y)}")
    concordant = discordant = tied_x = tied_y = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            dx, dy = _sign(x[i] - x[j]), _sign(y[i] - y[j])
            if dx == 0 and dy == 0:
                continue  # tied in both: in neither count
            if dx == 0:
                tied_x += 1
            elif dy == 0:
                tied_y += 1
            elif dx == dy:
                concordant += 1
            else:
                discordant += 1
    denominator = math.sqrt((concordant + discordant + tied_x) * (concordant + discordant + tied_y))
    return (concordant - discordant) / denominator if denominator else float("nan")


def _sign(v: float) -> int:
    return (v > 0) - (v < 0)


def ranks(values: Sequence[float]) -> list[int]:
    """Each value's rank, 1 for the largest (ties share the better rank)."""
    return [1 + sum(other > v for other in values) for v in values]
