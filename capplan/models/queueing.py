"""Latency under load for one engine replica doing continuous batching (vLLM V1 style).

Steady state at arrival rate lambda (open loop) -- derivation in docs/queueing.md:

- Little's law: sequences decoding B = lambda * E[O-1] * tau; prefill tokens per step
  P = lambda * E[I] * tau, where tau is the mean step time. tau depends on B and P through the
  step-time model, so tau is the fixed point tau = T(B(tau), P(tau)), found by bisection.
- A step holds new prefill work with probability f = 1 - exp(-lambda * tau * E[chunks]);
  decode-only steps take T(B, 0), prefill steps T(B, chunk). Every inter-token gap is one step,
  so the TBT distribution is that two-point mixture (prefill interference sets its tail).
- TTFT = residual of the current step + wait behind other prefills (M/G/1 on prefill tokens,
  Pollaczek-Khinchine) + own prefill (its chunks) + wait for a slot when the concurrency cap
  (max_num_seqs or KV capacity) binds (M/G/c, Erlang C with the Allen-Cunneen correction).
  Waiting times get exponential tails (exact for M/M/c); TTFT and E2E percentiles are those of
  the sum of the terms' laws, convolved on a grid (see _sum_law).
- Unstable (the queue grows without bound) when prefill demand exceeds the token budget,
  the offered load reaches the concurrency cap, or the fixed point does not exist.

All functions broadcast: rates, and the StepModel's constants, may be arrays.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from capplan.models.closed_loop import block_rounding_tokens
from capplan.models.engine import SchedulerPolicy
from capplan.models.perf import StepModel
from capplan.models.prefill import packed_prefill_step
from capplan.models.prefix import PrefixCache

QUANTILES = {"p50": 0.50, "p90": 0.90, "p99": 0.99}
Z99 = 2.3263478740408408
"""Standard normal 99th percentile (scipy.stats.norm.ppf(0.99)): the one home of this value."""


def _special() -> Any:
    """scipy.special, imported on first use: a replayed closed loop or trace needs none of it,
    and importing scipy costs ~0.2 s of every command's start-up."""
    from scipy import special

    return special


def _fft() -> Any:
    """scipy.fft, imported on first use (as `_special`)."""
    from scipy import fft

    return fft


@cache
def _normal_z() -> np.ndarray:
    """Standard normal quantiles at the midpoints of _NORMAL_STRATA (computed once)."""
    return _special().ndtri((_NORMAL_STRATA[:-1] + _NORMAL_STRATA[1:]) / 2)
_TAU_MAX_S = 60.0
_FP_ITERS = 10
_FP_ITERS_MAX = 60
_FP_REL_TOL = 1e-4
_FP_ROUNDING_TOL = 1e-13
"""A bracket this narrow (relative) moves by no more than that in further iterations."""


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
        return cls(float(a.mean()), float((a * a).mean()),
                   {k: float(np.quantile(a, p)) for k, p in QUANTILES.items()},
                   tuple(np.quantile(a, np.linspace(0, 1, 201)).tolist()))

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


@dataclass(frozen=True)
class Limits:
    """Engine limits of one replica."""

    max_num_seqs: Any
    max_num_batched_tokens: Any
    kv_cache_tokens: Any
    state_tokens_per_seq: Any = 0.0
    """KV capacity (tokens) a running sequence's recurrent state holds whatever its length:
    hybrid models' state blocks * block_size (plan/deployment.KvPool)."""
    block_size: Any = 1
    """Tokens per KV block: a sequence holds whole blocks (1: counted in tokens)."""


