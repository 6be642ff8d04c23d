"""Special functions of the queueing laws, with numpy: the standard normal cdf and quantile,
log-factorials, and the Poisson pmf and cdf (the regularised upper incomplete gamma function
Q(c + 1, a) at an integer shape).

scipy.special has them, but its import (~0.3-0.4 s of CPU: its array-API layer loads numpy.f2py
and numpy.testing) would be a large share of a `recommend` answer. tests/unit/test_special.py
checks each function here against scipy.special to 1e-12 relative over the ranges the laws use
and beyond.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from numpy.typing import ArrayLike

# The standard normal cdf as Cephes computes it (S. L. Moshier, Cephes Math Library, ndtr.c; the
# rational approximations scipy.special.ndtr evaluates): erf(x) = x T(x^2) / U(x^2) for
# |x| <= 1, erfc(x) = exp(-x^2) P(x) / Q(x) for 1 <= x < 8 and exp(-x^2) R(x) / S(x) beyond;
# Q, S and U are monic (their leading 1 is left out here, as in Cephes).
_P = (2.46196981473530512524e-10, 5.64189564831068821977e-1, 7.46321056442269912687e0,
      4.86371970985681366614e1, 1.96520832956077098242e2, 5.26445194995477358631e2,
      9.34528527171957607540e2, 1.02755188689515710272e3, 5.57535335369399327526e2)
_Q = (1.32281951154744992508e1, 8.67072140885989742329e1, 3.54937778887819891062e2,
      9.75708501743205489753e2, 1.82390916687909736289e3, 2.24633760818710981792e3,
      1.65666309194161350182e3, 5.57535340817727675546e2)
_R = (5.64189583547755073984e-1, 1.27536670759978104416e0, 5.01905042251180477414e0,
      6.16021097993053585195e0, 7.40974269950448939160e0, 2.97886665372100240670e0)
_S = (2.26052863220117276590e0, 9.39603524938001434673e0, 1.20489539808096656605e1,
      1.70814450747565897222e1, 9.60896809063285878198e0, 3.36907645100081516050e0)
_T = (9.60497373987051638749e0, 9.00260197203842689217e1, 2.23200534594684319226e3,
      7.00332514112805075473e3, 5.55923013010394962768e4)
_U = (3.35617141647503099647e1, 5.21357949780152679795e2, 4.59432382970980127987e3,
      2.26290000613890934246e4, 4.92673942608635921086e4)
_MAXLOG = 7.09782712893383996843e2
"""log(largest double): exp(-x^2) underflows beyond it (Cephes MAXLOG)."""
_SQRT1_2 = 7.07106781186547524401e-1
_TAIL_TOL = 2.0**-56
"""A Poisson sum stops where the terms left are bounded under this share of it."""


def _poly(x: np.ndarray, coef: tuple[float, ...], monic: bool = False) -> np.ndarray:
    """Horner's rule (Cephes polevl; p1evl where `monic`: a leading 1 not in `coef`)."""
    y = x + coef[0] if monic else np.full_like(x, coef[0])
    for c in coef[1:]:
        y = y * x + c
    return y


def _erf_small(x: np.ndarray) -> np.ndarray:
    """erf(x) for |x| <= 1 (Cephes erf)."""
    z = x * x
    return x * _poly(z, _T) / _poly(z, _U, monic=True)


def _erfc_large(x: np.ndarray) -> np.ndarray:
    """erfc(x) for x >= 1 (Cephes erfc; 0 where exp(-x^2) underflows)."""
    with np.errstate(under="ignore"):
        e = np.exp(-x * x)
    near = x < 8.0
    y = np.where(near, e * _poly(x, _P) / _poly(x, _Q, monic=True),
                 e * _poly(x, _R) / _poly(x, _S, monic=True))
    return np.where(x * x > _MAXLOG, 0.0, y)


