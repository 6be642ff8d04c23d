"""Arrival processes and the laws they induce on one replica.

Open-loop arrivals are Poisson (or G/G with a squared coefficient of variation ca2, Kingman's
correction): the probability that a request waits for one of c slots (Erlang C), the mean waits
of the prefill queue (M/G/1, Pollaczek-Khinchine) and of the slot queue (M/G/c, Allen-Cunneen),
and the law of the prompt tokens that Poisson arrivals put into one step (compound Poisson).
Derivations: docs/queueing.md.
"""

from __future__ import annotations

import numpy as np

from capplan.models.queueing.laws import LengthStats
from capplan.models.queueing.special import ndtr, poisson_cdf, poisson_pmf


def _poisson_erlang_c(c: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Erlang C probability of waiting with c servers and offered load a (< c).

    Erlang B = Poisson pmf(c; a) / cdf(c; a); C = c B / (c - a (1 - B)). The Poisson cdf is the
    regularised upper incomplete gamma Q(c + 1, a).
    """
    c = np.maximum(np.floor(c), 1.0)
    a = np.maximum(np.asarray(a, float), 1e-300)
    pmf = poisson_pmf(c, a)
    # Q only where it is not 1 to double precision and B depends on it: where pmf underflows,
    # B = 0 whatever Q is; where a < c the tail beyond c, 1 - Q, is under pmf a / (c + 1 - a)
    # (a geometric series bounds the Poisson terms after c), and under 1e-17 Q rounds to 1
    need = (pmf > 0) & ~((a < c) & (pmf * a < 1e-17 * (c + 1 - a)))
    q = np.ones(np.shape(pmf))
    q[need] = poisson_cdf(np.broadcast_to(c, q.shape)[need], np.broadcast_to(a, q.shape)[need],
                          pmf[need])
    b = pmf / np.maximum(q, 1e-300)
    return np.clip(c * b / np.maximum(c - a * (1 - b), 1e-12), 0.0, 1.0)


def prefill_wait_s(lam: np.ndarray, inp: LengthStats, rate_tokens_per_s: np.ndarray,
                   ca2: float) -> tuple[np.ndarray, np.ndarray]:
    """Utilisation and mean wait of the prefill queue: M/G/1 over prompt tokens served at
    `rate_tokens_per_s` (full-budget chunks), Pollaczek-Khinchine's mean wait
    lambda E[S^2] / (2 (1 - rho)) scaled by Kingman's G/G factor (ca2 + cs2) / (1 + cs2)
    (Kingman 1961); inf when rho >= 1."""
    r = rate_tokens_per_s
    rho_p = lam * inp.mean / r
    cs2_p = inp.var / max(inp.mean**2, 1e-12)
    kingman_p = (ca2 + cs2_p) / (1 + cs2_p)  # Kingman: G/G/1 wait ~ (ca2+cs2)/2 scaling
    wq_p = np.where(rho_p < 1, kingman_p * lam * inp.mean_sq / r**2 / (
        2 * np.maximum(1 - rho_p, 1e-9)), np.inf)
    return rho_p, wq_p


def slot_wait_s(a: np.ndarray, c: np.ndarray, slot_s: np.ndarray, cs2: np.ndarray,
                ca2: float) -> tuple[np.ndarray, np.ndarray]:
    """Probability of waiting and mean wait for one of c slots at offered load a = lambda
    slot_s: Erlang C with the Allen-Cunneen G/G/c factor (ca2 + cs2) / 2 (Allen, Probability,
    Statistics and Queueing Theory, 1990); 1 and inf when a >= c."""
    p_wait = np.where(a < c, _poisson_erlang_c(c, a), 1.0)
    wq_c = np.where(a < c, p_wait * slot_s / np.maximum(c - a, 1e-9) * (ca2 + cs2) / 2,
                    np.inf)
    return p_wait, wq_c


def shared_chunks_law(m: np.ndarray, shared_max: int) -> tuple[np.ndarray, np.ndarray,
                                                                np.ndarray, np.ndarray]:
    """Poisson(m) counts of other chunks in a step (m (..., 1)): P(0), P(1), and P(k) for
    k = 2 .. shared_max - 1 with the tail beyond folded into the last; and those k."""
    k = np.arange(2, shared_max)
    pk = poisson_pmf(k, m)
    p0, p1 = np.exp(-m), m * np.exp(-m)
    tail = np.maximum(1 - p0 - p1 - pk.sum(axis=-1, keepdims=True), 0.0)
    pk[..., -1:] += tail
    return p0, p1, pk, k


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
    # terms whose probability is negligible add nothing to F: each row drops its own (so a
    # row's quantile does not depend on the rows evaluated with it)
    terms = [k for k in range(2, kmax + 1) if float(np.max(pk[k], initial=0.0)) > 1e-7]
    for k in terms:
        pk[k] = np.where(pk[k] > 1e-7, pk[k], 0.0)
    levels = np.linspace(0.0, 1.0, 201)
    centres = np.stack([k * mu for k in terms], -1) if terms else None
    scales = np.stack([np.maximum(np.sqrt(k) * sigma, 1e-9) for k in terms], -1) if terms else None

    def cdf(x: np.ndarray) -> np.ndarray:
        if inp.table:
            f1 = np.interp(x, np.asarray(inp.table, float), levels)
        else:
            f1 = (x >= inp.mean).astype(float)
        f1 = np.where(x >= budget, 1.0, f1)
        f = pk[0] + pk[1] * f1
        if terms:  # every k's normal cdf in one evaluation, added in k's order
            phi = ndtr((x[..., None] - centres) / scales)
            for i, k in enumerate(terms):
                f = f + pk[k] * phi[..., i]
        return f

    lo, hi = np.zeros_like(m), budget.astype(float).copy()
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        below = cdf(mid) < p
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return np.where(p <= pk[0], 0.0, hi)
