"""Latency of a closed-loop benchmark, as `vllm bench serve --max-concurrency C --num-prompts N`
(and genai-perf, AIPerf, the AIConfigurator silicon runs) measure it. Derivation and the check
against the simulator: docs/queueing.md, "Closed loop".

C clients start together and each sends its next request the moment its last one ends; the
benchmark reports means over its N requests. Two regimes make up that mean:

- the start-up wave: C prompts arrive at t = 0. The engine admits m = min(C, cap) of them and
  prefills them in arrival order at the token budget B per step, so the i-th admitted prompt
  gets its first token after ceil((i+1) ISL / B) prefill steps;
- the steady state: requests prefilled in the same step have equal lengths, so they decode
  together, finish together and come back together. Prompts therefore arrive in cohorts of
  k = min(m, floor(B_eff / ISL)) (one prompt when ISL > B_eff), and a cohort's TTFT is the
  step(s) that prefill it, with the other m - k sequences decoding in them (mixed engines) or
  waiting (prefill-first engines). Throughput X closes the loop: C = X (cycle), cycle = TTFT +
  (OSL - 1) TPOT + per-request overhead; when C exceeds the concurrency cap m, the remainder wait
  for a slot, W = C / X - S - overhead with S the slot holding time.

mean TTFT = overhead + [m TTFT_wave + (N - m) (TTFT_steady + W)] / N.

With a per-request overhead or client jitter (each next request reaches the engine after a
random delay: models.engine.closed_loop_delay) cohorts merge behind each other's prefill steps
or break up; TTFT_steady and the
prompts per prefill step then come from an event model of the loop in expected values
(`_jittered_loop`; docs/queueing.md, "Jitter").

The concurrency cap m depends on the engine's admission rule (SchedulerPolicy): vLLM admits
while blocks for the prompt are free (and preempts when decode runs out of them), TensorRT-LLM's
GUARANTEED_NO_EVICT reserves prompt + output, SGLang a fraction of the output.
"""

from __future__ import annotations

import math
from bisect import bisect_right, insort
from dataclasses import dataclass
from typing import Any

import numpy as np

from capplan.models.engine import NO_JITTER, ClientJitter, SchedulerPolicy, closed_loop_delay
from capplan.models.layers import DENSE_LAYOUT, BlockLayout
from capplan.models.perf import StepModel, chunk_attention

_FP_ITERS = 60
QUANTILES = {"p50": 0.50, "p90": 0.90, "p99": 0.99}

VLLM_BENCH_NUM_PROMPTS = 1000
"""`vllm bench serve --num-prompts` default (vllm/benchmarks/serve.py)."""


@dataclass(frozen=True)
class BenchmarkProtocol:
    """How the benchmark client runs: N requests through C concurrent clients."""

    concurrency: int
    num_prompts: int = VLLM_BENCH_NUM_PROMPTS
    warmup_prompts: int = 0
    """Requests sent (and excluded from the averages) before the measured ones; they leave the
    engine in steady state, so no start-up wave is measured."""
    client_jitter: ClientJitter = NO_JITTER
    """Timing noise of the clients and the server's front end, which breaks cohorts up
    (`_jittered_burst`; the engine profile's default)."""


def cohort_step_s(step: StepModel, k: float, isl: float, num_decode: float,
                  decode_ctx: float) -> float:
    """One step prefilling k whole prompts of `isl` tokens with `num_decode` decoders
    (attention work per prompt from perf.chunk_attention, no cached prefix)."""
    k = max(float(k), 0.0)
    w = float(np.asarray(step.window))
    one, one_w, _ = chunk_attention(float(isl), 0.0, w)
    pairs, pairs_w = k * one, k * one_w
    out = step.step(num_decode=num_decode, decode_kv_tokens=num_decode * decode_ctx,
                    decode_kv_tokens_window=num_decode * min(decode_ctx, w),
                    prefill_tokens=k * isl, prefill_pairs=pairs, prefill_pairs_window=pairs_w,
                    num_prefill_seqs=math.ceil(k), num_logits=num_decode + math.ceil(k),
                    detail=False)["step_s"]
    return float(np.asarray(out))


def decode_step_s(step: StepModel, b: float, ctx: float) -> float:
    return float(np.asarray(step.decode_step(max(b, 1e-9), ctx, detail=False)["step_s"]))