def ndtr(a: ArrayLike) -> np.ndarray:
    """Standard normal cdf Phi(a) (Cephes ndtr: 1/2 + erf(a / sqrt 2) / 2 near 0, else
    erfc(|a| / sqrt 2) / 2 or one minus it).

    Where the answer is 0 or 1 to double precision it is set without the rational functions
    (the laws' compound sums put most arguments there): 0 where Cephes' exp(-x^2) underflows
    (x^2 > MAXLOG, x = a / sqrt 2, a < 0), 1 from a = 8.5 on (Phi(-8.5) = 9.5e-18 is under
    half an ulp of 1, 2^-54, so 1 - Phi(-a) rounds to 1)."""
    a = np.asarray(a, float)
    x = a * _SQRT1_2
    out = np.array(a >= 8.5, float)
    rest = (a < 8.5) & (x * x <= _MAXLOG)
    if not np.any(rest):
        return out
    xr = x[rest]
    z = np.abs(xr)
    small = z < 1.0
    y = np.empty(xr.shape)
    if np.any(small):
        xs = xr[small]
        erf = _erf_small(xs)
        # |x| < 1/sqrt 2: 1/2 + erf(x) / 2; up to 1: erfc(|x|) = 1 - erf(|x|) (erf is odd)
        half_erfc = 0.5 * (1.0 - np.abs(erf))
        y[small] = np.where(np.abs(xs) < _SQRT1_2, 0.5 + 0.5 * erf,
                            np.where(xs > 0, 1.0 - half_erfc, half_erfc))
    large = ~small
    if np.any(large):
        half_erfc = 0.5 * _erfc_large(z[large])
        y[large] = np.where(xr[large] > 0, 1.0 - half_erfc, half_erfc)
    out[rest] = y
    return out


def normal_quantiles(p: ArrayLike) -> np.ndarray:
    """Standard normal quantiles at levels p in (0, 1) (Wichura's algorithm AS 241, the
    standard library's NormalDist.inv_cdf, ~1e-16 relative)."""
    from statistics import NormalDist  # ~0.02 s to import; read once per process (sums.py)

    dist = NormalDist()
    flat = np.asarray(p, float)
    return np.asarray([dist.inv_cdf(float(v)) for v in flat.ravel()]).reshape(flat.shape)


@cache
def _log_factorial_table(size: int) -> np.ndarray:
    return np.asarray([math.lgamma(k + 1.0) for k in range(size)])


def log_factorial(n: ArrayLike) -> np.ndarray:
    """log(n!) of non-negative integers n (held as floats): math.lgamma(n + 1), tabulated."""
    n = np.asarray(n)
    size = 16 if n.size == 0 else max(16, 1 << (int(np.max(n)) + 1).bit_length())
    return _log_factorial_table(size)[n.astype(np.int64)]


def _stirling_remainder(c: np.ndarray) -> np.ndarray:
    """log(c!) - (c log c - c + log(2 pi c) / 2) for integers c >= 1: the table below 16, and
    Stirling's series 1/(12c) - 1/(360c^3) + 1/(1260c^5) - 1/(1680c^7) + 1/(1188c^9) above
    (Abramowitz and Stegun 6.1.41; the next term is under 1e-16 at c = 16)."""
    small = np.minimum(c, 15.0)
    direct = (log_factorial(small) - (small * np.log(small) - small
                                      + 0.5 * np.log(2 * math.pi * small)))
    r = 1.0 / np.maximum(c, 16.0)
    r2 = r * r
    series = r * (1 / 12 - r2 * (1 / 360 - r2 * (1 / 1260 - r2 * (1 / 1680 - r2 / 1188))))
    return np.where(c < 16, direct, series)


SMALL_COUNT = 128.0
"""Counts up to which `poisson_pmf` takes log P = c log a - a - log c! as written."""


def poisson_pmf(c: ArrayLike, a: ArrayLike) -> np.ndarray:
    """P(N = c) for N ~ Poisson(a), integers c >= 0 (held as floats), a > 0.

    log P = c log a - a - log c!. Up to c = SMALL_COUNT it is computed so (log a once per a,
    before broadcasting over c: the queueing laws ask for whole tables of counts); above, as
    c (log1p(x) - x) - log(2 pi c) / 2 - s(c) with x = (a - c) / c and s Stirling's
    remainder, so that no large terms cancel (c ~ 1000)."""
    c = np.asarray(c, float)
    a = np.asarray(a, float)
    if c.size and float(np.max(c)) <= SMALL_COUNT:
        # the terms are at most ~SMALL_COUNT x log a: cancellation costs under 1e-13 relative
        with np.errstate(under="ignore", divide="ignore"):
            log_a = np.where(a > 0, np.log(a), -1e4)  # a = 0: exactly 0 for c >= 1
            return np.exp(c * log_a - a - log_factorial(c))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        c1 = np.maximum(c, 1.0)
        x = (a - c1) / c1
        log_p = c1 * (np.log1p(x) - x) - 0.5 * np.log(2 * math.pi * c1) - _stirling_remainder(c1)
        return np.where(c == 0, np.exp(-a), np.exp(log_p))


