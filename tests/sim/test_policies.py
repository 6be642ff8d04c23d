"""Scheduler policies of the engine profiles: hand-computed traces and invariants.

Every step of `ConstStep(0.01)` takes 10 ms; `LinearStep` takes 1 ms per token computed plus
0.1 ms per decode KV token read, so each trace below is written out by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capplan.errors import InputError
from capplan.models.engine import NO_JITTER, SchedulerPolicy
from capplan.sim import ContinuousEngine, Requests
from capplan.sim.metrics import summarize
from capplan.sim.workload import Lane
from tests.sim.conftest import ConstStep, LinearStep

VLLM = SchedulerPolicy()
PREFILL_FIRST = SchedulerPolicy(prefill_first=True)  # SGLang without --enable-mixed-chunk
NO_EVICT = SchedulerPolicy(chunked_prefill=False, reserve_output_frac=1.0, preemption=False)
"""TensorRT-LLM defaults: whole prompts, GUARANTEED_NO_EVICT (ISL + OSL reserved)."""


def reqs(arrivals, prompts, outputs, concurrency=None) -> Requests:
    n = len(prompts)
    return Requests(np.asarray(arrivals, float), np.asarray(prompts), np.asarray(outputs),
                    np.zeros(n, np.int64), concurrency)


def run(model, r, policy, blocks=100, bs=16, seqs=4, tokens=64, overhead_s=0.0):
    return ContinuousEngine(model, blocks, bs, seqs, tokens, policy).run(
        r, request_overhead_s=overhead_s)


def tbt_samples(rec) -> list[float]:
    """Every TBT gap, each weighted sample repeated."""
    out = np.repeat(rec.step_tbt_gap_s, rec.step_tbt_count).tolist() + rec.extra_gaps_s.tolist()
    return sorted(out)


# ---------------------------------------------------------------------------------------------
# prefill_first (SGLang)
def test_prefill_first_decoder_gap_spans_the_prefill_step_it_skipped():
    # A: prompt 3, output 4 at t=0; B: prompt 5, output 3 at t=4 ms. LinearStep:
    # step 0 [0, 3]       prefill A (3 tokens): 3 ms; A's token 1 at 3 ms
    # step 1 [3, 4.4]     decode A (context 4): 1 + 0.4 ms; A's token 2
    # step 2 [4.4, 9.4]   B waits (arrived 4.0): prefill only, 5 ms; A skips; B's token 1
    # step 3 [9.4, 12.5]  decode A (ctx 5) and B (ctx 6): 2 + 1.1 ms; A's token 3, B's 2
    # step 4 [12.5, 15.8] decode A (ctx 6), B (ctx 7): 2 + 1.3 ms; both finish
    rec = run(LinearStep(), reqs([0.0, 0.004], [3, 5], [4, 3]), PREFILL_FIRST)
    assert rec.step_dur_s.tolist() == pytest.approx([0.003, 0.0014, 0.005, 0.0031, 0.0033])
    assert rec.admitted_at_s.tolist() == pytest.approx([0.0, 0.0044])
    assert rec.first_token_at_s.tolist() == pytest.approx([0.003, 0.0094])
    assert rec.finished_at_s.tolist() == pytest.approx([0.0158, 0.0158])
    # A's gap over the prefill step it skipped: 5 ms (B's prefill) + 3.1 ms (the decode step)
    assert tbt_samples(rec) == pytest.approx(sorted([0.0014, 0.0081, 0.0033, 0.0031, 0.0033]))
    assert rec.step_running.tolist() == [1, 1, 2, 2, 2]


def test_mixed_step_for_comparison_vllm():
    # The same requests under vLLM: step 2 mixes A's decode (ctx 5) with B's prefill:
    # 1 + 5 + 0.5 = 6.5 ms, so A's gap is 6.5 ms instead of 8.1 ms.
    rec = run(LinearStep(), reqs([0.0, 0.004], [3, 5], [4, 3]), VLLM)
    assert rec.step_dur_s[:3].tolist() == pytest.approx([0.003, 0.0014, 0.0065])
    assert rec.first_token_at_s.tolist() == pytest.approx([0.003, 0.0109])


def test_prefill_first_chunks_a_long_prompt_over_several_prefill_steps():
    # Budget 8 tokens. A (prompt 3, output 3) at 0; B (prompt 20, output 2) at 1 ms.
    # step 0: prefill A | 1-3: B's chunks 8, 8, 4 (A skips three steps) | 4: decode A, B (B
    # done) | 5: decode A (done). A's tokens at 10, 50, 60 ms; B's at 40, 50 ms.
    rec = run(ConstStep(0.01), reqs([0.0, 0.001], [3, 20], [3, 2]), PREFILL_FIRST, tokens=8)
    assert rec.first_token_at_s.tolist() == pytest.approx([0.010, 0.040])
    assert rec.finished_at_s.tolist() == pytest.approx([0.060, 0.050])
    assert tbt_samples(rec) == pytest.approx([0.01, 0.01, 0.04])
    assert summarize(rec, (Lane(),)).tbt_s["p99"] == pytest.approx(0.04)


def test_prefill_first_respects_max_num_seqs():
    # Two sequences at most: C waits for A's finish although the budget has room.
    rec = run(ConstStep(0.01), reqs([0, 0, 0], [2, 2, 2], [2, 3, 1]), PREFILL_FIRST, seqs=2,
              tokens=8)
    # step 0: prefill A, B | 1: decode (A done) | 2: prefill C (done; B skips) | 3: decode B
    assert rec.admitted_at_s.tolist() == pytest.approx([0.0, 0.0, 0.020])
    assert rec.finished_at_s.tolist() == pytest.approx([0.020, 0.040, 0.030])


# ---------------------------------------------------------------------------------------------
# chunked_prefill False + reserve_output_frac 1 + no preemption (TensorRT-LLM)
def test_no_evict_admission_waits_for_isl_plus_osl_blocks():
    # 4 blocks of 4 tokens. A (prompt 4, output 8) reserves ceil(12 / 4) = 3 blocks; B (prompt
    # 4, output 4) needs 2, one is free: B waits until A finishes (8 steps, 80 ms).
    r = reqs([0, 0], [4, 4], [8, 4])
    rec = run(ConstStep(0.01), r, NO_EVICT, blocks=4, bs=4)
    assert rec.admitted_at_s.tolist() == pytest.approx([0.0, 0.080])
    assert rec.finished_at_s.tolist() == pytest.approx([0.080, 0.120])
    assert rec.preemptions == 0
    assert rec.step_kv_blocks.tolist() == [3] * 8 + [2] * 4
    # vLLM admits B at once (one block for its prompt, more as it decodes): A's contexts 5..8
    # and B's 5..7 hold 2 + 2 blocks until B ends at 40 ms; A's ninth token takes a third.
    rec = run(ConstStep(0.01), r, VLLM, blocks=4, bs=4)
    assert rec.admitted_at_s.tolist() == pytest.approx([0.0, 0.0])
    assert rec.finished_at_s.tolist() == pytest.approx([0.080, 0.040])
    assert rec.step_kv_blocks.tolist() == [2, 4, 4, 4, 2, 3, 3, 3]


def test_whole_prompt_joins_decodes_only_when_both_fit_the_budget():
    # Budget 8: A (prompt 7, output 3) at 0; B (prompt 8) at 5 ms. A decodes in steps 1-2;
    # 1 decode + 8 prompt tokens > 8, so B's prompt waits for A's end (30 ms): TTFT 35 ms.
    r = reqs([0, 0.005], [7, 8], [3, 1])
    rec = run(ConstStep(0.01), r, NO_EVICT, tokens=8)
    assert rec.first_token_at_s.tolist() == pytest.approx([0.010, 0.040])
    # B with a 7-token prompt fits beside A's decode token: in-flight batching, step 1.
    rec = run(ConstStep(0.01), reqs([0, 0.005], [7, 7], [3, 1]), NO_EVICT, tokens=8)
    assert rec.first_token_at_s.tolist() == pytest.approx([0.010, 0.020])
    # vLLM chunks B: 7 tokens beside A's decode, then the last one: first token at 30 ms.
    rec = run(ConstStep(0.01), r, VLLM, tokens=8)
    assert rec.first_token_at_s.tolist() == pytest.approx([0.010, 0.030])


def test_prompt_over_the_budget_is_refused_without_chunking():
    with pytest.raises(InputError, match="request 1 needs a prefill of 9 tokens"):
        run(ConstStep(), reqs([0, 0], [8, 9], [2, 2]), NO_EVICT, tokens=8)


def test_partial_reservation_is_held_from_admission():
    # r = 0.5: prompt 4 + 0.5 * 8 output tokens = 8 tokens, 2 blocks of 4 from the first
    # step (vLLM: 1); the third block comes when the context reaches 9 (decode step 5).
    pol = SchedulerPolicy(reserve_output_frac=0.5)
    rec = run(ConstStep(0.01), reqs([0], [4], [8]), pol, bs=4)
    assert rec.step_kv_blocks.tolist() == [2, 2, 2, 2, 2, 3, 3, 3]
    rec = run(ConstStep(0.01), reqs([0], [4], [8]), VLLM, bs=4)
    assert rec.step_kv_blocks.tolist() == [1, 2, 2, 2, 2, 3, 3, 3]


def test_policy_values_are_checked():
    with pytest.raises(InputError, match="reserve_output_frac 1.5"):
        ContinuousEngine(ConstStep(), 10, 16, 4, 64, SchedulerPolicy(reserve_output_frac=1.5))
    with pytest.raises(InputError, match="without preemption must reserve the whole output"):
        ContinuousEngine(ConstStep(), 10, 16, 4, 64, SchedulerPolicy(preemption=False))


def test_running_out_of_blocks_without_preemption_is_an_invariant(monkeypatch):
    # Reservation is what makes preemption unnecessary: without it the engine asserts rather
    # than preempting silently.
    monkeypatch.setattr(ContinuousEngine, "reserved_blocks", lambda self, p, o: 0)
    with pytest.raises(AssertionError, match="without preemption"):
        run(ConstStep(), reqs([0, 0], [4, 4], [8, 8]), NO_EVICT, blocks=4, bs=4)


# ---------------------------------------------------------------------------------------------
# Invariants over every policy
POLICIES = st.builds(
    lambda first, chunked, preempt, r: SchedulerPolicy(first, chunked, 1.0 if not preempt else r,
                                                       preempt),
    st.booleans(), st.booleans(), st.booleans(), st.sampled_from([0.0, 0.3, 1.0]))


@settings(max_examples=50, deadline=None)
@given(policy=POLICIES, n=st.integers(1, 25), seed=st.integers(0, 10**6),
       blocks=st.integers(15, 60), tokens=st.sampled_from([8, 16, 64]),
       clients=st.sampled_from([None, 1, 3]), overhead_s=st.sampled_from([0.0, 0.004]))
def test_every_request_completes_within_the_cache(policy, n, seed, blocks, tokens, clients,
                                                   overhead_s):
    if not policy.chunked_prefill:
        tokens = 64  # whole prompts (and recomputes) must fit the budget
    rng = np.random.default_rng(seed)
    arrivals = np.zeros(n) if clients else np.sort(rng.uniform(0, 0.05, n))
    r = reqs(arrivals, rng.integers(1, 30, n), rng.integers(1, 30, n), concurrency=clients)
    rec = run(LinearStep(), r, policy, blocks=blocks, bs=4, seqs=8, tokens=tokens,
              overhead_s=overhead_s)
    assert np.all(rec.first_token_at_s > rec.arrival_at_s)
    assert np.all(rec.finished_at_s >= rec.first_token_at_s)
    assert np.all(rec.admitted_at_s >= rec.arrival_at_s)
    assert int(rec.step_kv_blocks.max()) <= blocks
    assert int(rec.step_running.max()) <= 8
    if not policy.preemption:
        assert rec.preemptions == 0
    # every output token but the first is one TBT gap, each gap > 0
    assert int(rec.step_tbt_count.sum()) + len(rec.extra_gaps_s) == int((r.output_tokens - 1).sum())
    assert min(tbt_samples(rec), default=1.0) > 0
    # Little's law on the step samples: the time-integral of the number in the system (running
    # + waiting, sampled each step) equals the sum of the times requests spend in it, counted
    # from the first step boundary at or after each arrival (the engine sees arrivals there).
    starts, ends = rec.step_start_s, rec.step_start_s + rec.step_dur_s
    seen = starts[np.searchsorted(starts, rec.arrival_at_s)]
    in_system = float(np.dot(rec.step_running + rec.step_waiting, rec.step_dur_s))
    assert in_system == pytest.approx(float((rec.finished_at_s - seen).sum()), rel=1e-9)
    assert rec.finished_at_s.max() == pytest.approx(ends[-1])
    if clients:  # the k-th completion sends request clients + k, overhead_s x e its own later
        assert int((rec.step_running + rec.step_waiting).max()) <= clients
        e = np.random.default_rng(NO_JITTER.seed).standard_exponential(n)[clients:]
        sent = np.sort(np.sort(rec.finished_at_s)[: max(n - clients, 0)] + overhead_s * e)
        assert np.sort(rec.arrival_at_s)[clients:] == pytest.approx(sent)



class WindowStep(LinearStep):
    """LinearStep for a model with a 12-token sliding window."""

    window = 12.0


def _recount(decode: bool, q, sc, cfg, x) -> None:
    """The step's decode inputs and the blocks in use recounted from each sequence's own
    state (capplan.sim.compiled's rows): decoders' contexts and every running sequence's
    blocks (a decode step holds the new token's block, a prefill its chunk's)."""
    from capplan.sim import compiled as c

    dec = q[c.STATE] == c.DECODING
    ctx = q[c.COMPUTED][dec].astype(np.int64) + 1
    if decode:
        assert (x[0], x[1]) == (len(ctx), ctx.sum())
        assert x[2] == np.minimum(ctx, 12).sum()
    pre = q[c.STATE] == c.PREFILLING
    bs = int(cfg[c.BS])
    held = np.concatenate([q[c.COMPUTED][dec] + decode, q[c.COMPUTED][pre] + q[c.CHUNK][pre]])
    res = np.concatenate([q[c.RESERVED][dec], q[c.RESERVED][pre]])
    assert cfg[c.TOTAL] - sc[c.FREE] == np.maximum(res, -(-held // bs)).sum()


@settings(max_examples=30, deadline=None)
@given(policy=POLICIES, n=st.integers(1, 20), seed=st.integers(0, 10**6))
def test_step_inputs_match_a_recount(policy, n, seed):
    """The loop keeps the decode sums as it advances the sequences (and advances decode
    stretches in closed form); every step its step-time inputs and blocks in use equal a
    recount over the sequences themselves."""
    from capplan.sim.compiled import plain_module

    mod = plain_module()  # a stand-in step model runs the plain loop
    steps = []
    original = mod._inputs

    def checked(decode, q, sc, cfg, chl):  # noqa: ANN001, ANN202
        x = original(decode, q, sc, cfg, chl)
        _recount(decode, q, sc, cfg, x)
        steps.append(decode)
        return x

    rng = np.random.default_rng(seed)
    r = reqs(np.sort(rng.uniform(0, 0.05, n)), rng.integers(1, 30, n), rng.integers(1, 30, n))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mod, "_inputs", checked)
        run(WindowStep(), r, policy, blocks=40, bs=4, seqs=8,
            tokens=16 if policy.chunked_prefill else 64)
    assert steps


def test_prefill_first_decodes_more_sequences_than_its_prefill_budget():
    # vLLM's budget holds every decoder's token, so a budget below max_num_seqs is refused (as
    # vLLM's SchedulerConfig does); SGLang's chunked_prefill_size bounds prefill steps only.
    # Three 2-token prompts with a 2-token budget: three prefill steps (10 ms each, ConstStep),
    # then all three decode together for their second and third tokens (2 steps): 50 ms.
    with pytest.raises(InputError, match="must be >= --max-num-seqs 4"):
        run(ConstStep(0.01), reqs([0, 0, 0], [2, 2, 2], [3, 3, 3]), VLLM, tokens=2)
    rec = run(ConstStep(0.01), reqs([0, 0, 0], [2, 2, 2], [3, 3, 3]), PREFILL_FIRST, tokens=2)
    assert rec.finished_at_s.max() == pytest.approx(0.05)
