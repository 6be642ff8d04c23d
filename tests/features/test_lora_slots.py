"""LoRA slots (vLLM max_loras) in the answers: the replay runs the admission rule per request
(tests/sim/test_lora_admission.py), so no answer caps the running batch; `latency` answers a
load with fewer slots than adapters by replay, and the planner ranks full slots first."""

import json

import pytest
from click.testing import CliRunner

import capplan
from capplan.cli import cli
from capplan.plan.replay import LORA_REPLAY_REQUESTS, LORA_SLOT_REASON

MODEL, GPU = "llama-3.1-8b", "h100-sxm"
LATENCY = ["latency", "--model", MODEL, "--gpu", GPU, "--input-len", "500", "--output-len",
           "300", "--format", "json"]


def test_no_answer_caps_the_batch_by_the_slots():
    for opts in ({}, {"max_loras": 4, "lora_adapters": 32}):
        dep = capplan.deployment(MODEL, GPU, max_model_len=4096, **opts)
        assert dep.limits.max_num_seqs == dep.settings.max_num_seqs


def test_the_simulator_fills_the_batch_with_loaded_adapters():
    # 4 slots, 8 uniform adapters: the batch whose expected distinct adapters fit 4 slots is 5
    # sequences (E[D(5)] = 8 (1 - (7/8)^5) = 3.90); the replay admits every waiting request of
    # a loaded adapter (vLLM Scheduler.schedule), so at 20 req/s it runs far more at once
    res = capplan.simulate(MODEL, GPU, rate=20, input_len=500, output_len=200, requests=400,
                           max_loras=4, lora_adapters=8).to_dict()
    assert max(res["time_series"]["running"]) > 20
    assert res["mean_running_batch"] > 10


def test_latency_answers_slots_below_the_adapters_by_replay():
    # 4 slots over 32 adapters: the analytic queue (no wait for a slot) would answer 2 req/s
    # with ~50 ms TTFTs; the replay's requests wait seconds for their adapter
    r = CliRunner().invoke(cli, [*LATENCY, "--rate", "2", "--max-loras", "4",
                                 "--lora-adapters", "32"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    assert res["answered_by"] == "replay" and res["num_requests"] == LORA_REPLAY_REQUESTS
    assert res["analytic_check"]["reason"] == LORA_SLOT_REASON
    assert not res["analytic_check"]["agrees"]
    assert res["ttft_s"]["mean"] > 1.0 > 0.1 > res["analytic_check"]["analytic"]["ttft_s"]["mean"]
    assert any(w.startswith("max_loras 4 < 32 uniform adapters: a request whose adapter has "
                            "no slot waits") for w in res["warnings"])


def test_an_overloaded_slot_bound_rate_is_the_replays_verdict():
    # 40 req/s is over what one replica serves with or without adapters; with fewer slots
    # than adapters the replay, not the analytic queue, says so and gives the rate it served
    r = CliRunner().invoke(cli, [*LATENCY, "--rate", "40", "--max-loras", "4",
                                 "--lora-adapters", "32"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    assert res["stable"] is False and res["answered_by"] == "replay"
    assert 5 < res["capacity_requests_per_s"] < 35


def test_slots_for_every_adapter_leave_the_analytic_screen():
    r = CliRunner().invoke(cli, [*LATENCY, "--rate", "5", "--max-loras", "8",
                                 "--lora-adapters", "8"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    assert res["answered_by"] == "analytic"
    assert not any("max_loras" in w for w in res["warnings"])


def test_recommend_gives_every_adapter_a_slot():
    # 5 req/s of 500 + 200 tokens, 8 adapters: one GPU carries it with 1, 2, 4 or 8 slots by
    # the analytic screen (which does not price the wait for a slot); at equal cost the
    # planner ranks the configuration whose slots hold every adapter first
    # (search.slot_shortfall), which the replay confirms: with 1 slot requests wait seconds
    r = CliRunner().invoke(cli, ["recommend", "--model", MODEL, "--gpu", GPU, "--rate", "5",
                                 "--input-len", "500", "--output-len", "200", "--ttft-p99", "1",
                                 "--tbt-p99", "0.05", "--no-disagg", "--adapters", "8",
                                 "--format", "json"])
    assert r.exit_code == 0, r.output
    best = json.loads(r.output)["recommendations"][0]
    assert best["features"]["max_loras"] == 8
    assert best["gpus_total"] == 1


@pytest.mark.parametrize("opts", [{"max_loras": 4, "lora_adapters": 8}, {}])
def test_a_plans_verification_replay_runs_max_num_seqs_as_simulate_does(opts):
    # the planner's replay job (planner._verify_job) takes the engine's max_num_seqs, as
    # `simulate` does, LoRA or not: the replay applies the slots per request
    from types import SimpleNamespace

    from capplan.plan.planner import _verify_job

    dep = capplan.deployment(MODEL, GPU, max_model_len=4096, **opts)
    cand = SimpleNamespace(settings=dep.settings, step=dep.step, pool=dep.pool)
    rec = SimpleNamespace(candidate=cand, replicas=1,
                          predicted=SimpleNamespace(mean_running_batch=4.0))
    pool = SimpleNamespace(lanes=[], traffic=SimpleNamespace(out=SimpleNamespace(mean=200)))
    job = _verify_job(rec, pool, 300)
    assert job.max_num_seqs == dep.limits.max_num_seqs == 1024


def test_a_runs_adapters_follow_its_seed():
    # run_simulation draws each request's adapter once, with the run's seed, for every
    # scheduler and replica: the same seed gives the same run, another seed another draw
    kw = dict(rate=6, input_len=500, output_len=300, requests=600, max_loras=2,
              lora_adapters=8)
    a, b, c = (capplan.simulate(MODEL, GPU, seed=s, **kw).to_dict() for s in (1, 1, 2))
    assert a["ttft_s"] == b["ttft_s"] and a["ttft_s"] != c["ttft_s"]
