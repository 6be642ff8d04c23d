"""The token gap of a prefill-first engine: a busy period of the prefill server.

A prefill-first scheduler (SGLang `Scheduler.get_next_batch_to_run`: a prefill batch whenever
one can be formed, the decode batch otherwise) runs a decode step, then prefill-only steps for
every prompt that arrived meanwhile, and for the prompts that arrive during those steps, until
none waits; only then the next decode step. A decoder's gap, from the start of one decode
step to the start of the next (the same length as between their ends), is therefore the busy
period B(x) of a single server that starts with the work x of the decode step and serves the
prompts of a Poisson(lambda) stream, each its prefill time S (docs/queueing.md, "TBT").

Takacs' busy-period theorem (Takacs 1962, Introduction to the Theory of Queues, ch. 2;
Kemperman's hitting-time theorem for lattice jumps): with A(u) the work that arrives in time
u (compound Poisson: N ~ Poisson(lambda u) jumps S),

    P(B(x) = x + y) = x / (x + y) * P(A(x + y) = y),

so on a lattice of step h, P(B = x + n h) = x / u_n * sum_k Poisson(k; lambda u_n) f^{*k}(n)
with u_n = x + n h and f^{*k} the k-fold convolution of the prefill times' lattice pmf.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from capplan.models.queueing.special import poisson_pmf

_LATTICE = 64
"""Points of the lattice of the work beyond x (the gap's law is read off it)."""
_K_MAX = 192
"""Most arrivals counted in one gap (rows that need more are next to saturation: the mass
beyond is left out, which only raises their quantiles)."""
_SPAN_SD = 5.0
"""The lattice reaches the busy period's mean plus this many standard deviations and the
longest prompt (rows whose highest level lies beyond: on a lattice _WIDER times as wide)."""
_WIDER = 4.0
_K_ONE_MAX = 1024
"""Most arrivals counted in one gap when every prompt brings the same work."""


def _lattice_pmf(jumps: np.ndarray, weights: np.ndarray, h: np.ndarray) -> np.ndarray:
    """pmf (rows, L) of the jumps (rows, m) with probabilities weights (m,) on the lattice of
    step h (rows,): a value between two points splits its mass between them (linear
    binning, so the law moves continuously with the values)."""
    rows = jumps.shape[0]
    pos = np.clip(jumps / h[:, None], 0, _LATTICE - 2)
    i0 = pos.astype(np.int64)
    frac = pos - i0
    flat = (i0 + np.arange(rows)[:, None] * _LATTICE).ravel()
    w = np.broadcast_to(weights, i0.shape)
    size = rows * _LATTICE
    pmf = (np.bincount(flat, (w * (1 - frac)).ravel(), minlength=size)
           + np.bincount(flat + 1, (w * frac).ravel(), minlength=size))
    return pmf.reshape(rows, _LATTICE)


def _rows(x: np.ndarray, lam: np.ndarray, jumps: np.ndarray, weights: np.ndarray) -> tuple:
    """(shape, x, lam, jumps, weights, rho) as 1-D rows (jumps (rows, m)): the arguments of the
    busy-period laws. The lattice spans the busy period's mean x / (1 - rho) and sd
    (x lambda E[S^2] / (1 - rho)^3)^(1/2) (Takacs; Kleinrock vol. 1, 5.8), rho held under 0.95
    for the span only."""
    shape = np.shape(x)
    x = np.maximum(np.asarray(x, float).reshape(-1), 1e-12)
    lam = np.broadcast_to(np.asarray(lam, float), shape).reshape(-1)
    s = np.broadcast_to(np.asarray(jumps, float), shape + np.shape(jumps)[-1:]).reshape(
        x.size, -1)
    w = np.asarray(weights, float)
    return shape, x, lam, s, w, np.minimum(lam * (s * w).sum(-1), 0.95)


def busy_period_quantiles(x: np.ndarray, lam: np.ndarray, jumps: np.ndarray,
                          weights: np.ndarray, probs: Sequence[float]) -> list[np.ndarray]:
    """Quantiles at `probs` of the busy period B(x) (module docstring): initial work x (...,),
    Poisson arrivals at rate lam (...,), each bringing work drawn from `jumps` (..., m) with
    probabilities `weights` (m,). A level the lattice does not reach (the load next to
    saturation) reads its end."""
    shape, x, lam, s, w, rho = _rows(x, lam, jumps, weights)
    if np.all(s == s[:, :1]):  # one prompt length: the exact law, atoms at x + k S
        return _one_length(x, lam, s[:, 0], rho, probs, shape)
    span = _busy_span(x, lam, s, w, rho)
    cdf, h = _busy_cdf(x, lam, s, w, span)
    short = cdf[:, -1] < max(probs, default=0.0)
    if np.any(short):  # a tail longer than the span allowed for: those rows on a wider one
        cdf[short], h[short] = _busy_cdf(x[short], lam[short], s[short], w,
                                         span[short] * _WIDER)
    return _lattice_quantiles(x, cdf, h, probs, shape)


def _busy_span(x: np.ndarray, lam: np.ndarray, s: np.ndarray, w: np.ndarray,
               rho: np.ndarray) -> np.ndarray:
    """The lattice's span for B(x): its mean beyond x, x rho / (1 - rho), _SPAN_SD sd and the
    longest jump (`_rows`: the moments)."""
    sd = np.sqrt(x * lam * (s * s * w).sum(-1) / (1 - rho) ** 3)
    return x * rho / (1 - rho) + _SPAN_SD * sd + s.max(-1)


def _served_law(x: np.ndarray, lam: np.ndarray, work: np.ndarray, rho: np.ndarray
                ) -> tuple[int, np.ndarray, np.ndarray]:
    """(k_max, t, p) of B(x) when every arrival brings the same work S: B = t_k = x + k S with
    probability p_k = x / t_k Poisson(k; lambda t_k), k = 0..k_max, counted up to 8 sd above
    the mean number served, lambda x / (1 - rho), of variance lambda x / (1 - rho)^3."""
    served = lam * x / (1 - rho)
    k_max = int(np.clip(np.max(served + 8 * np.sqrt(served / (1 - rho) ** 2), initial=0.0) + 8,
                        8, _K_ONE_MAX))
    k = np.arange(k_max + 1)
    t = x[:, None] + k * work[:, None]
    return k_max, t, x[:, None] / t * poisson_pmf(k, lam[:, None] * t)


def _one_length(x: np.ndarray, lam: np.ndarray, work: np.ndarray, rho: np.ndarray,
                probs: Sequence[float], shape: tuple[int, ...]) -> list[np.ndarray]:
    """Quantiles of B(x) when every arrival brings the same work S (rows of 1-D arrays): B is
    x + k S with probability x / (x + k S) Poisson(k; lambda (x + k S)) (the theorem with f^{*k}
    a unit mass at k S), counted up to 8 sd above the mean number served, lambda x / (1 - rho),
    of variance lambda x / (1 - rho)^3 (rho held under 0.95 for the count only; a level the
    count does not reach reads its last atom)."""
    _k_max, _t, p = _served_law(x, lam, work, rho)
    return _atom_quantiles(x, work, np.cumsum(p, axis=-1), probs, shape)


def _atom_quantiles(x: np.ndarray, work: np.ndarray, cdf: np.ndarray, probs: Sequence[float],
                    shape: tuple[int, ...]) -> list[np.ndarray]:
    """Quantiles at `probs` of a law on the atoms x + j S (cdf over j = 0, 1, ...): the first
    atom where the cdf reaches the level; a level the atoms do not reach reads the last."""
    out = []
    for q in probs:
        j = np.minimum((cdf < q).sum(-1), cdf.shape[-1] - 1)
        out.append((x + j * work).reshape(shape))
    return out


def _busy_cdf(x: np.ndarray, lam: np.ndarray, s: np.ndarray, w: np.ndarray,
              span: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(cdf at x + n h for n < _LATTICE, h) of B(x) on the lattice of step h = span / (L - 2)
    (rows of 1-D x, lam, span; jumps s (rows, m))."""
    # h on a ladder of ratio 2^(1/32): a row's lattice stays put while its rate moves a little
    # (a lattice that moved with the rate would move the atoms' binning, and the quantiles)
    h = np.exp2(np.ceil(np.log2(np.maximum(span / (_LATTICE - 2), 1e-12)) * 32) / 32)
    u = x[:, None] + np.arange(_LATTICE) * h[:, None]  # u_n = x + n h
    lu = lam[:, None] * u
    # the arrivals a row needs counted: up to 6 sd above the most expected, lambda u_max (the
    # Poisson mass beyond is under 1e-8); rows sorted by it, most first, so that the rows still
    # counting at k are a leading slice
    need = np.minimum(lu[:, -1] + 6 * np.sqrt(lu[:, -1]) + 4, _K_MAX).astype(np.int64)
    order = np.argsort(-need, kind="stable")
    lu_s, need_s = lu[order], need[order]
    spec = np.fft.rfft(_lattice_pmf(s[order], w, h[order]).astype(np.float32), 2 * _LATTICE,
                       axis=-1)  # twice the lattice: no wrap-around; single precision (a cdf)
    # k = 0: no arrival, B = x (the point n = 0, where x / u_0 = 1)
    p = np.zeros_like(u)
    p[:, 0] = np.exp(-lu_s[:, 0])
    pois = np.exp(-lu_s)  # Poisson(k; lambda u_n), updated by the ratio lambda u_n / k
    power = np.ones_like(spec)
    for k in range(1, int(need_s[0]) + 1 if need_s.size else 0):
        m = int(np.searchsorted(-need_s, -k, side="right"))  # rows with need >= k
        power = power[:m] * spec[:m]
        pois = pois[:m] * (lu_s[:m] / k)
        conv = np.fft.irfft(power, 2 * _LATTICE, axis=-1)[:, :_LATTICE]
        p[:m] += pois * np.maximum(conv, 0.0)
    p[order] = p.copy()
    p *= x[:, None] / u
    return np.cumsum(p, axis=-1), h


def lagged_busy_period_quantiles(x: np.ndarray, lam: np.ndarray, jumps: np.ndarray,
                                 weights: np.ndarray, carry: np.ndarray,
                                 probs: Sequence[float]) -> list[np.ndarray]:
    """Quantiles at `probs` of the gap of a prefill-first engine that forms each step a step
    ahead (SchedulerPolicy.schedules_ahead): G = x when no prompt is carried in (N = 0), else
    B(x) + the work of the N carried prompts, N independent of B(x), with P(N = n) =
    carry[..., n] (n = 0, 1, ...; docs in latency.QueueModel._prefill_first_tbt). Arguments
    otherwise as `busy_period_quantiles`."""
    shape, x, lam, s, w, rho = _rows(x, lam, jumps, weights)
    pn = np.asarray(carry, float).reshape(x.size, -1)
    if np.all(s == s[:, :1]):  # one prompt length: atoms at x + k S
        return _lagged_one_length(x, lam, s[:, 0], rho, pn, probs, shape)
    mean_s, sq_s = (s * w).sum(-1), (s * s * w).sum(-1)
    n = np.arange(pn.shape[1])
    mean_n, sq_n = (pn * n).sum(-1), (pn * n * n).sum(-1)
    # the span of B(x) plus that of the carried work (a compound sum: its mean, _SPAN_SD sd and
    # the longest jump)
    sd_c = np.sqrt(np.maximum(mean_n * (sq_s - mean_s ** 2) + (sq_n - mean_n ** 2) * mean_s ** 2,
                              0.0))
    span = (_busy_span(x, lam, s, w, rho) + mean_n * mean_s + _SPAN_SD * sd_c + s.max(-1))
    cdf, h = _lagged_cdf(x, lam, s, w, pn, span)
    short = cdf[:, -1] < max(probs, default=0.0)
    if np.any(short):  # a tail longer than the span allowed for: those rows on a wider one
        cdf[short], h[short] = _lagged_cdf(x[short], lam[short], s[short], w, pn[short],
                                           span[short] * _WIDER)
    return _lattice_quantiles(x, cdf, h, probs, shape)


def _lagged_cdf(x: np.ndarray, lam: np.ndarray, s: np.ndarray, w: np.ndarray, pn: np.ndarray,
                span: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(cdf at x + n h, h) of `lagged_busy_period_quantiles`' G: B(x)'s lattice law
    (`_busy_cdf`) convolved with the carried work's, sum_(n >= 1) P(N = n) f^{*n}, plus the
    atom P(N = 0) at x."""
    cdf_b, h = _busy_cdf(x, lam, s, w, span)
    pmf_b = np.diff(cdf_b, prepend=0.0, axis=-1)
    spec = np.fft.rfft(_lattice_pmf(s, w, h), 2 * _LATTICE, axis=-1)
    carried = np.zeros_like(spec)
    power = np.ones_like(spec)
    for k in range(1, pn.shape[1]):
        power = power * spec
        carried += pn[:, k:k + 1] * power
    conv = np.fft.irfft(np.fft.rfft(pmf_b, 2 * _LATTICE, axis=-1) * carried, 2 * _LATTICE,
                        axis=-1)[:, :_LATTICE]
    pmf = np.maximum(conv, 0.0)
    pmf[:, 0] += pn[:, 0]
    return np.cumsum(pmf, axis=-1), h


def _lagged_one_length(x: np.ndarray, lam: np.ndarray, work: np.ndarray, rho: np.ndarray,
                       pn: np.ndarray, probs: Sequence[float], shape: tuple[int, ...]
                       ) -> list[np.ndarray]:
    """`lagged_busy_period_quantiles` when every prompt brings the same work S: G = x + J S,
    J = 0 when N = 0, else K + N with K the prompts B(x) serves (`_one_length`'s law)."""
    k_max, _t, p_k = _served_law(x, lam, work, rho)
    n_max = pn.shape[1] - 1
    p_j = np.zeros((x.size, k_max + n_max + 1))
    p_j[:, 0] = pn[:, 0]
    for n in range(1, n_max + 1):
        p_j[:, n:n + k_max + 1] += pn[:, n:n + 1] * p_k
    return _atom_quantiles(x, work, np.cumsum(p_j, axis=-1), probs, shape)


def _lattice_quantiles(x: np.ndarray, cdf: np.ndarray, h: np.ndarray, probs: Sequence[float],
                       shape: tuple[int, ...]) -> list[np.ndarray]:
    """Quantiles at `probs` of a law whose cdf is given at x + n h (n < _LATTICE): the cdf
    rises linearly from point j - 1 to point j (point 0 is the atom at x); a level the lattice
    does not reach reads its end."""
    out = []
    for q in probs:
        j = np.minimum((cdf < q).sum(-1), _LATTICE - 1)  # first point with cdf >= q
        below = np.where(j > 0, np.take_along_axis(cdf, np.maximum(j - 1, 0)[:, None], -1)[:, 0],
                         0.0)
        at = np.take_along_axis(cdf, j[:, None], -1)[:, 0]
        frac = np.clip((q - below) / np.maximum(at - below, 1e-30), 0.0, 1.0)
        n = np.where(j > 0, j - 1 + frac, 0.0)
        out.append((x + n * h).reshape(shape))
    return out
