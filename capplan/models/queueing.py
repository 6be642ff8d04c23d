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
  Waiting times get exponential tails (exact for M/M/c); percentiles of the sum combine the
  components' excesses over their means in quadrature.
- Unstable (the queue grows without bound) when prefill demand exceeds the token budget,
  the offered load reaches the concurrency cap, or the fixed point does not exist.

All functions broadcast: rates, and the StepModel's constants, may be arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import special

from capplan.models.engine import SchedulerPolicy
from capplan.models.perf import StepModel
from capplan.models.prefix import PrefixCache

QUANTILES = {"p50": 0.50, "p90": 0.90, "p99": 0.99}
Z99 = 2.3263478740408408
"""Standard normal 99th percentile (scipy.stats.norm.ppf(0.99)): the one home of this value."""
_TAU_MAX_S = 60.0
_FP_ITERS = 10


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


def _poisson_erlang_c(c: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Erlang C probability of waiting with c servers and offered load a (< c).

    Erlang B = Poisson pmf(c; a) / cdf(c; a); C = c B / (c - a (1 - B)). The Poisson cdf is the
    regularised upper incomplete gamma Q(c + 1, a).
    """
    c = np.maximum(np.floor(c), 1.0)
    a = np.maximum(np.asarray(a, float), 1e-300)
    pmf = np.exp(c * np.log(a) - a - special.gammaln(c + 1))
    b = pmf / np.maximum(special.gammaincc(c + 1, a), 1e-300)
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

    def cdf(x: np.ndarray) -> np.ndarray:
        if inp.table:
            f1 = np.interp(x, np.asarray(inp.table, float), levels)
        else:
            f1 = (x >= inp.mean).astype(float)
        f1 = np.where(x >= budget, 1.0, f1)
        f = pk[0] + pk[1] * f1
        for k in terms:
            z = (x - k * mu) / np.maximum(np.sqrt(k) * sigma, 1e-9)
            f = f + pk[k] * special.ndtr(z)
        return f

    lo, hi = np.zeros_like(m), budget.astype(float).copy()
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        below = cdf(mid) < p
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return np.where(p <= pk[0], 0.0, hi)


def _exp_tail_quantile(p_wait: np.ndarray, mean_wait: np.ndarray, p: float) -> np.ndarray:
    """Quantile of a wait that is 0 w.p. 1-p_wait, else exponential with the given overall mean."""
    cond_mean = mean_wait / np.maximum(p_wait, 1e-12)
    return np.where(p_wait > 1 - p, cond_mean * np.log(np.maximum(p_wait, 1e-12) / (1 - p)), 0.0)


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
        # An engine reserving a fraction r of the output at admission holds at least I + r O:
        # mean I + O (1 + r) / 2 (TensorRT-LLM's GUARANTEED_NO_EVICT: r = 1, I + O).
        r = min(max(self.policy.reserve_output_frac, 0.0), 1.0)
        # Blocks shared with other running requests are held once (vLLM block_pool.touch).
        mu = max(inp.mean + out.mean * (1 + r) / 2 - self.prefix.shared_kv_tokens_per_seq, 1.0)
        sigma = math.sqrt(inp.var + out.var / 4 + out.mean_sq / 12)
        kv = np.asarray(limits.kv_cache_tokens, float) - self.prefix.resident_kv_tokens
        z = Z99
        root = (-z * sigma + np.sqrt(z * z * sigma * sigma + 4 * mu * np.maximum(kv, 0.0))) / (
            2 * mu)
        kv_cap = root * root
        self.cap = np.maximum(np.minimum(np.asarray(limits.max_num_seqs, float), kv_cap), 0.0)
        self.mnbt = mnbt

    # -- step times ------------------------------------------------------------------------
    def _decode(self, b: np.ndarray) -> np.ndarray:
        w = self.step.window
        return self.step.step(num_decode=b, decode_kv_tokens=b * self.ctx_mean,
                              decode_kv_tokens_window=b * np.minimum(self.ctx_mean, w),
                              detail=False)["step_s"]

    def _mixed(self, b: np.ndarray, chunk: np.ndarray) -> np.ndarray:
        """A step with b decode sequences and one prefill chunk of `chunk` tokens (mean prefix);
        a prefill-first engine runs the chunk alone (the decoders wait)."""
        prefix = self.cached + np.maximum(self.pf.mean - chunk, 0.0) / 2
        if self.policy.prefill_first:
            b = np.zeros_like(np.asarray(b, float))
        return self.step.prefill_chunk(chunk, prefix, num_decode=b,
                                       decode_kv_tokens=b * self.ctx_mean,
                                       detail=False)["step_s"]

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

    def _fixed_point(self, lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean step time solving tau = T(tau), and whether it exists.

        g(tau) = T(tau) - tau is positive at tau = 0 and, when a fixed point exists, negative
        at _TAU_MAX_S. T is close to affine in tau (B and P grow linearly with it), so the
        Illinois variant of regula falsi converges in a few vectorised steps.
        """
        lo = np.zeros(np.broadcast_shapes(np.shape(lam), np.shape(self.cap)))
        g_lo = self._mean_step(lam, lo)["tau"] - lo
        hi = np.full_like(lo, _TAU_MAX_S)
        g_hi = self._mean_step(lam, hi)["tau"] - hi
        exists = g_hi <= 0
        side = np.zeros_like(lo)
        for _ in range(_FP_ITERS):
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

    # -- public ------------------------------------------------------------------------------
    def at_rate(self, rate_per_s: ArrayLike) -> dict[str, Any]:
        """Latency and throughput at an open-loop Poisson arrival rate (array-friendly)."""
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return self._at_rate(rate_per_s)

    def _at_rate(self, rate_per_s: ArrayLike) -> dict[str, Any]:
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
        stable = exists & (rho_p < 1) & (a < c) & (lam * inp.mean * tau < budget)
        # Unstable rows are reported as inf below; give them m = 0 so that the compound-Poisson
        # sum does not loop over ~m terms for an absurd rate (1e9 req/s took minutes, 7 GB).
        m_chunks = np.where(stable, lam * tau * s["n"], 0.0)
        res: dict[str, Any] = {"stable": stable, "step_s": tau, "decode_step_s": t_dec,
                               "prefill_step_s": t_pf, "prefill_step_frac": s["f"]}
        ttft: dict[str, Any] = {"mean": tau / 2 + wq_p + own_mean + wq_c
                                + self.step.request_overhead_s}
        tbt: dict[str, Any] = {"mean": gap}
        e2e: dict[str, Any] = {"mean": ttft["mean"] + self.dec_tokens * gap}
        rho_safe = np.clip(rho_p, 1e-12, 1.0)
        prev_tbt = None
        moments = _chunk_moments(inp, budget)
        for name, p in QUANTILES.items():
            ex = [
                p * tau - tau / 2,
                _exp_tail_quantile(rho_safe, wq_p, p) - wq_p,
                own(inp.q[name]) - own_mean,
                _exp_tail_quantile(p_wait, wq_c, p) - wq_c,
            ]
            excess = np.sqrt(sum(np.maximum(x, 0.0) ** 2 for x in ex))
            ttft[name] = ttft["mean"] + excess
            # TBT: every gap is one step. The number K of prefill chunks landing in a step is
            # Poisson with mean m = lambda * tau * E[chunks]; the step carries the sum of K
            # chunk sizes (capped by the budget). The p-quantile gap is the step carrying the
            # p-quantile of that compound sum: exact for K <= 1 (the prompt-length
            # distribution), normal for K >= 2. Its quantile grows with m, so TBT tails grow
            # with load.
            tokens = chunk_sum_quantile(m_chunks, p, inp, budget, moments=moments)
            tbt[name] = np.where(tokens < 0.5, t_dec,
                                 np.maximum(t_dec, self._mixed(b, np.maximum(tokens, 1.0))))
            if prev_tbt is not None:  # quantiles are ordered by construction of the mixture
                tbt[name] = np.maximum(tbt[name], prev_tbt)
            prev_tbt = tbt[name]
            dec_excess = max(out.q[name] - out.mean, 0.0) * tau
            e2e[name] = e2e["mean"] + np.sqrt(excess**2 + dec_excess**2)
        running = b + lam * own_mean
        kv_used = b * self.ctx_mean + lam * own_mean * self.inp.mean
        b_p99 = b + Z99 * np.sqrt(b)  # normal approximation of the Poisson p99
        kv_cap = np.maximum(np.asarray(self.limits.kv_cache_tokens, float), 1.0)
        res.update({
            "ttft_s": ttft, "tbt_s": tbt, "e2e_s": e2e,
            "requests_per_s": lam, "output_tokens_per_s": lam * out.mean,
            "input_tokens_per_s": lam * self.inp.mean, "mean_running_batch": running,
            "preemptions": np.zeros_like(lam),
            "kv_mean_utilization": kv_used / kv_cap,
            "kv_peak_utilization": np.minimum(b_p99 * self.ctx_mean / kv_cap + (
                lam * own_mean * self.inp.mean) / kv_cap, 1.0),
            "concurrency_cap": c, "prefill_utilization": rho_p, "slot_utilization": a / c,
        })
        if self.prefix.active:
            res["cached_tokens_per_request"] = np.full_like(lam, self.cached)
        for key in ("ttft_s", "tbt_s", "e2e_s"):
            res[key] = {k: np.where(stable, v, np.inf) for k, v in res[key].items()}
        return res

    def stable(self, rate_per_s: ArrayLike) -> np.ndarray:
        """The stability test of at_rate() alone (cheaper: no percentiles)."""
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            lam = np.asarray(rate_per_s, float)
            lam = np.broadcast_to(lam, np.broadcast_shapes(lam.shape, np.shape(self.cap))).copy()
            tau, exists = self._fixed_point(lam)
            s = self._mean_step(lam, tau)
            b, budget = s["b"], s["budget"]
            t_full = self._mixed(b, budget)
            pf = self.pf.mean
            rho_p = lam * pf * t_full / budget
            own_mean = np.where(pf <= budget, self._mixed(b, np.minimum(pf, budget)),
                                pf / budget * t_full)
            a = lam * (own_mean + self.dec_tokens * tau)
            return exists & (rho_p < 1) & (a < np.maximum(self.cap, 1.0)) & (
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

    def closed_loop(self, concurrency: float) -> dict[str, Any]:
        """C clients, each sending its next request when its last one ends (no think time).

        The arrival rate solves lambda = C / (E2E(lambda) + slot wait); clients beyond the
        concurrency cap wait in the queue (closed network, Little's law).
        """
        conc = float(concurrency)
        lo, hi = 1e-9, conc / max(float(self.at_rate(1e-9)["e2e_s"]["mean"]), 1e-9)
        for _ in range(36):
            lam = 0.5 * (lo + hi)
            r = self._closed_at(lam, conc)
            implied = conc / r["e2e_s"]["mean"] if np.isfinite(r["e2e_s"]["mean"]) else 0.0
            lo, hi = (lam, hi) if implied > lam else (lo, lam)
        return self._closed_at(lo, conc)

    def _closed_at(self, lam: float, conc: float) -> dict[str, Any]:
        # In a closed loop the open-loop queueing terms do not apply: at most C requests exist.
        # Model the decode batch as min(C, cap) and the prefill queue as the C clients' work.
        cap = float(np.min(self.cap))
        r = self.at_rate(np.asarray(lam))
        queue_extra = max(conc - cap, 0.0) / max(lam, 1e-12)
        for key in ("ttft_s", "e2e_s"):
            r[key] = {k: float(v) + queue_extra for k, v in r[key].items()}
        r["concurrency"] = conc
        return r


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
