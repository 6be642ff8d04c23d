"""Latency under load of one replica: means and percentiles of TTFT, TBT, TPOT and E2E.

On top of the steady state (steady.py): the TBT percentiles from the prompt tokens a step carries
(arrivals.chunk_sum_quantile; a prefill-first engine's from the prefill server's busy period,
busy.py), the TTFT and E2E percentiles as laws of sums of independent terms
(sums.py), the waits from the arrival laws (arrivals.py). Derivation: docs/queueing.md.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from capplan.models.queueing.arrivals import (
    _chunk_moments,
    chunk_sum_quantile,
    prefill_wait_s,
    shared_chunks_law,
    slot_wait_s,
)
from capplan.models.queueing.busy import busy_period_quantiles, lagged_busy_period_quantiles
from capplan.models.queueing.laws import QUANTILES, Z99
from capplan.models.queueing.special import poisson_mixture_pmf, poisson_pmf
from capplan.models.queueing.steady import SteadyState
from capplan.models.queueing.sums import (
    _compound_term,
    _normal_term,
    _strata_lengths,
    _sum_law,
    _sum_with_waits,
    _take_pair,
    _Term,
    _uniform_term,
    _values_term,
    _wait_term,
)

TPOT_TAIL_OUTPUT_QUANTILE = 0.1
"""TPOT's tail comes from the short outputs: a request's TPOT averages its gaps, so the p99
is set by requests with few of them; the law takes the gaps of the outputs' lower decile."""

_OWN_NODES = 6
"""Chunk sizes at which the own-prefill time is evaluated, then interpolated linearly."""
_SHARED_MAX = 8
"""Other prompts' chunks counted in the step that carries a request's own prefill (0..7)."""


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
    own: np.ndarray | None = None
    """Own-prefill times at the prompt strata (_own_values), when already computed."""


