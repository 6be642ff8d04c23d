"""Token-length laws and the quantile levels every latency answer reports.

A length distribution enters the queue through its first two moments (means, Little's law,
Pollaczek-Khinchine) and its quantile table (the strata the quantile composition integrates
over, sums.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

QUANTILES = {"p50": 0.50, "p90": 0.90, "p99": 0.99}
Z99 = 2.3263478740408408
"""Standard normal 99th percentile (scipy.stats.norm.ppf(0.99)): the one home of this value."""


@dataclass(frozen=True)
class LengthStats:
    """Moments and quantiles of a token-length distribution."""

    mean: float
    mean_sq: float
    q: dict[str, float]
    table: tuple[float, ...] = ()
    """Quantiles at 0, 0.005, ..., 1 (201 points) for interpolation; empty = fixed length."""

    @classmethod
    def from_samples(cls, x: ArrayLike) -> LengthStats:
        a = np.asarray(x, float)
        # one call for every level (one sort of the sample; the same values as one call each)
        q = np.quantile(a, [*QUANTILES.values(), *np.linspace(0, 1, 201)])
        return cls(float(a.mean()), float((a * a).mean()),
                   {k: float(v) for k, v in zip(QUANTILES, q, strict=False)},
                   tuple(q[len(QUANTILES):].tolist()))

    @classmethod
    def fixed(cls, n: float) -> LengthStats:
        return cls(float(n), float(n) ** 2, {k: float(n) for k in QUANTILES})

    def quantile(self, u: ArrayLike) -> np.ndarray:
        """Length at quantile level(s) u in [0, 1]."""
        if not self.table:
            return np.full(np.shape(u), self.mean)
        return np.interp(np.clip(u, 0.0, 1.0), np.linspace(0, 1, 201), self.table)

    @property
    def var(self) -> float:
        return max(self.mean_sq - self.mean**2, 0.0)