def _poisson_erlang_c(c: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Erlang C probability of waiting with c servers and offered load a (< c).

    Erlang B = Poisson pmf(c; a) / cdf(c; a); C = c B / (c - a (1 - B)). The Poisson cdf is the
    regularised upper incomplete gamma Q(c + 1, a).
    """
    c = np.maximum(np.floor(c), 1.0)
    a = np.maximum(np.asarray(a, float), 1e-300)
    pmf = np.exp(c * np.log(a) - a - _special().gammaln(c + 1))
    b = pmf / np.maximum(_special().gammaincc(c + 1, a), 1e-300)
    return np.clip(c * b / np.maximum(c - a * (1 - b), 1e-12), 0.0, 1.0)


def _poisson_quantile(m: np.ndarray, p: float, kmax: int = 64
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Smallest k with P(Poisson(m) <= k) >= p, with P(K < k) and P(K = k); vectorised."""
    m = np.asarray(m, float)
    term = np.exp(-m)
    cdf = term.copy()
    k = np.zeros_like(m)
    below, at = np.zeros_like(m), term.copy()
    for i in range(1, kmax + 1):
        more = cdf < p
        nxt = term * m / i
        k = np.where(more, i, k)
        below = np.where(more, cdf, below)
        at = np.where(more, nxt, at)
        term = nxt
        cdf = cdf + term
    return k, below, at


def _chunk_moments(inp: LengthStats, budget: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation of a chunk, min(prompt length, budget)."""
    if not inp.table:
        c = np.minimum(inp.mean, budget)
        return c, np.zeros_like(c)
    levels = np.asarray(inp.table, float)
    clipped = np.minimum(levels, np.asarray(budget, float)[..., None])
    mean = clipped.mean(axis=-1)
    return mean, np.sqrt(np.maximum((clipped**2).mean(axis=-1) - mean**2, 0.0))


def chunk_sum_quantile(m: np.ndarray, p: float, inp: LengthStats, budget: np.ndarray,
                       iters: int = 12,
                       moments: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """p-quantile of the prompt tokens in a step: a compound Poisson sum of chunk sizes.

    F(x) = P(K=0) + P(K=1) F_chunk(x) + sum_{k>=2} P(K=k) Phi((x - k mu) / (sqrt(k) sigma)),
    solved for F(x) = p by bisection on [0, budget]; 0 when p <= P(K=0) (a decode-only step).
    """
    m = np.asarray(m, float)
    budget = np.broadcast_to(np.asarray(budget, float), m.shape)
    mu, sigma = moments if moments is not None else _chunk_moments(inp, budget)
    kmax = int(np.ceil(float(np.max(m, initial=0.0)) + 6 * np.sqrt(float(np.max(m, initial=0.0)))
                       + 4))
    pk = [np.exp(-m)]
    for k in range(1, kmax + 1):
        pk.append(pk[-1] * m / k)
    # terms whose probability is negligible for every configuration add nothing to F
    terms = [k for k in range(2, kmax + 1) if float(np.max(pk[k], initial=0.0)) > 1e-7]
    levels = np.linspace(0.0, 1.0, 201)
    centre = {k: k * mu for k in terms}
    scale = {k: np.maximum(np.sqrt(k) * sigma, 1e-9) for k in terms}

    def cdf(x: np.ndarray) -> np.ndarray:
        if inp.table:
            f1 = np.interp(x, np.asarray(inp.table, float), levels)
        else:
            f1 = (x >= inp.mean).astype(float)
        f1 = np.where(x >= budget, 1.0, f1)
        f = pk[0] + pk[1] * f1
        for k in terms:
            z = (x - centre[k]) / scale[k]
            f = f + pk[k] * _special().ndtr(z)
        return f

    lo, hi = np.zeros_like(m), budget.astype(float).copy()
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        below = cdf(mid) < p
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return np.where(p <= pk[0], 0.0, hi)


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
_OWN_NODES = 6
_SHARED_MAX = 8
"""Other prompts' chunks counted in the step that carries a request's own prefill (0..7)."""
"""Chunk sizes at which the own-prefill time is evaluated, then interpolated linearly."""
_FREQ = np.arange(_GRID_LEN // 2 + 1)
_ROOTS = np.exp(-2j * np.pi * np.arange(_GRID_LEN) / _GRID_LEN).astype(np.complex64)
"""exp(-2 pi i k / L): _ROOTS[(j * n) % L] is the DFT at frequency j of a unit mass at n."""
_CONJ = np.conj(_ROOTS[:_GRID_LEN // 2 + 1])
_INV_DIFF = np.concatenate([[0.0], 1.0 / (1.0 - _ROOTS[1:_GRID_LEN // 2 + 1])]).astype(
    np.complex64)


def _shift(n: np.ndarray) -> np.ndarray:
    """DFT of a unit mass at integer points n (...,): shape (..., L/2 + 1)."""
    return _ROOTS[(_FREQ * n.astype(np.int64)[..., None]) % _GRID_LEN]


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
        return _fft().rfft(pmf.reshape(h.shape + (_GRID_LEN,)).astype(np.float32), axis=-1)
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


@dataclass(frozen=True)
class _SumLaw:
    """A mixture of grid laws sharing one offset: with probability w[i], offset + X_i where X_i
    has cdf cdfs[i] on the grid of step hs[i] (over [0, spans[i]])."""

    offset: np.ndarray
    parts: tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], ...]
    """(weight, h, span, cdf with a 0 in front) per component."""

    @property
    def span(self) -> np.ndarray:
        return np.maximum.reduce([sp for _, _, sp, _ in self.parts])

    def cdf(self, y: np.ndarray) -> np.ndarray:
        return sum(w[..., None] * _interp_cdf(c, h, y) for w, h, _, c in self.parts)

    def quantiles(self, probs: tuple[float, ...]) -> list[np.ndarray]:
        """One law: read off its piecewise-linear cdf. A mixture: bisection on its cdf (all
        levels at once) to 2^-14 of the span, then linear interpolation within the bracket."""
        p = np.asarray(probs, np.float32)
        if len(self.parts) == 1:
            _, h, _, pad = self.parts[0]
            out = []
            for q in probs:
                k = np.minimum((pad < q).sum(axis=-1, keepdims=True), _GRID_LEN)  # pad[k] >= q
                lo = np.take_along_axis(pad, k - 1, -1)
                frac = np.clip((q - lo) / np.maximum(np.take_along_axis(pad, k, -1) - lo, 1e-30),
                               0.0, 1.0)
                out.append(self.offset + np.maximum(k[..., 0] - 1.5 + frac[..., 0], 0.0) * h)
            return out
        hi = np.broadcast_to((self.span + max(float(np.max(h)) for _, h, _, _ in self.parts)
                              )[..., None], self.offset.shape + p.shape).copy()
        lo = np.zeros_like(hi)
        f_lo, f_hi = np.zeros_like(hi), np.ones_like(hi)
        for _ in range(14):
            mid = 0.5 * (lo + hi)
            f = self.cdf(mid)
            below = f < p
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
            f_lo, f_hi = np.where(below, f, f_lo), np.where(below, f_hi, f)
        x = lo + (hi - lo) * np.clip((p - f_lo) / np.maximum(f_hi - f_lo, 1e-30), 0.0, 1.0)
        return [self.offset + x[..., i] for i in range(len(probs))]

    def as_term(self) -> _Term:
        """This sum as one term of another sum (its cdf resampled on the other grid)."""
        def spectrum(h: np.ndarray) -> np.ndarray:
            g = self.cdf((np.arange(_GRID_LEN - 1) + 0.5) * h[..., None])
            ends = g.shape[:-1] + (1,)
            pmf = np.diff(np.concatenate([np.zeros(ends, np.float32), g,
                                          np.ones(ends, np.float32)], -1), axis=-1)
            return _fft().rfft(pmf, axis=-1)
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
    spec = live[0].spectrum(h)
    for t in live[1:]:
        spec = spec * t.spectrum(h)
    pmf = np.maximum(_fft().irfft(spec, n=_GRID_LEN, axis=-1), 0.0)
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
    return _SumLaw(_offset(terms, shape), ((pi0, h0, span0, cdf0), (1 - pi0, h1, span1, cdf1)))


@dataclass(frozen=True)
class _Terms:
    """The steady-state quantities _sum_quantiles composes (arrays of one shape)."""

    lam: np.ndarray
    tau: np.ndarray
    b: np.ndarray
    budget: np.ndarray
    t_dec: np.ndarray
    t_full: np.ndarray
    rho_p: np.ndarray
    wq_p: np.ndarray
    p_wait: np.ndarray
    wq_c: np.ndarray
    m_chunks: np.ndarray
    chunk_mean: np.ndarray
    gap: np.ndarray
    """Mean gap between a sequence's tokens (tau, or longer for a prefill-first engine)."""


class QueueModel:
    """Analytic steady state of one replica for given lengths and limits."""

    def __init__(self, step: StepModel, inp: LengthStats, out: LengthStats, limits: Limits,
                 arrival_scv: float = 1.0, policy: SchedulerPolicy | None = None,
                 prefix: PrefixCache | None = None):
        """arrival_scv: squared coefficient of variation of inter-arrival times (1 = Poisson;
        gamma arrivals with burstiness k have 1/k), used in Kingman's G/G correction.
        policy: the engine profile's scheduler (default vLLM's): prefill-first steps stall the
        decoders, whole-prompt engines take a prompt in one step, and an output reservation
        lowers the KV concurrency cap (docs/engines.md).
        prefix: automatic prefix caching (models/prefix.py, docs/prefix_caching.md): prompts
        compute only their uncached tokens (`self.pf`), attention still reads the cached ones,
        and blocks shared between running requests are held once."""
        self.step, self.inp, self.out, self.limits = step, inp, out, limits
        self.policy = policy or SchedulerPolicy()
        self.prefix = prefix if (prefix is not None and prefix.active
                                 and self.policy.prefix_caching) else PrefixCache()
        self.cached = self.prefix.cached_tokens_mean
        self.pf = (LengthStats.from_samples(self.prefix.prefill_tokens) if self.prefix.active
                   else inp)
        """Prompt tokens each request computes (all of them without a cache hit)."""
        self.ca2 = float(arrival_scv)
        self.pack_prompts = False
        """Cost a chunk longer than a prompt as whole prompts (models/prefill.py): always with
        attention DP; on request otherwise (the disaggregated pools, capplan.plan.pd), while
        the aggregated answers keep one sequence's chunk (docs/multinode.md, known limits)."""
        self._dp = bool(np.any(np.asarray(step.attention_dp) > 1))
        self.dec_tokens = max(out.mean - 1.0, 0.0)
        # Time-averaged context of a decoding sequence, lengths independent:
        # E[(O-1)(I + O/2)] / E[O-1] = E[I] + (E[O^2] - E[O]) / (2 E[O-1]).
        self.ctx_mean = inp.mean + ((out.mean_sq - out.mean) / (2 * self.dec_tokens)
                                    if self.dec_tokens > 0 else 0.0)
        mnbt = np.asarray(limits.max_num_batched_tokens, float)
        # KV held by a running sequence: its prompt plus the part of its output generated so
        # far (uniform over its life): mean I + O/2, variance Var(I) + Var(O)/4 + E[O^2]/12.
        # B sequences hold a sum with mean B mu and sd sqrt(B) sigma; the cap is the largest B
        # whose 99th percentile fits: B mu + 2.33 sqrt(B) sigma = KV tokens (heavy-tailed
        # lengths leave less room than the mean suggests; vLLM would preempt beyond it).
        # An output reservation at admission raises it (SchedulerPolicy.held_tokens); blocks
        # shared with other running requests are held once (vLLM block_pool.touch); a hybrid's
        # recurrent state holds its fixed blocks whatever the length (vLLM MambaManager), and
        # the last block is partly empty (large for hybrids' raised block sizes).
        mu = np.maximum(float(self.policy.held_tokens(inp.mean, out.mean))
                        + block_rounding_tokens(inp.mean, out.mean, limits.block_size)
                        - self.prefix.shared_kv_tokens_per_seq
                        + np.asarray(limits.state_tokens_per_seq, float), 1.0)
        sigma = math.sqrt(inp.var + out.var / 4 + out.mean_sq / 12)
        kv = np.asarray(limits.kv_cache_tokens, float) - self.prefix.resident_kv_tokens
        z = Z99
        root = (-z * sigma + np.sqrt(z * z * sigma * sigma + 4 * mu * np.maximum(kv, 0.0))) / (
            2 * mu)
        kv_cap = root * root
        self.cap = np.maximum(np.minimum(np.asarray(limits.max_num_seqs, float), kv_cap), 0.0)
        self.mnbt = mnbt
        # Whole-prompt engines (no chunked prefill) cannot run a prompt over the token budget:
        # TensorRT-LLM rejects it (max_num_tokens), so such a configuration has no steady state.
        longest = max(inp.table) if inp.table else inp.mean
        self.whole_prompts_fit = (np.ones_like(mnbt, bool) if self.policy.chunked_prefill
                                  else mnbt >= longest)

    # -- step times ------------------------------------------------------------------------
    def _decode(self, b: np.ndarray) -> np.ndarray:
        w = self.step.window
        return self.step.step(num_decode=b, decode_kv_tokens=b * self.ctx_mean,
                              decode_kv_tokens_window=b * np.minimum(self.ctx_mean, w),
                              detail=False)["step_s"]

    def _mixed(self, b: np.ndarray, chunk: np.ndarray) -> np.ndarray:
        """A step with b decode sequences and `chunk` prefill tokens (mean prefix); a
        prefill-first engine runs the chunk alone (the decoders wait).

        Attention DP splits the chunk over the ranks, each its own sequences' chunk; a rank's
        chunk longer than a prompt packs whole prompts (chunk / prompt of them), whose causal
        pairs add per prompt, not as one sequence of the chunk's length (models/prefill.py)."""
        prefix = self.cached + np.maximum(self.pf.mean - chunk, 0.0) / 2
        if self.policy.prefill_first:
            b = np.zeros_like(np.asarray(b, float))
        if not (self.pack_prompts or self._dp):
            return self.step.prefill_chunk(chunk, prefix, num_decode=b,
                                           decode_kv_tokens=b * self.ctx_mean,
                                           detail=False)["step_s"]
        return packed_prefill_step(self.step, chunk, self.pf.mean, self.cached, b,
                                   b * self.ctx_mean)

    def _chunk_budget(self, b: np.ndarray) -> np.ndarray:
        if self.policy.prefill_first:  # the prefill step holds no decode tokens
            return np.maximum(self.mnbt + 0 * np.asarray(b, float), 1.0)
        return np.maximum(self.mnbt - b, 1.0)

    def _n_chunks(self, budget: np.ndarray) -> np.ndarray:
        if not self.policy.chunked_prefill:  # whole prompts: one step each
            return np.ones_like(np.asarray(budget, float))
        per_budget = self.pf.mean / budget
        return np.maximum(1.0, per_budget + 0.5 * np.minimum(1.0, per_budget))

    def _mean_step(self, lam: np.ndarray, tau: np.ndarray) -> dict[str, np.ndarray]:
        # Decoders get a token every step (mixed), or only in decode steps (prefill-first:
        # the gap between tokens is tau / (1 - f)). Little's law for the decoding batch:
        # B = lambda (O - 1) gap. At least a sliver of a sequence, so that a step always costs
        # its fixed overheads.
        if self.policy.prefill_first:
            budget = self._chunk_budget(np.zeros_like(np.asarray(tau, float)))
            n = self._n_chunks(budget)
            f = 1.0 - np.exp(-lam * tau * n)
            gap = tau / np.maximum(1.0 - f, 1e-3)
            b = np.maximum(np.minimum(lam * self.dec_tokens * gap, self.cap), 1e-9)
        else:
            b = np.maximum(np.minimum(lam * self.dec_tokens * tau, self.cap), 1e-9)
            budget = self._chunk_budget(b)
            n = self._n_chunks(budget)
            f = 1.0 - np.exp(-lam * tau * n)
        p_bar = lam * self.pf.mean * tau
        chunk = np.clip(p_bar / np.maximum(f, 1e-12), 1.0, budget)
        t_dec = self._decode(b)
        t_pf = self._mixed(b, chunk)
        if not self.policy.chunked_prefill:  # a whole prompt per prefill step
            chunk = np.maximum(chunk, np.minimum(self.pf.mean, budget))
        mean = (1 - f) * t_dec + f * t_pf
        return {"tau": mean, "b": b, "f": f, "t_dec": t_dec, "t_pf": t_pf, "budget": budget,
                "chunk": chunk, "n": n}

    def token_gap(self, s: dict[str, np.ndarray], tau: np.ndarray) -> np.ndarray:
        """Mean gap between a sequence's tokens: the mean step, or for a prefill-first engine
        the mean step over the share of steps that decode."""
        if self.policy.prefill_first:
            return tau / np.maximum(1.0 - s["f"], 1e-3)
        return tau

    def _fixed_point(self, lam: np.ndarray, every_row: bool = True
                     ) -> tuple[np.ndarray, np.ndarray]:
        """Mean step time solving tau = T(tau), and whether it exists.

        g(tau) = T(tau) - tau is positive at tau = 0 and, when a fixed point exists, negative
        at _TAU_MAX_S. T is close to affine in tau (B and P grow linearly with it), so the
        Illinois variant of regula falsi converges in a few vectorised steps; near saturation
        it can need more, so it goes on (up to _FP_ITERS_MAX) until every bracket is within
        _FP_REL_TOL (a stalled bracket left tau at _TAU_MAX_S: an unstable verdict between two
        stable rates).

        It stops early, with the same result to _FP_ROUNDING_TOL, once every row is either
        within _FP_ROUNDING_TOL or at an exact root (g(hi) == 0: x = hi again, so hi stays);
        rows where no fixed point exists never converge and keep it going to _FP_ITERS_MAX
        unless `every_row` is False (a caller that reads no tau of those rows: stable()).
        """
        lo = np.zeros(np.broadcast_shapes(np.shape(lam), np.shape(self.cap)))
        g_lo = self._mean_step(lam, lo)["tau"] - lo
        hi = np.full_like(lo, _TAU_MAX_S)
        g_hi = self._mean_step(lam, hi)["tau"] - hi
        exists = g_hi <= 0
        side = np.zeros_like(lo)
        for i in range(_FP_ITERS_MAX):
            if i >= _FP_ITERS and (np.all(hi - lo <= _FP_REL_TOL * hi + 1e-12) or np.all(
                    (hi - lo <= _FP_ROUNDING_TOL * hi) | (g_hi == 0) | ~(exists | every_row))):
                break
            den = g_lo - g_hi
            x = np.where(den > 0, (lo * -g_hi + hi * g_lo) / np.where(den > 0, den, 1.0),
                         0.5 * (lo + hi))
            x = np.clip(x, lo, hi)
            g = self._mean_step(lam, x)["tau"] - x
            pos = g > 0
            # Illinois: halve the stale end's g when the same side is kept twice.
            g_hi = np.where(pos & (side > 0), 0.5 * g_hi, g_hi)
            g_lo = np.where(~pos & (side < 0), 0.5 * g_lo, g_lo)
            lo, g_lo = np.where(pos, x, lo), np.where(pos, g, g_lo)
            hi, g_hi = np.where(pos, hi, x), np.where(pos, g_hi, g)
            side = np.where(pos, 1.0, -1.0)
        return hi, exists

    def _own_values(self, b: np.ndarray, budget: np.ndarray, t_full: np.ndarray,
                    prompt: np.ndarray) -> np.ndarray:
        """Own-prefill time of prompts of the given lengths (m,) -> (..., m): one mixed step
        when the prompt fits the budget (interpolated between _OWN_NODES + 1 evaluated chunk
        sizes over the prompts' range), else prompt / budget full chunks."""
        lo = np.minimum(prompt.min(), budget)
        width = np.minimum(prompt.max(), budget) - lo
        if prompt.size > 1 and prompt.min() == prompt.max():
            # one prompt length (a fixed length's strata): every stratum's value is the first's
            one = self._own_values(b, budget, t_full, prompt[:1])
            return np.broadcast_to(one, one.shape[:-1] + prompt.shape).copy()
        nodes = np.linspace(0.0, 1.0, _OWN_NODES + 1)
        t_nodes = np.stack([self._mixed(b, np.maximum(lo + width * x, 1.0)) for x in nodes], -1)
        pos = (np.minimum(prompt, budget[..., None]) - lo[..., None]) / np.maximum(
            width[..., None], 1e-9) * _OWN_NODES
        i0 = np.clip(np.floor(pos), 0, _OWN_NODES - 1).astype(np.int64)
        frac = np.clip(pos - i0, 0.0, 1.0)
        at, nxt = _take_pair(t_nodes, i0)
        t = at * (1 - frac) + nxt * frac
        return np.where(prompt > budget[..., None], prompt / budget[..., None]
                        * t_full[..., None], t)

    def _sum_quantiles(self, x: _Terms, levels: dict[str, tuple[str, ...]]
                       ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Quantiles of TTFT and E2E as sums of independent terms, at the QUANTILES names in
        levels["ttft_s"] and levels["e2e_s"] (E2E's law is built only when some are asked).

        TTFT = overhead + residual of the current step (uniform on [0, tau]) + prefill-queue
        wait + own prefill (a function of the prompt length, over its distribution) + the other
        prompts sharing that step + slot wait.
        E2E = TTFT + (O - 1) tau over the output-length distribution + a normal term for the
        variation of those steps: the prompts arriving during the decode (compound Poisson,
        lambda (O-1) tau arrivals each adding its prefill's extra time) and the slow drift of the
        batch (M/G/inf: the batch averaged over a window as long as the service has variance
        (2/3) b, from the autocovariance lambda (D - |s|); Takacs 1962).
        """
        # the prefill work is the uncached prompt tokens, as in the means (self.pf; the prompt
        # itself without a prefix cache)
        inp, out = self.pf, self.out
        lam, tau, b, budget, t_dec, t_full = x.lam, x.tau, x.b, x.budget, x.t_dec, x.t_full
        rho_p, wq_p, p_wait, wq_c, m_chunks = x.rho_p, x.wq_p, x.p_wait, x.wq_c, x.m_chunks
        chunk_mean = x.chunk_mean

        def fin(v: np.ndarray) -> np.ndarray:  # unstable rows: replaced by inf afterwards
            return np.where(np.isfinite(v), v, 0.0)
        shape = np.shape(tau)
        prompt, p_w = _strata_lengths(inp)
        own = self._own_values(b, budget, t_full, prompt)
        p_pf = fin(np.clip(rho_p, 0.0, 1.0))
        # Prompts that arrived during the same step share the step that carries this one: K
        # other chunks, Poisson with the mean m of the TBT model; one chunk is drawn from the
        # prompt lengths (10 strata, capped at the budget), more are taken at the mean chunk;
        # each token at the step's marginal cost per prefill token (up to the budget).
        m = fin(m_chunks)[..., None]
        k = np.arange(2, _SHARED_MAX)
        pk = np.exp(k * np.log(np.maximum(m, 1e-300)) - m - _special().gammaln(k + 1))
        p0, p1 = np.exp(-m), m * np.exp(-m)
        tail = np.maximum(1 - p0 - p1 - pk.sum(axis=-1, keepdims=True), 0.0)
        pk[..., -1:] += tail
        one = np.minimum(inp.quantile((np.arange(10) + 0.5) / 10), budget[..., None])
        tokens = np.concatenate([np.zeros(shape + (1,)), one, k * chunk_mean[..., None]], -1)
        weights = np.concatenate([p0, np.broadcast_to(p1 / 10, shape + (10,)), pk], -1)
        per_token = np.maximum(fin(t_full) - fin(t_dec), 0.0) / budget
        shared = np.minimum(tokens, budget[..., None]) * per_token[..., None]
        # the shared step, like the waits, is 0 with a probability (no other chunk) and long
        # otherwise: it joins them in the split that keeps the no-wait law on a fine grid
        ttft = _sum_with_waits(
            [_Term(np.zeros(shape) + self.step.request_overhead_s, 0.0),
             _uniform_term(fin(tau)), _values_term(fin(own), p_w)],
            [_wait_term(p_pf, fin(wq_p)), _wait_term(fin(p_wait), fin(wq_c)),
             _values_term(shared, weights)],
            (1 - p_pf) * (1 - np.clip(fin(p_wait), 0.0, 1.0)) * p0[..., 0], shape)
        if not levels["e2e_s"]:
            return dict(zip(levels["ttft_s"], ttft.quantiles(
                tuple(QUANTILES[k] for k in levels["ttft_s"])), strict=True)), {}
        steps = np.maximum(1.0, prompt / budget[..., None])
        extra = np.maximum(own - t_dec[..., None] * steps, 0.0)
        # Prompts arriving during the decode lengthen it, which lets more arrive: a busy period
        # started by the decode alone, D0 = D (1 - rho_e), rho_e = lambda E[e] (Takacs;
        # Kleinrock vol. 1, 5.8: D0 + the busy periods of the N ~ Poisson(lambda D0) prompts
        # arriving in D0, each ~ e / (1 - rho_e) on average; variance lambda D0 E[e^2] /
        # (1 - rho_e)^3). The jumps are rare and long (skewed): a compound Poisson law, not
        # a normal; the sub-busy periods' own spread (the rest of the variance) is normal.
        rho_e = np.clip(fin(lam * (extra * p_w).sum(axis=-1)), 0.0, 0.95)
        d0 = fin(self.dec_tokens * tau) * (1.0 - rho_e)
        jumps = fin(extra) / (1.0 - rho_e)[..., None]
        arrivals = _compound_term(fin(lam) * d0, jumps, p_w)
        var_pf = fin(lam * d0 * (extra**2 * p_w).sum(axis=-1) * rho_e / (1.0 - rho_e) ** 3)
        slope = self._decode(b + 1.0) - t_dec
        # The batch feeds back on itself: more sequences, slower steps, longer stays. With
        # kappa = b T'(b) / tau (the step's elasticity in the batch), the linear-noise
        # approximation of the batch's birth-death process (van Kampen, Stochastic Processes in
        # Physics and Chemistry, ch. X) gives variance b / (1 - kappa) and correlation time
        # D / (1 - kappa); averaged over a window D, an exponentially correlated process keeps
        # g(x) = 2 (x - 1 + e^-x) / x^2 of its variance (x = 1 - kappa: ox). Relative to no
        # feedback (x = 1, where the M/G/inf window average is (2/3) b) that is the factor
        # g(1 - kappa) / ((1 - kappa) g(1)).
        ox = np.clip(1.0 - fin(b * slope / np.maximum(tau, 1e-12)), 0.05, 1.0)
        gain = 2 * (ox - 1 + np.exp(-ox)) / ox**2 / (ox * 2 * math.exp(-1.0))
        var_b = (self.dec_tokens * slope) ** 2 * (2.0 / 3.0) * b * gain
        out_len, o_w = _strata_lengths(out)
        decode = np.maximum(out_len - 1.0, 0.0) * fin(x.gap)[..., None]
        e2e = _sum_law([_Term(ttft.offset, 0.0), ttft.as_term(), _values_term(decode, o_w),
                        arrivals, _normal_term(np.sqrt(fin(np.maximum(var_pf + var_b, 0.0))))],
                       shape)
        return (dict(zip(levels["ttft_s"], ttft.quantiles(
            tuple(QUANTILES[k] for k in levels["ttft_s"])), strict=True)),
            dict(zip(levels["e2e_s"], e2e.quantiles(tuple(QUANTILES[k] for k in levels["e2e_s"])),
                     strict=True)))

    # -- public ------------------------------------------------------------------------------
    def at_rate(self, rate_per_s: ArrayLike, metrics: Collection[str] | None = None
                ) -> dict[str, Any]:
        """Latency and throughput at an open-loop Poisson arrival rate (array-friendly).

        metrics: the latency keys ("ttft_s", "e2e_s", ...) whose p99 alone the caller reads (a
        planner's SLO check): TTFT's and E2E's other quantiles, and E2E's p99 unless named,
        are left out (the sums' laws are most of the cost); the values computed are the same.
        None: everything."""
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return self._at_rate(rate_per_s, metrics)

    def _at_rate(self, rate_per_s: ArrayLike, metrics: Collection[str] | None = None
                 ) -> dict[str, Any]:
        lam = np.asarray(rate_per_s, float)
        lam = np.broadcast_to(lam, np.broadcast_shapes(lam.shape, np.shape(self.cap))).copy()
        tau, exists = self._fixed_point(lam)
        s = self._mean_step(lam, tau)
        b, budget, t_dec, t_pf = s["b"], s["budget"], s["t_dec"], s["t_pf"]
        inp, out = self.pf, self.out  # prefill work: the uncached prompt tokens
        # Own prefill: one mixed step when the prompt fits the budget, else full chunks.
        t_full = self._mixed(b, budget)

        def own(i: float) -> np.ndarray:
            return np.where(i <= budget, self._mixed(b, np.minimum(i, budget)),
                            i / budget * t_full)

        own_mean = own(inp.mean)
        # Prefill queue (M/G/1 over prompt tokens at the full-chunk rate R).
        r = budget / t_full
        rho_p = lam * inp.mean / r
        cs2_p = inp.var / max(inp.mean**2, 1e-12)
        kingman_p = (self.ca2 + cs2_p) / (1 + cs2_p)  # Kingman: G/G/1 wait ~ (ca2+cs2)/2 scaling
        wq_p = np.where(rho_p < 1, kingman_p * lam * inp.mean_sq / r**2 / (
            2 * np.maximum(1 - rho_p, 1e-9)), np.inf)
        # Concurrency cap (M/G/c): a request holds a slot for its prefill and its decode.
        gap = self.token_gap(s, tau)
        slot_s = own_mean + self.dec_tokens * gap
        a = lam * slot_s
        c = np.maximum(self.cap, 1.0)
        p_wait = np.where(a < c, _poisson_erlang_c(c, a), 1.0)
        cs2 = (out.var * tau**2) / np.maximum(slot_s**2, 1e-12)
        wq_c = np.where(a < c, p_wait * slot_s / np.maximum(c - a, 1e-9) * (self.ca2 + cs2) / 2,
                        np.inf)
        stable = (exists & (rho_p < 1) & (a < c) & (lam * inp.mean * tau < budget)
                  & self.whole_prompts_fit)
        # Unstable rows are reported as inf below; give them m = 0 so that the compound-Poisson
        # sum does not loop over ~m terms for an absurd rate (1e9 req/s took minutes, 7 GB).
        m_chunks = np.where(stable, lam * tau * s["n"], 0.0)
        res: dict[str, Any] = {"stable": stable, "step_s": tau, "decode_step_s": t_dec,
                               "prefill_step_s": t_pf, "prefill_step_frac": s["f"]}
        ttft: dict[str, Any] = {"mean": tau / 2 + wq_p + own_mean + wq_c
                                + self.step.request_overhead_s}
        tbt: dict[str, Any] = {"mean": gap}
        e2e: dict[str, Any] = {"mean": ttft["mean"] + self.dec_tokens * gap}
        # TBT: every gap is one step. The number K of prefill chunks landing in a step is
        # Poisson with mean m = lambda * tau * E[chunks]; the step carries the sum of K chunk
        # sizes (capped by the budget). The p-quantile gap is the step carrying the p-quantile
        # of that compound sum: exact for K <= 1 (the prompt-length distribution), normal for
        # K >= 2. Its quantile grows with m, so TBT tails grow with load.
        prev_tbt = None
        moments = _chunk_moments(inp, budget)
        # A caller reading p99s alone gets the p99 alone: the lower quantiles only guard the
        # ordering, which the mixture already gives (a higher level's token quantile is never
        # lower, and a step with more tokens is never faster).
        tbt_levels = QUANTILES if metrics is None else {"p99": QUANTILES["p99"]}
        for name, p in tbt_levels.items():
            tokens = chunk_sum_quantile(m_chunks, p, inp, budget, moments=moments)
            pf = self._mixed(b, np.maximum(tokens, 1.0))
            # Prefill-first: the prefill step is extra to the decoders' gap, not instead of one.
            hit = t_dec + pf if self.policy.prefill_first else np.maximum(t_dec, pf)
            tbt[name] = np.where(tokens < 0.5, t_dec, hit)
            if prev_tbt is not None:  # quantiles are ordered by construction of the mixture
                tbt[name] = np.maximum(tbt[name], prev_tbt)
            prev_tbt = tbt[name]
        levels = {k: tuple(QUANTILES) if metrics is None else ("p99",) * (k in metrics)
                  for k in ("ttft_s", "e2e_s")}
        if levels["ttft_s"] or levels["e2e_s"]:
            ttft_q, e2e_q = self._sum_quantiles(_Terms(
                lam, tau, b, budget, t_dec, t_full, rho_p, wq_p, p_wait, wq_c, m_chunks,
                moments[0], gap), levels)
            ttft.update(ttft_q)
            e2e.update(e2e_q)
        # the mean of the shared-step term of _sum_quantiles (m chunks of the mean size)
        shared_mean = np.minimum(m_chunks * moments[0], budget) * np.maximum(
            t_full - t_dec, 0.0) / budget
        ttft["mean"] = ttft["mean"] + shared_mean
        e2e["mean"] = e2e["mean"] + shared_mean
        running = b + lam * own_mean
        state = np.asarray(self.limits.state_tokens_per_seq, float)
        kv_used = b * (self.ctx_mean + state) + lam * own_mean * (self.inp.mean + state)
        b_p99 = b + Z99 * np.sqrt(b)  # normal approximation of the Poisson p99
        kv_cap = np.maximum(np.asarray(self.limits.kv_cache_tokens, float), 1.0)
        res.update({
            "ttft_s": ttft, "tbt_s": tbt, "e2e_s": e2e,
            "requests_per_s": lam, "output_tokens_per_s": lam * out.mean,
            "input_tokens_per_s": lam * self.inp.mean, "mean_running_batch": running,
            "preemptions": np.zeros_like(lam),
            "kv_mean_utilization": kv_used / kv_cap,
            "kv_peak_utilization": np.minimum(b_p99 * (self.ctx_mean + state) / kv_cap + (
                lam * own_mean * (self.inp.mean + state)) / kv_cap, 1.0),
            "concurrency_cap": c, "prefill_utilization": rho_p, "slot_utilization": a / c,
        })
        if self.prefix.active:
            res["cached_tokens_per_request"] = np.full_like(lam, self.cached)
        # TPOT (one request's mean gap): its mean is the mean gap; its p99 is at most TBT's
        # (a mean of gaps never exceeds their largest), the conservative bound used here
        # (plan/slo.py; the simulator measures TPOT itself).
        res["tpot_s"] = {k: tbt[k] for k in ("mean", "p99") if k in tbt}
        for key in ("ttft_s", "tbt_s", "tpot_s", "e2e_s"):
            res[key] = {k: np.where(stable, v, np.inf) for k, v in res[key].items()}
        return res

    def stable(self, rate_per_s: ArrayLike) -> np.ndarray:
        """The stability test of at_rate() alone (cheaper: no percentiles)."""
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            lam = np.asarray(rate_per_s, float)
            lam = np.broadcast_to(lam, np.broadcast_shapes(lam.shape, np.shape(self.cap))).copy()
            tau, exists = self._fixed_point(lam, every_row=False)
            s = self._mean_step(lam, tau)
            b, budget = s["b"], s["budget"]
            t_full = self._mixed(b, budget)
            pf = self.pf.mean
            rho_p = lam * pf * t_full / budget
            own_mean = np.where(pf <= budget, self._mixed(b, np.minimum(pf, budget)),
                                pf / budget * t_full)
            a = lam * (own_mean + self.dec_tokens * tau)
            return self.whole_prompts_fit & exists & (rho_p < 1) & (
                a < np.maximum(self.cap, 1.0)) & (
                lam * pf * tau < budget)

    def capacity_rate(self) -> np.ndarray:
        """Largest stable arrival rate (requests/s), by bisection on the stability test."""
        lo = np.zeros(np.shape(self.cap))
        # Upper bounds: a step computes at most mnbt tokens and lasts at least a 1-token step;
        # prompts go no faster than full-budget prefill chunks.
        one = self._decode(np.ones_like(lo))
        full = self._mixed(np.zeros_like(lo), self.mnbt)
        per_req = max(self.pf.mean + self.dec_tokens, 1.0)
        hi = np.minimum(self.mnbt / np.maximum(one, 1e-9) / per_req,
                        self.mnbt / np.maximum(full, 1e-9) / max(self.pf.mean, 1.0))
        hi = np.broadcast_to(hi * 1.05, lo.shape).copy()
        for _ in range(13):
            mid = 0.5 * (lo + hi)
            ok = self.stable(mid)
            lo = np.where(ok, mid, lo)
            hi = np.where(ok, hi, mid)
        return lo


def summarize(res: dict[str, Any], index: Any = ()) -> dict[str, Any]:
    """Plain floats of one element of an at_rate() result (for JSON)."""
    out: dict[str, Any] = {}
    for k, v in res.items():
        if isinstance(v, dict):
            out[k] = {kk: float(np.asarray(vv)[index]) for kk, vv in v.items()}
        elif isinstance(v, np.ndarray | float | int | np.floating | np.bool_):
            a = np.asarray(v)[index]
            out[k] = bool(a) if a.dtype == bool else float(a)
        else:
            out[k] = v
    return out