def block_rounding_tokens(start_tokens: Any, added_tokens: Any, block_size: Any) -> Any:
    """Mean KV tokens a sequence's last, partly filled block leaves empty while it grows from
    start_tokens + 1 to start_tokens + added_tokens tokens (paged KV holds ceil(h / block_size)
    blocks, Kwon et al. SOSP 2023): the mean of ceil(h / b) b - h over those h.

    sum_{h=1..N} ceil(h / b) = b q (q + 1) / 2 + r (q + 1) with N = q b + r. 0 at b = 1.
    Hybrids make it matter: vLLM raises their block size to hundreds or thousands of tokens.
    """
    b = np.maximum(np.asarray(block_size, float), 1.0)
    s, n = float(start_tokens), max(float(added_tokens), 1.0)

    def ceil_sum(x: float) -> Any:
        q = np.floor(x / b)
        return b * q * (q + 1) / 2 + (x - q * b) * (q + 1)

    waste = (ceil_sum(s + n) - ceil_sum(s)) / n * b - (s + (n + 1) / 2)
    return np.where(b > 1, np.maximum(waste, 0.0), 0.0)


def kv_concurrency_cap(kv_tokens: float, isl: float, osl: float, block_size: int,
                       policy: SchedulerPolicy, state_tokens_per_seq: float = 0.0,
                       layout: BlockLayout = DENSE_LAYOUT) -> float:
    """Sequences the KV cache holds at once under the engine's admission rule.

    Per sequence the mean it holds under the policy (SchedulerPolicy.held_tokens), rounded up
    to whole blocks, its sliding-window layers' capped at their window (`layout`,
    layers.BlockLayout.kv_tokens: vLLM's hybrid allocator frees out-of-window blocks), plus a
    hybrid's recurrent state (`state_tokens_per_seq`, whole blocks held from admission to
    finish: vLLM V1 MambaManager); vLLM (no reservation) preempts to stay there.
    """
    held = math.ceil(policy.held_tokens(isl, osl) / block_size) * block_size
    per_seq = float(layout.kv_tokens(held, block_size)) + state_tokens_per_seq
    return max(math.floor(kv_tokens / max(per_seq, 1)), 0)