class QueueModel(SteadyState):
    """Analytic latency of one replica under load: its steady state (SteadyState) and the
    laws of TTFT, TBT, TPOT and E2E at a rate."""

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
        if prompt.size == 1:  # width 0: every node is the first, and the first is read
            t = self._mixed(b, np.maximum(lo, 1.0))[..., None]
        else:
            nodes = np.linspace(0.0, 1.0, _OWN_NODES + 1)
            t_nodes = np.stack(self._steps(b, tuple(np.maximum(lo + width * x, 1.0)
                                                     for x in nodes)), -1)
            pos = (np.minimum(prompt, budget[..., None]) - lo[..., None]) / np.maximum(
                width[..., None], 1e-9) * _OWN_NODES
            i0 = np.clip(np.floor(pos), 0, _OWN_NODES - 1).astype(np.int64)
            frac = np.clip(pos - i0, 0.0, 1.0)
            at, nxt = _take_pair(t_nodes, i0)
            t = at * (1 - frac) + nxt * frac
        return np.where(prompt > budget[..., None], prompt / budget[..., None]
                        * t_full[..., None], t)

    def _ahead(self, tau: Any, b: Any, rho_p: Any, wq_p: Any) -> tuple[Any, Any]:
        """(lag, f): an engine that forms each batch a step ahead (SchedulerPolicy.
        schedules_ahead) formed the step after the running one when that began, so a request
        arriving while a step runs joins the one after, a step later: lag = tau, times the
        chance the engine is busy (an idle one, no decodes (Poisson, mean b) and no prefill
        (1 - rho_p), schedules it at once). The prefill-queue wait W (0 with 1 - rho_p, else
        exponential) overlaps it: the request waits max(lag, W) = lag + (W - lag)+, and
        (W - lag)+ is the same law with its chance and mean times f = exp(-lag / E[W | W > 0])
        (memoryless). Without it: (0, 1)."""
        if not self.policy.schedules_ahead:
            return 0.0 * tau, 1.0 + 0.0 * tau
        p = np.clip(rho_p, 0.0, 1.0)
        lag = tau * (1.0 - (1.0 - p) * np.exp(-np.maximum(b, 0.0)))
        cond = np.asarray(wq_p, float) / np.maximum(p, 1e-12)
        return lag, np.exp(-lag / np.maximum(cond, 1e-12))

    def _sum_quantiles(self, x: _Terms, levels: dict[str, tuple[str, ...]]
                       ) -> tuple[dict[str, np.ndarray], ...]:
        """Quantiles of TTFT, E2E and TPOT as sums of independent terms, at the QUANTILES names
        in levels["ttft_s"], levels["e2e_s"] and levels["tpot_s"] (the decode's law is built
        only when E2E or TPOT quantiles are asked).

        TTFT = overhead + residual of the current step (uniform on [0, tau]) + the step already
        formed when the engine schedules a step ahead, overlapping the prefill-queue wait
        (`_ahead`) + prefill-queue
        wait + own prefill (a function of the prompt length, over its distribution) + the other
        prompts sharing that step + slot wait.
        E2E = TTFT + (O - 1) tau over the output-length distribution + a normal term for the
        variation of those steps: the prompts arriving during the decode (compound Poisson,
        lambda (O-1) tau arrivals each adding its prefill's extra time) and the slow drift of the
        batch (M/G/inf: the batch averaged over a window as long as the service has variance
        (2/3) b, from the autocovariance lambda (D - |s|); Takacs 1962).
        TPOT = that decode time over its O - 1 gaps: the mean gap + the two variation terms,
        each over the gaps of the output lengths' lower decile (a request's mean gap averages
        its stalls out, a short one's least; the tail of TPOT is theirs: the p99 of single
        gaps, TBT's, averages nothing).
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
        own = x.own if x.own is not None else self._own_values(b, budget, t_full, prompt)
        lag, f = self._ahead(tau, b, rho_p, wq_p)
        p_pf = fin(np.clip(rho_p, 0.0, 1.0) * f)  # the prefill-queue wait beyond the lag
        # Prompts that arrived during the same step share the step that carries this one: K
        # other chunks, Poisson with the mean m of the TBT model; one chunk is drawn from the
        # prompt lengths (10 strata, capped at the budget), more are taken at the mean chunk;
        # each token at the step's marginal cost per prefill token (up to the budget).
        p0, p1, pk, k = shared_chunks_law(fin(m_chunks)[..., None], _SHARED_MAX)
        one = np.minimum(inp.quantile((np.arange(10) + 0.5) / 10), budget[..., None])
        tokens = np.concatenate([np.zeros(shape + (1,)), one, k * chunk_mean[..., None]], -1)
        weights = np.concatenate([p0, np.broadcast_to(p1 / 10, shape + (10,)), pk], -1)
        per_token = np.maximum(fin(t_full) - fin(t_dec), 0.0) / budget
        shared = np.minimum(tokens, budget[..., None]) * per_token[..., None]
        # the shared step, like the waits, is 0 with a probability (no other chunk) and long
        # otherwise: it joins them in the split that keeps the no-wait law on a fine grid
        ttft = _sum_with_waits(
            [_Term(np.zeros(shape) + self.step.request_overhead_s + fin(lag), 0.0),
             _uniform_term(fin(tau)), _values_term(fin(own), p_w)],
            [_wait_term(p_pf, fin(wq_p * f)), _wait_term(fin(p_wait), fin(wq_c)),
             _values_term(shared, weights)],
            (1 - p_pf) * (1 - np.clip(fin(p_wait), 0.0, 1.0)) * p0[..., 0], shape)
        ttft_q = dict(zip(levels["ttft_s"], ttft.quantiles(
            tuple(QUANTILES[k] for k in levels["ttft_s"])), strict=True))
        if not (levels["e2e_s"] or levels["tpot_s"]):
            return ttft_q, {}, {}
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
        sd = np.sqrt(fin(np.maximum(var_pf + var_b, 0.0)))
        tpot_q: dict[str, np.ndarray] = {}
        if levels["tpot_s"]:
            n = max(float(out.quantile(TPOT_TAIL_OUTPUT_QUANTILE)) - 1.0, 1.0)
            tpot = _sum_law([_Term(fin(x.gap), 0.0),
                             _compound_term(fin(lam) * d0, jumps / n, p_w), _normal_term(sd / n)],
                            shape)
            tpot_q = dict(zip(levels["tpot_s"], tpot.quantiles(
                tuple(QUANTILES[k] for k in levels["tpot_s"])), strict=True))
        if not levels["e2e_s"]:
            return ttft_q, {}, tpot_q
        out_len, o_w = _strata_lengths(out)
        decode = np.maximum(out_len - 1.0, 0.0) * fin(x.gap)[..., None]
        e2e = _sum_law([_Term(ttft.offset, 0.0), ttft.as_term(), _values_term(decode, o_w),
                        arrivals, _normal_term(sd)], shape)
        return (ttft_q, dict(zip(levels["e2e_s"], e2e.quantiles(
            tuple(QUANTILES[k] for k in levels["e2e_s"])), strict=True)), tpot_q)

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
        tau, exists, s = self._fixed_point(lam)
        b, budget, t_dec, t_pf = s["b"], s["budget"], s["t_dec"], s["t_pf"]
        inp, out = self.pf, self.out  # prefill work: the uncached prompt tokens
        # Own prefill: one mixed step when the prompt fits the budget, else full chunks.
        t_full, t_own = self._steps(b, (budget, np.minimum(inp.mean, budget)))
        own_mean = np.where(inp.mean <= budget, t_own, inp.mean / budget * t_full)
        # Prefill queue (M/G/1 over prompt tokens at the full-chunk rate R).
        rho_p, wq_p = prefill_wait_s(lam, inp, budget / t_full, self.ca2)
        # Concurrency cap (M/G/c): a request holds a slot for its prefill and its decode.
        gap = self.token_gap(s, tau)
        slot_s = own_mean + self.dec_tokens * gap
        a = lam * slot_s
        c = np.maximum(self.cap, 1.0)
        cs2 = (out.var * tau**2) / np.maximum(slot_s**2, 1e-12)
        p_wait, wq_c = slot_wait_s(a, c, slot_s, cs2, self.ca2)
        stable = (exists & (rho_p < 1) & (a < c) & (lam * inp.mean * tau < budget)
                  & self.whole_prompts_fit)
        # Unstable rows are reported as inf below; give them m = 0 so that the compound-Poisson
        # sum does not loop over ~m terms for an absurd rate (1e9 req/s took minutes, 7 GB).
        m_chunks = np.where(stable, lam * tau * s["n"], 0.0)
        res: dict[str, Any] = {"stable": stable, "step_s": tau, "decode_step_s": t_dec,
                               "prefill_step_s": t_pf, "prefill_step_frac": s["f"]}
        lag, f = self._ahead(tau, b, rho_p, wq_p)
        ttft: dict[str, Any] = {"mean": tau / 2 + lag + wq_p * f + own_mean + wq_c
                                + self.step.request_overhead_s}
        tbt: dict[str, Any] = {"mean": gap}
        e2e: dict[str, Any] = {"mean": ttft["mean"] + self.dec_tokens * gap}
        moments = _chunk_moments(inp, budget)
        own = None
        if self.policy.prefill_first:  # unstable rows: no arrivals (their answer is inf)
            own = self._own_values(b, budget, t_full, _strata_lengths(self.pf)[0])
            tbt.update(self._prefill_first_tbt(np.where(stable, lam, 0.0), tau, budget,
                                               (t_dec, t_full, own), metrics))
        else:
            tbt.update(self._tbt_quantiles(m_chunks, b, budget, t_dec, moments, metrics))
        levels = {k: tuple(QUANTILES) if metrics is None else ("p99",) * (k in metrics)
                  for k in ("ttft_s", "e2e_s", "tpot_s")}
        tpot: dict[str, Any] = {"mean": gap}
        if levels["ttft_s"] or levels["e2e_s"] or levels["tpot_s"]:
            ttft_q, e2e_q, tpot_q = self._sum_quantiles(_Terms(
                lam, tau, b, budget, t_dec, t_full, rho_p, wq_p, p_wait, wq_c, m_chunks,
                moments[0], gap, own), levels)
            ttft.update(ttft_q)
            e2e.update(e2e_q)
            # a request's mean gap is never below the decode step; its tail never below the mean
            tpot.update({k: np.maximum(v, gap if k != "p50" else t_dec)
                         for k, v in tpot_q.items()})
        # the mean of the shared-step term of _sum_quantiles (m chunks of the mean size)
        shared_mean = np.minimum(m_chunks * moments[0], budget) * np.maximum(
            t_full - t_dec, 0.0) / budget
        ttft["mean"] = ttft["mean"] + shared_mean
        e2e["mean"] = e2e["mean"] + shared_mean
        running, kv_mean, kv_peak = self._occupancy(lam, b, own_mean)
        res.update({
            "ttft_s": ttft, "tbt_s": tbt, "e2e_s": e2e,
            "requests_per_s": lam, "output_tokens_per_s": lam * out.mean,
            "input_tokens_per_s": lam * self.inp.mean, "mean_running_batch": running,
            "preemptions": np.zeros_like(lam),
            "kv_mean_utilization": kv_mean, "kv_peak_utilization": kv_peak,
            "concurrency_cap": c, "prefill_utilization": rho_p, "slot_utilization": a / c,
        })
        if self.prefix.active:
            res["cached_tokens_per_request"] = np.full_like(lam, self.cached)
        # TPOT (one request's mean gap): its mean is the mean gap, its quantiles the decode
        # time's law over the request's gaps (_sum_quantiles; the simulator measures it itself)
        res["tpot_s"] = tpot
        for key in ("ttft_s", "tbt_s", "tpot_s", "e2e_s"):
            res[key] = {k: np.where(stable, v, np.inf) for k, v in res[key].items()}
        return res

    def _tbt_quantiles(self, m_chunks: np.ndarray, b: np.ndarray, budget: np.ndarray,
                       t_dec: np.ndarray, moments: tuple[np.ndarray, np.ndarray],
                       metrics: Collection[str] | None) -> dict[str, np.ndarray]:
        """TBT quantiles. Every gap is one step. The number K of prefill chunks landing in a
        step is Poisson with mean m = lambda * tau * E[chunks]; the step carries the sum of K
        chunk sizes (capped by the budget). The p-quantile gap is the step carrying the
        p-quantile of that compound sum: exact for K <= 1 (the prompt-length distribution),
        normal for K >= 2. Its quantile grows with m, so TBT tails grow with load."""
        inp = self.pf
        tbt: dict[str, np.ndarray] = {}
        prev_tbt = None
        # A caller reading p99s alone gets the p99 alone: the lower quantiles only guard the
        # ordering, which the mixture already gives (a higher level's token quantile is never
        # lower, and a step with more tokens is never faster).
        tbt_levels = QUANTILES if metrics is None else {"p99": QUANTILES["p99"]}
        for name, p in tbt_levels.items():
            tokens = chunk_sum_quantile(m_chunks, p, inp, budget, moments=moments)
            pf = self._mixed(b, np.maximum(tokens, 1.0))
            tbt[name] = np.where(tokens < 0.5, t_dec, np.maximum(t_dec, pf))
            if prev_tbt is not None:  # quantiles are ordered by construction of the mixture
                tbt[name] = np.maximum(tbt[name], prev_tbt)
            prev_tbt = tbt[name]
        return tbt

    def _prefill_first_tbt(self, lam: np.ndarray, tau: np.ndarray, budget: np.ndarray,
                           steps: tuple[np.ndarray, np.ndarray, np.ndarray],
                           metrics: Collection[str] | None) -> dict[str, np.ndarray]:
        """TBT quantiles of a prefill-first engine: a decoder's gap is a decode step and the
        prefill-only steps of every prompt admitted before the next one (SGLang
        scheduler.py get_next_batch_to_run: prefill batch first), the busy period
        B(t_dec) of busy.py, each prompt's work its prefill time.

        Prompts admitted together share steps: of Poisson arrivals in a step of mean length
        tau, the share that opens a prefill batch (the first to arrive) is
        phi = E[batches] / E[prompts] = (1 - e^(-lambda tau)) / (lambda tau); that one pays its
        own step (own prefill time), the others ride in it at their tokens' share of a full
        step, prompt / budget * T(budget) (never above their own). `steps`: the decode step,
        the full-budget step and the own-prefill times at the prompt strata.

        Formed a step ahead (SchedulerPolicy.schedules_ahead), step i + 2 prefills the prompts
        that arrived during step i: after a decode step D, the next step carries the N prompts
        that arrived during the step before D (`_carried_prompts`; none: the gap is D alone),
        and the steps after it continue from the prompts that arrived during D, as the busy
        period B(t_dec) does (each prefill step's arrivals open the step after the next, which
        in a run of prefill steps of one law stops with the same chance as the next step
        would): the gap is t_dec with P(N = 0), else B(t_dec) + the N carried prompts' work
        (busy.lagged_busy_period_quantiles)."""
        t_dec, t_full, own = steps
        prompt, p_w = _strata_lengths(self.pf)
        lt = np.maximum(lam * tau, 1e-12)
        phi = np.where(lt > 1e-6, -np.expm1(-lt) / lt, 1.0)[..., None]
        ride = np.minimum(prompt / budget[..., None] * t_full[..., None], own)
        work = phi * own + (1 - phi) * ride
        levels = QUANTILES if metrics is None else {"p99": QUANTILES["p99"]}
        if self.policy.schedules_ahead:
            gaps = lagged_busy_period_quantiles(t_dec, lam, work, p_w,
                                                _carried_prompts(lam, t_dec, own, p_w),
                                                tuple(levels.values()))
        else:
            gaps = busy_period_quantiles(t_dec, lam, work, p_w, tuple(levels.values()))
        return dict(zip(levels, gaps, strict=True))

    def _occupancy(self, lam: np.ndarray, b: np.ndarray, own_mean: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Mean running batch, and the KV cache's mean and peak utilisation: B decoding
        sequences at the mean context plus the lambda * own-prefill prompts being prefilled
        (Little's law); the peak at the Poisson p99 of B (normal approximation)."""
        running = b + lam * own_mean
        state = np.asarray(self.limits.state_tokens_per_seq, float)
        # window layers capped at their window (Limits.held_kv)
        ctx, prompt = self.limits.held_kv(self.ctx_mean), self.limits.held_kv(self.inp.mean)
        kv_used = b * (ctx + state) + lam * own_mean * (prompt + state)
        b_p99 = b + Z99 * np.sqrt(b)  # normal approximation of the Poisson p99
        kv_cap = np.maximum(np.asarray(self.limits.kv_cache_tokens, float), 1.0)
        peak = np.minimum(b_p99 * (ctx + state) / kv_cap + (
            lam * own_mean * (prompt + state)) / kv_cap, 1.0)
        return running, kv_used / kv_cap, peak


