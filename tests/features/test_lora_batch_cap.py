"""The running batch LoRA slots allow (vLLM admits no request of a further adapter once
max_loras distinct adapters run): hand calculations, the simulator, latency and recommend."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

import capplan
from capplan.cli import cli
from capplan.models.lora import adapter_groups, running_batch_cap

MODEL, GPU = "llama-3.1-8b", "h100-sxm"


# 8 uniform adapters, E[D(B)] = 8 (1 - (7/8)^B):
#   B = 1: 1.000, 2: 1.875, 3: 2.641, 5: 3.897, 6: 4.410, 15: 6.921, 16: 7.055; never above 8.
@pytest.mark.parametrize(("slots", "batch"), [(1, 1), (2, 2), (4, 5), (7, 15), (8, np.inf)])
def test_uniform_cap_by_hand(slots, batch):
    assert float(running_batch_cap(adapter_groups(8, "uniform"), slots)) == batch


@pytest.mark.parametrize(("slots", "batch"), [(1, 1), (8, 9)])
def test_zipf_cap_matches_the_exact_sum(slots, batch):
    # Zipf (s = 1) over 100 adapters, p_a = 1 / (a H_100): the exact per-adapter sum
    # sum_a 1 - (1 - p_a)^B is 7.38 at B = 9 and 8.05 at B = 10 (and 1 at B = 1).
    p = 1 / np.arange(1, 101)
    p /= p.sum()
    exact = [float((1 - (1 - p) ** b).sum()) for b in (batch, batch + 1)]
    assert exact[0] <= slots < exact[1]
    assert float(running_batch_cap(adapter_groups(100, "zipf"), slots)) == batch


def test_no_lora_no_cap():
    dep = capplan.deployment(MODEL, GPU, max_model_len=4096)
    assert float(dep.step.lora_batch_cap) == np.inf
    assert dep.limits.max_num_seqs == dep.settings.max_num_seqs


def test_the_simulator_fills_the_batch_with_loaded_adapters():
    # 4 slots, 8 uniform adapters: the expected-count cap above is 5 sequences, but the replay
    # draws each request's adapter and admits every waiting request of a loaded adapter (vLLM
    # Scheduler.schedule), so at 20 req/s its running batch holds many more than 5 (and never
    # more than 4 adapters: tests/sim/test_lora_admission.py)
    res = capplan.simulate(MODEL, GPU, rate=20, input_len=500, output_len=200, requests=400,
                           max_loras=4, lora_adapters=8).to_dict()
    assert max(res["time_series"]["running"]) > 20
    assert res["mean_running_batch"] > 10


def test_latency_says_max_loras_binds():
    r = CliRunner().invoke(cli, ["latency", "--model", MODEL, "--gpu", GPU, "--rate", "0.3",
                                 "--input-len", "500", "--output-len", "200",
                                 "--lora-adapters", "8", "--max-loras", "1"])
    assert r.exit_code == 0, r.output
    assert ("max_loras 1 binds: with 8 uniform adapters a replica runs at most 1 sequence "
            "at once") in r.output
    r = CliRunner().invoke(cli, ["latency", "--model", MODEL, "--gpu", GPU, "--rate", "0.3",
                                 "--input-len", "500", "--output-len", "200",
                                 "--lora-adapters", "8", "--max-loras", "8"])
    assert r.exit_code == 0, r.output
    assert "binds" not in r.output


def test_recommend_keeps_the_batch():
    # 5 req/s (6 with headroom) of 500 + 200 tokens needs more than 5 running sequences (one
    # replica at 5 sequences serves ~2.9 req/s), so 1, 2 and 4 slots (at most 1, 2, 5
    # sequences) cannot carry it on one GPU; 8 slots hold every adapter.
    r = CliRunner().invoke(cli, ["recommend", "--model", MODEL, "--gpu", GPU, "--rate", "5",
                                 "--input-len", "500", "--output-len", "200", "--ttft-p99", "1",
                                 "--tbt-p99", "0.05", "--no-disagg", "--adapters", "8",
                                 "--verify-top", "0", "--format", "json"])
    assert r.exit_code == 0, r.output
    best = json.loads(r.output)["recommendations"][0]
    assert best["features"]["max_loras"] == 8
    assert best["gpus_total"] == 1


def test_a_plans_verification_replay_runs_max_num_seqs_as_simulate_does():
    # the planner's replay job (planner._verify_job) takes the engine's max_num_seqs, as
    # `simulate` does, LoRA or not: the replay applies the slots per request (max_loras rule)
    from types import SimpleNamespace

    from capplan.plan.planner import _verify_job

    for opts in ({"max_loras": 4, "lora_adapters": 8}, {}):
        dep = capplan.deployment(MODEL, GPU, max_model_len=4096, **opts)
        cand = SimpleNamespace(settings=dep.settings, step=dep.step, pool=dep.pool)
        rec = SimpleNamespace(candidate=cand, replicas=1,
                              predicted=SimpleNamespace(mean_running_batch=4.0))
        pool = SimpleNamespace(lanes=[], traffic=SimpleNamespace(out=SimpleNamespace(mean=200)))
        job = _verify_job(rec, pool, 300)
        assert job.max_num_seqs == dep.limits.max_num_seqs == 1024