def closed_loop_latency(step: StepModel, isl: float, osl: float, max_num_seqs: int,
                        max_num_batched_tokens: int, kv_cache_tokens: float, block_size: int,
                        protocol: BenchmarkProtocol,
                        policy: SchedulerPolicy | None = None,
                        state_tokens_per_seq: float = 0.0,
                        layout: BlockLayout = DENSE_LAYOUT) -> dict[str, Any]:
    """Mean TTFT, TPOT and E2E the benchmark reports, with throughput and what bound it.
    `state_tokens_per_seq`: KV capacity a hybrid's recurrent state holds per sequence;
    `layout`: sliding-window layers capped at their window (plan/deployment.KvPool)."""
    policy = policy or SchedulerPolicy()
    c = int(protocol.concurrency)
    n = max(int(protocol.num_prompts), 1)
    isl, osl = float(isl), float(osl)
    overhead = float(np.asarray(step.request_overhead_s))
    # the delay before a client's next request: fixed + spread x Exp(1) (closed_loop_delay)
    fixed, spread = closed_loop_delay(overhead, protocol.client_jitter, osl)
    kv_cap = kv_concurrency_cap(kv_cache_tokens, isl, osl, block_size, policy,
                                state_tokens_per_seq, layout)
    m = max(min(c, max_num_seqs, kv_cap), 1)
    bound = ("clients" if m == c else "max_num_seqs" if m == max_num_seqs else "kv_cache")
    budget = float(max_num_batched_tokens)
    dec_tokens = max(osl - 1.0, 0.0)
    ctx = isl + osl / 2

    # Steady state: the decode batch b, the cohort size k and the fixed point in X.
    def steady(x: float) -> dict[str, float]:
        # Little: sequences decoding = X * decode time; the rest of the m prefill or wait.
        b_guess = min(m, max(x * dec_tokens * tpot_box[0], 0.0))
        b_eff_budget = budget if policy.prefill_first else max(budget - b_guess, 1.0)
        t_dec = decode_step_s(step, b_guess, ctx)
        resid = 0.0
        if isl <= b_eff_budget:
            k = max(min(float(m), math.floor(b_eff_budget / isl)), 1.0)
            others = max(b_guess - 0.0, 0.0) if not policy.prefill_first else 0.0
            t_pf = cohort_step_s(step, k, isl, others, ctx)
            ttft = t_pf
            if spread > 0 and m > 1:  # jitter: cohorts merge or break up (_jittered_loop)
                ttft, k = _jittered_loop(
                    step, _LoopShape(m, int(k), isl, others, ctx, t_dec, int(dec_tokens)),
                    (fixed, spread), (m, max(n, m + 1) + protocol.warmup_prompts))
                t_pf = cohort_step_s(step, k, isl, others, ctx)
            pf_steps_per_cohort = 1.0
        else:
            k = 1.0
            n_steps = isl / b_eff_budget
            others = b_guess if not policy.prefill_first else 0.0
            t_pf = cohort_step_s(step, b_eff_budget / isl, isl, others, ctx)
            ttft = t_pf * math.ceil(n_steps)
            pf_steps_per_cohort = n_steps
            if spread > 0 and m > 1:  # arrivals land inside a step and wait for its end
                resid = t_dec / 2
        # Steps per second that carry prefill: cohorts arrive at X / k per second.
        cohorts_per_s = x / k
        # Time shares: prefill steps take t_pf each, decode steps t_dec.
        pf_time_frac = min(cohorts_per_s * pf_steps_per_cohort * t_pf, 0.999)
        n_dec_steps_per_s = (1.0 - pf_time_frac) / t_dec
        if policy.prefill_first:
            # Decoders get no token in a prefill step: the gap includes the prefill steps.
            tpot = t_dec / max(1.0 - pf_time_frac, 1e-3)
            # Share of token GAPS (not of time) that hold a cohort's prefill steps: one gap per
            # cohort among the decode steps' gaps.
            gap_share = cohorts_per_s / max(n_dec_steps_per_s, 1e-9)
        else:
            # Every step gives each decoder a token; a prefill step is just a slower step.
            n_pf_steps_per_s = cohorts_per_s * pf_steps_per_cohort
            tpot = 1.0 / max(n_dec_steps_per_s + n_pf_steps_per_s, 1e-9)
            # Share of token gaps that are prefill steps: their count over all steps' count.
            gap_share = n_pf_steps_per_s * tpot
        # formed a step ahead, the step after a returning request's arrival was scheduled
        # without it: dispersed (jitter) it is a decode step, synchronised `_cohort_lag`
        lag = ((t_dec if spread > 0 and m > 1 else _cohort_lag(m, k, t_pf, t_dec))
               if policy.schedules_ahead else 0.0)
        ttft += resid + lag
        return {"ttft": ttft, "tpot": tpot, "k": k, "b": b_guess, "t_pf": t_pf,
                "t_dec": t_dec, "pf_frac": pf_time_frac, "pf_gap_share": min(gap_share, 1.0)}

    tpot_box = [decode_step_s(step, m, ctx)]
    x = m / max(isl / budget * tpot_box[0] + dec_tokens * tpot_box[0] + overhead, 1e-9)
    st: dict[str, float] = {}
    wait = 0.0
    for _ in range(_FP_ITERS):  # damped fixed point on X (converges in a few dozen steps)
        st = steady(x)
        tpot_box[0] = st["tpot"]
        service = st["ttft"] + dec_tokens * st["tpot"]
        x_clients = c / max(service + overhead, 1e-12)
        x_slots = m / max(service, 1e-12)
        x_new = min(x_clients, x_slots)
        wait = max(c / x_new - service - overhead, 0.0)
        if abs(x_new - x) <= 1e-6 * x:
            x = x_new
            break
        x = 0.5 * x + 0.5 * x_new

    # Start-up wave: m prompts at once, prefilled in order at the full budget per step.
    first = min(m, c)
    if protocol.warmup_prompts >= c:
        wave = st["ttft"] + wait
    else:
        wave = _wave_ttft(step, first, isl, budget, ctx, policy)
    # Without a delay (no overhead, no jitter) cohorts stay synchronised; with one the steady
    # state comes from the event model (_jittered_loop), which merges and breaks them up as
    # the simulator does (docs/queueing.md, "Jitter").
    steady_ttft = st["ttft"] + wait
    measured_wave = min(first, n) if protocol.warmup_prompts < c else 0
    wave_frac = measured_wave / n
    ttft_mean = overhead + wave_frac * wave + (1 - wave_frac) * steady_ttft
    e2e = ttft_mean + dec_tokens * st["tpot"]
    ttft_q = {name: overhead + _mixture_quantile(q, wave_frac, wave, steady_ttft)
              for name, q in QUANTILES.items()}
    # Token gaps: decode steps, and for each cohort one slower gap carrying its prefill (mixed
    # engines: the prefill step, t_pf; prefill-first: a decode step plus the cohort's prefill
    # steps). The quantiles weigh gaps, not time: pf_share is the share of gaps that carry a
    # prefill, and the prefill gap is the one that keeps the mixture's mean at TPOT (the mean
    # gap): t_dec + (TPOT - t_dec) / share, equal to t_pf for mixed engines (TPOT = 1 / steps
    # per second, each step one gap) and to t_dec + the cohort's prefill time for prefill-first
    # ones; so no quantile exceeds what the mean allows (q-quantile <= mean / (1 - q)).
    # The plain gap is at most the mean (a mixed step with few decoders can beat t_dec, which
    # is a full-batch decode step: with the mean below it, every gap is the mean).
    pf_share = st["pf_gap_share"]
    plain = min(st["t_dec"], st["tpot"])
    pf_gap = plain + (st["tpot"] - plain) / pf_share if pf_share > 0 else plain
    tbt_q = {name: (pf_gap if q > 1 - pf_share else plain) for name, q in QUANTILES.items()}
    e2e_q = {name: v + dec_tokens * st["tpot"] for name, v in ttft_q.items()}
    return {
        "ttft_s": {"mean": ttft_mean, **ttft_q},
        "tbt_s": {"mean": st["tpot"], **tbt_q},
        "e2e_s": {"mean": e2e, **e2e_q},
        "tpot_s": st["tpot"],
        "ttft_steady_s": steady_ttft + overhead, "ttft_wave_s": wave + overhead,
        "slot_wait_s": wait, "requests_per_s": x, "output_tokens_per_s": x * osl,
        "input_tokens_per_s": x * isl, "running": float(m), "cohort_size": st["k"],
        "decode_step_s": st["t_dec"], "prefill_step_s": st["t_pf"],
        "concurrency_cap": float(m), "bound": bound, "request_overhead_s": overhead,
        "mean_running_batch": float(m), "preemptions": 0.0,
        "kv_peak_utilization": min(float(m) * (float(layout.kv_tokens(isl + osl, block_size))
                                              + state_tokens_per_seq)
                                   / max(kv_cache_tokens, 1.0), 1.0),
        "stable": True, "concurrency": float(c), "num_prompts": float(n),
    }


