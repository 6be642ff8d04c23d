"""The closed-loop benchmark replay of a fixed P/D layout (capplan.plan.pd_sim.benchmark_replay):
a closed loop worked out by hand from constant step times, the truncated replay (wave + 4
rounds, the later rounds' mean repeated) against the whole run, and `latency`'s closed loop
answered by it (API and CLI)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from capplan.api import disaggregated, pd_latency
from capplan.models.disagg import kv_transfer_s
from capplan.plan.pd import make_layout
from capplan.plan.pd_sim import benchmark_replay


class ConstStep:
    """A step model stand-in: every step takes `step_s` seconds, whatever it computes."""

    window = 2.0**62
    request_overhead_s = 0.0
    spec_source = None

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s

    def step(self, detail: bool = True, **kw):  # noqa: ANN003, ANN201, ARG002
        return {"step_s": np.full(np.shape(kw["num_decode"]), self.step_s)}


S_P, S_D = 0.05, 0.01
"""Prefill step (one 1,024-token prompt per step: the prefill worker's budget is 1,024 tokens)
and decode step (any batch), in seconds."""


@pytest.fixture(scope="module")
def const_layout():
    lay = disaggregated("llama-3.1-8b", "h100-sxm", max_model_len=4096, prefill_workers=1,
                        decode_workers=1, prefill={"max_num_batched_tokens": 1024})
    return make_layout(replace(lay.prefill, step=ConstStep(S_P)), 1,
                       replace(lay.decode, step=ConstStep(S_D)), 1)


def test_a_prefill_bound_closed_loop_by_hand(const_layout):
    # C = 64 clients, 1024 / 201 tokens. A client's cycle without queueing is at least
    # 200 decode steps = 2.0 s, so 64 clients would send 32 req/s, above the prefill worker's
    # 1 / S_P = 20 req/s: the prefill worker never idles and is the loop's bound.
    # - TPOT: every decode step emits one token of every running request: S_D exactly.
    # - Start-up wave: the k-th prompt ends at k S_P (k = 1..64), then the KV transfer T, then
    #   the decode step that admits it: the decode worker (vLLM 0.14+, async scheduling) forms
    #   each step while the one before runs, so a request arriving during a step joins the step
    #   after the next (d in [2 S_D, 3 S_D): the rest of the running step, the step already
    #   formed, its own), the first one excepted (an idle worker admits at once):
    #   mean TTFT = (C + 1) / 2 x S_P + T + d = 1.625 s + T + d.
    # - Later rounds: request k of round r + 1 is sent when request k of round r ends; its
    #   prompt ends C S_P after that one's, so TTFT = C S_P - 200 S_D + (d' - d) = 1.2 s
    #   within one decode step.
    # - The benchmark's 20 rounds: (wave + 19 x later) / 20.
    c, isl, osl = 64, 1024, 201
    t = float(kv_transfer_s(isl, const_layout.decode.memory.kv_bytes_per_token_per_gpu,
                            const_layout.link))
    assert const_layout.decode.settings.profile.scheduler.schedules_ahead
    wave = (c + 1) / 2 * S_P + t + 2.5 * S_D
    later = c * S_P - (osl - 1) * S_D
    res = benchmark_replay(const_layout, c, str(isl), str(osl), 20 * c)
    assert res["tpot_s"]["mean"] == pytest.approx(S_D, rel=1e-9)
    b = res["benchmark_replay"]
    assert not b["extrapolated"] and b["replayed_requests"] == 20 * c and b["rounds"] == 20
    # the wave within half a decode step of the hand figure (d's range), over 1.6 s: 0.4%
    assert b["ttft_wave_mean_s"] == pytest.approx(wave, abs=0.5 * S_D + 1e-9)
    # the whole run within one decode step (the later rounds' d' - d): 1% of 1.2 s
    assert res["ttft_s"]["mean"] == pytest.approx((wave + 19 * later) / 20, abs=S_D)
    # the replayed rounds run at the prefill worker's 1 / S_P (the drain at the end aside)
    assert res["requests_per_s"] == pytest.approx(1 / S_P, rel=0.2)


@pytest.fixture(scope="module")
def llama_layout():
    return disaggregated("llama-3.1-8b", "h100-sxm", max_model_len=4096, prefill_workers=1,
                         decode_workers=2)


@pytest.mark.parametrize("spread", [0.0, None])
def test_the_benchmark_replay_runs_every_round_and_truncates_only_at_the_limit(
        llama_layout, monkeypatch, spread):
    # 24 clients, 20 rounds (AIPerf's 20 x C), against all 480 requests replayed to the exact
    # fixed point (simulate_pd). The benchmark replay runs every round; its passes stop when
    # the means settle (MEANS_SETTLED), near the fixed point (TTFT 1% with identical workers,
    # 6% with workers 8% apart; TPOT and E2E 1-2%, measured). Under a sim_tokens limit that
    # holds 4 rounds it replays the wave and rounds 2-4 and repeats their mean, missing how
    # the clients drift out of step over rounds 5-20 (each request overhead's own delay):
    # TTFT 4% and 2% below the fixed point here (measured).
    from capplan import limits
    from capplan.plan import pd_sim

    if spread is not None:
        monkeypatch.setattr(pd_sim, "SPEED_SPREAD", spread)
    c = 24
    whole = benchmark_replay(llama_layout, c, "2048", "128", 20 * c)
    reqs, _ = pd_sim.pd_requests(llama_layout, pd_sim.PdLoad(
        concurrency=c, input_len="2048", output_len="128", requests=20 * c))
    exact = pd_sim.simulate_pd(llama_layout, reqs)
    assert not whole["benchmark_replay"]["extrapolated"]
    assert whole["benchmark_replay"]["replayed_requests"] == 20 * c
    assert exact["replay_settled"]
    for key, tol in (("ttft_s", 0.03 if spread == 0.0 else 0.10), ("tpot_s", 0.02),
                     ("e2e_s", 0.02)):
        assert whole[key]["mean"] == pytest.approx(exact[key]["mean"], rel=tol), key
    limits.set_cap(f"sim_tokens={4 * c * 128}")
    try:
        cut = benchmark_replay(llama_layout, c, "2048", "128", 20 * c)
    finally:
        limits.reset_caps()
    assert cut["benchmark_replay"]["extrapolated"]
    assert cut["benchmark_replay"]["replayed_requests"] == 4 * c
    assert cut["ttft_s"]["mean"] == pytest.approx(exact["ttft_s"]["mean"],
                                                  rel=0.06 if spread == 0.0 else 0.05)
    for key in ("tpot_s", "e2e_s"):
        assert cut[key]["mean"] == pytest.approx(exact[key]["mean"], rel=0.02), key


def test_latency_closed_loop_answers_with_the_benchmark_replay(llama_layout, run_cli):
    res = pd_latency("llama-3.1-8b", "h100-sxm", prefill_workers=1, decode_workers=2,
                     concurrency=24, input_len=2048, output_len=128, max_model_len=4096,
                     benchmark="aiperf").data
    assert res["answered_by"] == "replay of the benchmark"
    assert res["benchmark_replay"]["measured_requests"] == 240  # AIPerf's 10 x C
    assert res["benchmark"]["tool"].startswith("AIPerf")
    assert "analytic_check" in res
    args = ("latency", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--prefill-workers",
            "1", "--decode-workers", "2", "--input-len", "2048", "--output-len", "128",
            "--max-model-len", "4096")
    out = run_cli(*args, "--concurrency", "24", "--benchmark", "aiperf")
    assert out.exit_code == 0
    # AIPerf's 240 measured requests, all replayed (10 rounds); above the sim_tokens limit
    # the wave and rounds 2-4 (4 x 24 = 96), the other 144 at their mean, counted once
    assert ("load: closed loop, 24 clients, 240 measured requests (AIPerf / genai-perf);"
            in " ".join(out.stdout.split()))
    assert "replayed:" not in out.stdout
    cut = run_cli("--limit", f"sim_tokens={4 * 24 * 128}", *args, "--concurrency", "24",
                  "--benchmark", "aiperf")
    assert cut.exit_code == 0
    assert ("load: closed loop, 24 clients, 240 measured requests (AIPerf / genai-perf); "
            "replayed: 96 "
            "requests (the start-up wave and rounds 2-4), the other 144 at rounds 2-4's mean;"
            in " ".join(cut.stdout.split()))
    bad = run_cli(*args, "--rate", "2", "--benchmark", "aiperf")
    assert bad.exit_code == 2 and "--concurrency" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_a_replay_above_the_token_limit_is_answered_analytically(run_cli):
    # 24 clients x 4 rounds x 128 tokens = 12,288 tokens a pass, above a 1,000-token limit:
    # the analytic solve answers and says why (not an error)
    out = run_cli("--limit", "sim_tokens=1000", "latency", "--model", "llama-3.1-8b", "--gpu",
                  "h100-sxm", "--prefill-workers", "1", "--decode-workers", "2",
                  "--input-len", "2048", "--output-len", "128", "--max-model-len", "4096",
                  "--concurrency", "24", "--format", "json")
    assert out.exit_code == 0
    data = out.json()
    assert data["answered_by"] == "analytic" and "sim_tokens" in data["replay_note"]
