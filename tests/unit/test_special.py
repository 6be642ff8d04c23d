"""capplan.models.queueing.special against scipy.special (a test dependency), to 1e-12 relative
over the ranges the queueing laws use and beyond: the normal cdf of the compound chunk sums,
the normal quantiles of the strata, log-factorials, and the Poisson cdf Q(c + 1, a) of Erlang C
(c + 1 from 2 to ~1,000 slots and a / c from 0.1 to 1.04 in `recommend`; tested to 5,000 and
from 0.02 to 3)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special, stats

from capplan.models.queueing import special as own

REL = 1e-12


def _rel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a - b) / np.maximum(np.abs(b), 1e-300)


def test_ndtr_equals_scipy():
    rng = np.random.default_rng(0)
    z = np.concatenate([np.linspace(-45, 45, 90_001), rng.normal(0, 3, 20_000),
                        [-37.7, -37.6, -1.0, 0.0, 1.0, 1 / math.sqrt(2), 8.4999, 8.5, 11.32]])
    got, want = own.ndtr(z), special.ndtr(z)
    assert _rel(got, want).max() < REL
    np.testing.assert_array_equal(got == 0, want == 0)  # the same underflow
    np.testing.assert_array_equal(got == 1, want == 1)  # the same rounding to 1
    assert own.ndtr(np.zeros((3, 0))).shape == (3, 0)
    assert own.ndtr(0.0) == 0.5


def test_normal_quantiles_equal_scipy():
    p = np.concatenate([np.linspace(1e-6, 1 - 1e-6, 2001), [0.0005, 0.003, 0.9995]])
    got, want = own.normal_quantiles(p), special.ndtri(p)
    assert (np.abs(got - want) <= REL * np.maximum(np.abs(want), 1e-3)).all()


def test_log_factorial_equals_scipy():
    n = np.arange(0, 5001.0)
    assert (np.abs(own.log_factorial(n) - special.gammaln(n + 1))
            <= REL * np.maximum(special.gammaln(n + 1), 1.0)).all()
    assert own.log_factorial(np.arange(2, 8.0)).tolist() == pytest.approx(
        [math.log(math.factorial(k)) for k in range(2, 8)], rel=1e-15)


def _grid(size: int, c_max: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    c = np.floor(rng.uniform(1, c_max, size))
    a = c * np.exp(rng.uniform(math.log(0.02), math.log(3.0), size))
    return c, a


def test_poisson_cdf_equals_scipy_gammaincc():
    c, a = _grid(20_000, 5000)
    c = np.concatenate([c, [1, 1, 15, 16, 1000, 1000, 1000, 1024]])
    a = np.concatenate([a, [0.5, 3.0, 15.5, 16.0, 999.0, 1000.0, 1001.0, 1025.0]])
    want = special.gammaincc(c + 1, a)
    # scipy's own error grows in the far tails (1e-11 at 1e-82, where this function is 7e-14
    # from mpmath's 40 digits); Erlang C reads Q where a < c, Q > 1/2
    keep = want > 1e-20
    assert keep.sum() > 12_000
    assert _rel(own.poisson_cdf(c, a), want)[keep].max() < REL


def test_poisson_cdf_by_hand():
    # P(N <= 2) for N ~ Poisson(1): e^-1 (1 + 1 + 1/2); P(N <= 0) = e^-a
    assert own.poisson_cdf(2.0, 1.0) == pytest.approx(2.5 / math.e, rel=1e-15)
    assert own.poisson_cdf(0.0, 3.0) == pytest.approx(math.exp(-3.0), rel=1e-15)


def test_poisson_pmf_equals_scipy():
    c, a = _grid(20_000, 300)  # where scipy's c log a - a - log c! has no large cancellation
    want = stats.poisson.pmf(c, a)
    keep = want > 1e-100
    assert _rel(own.poisson_pmf(c, a), want)[keep].max() < 1e-12
    assert own.poisson_pmf(0.0, 2.0) == pytest.approx(math.exp(-2.0), rel=1e-15)


def test_poisson_pmf_of_small_counts_equals_scipy():
    # the queueing laws' tables (counts up to SMALL_COUNT, means from 0 to a few hundred),
    # computed as c log a - a - log c! with log a taken before broadcasting
    c = np.arange(int(own.SMALL_COUNT) + 1, dtype=float)[:, None]
    a = np.concatenate([[0.0, 1e-9, 1e-3], np.geomspace(0.01, 400.0, 300)])[None, :]
    got = own.poisson_pmf(c, a)
    want = stats.poisson.pmf(c, a)
    keep = want > 1e-100
    assert _rel(got, want)[keep].max() < 1e-12
    assert np.all(got[~keep] < 1e-99)
    assert got[0, 0] == 1.0 and np.all(got[1:, 0] == 0.0)  # a = 0: no arrivals


def test_a_recommendation_imports_no_scipy():
    """The queueing laws answer without scipy (its import alone was ~0.3-0.4 s of CPU)."""
    import subprocess
    import sys

    code = ("import sys\nfrom capplan.cli import cli\n"
            "try:\n    cli.main(args=sys.argv[1:], prog_name='capplan')\n"
            "except SystemExit:\n    pass\n"
            "sys.stderr.write('SCIPY=%s' % any(m.startswith('scipy') for m in sys.modules))")
    args = ["recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "10",
            "--input-len", "lognormal:mean=800,p99=3000", "--output-len", "200",
            "--ttft-p99", "1", "--tbt-p99", "0.06", "--verify-top", "0", "--format", "json"]
    res = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         timeout=300)
    assert "SCIPY=False" in res.stderr, res.stderr[-2000:]


def test_poisson_mixture_pmf_is_the_weighted_sum_of_its_strata():
    rng = np.random.default_rng(3)
    a = np.concatenate([[0.0], rng.uniform(0.0, 80.0, 40), [500.0, 7e4]])
    w = rng.dirichlet(np.ones(a.size))
    got = own.poisson_mixture_pmf(64, a[None, :], w[None, :])[0]
    want = (stats.poisson.pmf(np.arange(65)[:, None], a[None, :]) * w).sum(-1)
    assert _rel(got, want)[want > 1e-100].max() < 1e-12
    assert got.shape == (65,)
