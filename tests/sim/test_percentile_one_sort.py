"""`metrics.summary` sorts once for all its percentiles and keeps zero weights in place (for
memory at millions of TBT samples): the same values as the definition written out plainly,
drop zero weights, sort, the first value whose cumulative weight reaches q% of the total."""

from __future__ import annotations

import numpy as np

from capplan.sim.metrics import summary, weighted_percentile


def _plain(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    keep = weights > 0
    v, w = values[keep], weights[keep]
    if not len(v):
        return float("nan")
    order = np.argsort(v, kind="stable")
    cw = np.cumsum(w[order])
    i = int(np.searchsorted(cw, q / 100.0 * cw[-1] * (1 - 1e-12), side="left"))
    return float(v[order][min(i, len(v) - 1)])


def _same(a: float, b: float) -> bool:
    return a == b or (np.isnan(a) and np.isnan(b))


def test_matches_plain_definition_with_ties_nans_and_zero_weights():
    rng = np.random.default_rng(0)
    for case in range(600):
        n = int(rng.integers(0, 25))
        v = (rng.choice([0.1, 0.2, 0.3, np.nan, 1.0], n) if case % 3 == 0 else rng.random(n))
        w = rng.integers(0, 4, n).astype(float) * (rng.random(n) if case % 5 == 0 else 1.0)
        for q in (0, 1, 50, 90, 99, 100):
            assert _same(weighted_percentile(v, w, q), _plain(v, w, q)), (v, w, q)
        s = summary(v)
        for q in (50, 90, 99):
            assert _same(s[f"p{q}"], _plain(v, np.ones(n), q))