def _cohort_lag(m: int, k: float, t_pf: float, t_dec: float) -> float:
    """Mean extra TTFT of a synchronised closed loop when the engine forms each step a step
    ahead (SchedulerPolicy.schedules_ahead): a returning cohort arrives at a step's end, after
    the next step was formed, and waits that step. The m clients' cohorts of k, prefilled in
    consecutive steps, come back in consecutive steps: the first finds a decode step of the
    others formed (t_dec), each later one the previous cohort's (last) prefill step (t_pf), so
    the chain keeps its order, one decode step later. A prompt longer than the budget is a
    cohort of one (k = 1) whose prefill spans several steps. A single cohort (k >= m) finds
    the engine empty, which schedules it at once (0)."""
    if k >= m:
        return 0.0
    # per request: k of the m wait a decode step, the other m - k a cohort's prefill step
    return (k * t_dec + (m - k) * t_pf) / m


def _exp_order_means(n: int) -> np.ndarray:
    """Expected order statistics of n Exp(1) draws: sum_(l=0)^(j-1) 1 / (n - l), j = 1..n (the
    spacings of exponential order statistics are independent, Exp(1) / (n - l); Renyi 1953)."""
    return np.cumsum(1.0 / (n - np.arange(n)))


@dataclass(frozen=True)
class _LoopShape:
    """What `_jittered_loop` needs of the steady state besides the step model."""

    m: int
    """clients running (admitted)"""
    k: int
    """prompts the token budget admits to one prefill step"""
    isl: float
    others: float
    """sequences decoding in a prefill step"""
    ctx: float
    t_dec: float
    dec_steps: int
    """steps from a prompt's first token to its last (OSL - 1)"""