def poisson_mixture_pmf(n_max: int, a: ArrayLike, w: ArrayLike) -> np.ndarray:
    """sum over s of w_s P(N = n | N ~ Poisson(a_s)), n = 0..n_max (n_max <= SMALL_COUNT), the
    mixture's strata s on the last axis of `a` and `w`; the counts on the result's last axis.

    Term by term: w_s e^(-a_s) a_s^n / n! is the previous count's term times a_s / n, summed
    over the strata at each n, so no table of every (count, stratum) is formed (the
    prefill-first TBT law's would hold tens of millions). Means are capped at 6e4, where no
    count up to SMALL_COUNT keeps a probability above 1e-300 and the terms stay finite."""
    a, w = np.broadcast_arrays(np.minimum(np.asarray(a, float), 6e4), np.asarray(w, float))
    out = np.empty(a.shape[:-1] + (int(n_max) + 1,))
    with np.errstate(under="ignore"):
        term = w * np.exp(-a)
        out[..., 0] = term.sum(-1)
        for n in range(1, int(n_max) + 1):
            term *= a / n
            out[..., n] = term.sum(-1)
    return out


def poisson_cdf(c: ArrayLike, a: ArrayLike, pmf: ArrayLike | None = None) -> np.ndarray:
    """P(N <= c) for N ~ Poisson(a), integers c >= 0, a > 0: scipy.special.gammaincc(c + 1, a).

    From pmf(c) (`pmf`, computed if not given): where a < c + 1, one minus the terms above c
    (what is left is not far under 1/2: N's median lies within a - log 2 and a + 1/3), whose
    ratios to pmf(c) are products of a / (c + i); elsewhere pmf(c) plus the terms below it,
    products of (c + 1 - i) / a. Both ratios fall with i, so a sum is stopped where the
    geometric series of its next ratio bounds what is left under 2^-56 of it."""
    c, a = np.broadcast_arrays(np.asarray(c, float), np.asarray(a, float))
    p = poisson_pmf(c, a) if pmf is None else np.broadcast_to(np.asarray(pmf, float), c.shape)
    up = a < c + 1
    s = _ratio_sums(c.ravel(), a.ravel(), up.ravel()).reshape(c.shape)
    return np.where(up, 1.0 - p * s, p * (1.0 + s))


def _ratio_sums(c: np.ndarray, a: np.ndarray, up: np.ndarray) -> np.ndarray:
    """sum over j >= 1 of prod_{i <= j} r_i per row, r_i = a / (c + i) where `up`, else
    (c + 1 - i) / a (0 from i = c + 1), in blocks of terms until each row's rest is bounded."""
    total, last = np.zeros(c.size), np.ones(c.size)
    rows, start, width = np.arange(c.size), 0, 32
    with np.errstate(divide="ignore", invalid="ignore", under="ignore"):
        while rows.size:
            cr, ar, ur = c[rows, None], a[rows, None], up[rows, None]
            i = np.arange(start + 1, start + width + 1)
            ratio = np.where(ur, ar / (cr + i), np.maximum(cr + 1 - i, 0.0) / ar)
            terms = last[rows, None] * np.cumprod(ratio, axis=1)
            total[rows] += terms.sum(axis=1)
            last[rows] = terms[:, -1]
            start += width
            nxt = np.where(up[rows], a[rows] / (c[rows] + start + 1),
                           np.maximum(c[rows] - start, 0.0) / a[rows])
            rest = last[rows] * nxt / (1.0 - nxt)
            rows = rows[rest > _TAIL_TOL * (1.0 + total[rows])]  # NaN rows stop too
            width = min(4 * width, 1024)
    return total
