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

from capplan.models.queueing.special import log_factorial

_LATTICE = 128
"""Points of the lattice of the work beyond x (the gap's law is read off it)."""
_K_MAX = 192
"""Most arrivals counted in one gap (rows that need more are next to saturation: the mass
beyond is left out, which only raises their quantiles)."""
_SPAN_SD = 8.0
"""The lattice reaches the busy period's mean plus this many standard deviations."""


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


def busy_period_quantiles(x: np.ndarray, lam: np.ndarray, jumps: np.ndarray,
                          weights: np.ndarray, probs: Sequence[float]) -> list[np.ndarray]:
    """Quantiles at `probs` of the busy period B(x) (module docstring): initial work x (...,),
    Poisson arrivals at rate lam (...,), each bringing work drawn from `jumps` (..., m) with
    probabilities `weights` (m,). A level the lattice does not reach (the load next to
    saturation) reads its end."""
    shape = np.shape(x)
    x = np.maximum(np.asarray(x, float).reshape(-1), 1e-12)
    lam = np.broadcast_to(np.asarray(lam, float), shape).reshape(-1)
    s = np.broadcast_to(np.asarray(jumps, float), shape + np.shape(jumps)[-1:]).reshape(
        x.size, -1)
    w = np.asarray(weights, float)
    # the lattice spans the busy period's mean x / (1 - rho) and sd (x lambda E[S^2] /
    # (1 - rho)^3)^(1/2) (Takacs; Kleinrock vol. 1, 5.8), rho held under 0.95 for the span only
    rho = np.minimum(lam * (s * w).sum(-1), 0.95)
    sd = np.sqrt(x * lam * (s * s * w).sum(-1) / (1 - rho) ** 3)
    span = x * rho / (1 - rho) + _SPAN_SD * sd + 2 * s.max(-1)
    h = np.maximum(span / (_LATTICE - 2), 1e-12)
    u = x[:, None] + np.arange(_LATTICE) * h[:, None]  # u_n = x + n h
    lu = lam[:, None] * u
    log_lu = np.log(np.maximum(lu, 1e-300))
    # k = 0: no arrival, B = x (the point n = 0, where x / u_0 = 1)
    p = np.zeros_like(u)
    p[:, 0] = np.exp(-lu[:, 0])
    spec = np.fft.rfft(_lattice_pmf(s, w, h), 2 * _LATTICE, axis=-1)  # no wrap-around
    power = np.ones_like(spec)
    top = float(np.max(lu[:, -1], initial=0.0))
    k_max = min(_K_MAX, int(top + 8 * np.sqrt(top) + 6))
    for k in range(1, k_max + 1):
        power = power * spec
        conv = np.maximum(np.fft.irfft(power, 2 * _LATTICE, axis=-1)[:, :_LATTICE], 0.0)
        p += np.exp(k * log_lu - lu - log_factorial(np.asarray(k))) * conv
    p *= x[:, None] / u
    cdf = np.cumsum(p, axis=-1)
    out = []
    for q in probs:
        j = np.minimum((cdf < q).sum(-1), _LATTICE - 1)  # first point with cdf >= q
        below = np.where(j > 0, np.take_along_axis(cdf, np.maximum(j - 1, 0)[:, None], -1)[:, 0],
                         0.0)
        at = np.take_along_axis(cdf, j[:, None], -1)[:, 0]
        frac = np.clip((q - below) / np.maximum(at - below, 1e-30), 0.0, 1.0)
        # the cdf rises linearly from point j - 1 to point j (point 0 is the atom at x)
        n = np.where(j > 0, j - 1 + frac, 0.0)
        out.append((x + n * h).reshape(shape))
    return out
