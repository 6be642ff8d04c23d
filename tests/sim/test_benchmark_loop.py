"""Closed loop as benchmark clients run it (`vllm bench serve --max-concurrency C
--num-prompts N`): C requests start together at t = 0, each completion sends the next request
in order, N in total, and every one of the N is measured (no warm-up request is dropped)."""

from __future__ import annotations

import numpy as np
import pytest

from capplan.errors import InputError
from capplan.models.engine import NO_JITTER, ClientJitter, SchedulerPolicy
from capplan.sim import ContinuousEngine, Lane, Requests, Workload, parse_length, simulate
from capplan.sim.metrics import summarize
from tests.sim.conftest import ConstStep, step_by_step

FIXED = ClientJitter(fixed_overhead=True)
"""Every closed-loop delay exactly the request overhead (the hand calculations below)."""


def test_hand_computed_schedule_two_clients_five_requests():
    # C = 2, N = 5, prompts of 3 tokens (one step), outputs 2, 4, 1, 3, 2; 10 ms steps.
    # step 0 [0, 10]   prefill R0, R1 (sent at 0)            first tokens R0, R1 at 10
    # step 1 [10, 20]  decode R0 (done), R1                  R2 sent at 20
    # step 2 [20, 30]  decode R1, prefill R2 (done: 1 token) R3 sent at 30
    # step 3 [30, 40]  decode R1 (done), prefill R3          R4 sent at 40
    # step 4 [40, 50]  decode R3, prefill R4
    # step 5 [50, 60]  decode R3 (done), R4 (done)
    out = np.array([2, 4, 1, 3, 2])
    r = Requests(np.zeros(5), np.full(5, 3), out, np.zeros(5, np.int64), concurrency=2)
    rec = ContinuousEngine(ConstStep(0.01), 100, 16, 8, 64).run(r)
    assert rec.arrival_at_s.tolist() == pytest.approx([0.0, 0.0, 0.020, 0.030, 0.040])
    assert rec.first_token_at_s.tolist() == pytest.approx([0.010, 0.010, 0.030, 0.040, 0.050])
    assert rec.finished_at_s.tolist() == pytest.approx([0.020, 0.040, 0.030, 0.060, 0.060])
    res = summarize(rec, (Lane(),))
    assert res.num_requests == 5  # all N, the start-up wave included
    assert res.ttft_s["mean"] == pytest.approx(0.010)
    assert res.e2e_s["mean"] == pytest.approx((0.02 + 0.04 + 0.01 + 0.03 + 0.02) / 5)
    assert res.makespan_s == pytest.approx(0.060)
    assert res.requests_per_s == pytest.approx(5 / 0.060)
    # at most C requests are ever in the system
    assert int((rec.step_running + rec.step_waiting).max()) == 2


def test_start_up_wave_queues_behind_the_token_budget():
    # C = 3 clients start together with 6-token prompts and a budget of 8 tokens: the wave
    # prefills in chunks (R0 6 + R1 2 | R1 4 + R2 4 | R2 2), so the last client's first token
    # comes at the third step, 30 ms, as a benchmark measures it (no warm-up cut hides it).
    r = Requests(np.zeros(3), np.full(3, 6), np.full(3, 1), np.zeros(3, np.int64), concurrency=3)
    rec = ContinuousEngine(ConstStep(0.01), 100, 16, 8, 8).run(r)
    assert rec.first_token_at_s.tolist() == pytest.approx([0.010, 0.020, 0.030])


def test_simulate_runs_the_benchmark_protocol():
    # Workload(num_requests=N, concurrency=C): waves of C; fixed lengths prompt 3, output 2:
    # each wave takes a prefill step and a decode step (20 ms), N / C = 3 waves.
    wl = Workload((Lane(input_len=parse_length(3), output_len=parse_length(2)),),
                  num_requests=6, concurrency=2)
    res = simulate(ConstStep(0.01), workload=wl, seed=0, scheduler="continuous",
                   num_gpu_blocks=100, block_size=16, max_num_seqs=8, max_num_batched_tokens=64)
    assert res.num_requests == 6
    assert res.ttft_s["mean"] == pytest.approx(0.010)
    assert res.e2e_s["mean"] == pytest.approx(0.020)
    assert res.makespan_s == pytest.approx(0.060)
    assert res.requests_per_s == pytest.approx(100.0)


def test_closed_loop_under_prefill_first():
    # SGLang's prefill-first steps with C = 2: R2, sent when R0 ends, is prefilled in a step
    # of its own while R1 skips it, so R1 ends 10 ms later than it would under vLLM.
    r = Requests(np.zeros(3), np.full(3, 3), np.array([2, 3, 1]), np.zeros(3, np.int64),
                 concurrency=2)
    rec = ContinuousEngine(ConstStep(0.01), 100, 16, 8, 64,
                           SchedulerPolicy(prefill_first=True)).run(r)
    # step 0 prefill R0, R1 | 1 decode R0 (done), R1 | 2 prefill R2 (done) | 3 decode R1 (done)
    assert rec.arrival_at_s.tolist() == pytest.approx([0.0, 0.0, 0.020])
    assert rec.finished_at_s.tolist() == pytest.approx([0.020, 0.040, 0.030])


