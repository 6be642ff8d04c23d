"""An engine that prefills whole prompts in steps that also decode (TensorRT-LLM without
chunked prefill) admits a P-token prompt only beside at most budget - P running decodes
(SchedulerPolicy.decodes_beside_prompt; TensorRT-LLM MicroBatchScheduler counts each running
decode against max_num_tokens before a context request). With 8,192-token prompts and the
engine's default max_num_tokens of 8,192 no prompt joins a running decode: the replica serves
one request at a time. The analytic screen, the replay, `latency`'s warning and `recommend`'s
search all follow from that."""

from __future__ import annotations

import pytest

from capplan import api
from capplan.models.engine import engine_profile
from capplan.models.queueing import LengthStats
from capplan.plan.deployment import EngineOptions, resolve_deployment
from capplan.plan.load import LoadSpec, queue_model

ISL, OSL = 8192, 1024
SETUP = {"engine": "trtllm", "tp": 8, "input_len": ISL, "output_len": OSL}


def _dep(catalog, budget: int):
    return resolve_deployment(catalog, "llama-3.1-70b", "b200",
                              EngineOptions(engine="trtllm", tp=8, max_num_batched_tokens=budget))


def _alone_s(dep) -> float:
    """One request with the replica to itself, by hand: its prompt's step (the first token
    comes out of it), then OSL - 1 decode steps of one sequence at the mean context
    ISL + OSL / 2."""
    prefill = float(dep.step.prefill_chunk(ISL, 0)["step_s"])
    decode = float(dep.step.decode_step(1, ISL + OSL / 2)["step_s"])
    return prefill + (OSL - 1) * decode


def test_the_rule_is_the_profile_scheduler_s():
    trt = engine_profile("trtllm").scheduler
    assert trt.decodes_beside_prompt(8192, 8192) == 0
    assert trt.decodes_beside_prompt(9216, 8192) == 1024
    # chunking engines split the prompt; a prefill-first engine's prompt step has no decodes
    assert engine_profile("vllm").scheduler.decodes_beside_prompt(8192, 8192) is None
    assert engine_profile("vllm@0.6").scheduler.decodes_beside_prompt(8192, 8192) is None


def test_the_screen_serves_one_request_at_a_time_when_no_decode_fits(catalog):
    dep = _dep(catalog, 8192)
    q = queue_model(dep, _load(ISL, OSL))
    assert float(q.capacity_rate()) == pytest.approx(1 / _alone_s(dep), rel=0.05)
    # with room for every running sequence beside a prompt the cap is max_num_seqs again
    roomy = _dep(catalog, ISL + dep.settings.max_num_seqs)
    assert float(queue_model(roomy, _load(ISL, OSL)).capacity_rate()) > 3 / _alone_s(dep)


def test_the_replay_agrees_at_overload(catalog):
    dep = _dep(catalog, 8192)
    res = api.simulate("llama-3.1-70b", "b200", rate=1.0, requests=30,
                       max_num_batched_tokens=8192, **SETUP).data
    assert res["mean_running_batch"] <= 1.0 + 1e-9
    assert res["requests_per_s"] == pytest.approx(1 / _alone_s(dep), rel=0.05)


def test_latency_says_why_prompts_wait(catalog):
    tight = api.latency("llama-3.1-70b", "b200", concurrency=4, num_prompts=16,
                        max_num_batched_tokens=8192, **SETUP).data
    [w] = [w for w in tight["warnings"] if "prefills each prompt whole" in w]
    assert "joins at most 0 running sequences" in w and "--max_num_tokens" in w
    roomy = api.latency("llama-3.1-70b", "b200", concurrency=4, num_prompts=16,
                        max_num_batched_tokens=ISL + 2048, **SETUP).data
    assert not [w for w in roomy["warnings"] if "prefills each prompt whole" in w]
    # prompts that wait a whole request each: TTFT grows by several requests' decode time
    assert tight["ttft_s"]["mean"] > 10 * roomy["ttft_s"]["mean"]


