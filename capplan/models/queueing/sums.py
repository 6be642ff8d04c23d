"""Quantile composition: the law of a sum of independent latency terms (TTFT, E2E).

TTFT and E2E are sums of independent parts (residual step, waits, own prefill, decode, the
prompts arriving meanwhile); their percentiles are those of the sum's law, built on one grid per
configuration by multiplying the parts' discrete Fourier transforms (_sum_law) and read off its
cdf (_SumLaw.quantiles).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from capplan.models.queueing.laws import LengthStats
from capplan.models.queueing.special import normal_quantiles

# -- quantiles of a sum of independent terms (TTFT, E2E) -------------------------------------
# Each term is an offset plus a non-negative part on [0, span]. On one grid per configuration
# (step h, point k holding the mass of [(k - 1/2) h, (k + 1/2) h)) the terms' discrete Fourier
# transforms multiply; the inverse is the pmf of the sum (Feller vol. 2, XV.3: the transform of a
# sum of independent variables is the product of theirs), whose quantiles are read off its cdf.
# Waits, residuals and normal terms have closed-form transforms (geometric and Gaussian sums);
# only the empirical terms (functions of the prompt or output length) take an FFT.
_GRID_LEN = 128
"""Points of the convolution grid (FFT length)."""
_GRID_SPAN = _GRID_LEN - 8
"""Points that the summed spans cover; the spare points keep the sum from wrapping around."""
_TAIL_EPS = 1e-4
"""An exponential term's span ends at its (1 - eps) quantile; the mass beyond (under eps) wraps
to the grid's start, which lowers a p99 by under 0.5%."""
_FREQ = np.arange(_GRID_LEN // 2 + 1)
_ROOTS = np.exp(-2j * np.pi * np.arange(_GRID_LEN) / _GRID_LEN).astype(np.complex64)
"""exp(-2 pi i k / L): _ROOTS[(j * n) % L] is the DFT at frequency j of a unit mass at n."""
_CONJ = np.conj(_ROOTS[:_GRID_LEN // 2 + 1])
_INV_DIFF = np.concatenate([[0.0], 1.0 / (1.0 - _ROOTS[1:_GRID_LEN // 2 + 1])]).astype(
    np.complex64)


def _shift(n: np.ndarray) -> np.ndarray:
    """DFT of a unit mass at integer points n (...,): shape (..., L/2 + 1)."""
    # n >= 0 and _GRID_LEN a power of 2: the mask is the remainder
    return _ROOTS.take((n.astype(np.int64)[..., None] * _FREQ) & (_GRID_LEN - 1))


@dataclass(frozen=True)
class _Term:
    """offset + X with X in [0, span]; spectrum(h) is the DFT of X's masses on the grid of step
    h, shape (..., L/2 + 1); None for a constant."""

    offset: Any
    span: Any
    spectrum: Callable[[np.ndarray], np.ndarray] | None = None


def _uniform_term(width: np.ndarray) -> _Term:
    """Uniform on [0, width]: equal masses at 0, h, ..., n h (n = width / h, mixing the two
    integers around it)."""
    w = np.asarray(width, float)

    def boxcar(n: np.ndarray) -> np.ndarray:
        # sum_{k<=n} z^k / (n + 1) = (1 - z^(n+1)) / ((1 - z) (n + 1)); 1 at frequency 0
        out = (1 - _shift(n + 1)) * _INV_DIFF / (n + 1).astype(np.float32)[..., None]
        out[..., 0] = 1.0
        return out

    def spectrum(h: np.ndarray) -> np.ndarray:
        # between n and n + 1 steps wide, mixed so that the mean is width / 2 exactly
        x = np.clip(w / h, 0, _GRID_SPAN)
        n = np.floor(x)
        f = (x - n).astype(np.float32)[..., None]
        return (1 - f) * boxcar(n) + f * boxcar(n + 1)
    return _Term(0.0, w, spectrum)


def _wait_term(p_wait: np.ndarray, mean_wait: np.ndarray) -> _Term:
    """0 with probability 1 - p_wait, else exponential (overall mean mean_wait): the M/M/c
    waiting time (Kleinrock, Queueing Systems vol. 1, 1975, eq. 3.40), used for M/G/c and
    M/G/1 with their own means.

    Point 0 holds 1 - p r^(1/2) and point k >= 1 holds p (1 - r) r^(k - 1/2), r = exp(-h / m),
    m the conditional mean: a geometric series, DFT c0 + a r z / (1 - r z) (the tail beyond the
    grid, under eps, is left out).
    """
    p = np.clip(np.asarray(p_wait, float), 0.0, 1.0)
    cond = np.maximum(np.asarray(mean_wait, float) / np.maximum(p, 1e-12), 1e-300)
    span = np.where(p > _TAIL_EPS, cond * np.log(np.maximum(p, 1e-300) / _TAIL_EPS), 0.0)

    def spectrum(h: np.ndarray) -> np.ndarray:
        r = np.exp(-h / cond)
        root = np.sqrt(r)
        c0, a = (1 - p * root).astype(np.float32), (p * (1 - r) * root).astype(np.float32)
        inv_r = (1 / np.maximum(r, 1e-30)).astype(np.float32)
        # r z / (1 - r z) = 1 / (conj(z) / r - 1)
        return c0[..., None] + a[..., None] / (_CONJ * inv_r[..., None] - 1)
    return _Term(0.0, span, spectrum)


_NORMAL_STRATA = np.asarray([0, .001, .005, .01, .025, .05, .1, .2, .3, .4, .5, .6, .7, .8, .9,
                             .95, .975, .99, .995, .999, 1])
_NORMAL_W = np.diff(_NORMAL_STRATA)



@cache
def _normal_z() -> np.ndarray:
    """Standard normal quantiles at the midpoints of _NORMAL_STRATA (computed once)."""
    return normal_quantiles((_NORMAL_STRATA[:-1] + _NORMAL_STRATA[1:]) / 2)


def _normal_term(sd: np.ndarray) -> _Term:
    """Normal, mean 0, as 20 strata (finer in the tails) at their middle levels' quantiles."""
    sd = np.asarray(sd, float)
    return _values_term(sd[..., None] * _normal_z(), _NORMAL_W)


def _compound_term(m: np.ndarray, jumps: np.ndarray, weights: np.ndarray) -> _Term:
    """Compound Poisson, centred: the sum of N ~ Poisson(m) jumps drawn from `jumps` (..., k,
    >= 0) with probabilities `weights`, minus its mean. DFT exp(m (phi - 1)), phi the jumps'
    DFT (Feller vol. 1, XII.2); the span reaches 6 sd above the mean plus the largest jump."""
    m = np.asarray(m, float)
    j = np.asarray(jumps, float)
    mean = m * (j * weights).sum(axis=-1)
    sd = np.sqrt(m * (j * j * weights).sum(axis=-1))
    one = _values_term(np.concatenate([np.zeros(j.shape[:-1] + (1,)), j], -1),
                       np.concatenate([[0.0], weights]))
    if one.spectrum is None:
        return _Term(0.0, 0.0)

    def spectrum(h: np.ndarray) -> np.ndarray:
        phi = one.spectrum(h)
        return np.exp(m.astype(np.float32)[..., None] * (phi - 1)).astype(np.complex64)
    return _Term(-mean, mean + 6 * sd + j.max(axis=-1), spectrum)


# Strata of a length distribution: 1% wide up to 0.98, finer in the tail (p99 reads it).
_STRATA = np.concatenate([np.linspace(0.0, 0.98, 99), [0.985, 0.99, 0.9925, 0.995, 0.9975,
                                                       0.999, 1.0]])
_STRATA_MID = (_STRATA[:-1] + _STRATA[1:]) / 2
_STRATA_W = np.diff(_STRATA)


def _strata_lengths(x: LengthStats) -> tuple[np.ndarray, np.ndarray]:
    """Lengths at the strata's middle levels and their probabilities (or the fixed length)."""
    if not x.table:
        return np.asarray([x.mean]), np.ones(1)
    return x.quantile(_STRATA_MID), _STRATA_W


def _values_term(values: np.ndarray, weights: np.ndarray) -> _Term:
    """A discrete law: values (..., m) with probabilities weights (m,)."""
    v = np.asarray(values, float)
    lo = v.min(axis=-1)
    span = v.max(axis=-1) - lo
    if v.shape[-1] == 1:
        return _Term(lo, 0.0)

    def spectrum(h: np.ndarray) -> np.ndarray:
        rows = int(np.prod(h.shape))
        # linear binning: a value between two points splits its mass between them, so the
        # result moves continuously with the values (no snapping to the grid)
        pos = np.broadcast_to((v - lo[..., None]) / h[..., None], h.shape + v.shape[-1:])
        pos = np.clip(pos, 0, _GRID_LEN - 2)
        i0 = pos.astype(np.int64)
        frac = pos - i0
        flat = (i0 + np.arange(rows).reshape(h.shape)[..., None] * _GRID_LEN).ravel()
        w = np.broadcast_to(weights, i0.shape)
        pmf = (np.bincount(flat, (w * (1 - frac)).ravel(), minlength=rows * _GRID_LEN)
               + np.bincount(flat + 1, (w * frac).ravel(), minlength=rows * _GRID_LEN))
        return np.fft.rfft(pmf.reshape(h.shape + (_GRID_LEN,)).astype(np.float32), axis=-1)
    return _Term(lo, span, spectrum)


def _take_pair(a: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a[..., idx] and a[..., idx + 1] along the last axis (np.take_along_axis, twice, without
    its index set-up: one flat index serves both)."""
    if a.shape[:-1] != idx.shape[:-1]:
        return np.take_along_axis(a, idx, -1), np.take_along_axis(a, idx + 1, -1)
    n = a.shape[-1]
    flat = np.ascontiguousarray(a).reshape(-1)
    at = idx + (np.arange(flat.size // n) * n).reshape(idx.shape[:-1] + (1,))
    return flat[at], flat[at + 1]


def _interp_cdf(pad: np.ndarray, h: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The piecewise-linear cdf of a grid law (point k spread over [(k - 1/2) h, (k + 1/2) h],
    cdf[k] reached at (k + 1/2) h) at y (..., n), relative to the law's offset; pad is the cdf
    with a 0 in front."""
    u = y / h[..., None] + 0.5
    np.clip(u, 0, _GRID_LEN, out=u)
    i0 = np.minimum(u.astype(np.int64), _GRID_LEN - 1)
    frac = (u - i0).astype(np.float32)
    lo, up = _take_pair(pad, i0)
    return lo + (up - lo) * frac


def _read_off(offset: np.ndarray, part: tuple[np.ndarray, ...], probs: tuple[float, ...]
              ) -> list[np.ndarray]:
    """Quantiles of one grid law (offset + X, X's cdf `pad` on the grid of step h): read off
    its piecewise-linear cdf."""
    _, h, _, pad = part
    out = []
    for q in probs:
        k = np.minimum((pad < q).sum(axis=-1, keepdims=True), _GRID_LEN)  # pad[k] >= q
        lo = np.take_along_axis(pad, k - 1, -1)
        frac = np.clip((q - lo) / np.maximum(np.take_along_axis(pad, k, -1) - lo, 1e-30),
                       0.0, 1.0)
        out.append(offset + np.maximum(k[..., 0] - 1.5 + frac[..., 0], 0.0) * h)
    return out


@dataclass(frozen=True)
class _SumLaw:
    """A mixture of grid laws sharing one offset: with probability w[i], offset + X_i where X_i
    has cdf cdfs[i] on the grid of step hs[i] (over [0, spans[i]])."""

    offset: np.ndarray
    parts: tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], ...]
    """(weight, h, span, cdf with a 0 in front) per component."""
    single: np.ndarray | None = None
    """Rows that are the first component alone (its weight 1, the others' 0): their quantiles
    are read off it, as a one-component law's are."""

    @property
    def span(self) -> np.ndarray:
        span = np.maximum.reduce([sp for _, _, sp, _ in self.parts])
        if self.single is not None:
            span = np.where(self.single, self.parts[0][2], span)
        return span

    def cdf(self, y: np.ndarray) -> np.ndarray:
        return sum(w[..., None] * _interp_cdf(c, h, y) for w, h, _, c in self.parts)

    def quantiles(self, probs: tuple[float, ...]) -> list[np.ndarray]:
        """One law: read off its piecewise-linear cdf. A mixture: bisection on its cdf (all
        levels at once) to 2^-14 of the span, then linear interpolation within the bracket.
        Every bound is each row's own, so a row's quantiles do not depend on the other rows
        evaluated with it (the planner's search evaluates subsets of the configurations)."""
        if len(self.parts) == 1:
            return _read_off(self.offset, self.parts[0], probs)
        p = np.asarray(probs, np.float32)
        h_max = np.maximum.reduce([np.broadcast_to(h, self.offset.shape)
                                   for _, h, _, _ in self.parts])
        hi = np.broadcast_to((self.span + h_max)[..., None], self.offset.shape + p.shape).copy()
        lo = np.zeros_like(hi)
        f_lo, f_hi = np.zeros_like(hi), np.ones_like(hi)
        for _ in range(14):
            mid = 0.5 * (lo + hi)
            f = self.cdf(mid)
            below = f < p
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
            f_lo, f_hi = np.where(below, f, f_lo), np.where(below, f_hi, f)
        x = lo + (hi - lo) * np.clip((p - f_lo) / np.maximum(f_hi - f_lo, 1e-30), 0.0, 1.0)
        out = [self.offset + x[..., i] for i in range(len(probs))]
        if self.single is not None:
            first = _read_off(self.offset, self.parts[0], probs)
            out = [np.where(self.single, a, b) for a, b in zip(first, out, strict=True)]
        return out

    def as_term(self) -> _Term:
        """This sum as one term of another sum (its cdf resampled on the other grid)."""
        def spectrum(h: np.ndarray) -> np.ndarray:
            g = self.cdf((np.arange(_GRID_LEN - 1) + 0.5) * h[..., None])
            ends = g.shape[:-1] + (1,)
            pmf = np.diff(np.concatenate([np.zeros(ends, np.float32), g,
                                          np.ones(ends, np.float32)], -1), axis=-1)
            return np.fft.rfft(pmf, axis=-1)
        return _Term(0.0, self.span, spectrum)


def _grid_cdf(terms: list[_Term], shape: tuple[int, ...]
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(h, span, cdf) of the non-constant part of a sum of independent terms, from the product
    of their transforms; the grid step is h = (sum of spans) / _GRID_SPAN."""
    live = [t for t in terms if t.spectrum is not None and np.any(np.asarray(t.span) > 0)]
    total = np.broadcast_to(sum((np.asarray(t.span, float) for t in live), np.asarray(0.0)),
                            shape)
    h = np.maximum(total / _GRID_SPAN, 1e-15)
    if not live:  # a constant: all mass at point 0
        return h, total, _padded(np.ones(shape + (_GRID_LEN,), np.float32))
    spec = None
    for t in live:
        s = t.spectrum(h)
        zero = np.broadcast_to(np.asarray(t.span) <= 0, shape)
        if np.any(zero):  # a row where this term has no span does without it
            s = np.where(zero[..., None], np.ones((), s.dtype), s)
        spec = s if spec is None else spec * s
    pmf = np.maximum(np.fft.irfft(spec, n=_GRID_LEN, axis=-1), 0.0)
    cdf = np.cumsum(pmf, axis=-1)
    cdf /= np.maximum(cdf[..., -1:], 1e-30)
    return h, total, _padded(cdf)


def _padded(cdf: np.ndarray) -> np.ndarray:
    return np.concatenate([np.zeros(cdf.shape[:-1] + (1,), np.float32),
                           cdf.astype(np.float32)], -1)


def _offset(terms: list[_Term], shape: tuple[int, ...]) -> np.ndarray:
    return np.broadcast_to(sum(np.asarray(t.offset, float) for t in terms), shape)


def _sum_law(terms: list[_Term], shape: tuple[int, ...]) -> _SumLaw:
    h, span, cdf = _grid_cdf(terms, shape)
    return _SumLaw(_offset(terms, shape), ((np.ones(shape), h, span, cdf),))


def _sum_with_waits(terms: list[_Term], waits: list[_Term], no_wait: np.ndarray,
                    shape: tuple[int, ...]) -> _SumLaw:
    """terms + waits, split on whether any wait is positive: the waits' atoms at 0 would
    otherwise share a grid with their long tails and blur a median that lies below them. The
    positive-wait law's transform is (prod of the waits' transforms - P(no wait)) /
    (1 - P(no wait))."""
    pi0 = np.broadcast_to(no_wait, shape)
    if np.all(pi0 >= 1 - 1e-9):
        return _sum_law(terms, shape)
    h0, span0, cdf0 = _grid_cdf(terms, shape)
    span_w = sum(np.asarray(w.span, float) for w in waits)

    def spectrum(h: np.ndarray) -> np.ndarray:
        prod = waits[0].spectrum(h)
        for w in waits[1:]:
            prod = prod * w.spectrum(h)
        return (prod - pi0[..., None]) / np.maximum(1 - pi0, 1e-12)[..., None]
    # the no-wait law resampled onto the wider grid stands for the terms (cheaper than
    # discretising each of them again)
    base = _SumLaw(np.zeros(shape), ((np.ones(shape), h0, span0, cdf0),)).as_term()
    h1, span1, cdf1 = _grid_cdf([base, _Term(0.0, span_w, spectrum)], shape)
    # rows where no request waits are the no-wait law alone, as when every row is
    single = pi0 >= 1 - 1e-9
    w0 = np.where(single, 1.0, pi0)
    return _SumLaw(_offset(terms, shape), ((w0, h0, span0, cdf0), (1 - w0, h1, span1, cdf1)),
                   single if np.any(single) else None)