def _jittered_loop(step: StepModel, shape: _LoopShape, delay: tuple[float, float],
                   prompts: tuple[int, int]) -> tuple[float, float]:
    """Mean engine TTFT of the prompts after the start-up wave, and prompts per prefill step,
    for a closed loop whose clients send the next request overhead + spread * Exp(1) after the
    last one ends (`delay` = (overhead_s, spread_s); docs/queueing.md, "Jitter"). `prompts` =
    (first measured prompt, last + 1) in sending order, the wave's m first.

    An event model of the engine in expected values: a step prefills the prompts waiting at
    its start (at most k, P(n)) or, when none waits, decodes (t_dec); prompts prefilled in
    the same step decode in lockstep and finish together dec_steps steps later, whatever runs
    in between, and their clients' next prompts reach the engine at that step's end plus the
    overhead plus the spread times the expected order statistics of their Exp(1) delays. Runs
    of decode steps with no event are skipped in one go. Without spread or overhead this is
    the synchronised model (each cohort lands as the step before it ends); a delay shorter
    than a prefill step makes cohorts queue behind each other's prefill steps (they merge);
    a spread longer than one breaks them up."""
    overhead_s, spread_s = delay
    m, k, t_dec = shape.m, shape.k, shape.t_dec
    p_cache: dict[int, float] = {}

    def p_of(n: int) -> float:
        if n not in p_cache:
            p_cache[n] = cohort_step_s(step, n, shape.isl, shape.others, shape.ctx)
        return p_cache[n]

    first, last = prompts
    arrivals: list[float] = [0.0] * m  # sorted times of prompts sent and not yet prefilled
    finishes: list[tuple[int, int]] = []  # (step index of the last token, prompts), in order
    t, idx, served, sent = 0.0, 0, 0, m
    ttft_sum = 0.0
    n_measured = pf_steps = 0
    while served < last:
        waiting = bisect_right(arrivals, t)
        if waiting:
            n = min(waiting, k)
            end = t + p_of(n)
            lo, hi = max(served, first), min(served + n, last)
            if hi > lo:  # measured prompts of this step (in arrival order)
                got = arrivals[lo - served:hi - served]
                ttft_sum += (hi - lo) * end - sum(got)
                n_measured += hi - lo
                pf_steps += 1
            del arrivals[:n]
            served += n
            finishes.append((idx + shape.dec_steps, n))
            steps = 1
        elif not finishes:  # nothing runs: the engine starts a step when the next arrives
            if not arrivals:
                break
            t = arrivals[0]
            continue
        else:  # decode until the next event: a finish, or an arrival (then its step ends)
            nxt_f = finishes[0][0] - idx + 1
            nxt_a = math.ceil((arrivals[0] - t) / t_dec) if arrivals else nxt_f
            steps = max(1, min(nxt_f, nxt_a))
            end = t + steps * t_dec
        idx += steps
        t = end
        while finishes and finishes[0][0] < idx:  # their last token came at this step's end
            _, n = finishes.pop(0)
            n_send = min(n, max(last - sent, 0))
            if n_send:
                for d in overhead_s + spread_s * _exp_order_means(n)[:n_send]:
                    insort(arrivals, t + float(d))
                sent += n_send
    if not n_measured:
        return 0.0, float(k)
    return ttft_sum / n_measured, n_measured / max(pf_steps, 1)


def _mixture_quantile(q: float, wave_frac: float, wave_mean: float, steady: float) -> float:
    """Quantile of TTFT over the measured requests: a fraction wave_frac from the start-up wave
    (spread evenly over [0, 2 wave_mean], the prompts being prefilled in order), the rest at
    the steady-state value."""
    if wave_frac <= 0:
        return steady
    # P(T <= x) = (1 - w) 1[x >= steady] + w min(x / (2 wave_mean), 1)
    span = 2 * wave_mean
    below_steady = wave_frac * min(steady / span, 1.0) if span > 0 else wave_frac
    if q <= below_steady:
        return q / wave_frac * span
    if q <= below_steady + (1 - wave_frac):
        return steady
    return min((q - (1 - wave_frac)) / wave_frac * span, span)


def _wave_ttft(step: StepModel, m: int, isl: float, budget: float, ctx: float,
               policy: SchedulerPolicy) -> float:
    """Mean TTFT of m prompts arriving together: prefilled in order, B tokens per step.

    Step j holds the prompts whose tokens fall in [j B, (j+1) B); prompts finishing in step j
    start decoding in step j+1 (mixed engines take their decode tokens from the budget).
    """
    total_tokens = m * isl
    done = 0.0
    t = 0.0
    decoding = 0.0
    ttft_sum = 0.0
    finished = 0
    guard = 0
    while finished < m and guard < 100000:
        guard += 1
        room = budget if policy.prefill_first else max(budget - decoding, 1.0)
        take = min(room, total_tokens - done)
        t += cohort_step_s(step, take / isl, isl, 0.0 if policy.prefill_first else decoding, ctx)
        done += take
        newly = int(min(done // isl, m)) - finished  # prompts whose last token was this step
        if newly > 0:
            ttft_sum += newly * t
            finished += newly
            decoding += newly
    return ttft_sum / max(m, 1)