def test_recommend_sizes_a_budget_that_lets_prompts_join_and_launches_it():
    # Before: every configuration the screen passed (budget 8,192 among them) missed the TTFT
    # SLO in the replay, and recommend exited with no plan.
    rec = api.recommend("llama-3.1-70b", rate=1.0, input_len=ISL, output_len=OSL,
                        ttft_p99_s=2.0, tbt_p99_s=0.05, gpus=["b200"], engine="trtllm")
    best = rec.recommendations[0]
    budget = best.candidate.settings.max_num_batched_tokens
    assert budget >= ISL + best.candidate.settings.max_num_seqs
    line = best.engine_flags["trtllm"]
    assert f"--max_num_tokens {budget} " in line


def _load(isl: int, osl: int) -> LoadSpec:
    return LoadSpec(rate_per_s=0.01, concurrency=None, input_stats=LengthStats.fixed(isl),
                    output_stats=LengthStats.fixed(osl))


def test_prompts_over_the_budget_are_counted(catalog):
    # lognormal with mean 800 and p99 8,000 tokens, by hand: s solves
    # ln(8000 / 800) = 2.326 s - s^2 / 2 -> s = 1.429, mu = ln 800 - s^2 / 2 = 5.664;
    # P(prompt > 8,192) = 1 - Phi((ln 8192 - 5.664) / 1.429) = 1 - Phi(2.342) = 0.96%
    # (the length table holds 201 quantiles: its shares step by 0.5 point).
    import re

    from capplan.errors import InputError

    with pytest.raises(InputError) as e:
        api.latency("llama-3.1-8b", "h100-sxm", engine="trtllm", rate=10.0,
                    input_len="lognormal:mean=800,p99=8000", output_len=300)
    share = float(re.search(r"([\d.]+)% of prompts exceed it", str(e.value)).group(1))
    assert share == pytest.approx(0.96, abs=0.5)
    assert "--max-num-batched-tokens 8192" in str(e.value)
    assert "--engine trtllm+chunked-prefill" in str(e.value)  # the engine's way around it


def test_a_plan_takes_the_lengths_its_servers_accept(catalog):
    # max-model-len unset: twice the p99 request (4,000 + 1,000 tokens) rounded up to a power
    # of two = 16,384 tokens, below Llama-3.1-8B's 131,072: the lognormal's far tail (its
    # length table reaches ~130,000 tokens) is cut to fit, as the launched server rejects a
    # longer request, so a whole-prompt engine's budget of max-model-len holds every prompt.
    from capplan.plan.planner import served_traffic
    from capplan.plan.schema import PlanFile

    spec = {"model": "llama-3.1-8b", "candidates": {"gpus": ["h100-sxm"], "tp": [1]},
            "engine": {"name": "trtllm", "max_num_seqs": [128],
                       "max_num_batched_tokens": [8192]},
            "workloads": [{"rate_per_s": 5, "input_len": "lognormal:mean=800,p99=4000",
                           "output_len": "lognormal:mean=250,p99=1000",
                           "slo": {"ttft_p99_s": 1.0, "tbt_p99_s": 0.06}}]}
    plan = PlanFile.model_validate(spec)
    t = served_traffic(plan.workloads, plan, catalog.models["llama-3.1-8b"])
    assert max(t.inp.table) + t.out.table[0] <= 16384
    assert max(t.inp.table) > 8192  # the tail is cut at the server's limit, not at the budget
    # before: "no candidate configuration fits the model in memory" (no budget held the tail)
    rec = api.run_plan(spec)
    assert rec.best.candidate.settings.max_num_batched_tokens == 16384
    # the file asked for 8,192: the plan says it raised it, and why
    assert any("token budget 8192 raised to max-model-len 16384" in w for w in rec.warnings)
