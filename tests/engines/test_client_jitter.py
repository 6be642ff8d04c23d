"""Client jitter in closed-loop benchmarks (ClientJitter; docs/queueing.md, "Jitter"): the
delay model by hand and by sampling, the simulator's delays, the analytic break-up of cohorts
against hand calculations and the simulator."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capplan.errors import InputError
from capplan.models.closed_loop import (
    BenchmarkProtocol,
    _exp_order_means,
    closed_loop_latency,
    cohort_step_s,
)
from capplan.models.engine import NO_JITTER, ClientJitter, SchedulerPolicy
from capplan.plan.deployment import EngineOptions, calibration_for, resolve_deployment
from capplan.plan.verify import simulate_closed_loop
from capplan.sim import ContinuousEngine, Requests


@pytest.fixture(scope="module")
def dep(catalog):
    # engine time only: the jitter alone moves arrivals
    cal = calibration_for(catalog, catalog.gpu("h100-sxm"), None).with_(request_overhead_s=0.0)
    return resolve_deployment(catalog, "llama-3.1-8b", "h100-sxm",
                              EngineOptions(max_model_len=8192), cal)


def _cl(dep, c, isl, osl, n, jitter):
    s = dep.settings
    return closed_loop_latency(dep.step, isl, osl, s.max_num_seqs, s.max_num_batched_tokens,
                               dep.memory.kv_cache_tokens, s.block_size,
                               BenchmarkProtocol(c, n, client_jitter=jitter),
                               s.profile.scheduler)


def test_spread_by_hand():
    # sqrt(0.01^2 + 1024 * 0.001^2) = sqrt(1e-4 + 1.024e-3) = 0.0335261...
    j = ClientJitter(request_s=0.01, per_token_s=0.001)
    assert j.spread_s(1024) == pytest.approx(math.sqrt(0.001124), rel=1e-12)
    assert ClientJitter(per_token_s=0.001).spread_s(4096) == pytest.approx(0.064, rel=1e-12)
    assert not ClientJitter().active
    with pytest.raises(InputError, match="request_s"):
        ClientJitter(request_s=-0.01)


def test_expected_exponential_order_statistics_by_hand_and_by_sampling():
    # n = 3: 1/3, 1/3 + 1/2, 1/3 + 1/2 + 1 (Renyi's spacings Exp(1) / (n - l))
    assert _exp_order_means(3) == pytest.approx([1 / 3, 5 / 6, 11 / 6], rel=1e-12)
    e = np.sort(np.random.default_rng(1).standard_exponential((40000, 16)), axis=1)
    assert _exp_order_means(16) == pytest.approx(e.mean(axis=0), rel=0.03)


@pytest.mark.parametrize(("overhead_s", "jitter", "osl"), [
    (0.05, ClientJitter(request_s=0.01), 100),
    (0.0, ClientJitter(per_token_s=0.002), 100),  # spread 0.002 * sqrt(100) = 0.02 s
])
def test_simulated_delays_have_the_stated_mean(dep, overhead_s, jitter, osl):
    # every request after the first C is sent by a completion and reaches the engine
    # overhead + spread * Exp(1) later: the mean delay is overhead + spread
    n, c = 400, 8
    reqs = Requests(np.zeros(n), np.full(n, 200), np.full(n, osl), np.zeros(n, np.int64), c)
    eng = ContinuousEngine(dep.step, 4000, 16, 64, 2048, SchedulerPolicy())
    r = eng.run(reqs, request_overhead_s=overhead_s, client_jitter=jitter)
    sends = np.sort(r.finished_at_s)[: n - c]
    delay = float(np.mean(r.arrival_at_s[c:]) - np.mean(sends))
    spread = jitter.spread_s(osl)
    assert delay == pytest.approx(overhead_s + spread, abs=4 * spread / math.sqrt(n - c))
    assert (r.admitted_at_s >= r.arrival_at_s - 1e-12).all()


def test_large_jitter_gives_dispersed_arrivals_by_hand(dep):
    # spread far beyond a cycle: every prompt comes back alone, lands in a decode step of the
    # others (waits half of it), waits the step already formed (vLLM 0.14+ forms each step
    # while the one before runs: SchedulerPolicy.schedules_ahead) and is prefilled alone with
    # them decoding
    r = _cl(dep, 8, 1024, 256, 400, ClientJitter(request_s=30.0))
    t_dec = r["decode_step_s"]
    running = r["running"] - 1  # the others decode in the prompt's step
    ctx = 1024 + 256 / 2
    alone = cohort_step_s(dep.step, 1, 1024, running, ctx)
    assert dep.profile.scheduler.schedules_ahead
    hand = t_dec / 2 + t_dec + alone
    assert r["ttft_steady_s"] == pytest.approx(hand, rel=0.1)
    # against the synchronised cohort of eight (no jitter): far shorter
    assert r["ttft_steady_s"] < 0.5 * _cl(dep, 8, 1024, 256, 400, ClientJitter())[
        "ttft_steady_s"]


@pytest.mark.parametrize(("c", "isl", "osl", "jitter"), [
    (8, 1024, 512, ClientJitter(request_s=0.02, per_token_s=0.001)),
    (16, 512, 256, ClientJitter(per_token_s=0.5e-3)),
    (4, 1024, 2048, ClientJitter(request_s=0.2)),
])
def test_analytic_break_up_agrees_with_simulator(dep, c, isl, osl, jitter):
    # same protocol (10 rounds, start-up wave measured); docs/queueing.md has the whole grid
    a = _cl(dep, c, isl, osl, 10 * c, jitter)["ttft_s"]["mean"]
    s = simulate_closed_loop(dep, c, isl, osl, requests=10 * c, client_jitter=jitter)
    sync = simulate_closed_loop(dep, c, isl, osl, requests=10 * c, client_jitter=ClientJitter())
    assert a == pytest.approx(s["ttft_s"]["mean"], rel=0.25)
    assert s["ttft_s"]["mean"] < 0.8 * sync["ttft_s"]["mean"]  # the jitter did break cohorts


def test_latency_and_simulate_concurrency_use_the_profile_jitter(run_cli, catalog):
    # `latency --concurrency` and `simulate --concurrency` both replay the loop in the
    # simulator with the engine profile's jitter (none in every profile since session 4's
    # refit: docs/validation.md); the analytic closed loop (the planner's screen) takes it too
    import json

    args = ("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--concurrency", "16",
            "--input-len", "1024", "--output-len", "256")
    lat = run_cli("latency", *args, "--num-prompts", "160", "--format", "json")
    assert lat.exit_code == 0, lat.stderr
    got = json.loads(lat.stdout)["ttft_s"]["mean"]
    dep = resolve_deployment(catalog, "llama-3.1-8b", "h100-sxm", EngineOptions(),
                             calibration_for(catalog, catalog.gpu("h100-sxm"), None))
    assert got == pytest.approx(simulate_closed_loop(dep, 16, 1024, 256, requests=160)
                                ["ttft_s"]["mean"], rel=1e-9)

    def analytic(jitter):
        s = dep.settings
        return closed_loop_latency(dep.step, 1024, 256, s.max_num_seqs,
                                   s.max_num_batched_tokens, dep.memory.kv_cache_tokens,
                                   s.block_size, BenchmarkProtocol(16, 160, client_jitter=jitter),
                                   s.profile.scheduler)["ttft_s"]["mean"]

    assert analytic(NO_JITTER) != pytest.approx(
        analytic(ClientJitter(request_s=0.1, per_token_s=0.002)), rel=0.02)
    sim = run_cli("simulate", *args, "--requests", "160", "--format", "json")
    assert sim.exit_code == 0, sim.stderr
    simulated = simulate_closed_loop(dep, 16, 1024, 256, requests=160)
    out = json.loads(sim.stdout)
    res = out["results"]["continuous"] if "results" in out else out
    assert res["ttft_s"]["mean"] == pytest.approx(simulated["ttft_s"]["mean"], rel=1e-6)


@settings(max_examples=30, deadline=None)
@given(c=st.integers(2, 48), isl=st.sampled_from([128, 512, 1024, 3000]),
       osl=st.integers(2, 600), request_ms=st.floats(0, 300), per_token_ms=st.floats(0, 5))
def test_jittered_steady_ttft_lies_between_one_prompt_alone_and_a_full_train(
        dep, c, isl, osl, request_ms, per_token_ms):
    # a returning prompt takes at least a prefill step of its own (with the others decoding,
    # here bounded below by the step with none) and at most the wait for every running prompt
    # prefilled back to back at the full budget, plus the decode step it landed in
    jitter = ClientJitter(request_s=request_ms / 1e3, per_token_s=per_token_ms / 1e3)
    r = _cl(dep, c, isl, osl, 5 * c, jitter)
    ctx = isl + osl / 2
    alone = cohort_step_s(dep.step, 1, isl, 0, ctx)
    k = max(math.floor(dep.settings.max_num_batched_tokens / isl), 1)
    full = cohort_step_s(dep.step, k, isl, r["running"], ctx)
    train = math.ceil(r["running"] / k) * full + r["decode_step_s"]
    steady = r["ttft_steady_s"] - r["slot_wait_s"]
    assert alone * 0.999 <= steady <= train * 1.001
    assert math.isfinite(r["tpot_s"]) and r["tpot_s"] > 0