def test_request_overhead_delays_the_next_request():
    # C = 1, overhead 5 ms: each request reaches the engine 5 ms after the last one ended.
    # [0, 20] R0 (prefill, decode) | idle | [25, 45] R1 | idle | [50, 70] R2
    r = Requests(np.zeros(3), np.full(3, 3), np.full(3, 2), np.zeros(3, np.int64),
                 concurrency=1)
    rec = ContinuousEngine(ConstStep(0.01), 100, 16, 8, 64).run(r, request_overhead_s=0.005,
                                                               client_jitter=FIXED)
    assert rec.arrival_at_s.tolist() == pytest.approx([0.0, 0.025, 0.050])
    assert rec.finished_at_s.tolist() == pytest.approx([0.020, 0.045, 0.070])
    assert rec.step_start_s.tolist() == pytest.approx([0, 0.01, 0.025, 0.035, 0.05, 0.06])
    res = summarize(rec, (Lane(),))
    assert res.requests_per_s == pytest.approx(3 / 0.070)  # cycle = 20 ms + 5 ms overhead


def test_request_overhead_varies_per_request_with_mean_overhead():
    # C = 1, overhead 5 ms, no fixed_overhead: request k reaches the engine 5 ms x e_k after
    # request k - 1 ended, e_k the k-th Exp(1) draw of the seed's generator (sending order).
    # Each request is alone and arrives idle: prefill at its arrival, finish 20 ms later.
    r = Requests(np.zeros(4), np.full(4, 3), np.full(4, 2), np.zeros(4, np.int64),
                 concurrency=1)
    e = np.random.default_rng(NO_JITTER.seed).standard_exponential(4)
    want, t = [0.0], 0.0
    for k in range(1, 4):
        t = t + 0.020 + 0.005 * e[k]
        want.append(t)
    rec = ContinuousEngine(ConstStep(0.01), 100, 16, 8, 64).run(r, request_overhead_s=0.005)
    assert rec.arrival_at_s.tolist() == pytest.approx(want, abs=1e-12)
    assert rec.finished_at_s.tolist() == pytest.approx([a + 0.020 for a in want], abs=1e-12)


def test_request_overhead_arrival_waits_for_a_step_boundary():
    # C = 2, overhead 15 ms: R2 is sent when R0 ends (20 ms) and arrives at 35 ms, inside
    # R1's last decode step [30, 40]; it is prefilled in the next step, [40, 50].
    r = Requests(np.zeros(3), np.full(3, 3), np.array([2, 4, 1]), np.zeros(3, np.int64),
                 concurrency=2)
    rec = ContinuousEngine(ConstStep(0.01), 100, 16, 8, 64).run(r, request_overhead_s=0.015,
                                                               client_jitter=FIXED)
    assert rec.arrival_at_s.tolist() == pytest.approx([0.0, 0.0, 0.035])
    assert rec.admitted_at_s.tolist() == pytest.approx([0.0, 0.0, 0.040])
    assert rec.finished_at_s.tolist() == pytest.approx([0.020, 0.040, 0.050])
    with pytest.raises(InputError, match="request_overhead_s -1"):
        ContinuousEngine(ConstStep(0.01), 100, 16, 8, 64).run(r, request_overhead_s=-1)


def test_request_overhead_with_event_skipping_matches_step_by_step(llama_h100):
    """Closed-loop arrivals that depend on the clock: decode stretches (which stop at the next
    arrival) give the run of scheduling every step on its own."""
    wl = Workload((Lane(input_len=parse_length("lognormal:mean=500,p99=2500"),
                        output_len=parse_length("lognormal:mean=60,p99=300")),),
                  num_requests=300, concurrency=24)
    kw = dict(scheduler="continuous", num_gpu_blocks=3000, block_size=16, max_num_seqs=256,
              max_num_batched_tokens=2048, request_overhead_s=0.07)
    fast = simulate(llama_h100.step, workload=wl, seed=2, **kw).to_dict()
    with step_by_step():
        slow = simulate(llama_h100.step, workload=wl, seed=2, sim_engine="python",
                        **kw).to_dict()
    for key in ("ttft_s", "e2e_s", "tbt_s"):
        assert fast[key] == pytest.approx(slow[key], rel=1e-9)
    assert fast["makespan_s"] == pytest.approx(slow["makespan_s"], rel=1e-12)
    without = simulate(llama_h100.step, workload=wl, seed=2,
                       **dict(kw, request_overhead_s=0.0)).to_dict()
    assert fast["requests_per_s"] < without["requests_per_s"]