def _carried_prompts(lam: np.ndarray, t_dec: np.ndarray, own: np.ndarray, p_w: np.ndarray
                     ) -> np.ndarray:
    """P(N = n), n = 0, 1, ... (..., n): the prompts a prefill-first engine formed a step ahead
    carries into the step after a decode step, those that arrived during the step before it
    (Poisson, rate lam). That step is the last of the previous gap: a decode step (t_dec) when
    that gap carried none, else a prefill step, taken as one prompt's own (`own` at the
    strata p_w). Stationary, P(N > 0) = p solves p = (1 - p) q_d + p q_s with q_d = 1 -
    e^(-lam t_dec), q_s = E[1 - e^(-lam own)]: p = q_d / (1 - q_s + q_d)."""
    lam = np.asarray(lam, float)
    a_dec, a_pf = lam * t_dec, lam[..., None] * own
    q_d, q_s = -np.expm1(-a_dec), (-np.expm1(-a_pf) * p_w).sum(-1)
    p = q_d / np.maximum(1.0 - q_s + q_d, 1e-12)
    top = float(np.max(np.maximum(a_pf.max(-1), a_dec), initial=0.0))
    n = np.arange(int(min(top + 8.0 * math.sqrt(top) + 6.0, 64.0)) + 1)
    return ((1.0 - p)[..., None] * poisson_pmf(n, a_dec[..., None])
            + p[..., None] * poisson_mixture_pmf(n[-1], a_pf, p_w))


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
