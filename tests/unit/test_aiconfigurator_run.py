"""An AIConfigurator benchmark run as capplan predicts it (capplan.plan.aiconfigurator): the
deployment its generator launched, the benchmark-mean extrapolation, the release profiles."""

from __future__ import annotations

import math

import pytest

import capplan
from capplan.catalog.loader import load_catalog
from capplan.plan.aiconfigurator import (
    MEASURED_ROUNDS,
    REPLAY_ROUNDS,
    AggRun,
    agg_closed_loop,
    agg_deployment,
    agg_policy,
    agg_weight_dtype,
    benchmark_replay,
    disagg_worker,
    disagg_worker_options,
    measured_mean,
    release_engine,
    release_label,
    replay_rounds,
)
from capplan.sim.protocol import reported_ttft

CAT = load_catalog()
# the sample's first Llama row: SGLang on one H200, fp8, ISL 1000, OSL 100, batch_size 160
RUN = AggRun(backend="sglang", model="meta-llama/Llama-3.1-8B-Instruct", system="h200_sxm",
             precision="fp8", tp=1, isl=1000, osl=100, batch_size=160, concurrency=160)


def test_the_deployment_is_what_the_generator_launched():
    dep = agg_deployment(CAT, RUN)
    s = dep.settings
    # sglang.rule: max_running_requests = batch_size; max_prefill_tokens = ISL + 1500, the
    # chunk (--chunked-prefill-size) left at SGLang's default for a 141 GB GPU (8,192,
    # server_args.py _handle_gpu_memory_settings); max_model_len ISL + OSL + 1500
    assert (s.max_num_seqs, s.max_num_batched_tokens) == (160, 8192)
    assert agg_policy(dep, RUN).max_prefill_tokens == 1000 + 1500
    assert dep.memory.max_model_len == 1000 + 100 + 1500
    assert dep.gpu.key == "h200" and s.engine == "sglang"
    assert (dep.memory.weight_dtype, s.kv_dtype) == ("fp8", "fp8")  # quantized runs: fp8 KV
    assert agg_policy(dep, RUN).prefill_first is False  # --enable-mixed-chunk


def test_a_calibration_override_reaches_the_step_model():
    dep = agg_deployment(CAT, RUN, {"request_overhead_s": 0.123})
    assert float(dep.step.request_overhead_s) == pytest.approx(0.123)


def test_weight_dtype_keeps_the_checkpoint_format_it_matches():
    assert agg_weight_dtype("", "bf16") == "auto"
    assert agg_weight_dtype("fp8", "fp8") == "auto"
    assert agg_weight_dtype("fp4", "mxfp4") == "auto"  # gpt-oss: its own MXFP4 experts
    assert agg_weight_dtype("fp4", "bf16") == "fp4"
    assert agg_weight_dtype("fp8", "bf16") == "fp8"


def test_reported_ttft_weighs_one_wave_in_the_rounds():
    out = agg_closed_loop(agg_deployment(CAT, RUN), RUN, measured=4 * 160)
    o, w, st = out["request_overhead_s"], out["ttft_wave_s"], out["ttft_steady_s"]
    assert math.isfinite(w) and w >= st > 0
    # 4 rounds: one wave and three steady rounds, the overhead counted once per request
    assert reported_ttft(o, w, st, 4.0) == pytest.approx(o + (w - o) / 4 + 3 * (st - o) / 4)


def test_measured_mean_extrapolates_the_later_rounds():
    # wave 0.9 s; the first 4 rounds average 0.3 s, so rounds 2-4 average (4 x 0.3 - 0.9) / 3
    # = 0.1 s, and the 20-round mean is (0.9 + 19 x 0.1) / 20 = 0.14 s
    assert (MEASURED_ROUNDS, REPLAY_ROUNDS) == (20, 20)
    assert measured_mean(0.9, 0.3, k=4) == pytest.approx(0.14)
    assert measured_mean(0.2, 0.2, k=4) == pytest.approx(0.2)  # no wave effect: no change
    # all 20 rounds replayed: their mean is the measured one
    assert measured_mean(0.9, 0.3) == pytest.approx(0.3)


def test_replay_rounds_fit_the_token_limit():
    # 100 M tokens (the default sim_tokens cap): 64 clients x 1,024 tokens x 20 rounds = 1.3 M
    # fit; 1,024 clients x 8,192 tokens = 8.4 M a round fit 11 rounds; 16,384 clients x 8,192
    # tokens = 134 M a round fit none: the 4 the extrapolation needs
    assert replay_rounds(64, 1024) == 20
    assert replay_rounds(1024, 8192) == 11
    assert replay_rounds(16384, 8192) == 4


def test_replay_rounds_follow_a_smaller_setting(monkeypatch):
    # a what-if of 2 rounds (validate_disagg --replay-rounds 2) replays 2, not the floor of 4
    from capplan.plan import aiconfigurator

    monkeypatch.setattr(aiconfigurator, "REPLAY_ROUNDS", 2)
    assert replay_rounds(64, 1024) == 2
    assert replay_rounds(16384, 8192) == 2
    # one round replayed: the later rounds take the wave's mean
    assert measured_mean(0.9, 0.9, k=1) == pytest.approx(0.9)


def test_release_profiles():
    assert release_label(" ") == "unlabelled"
    assert release_label("nightly-5b8c") == "dev"
    assert release_engine("vllm", "0.12.0") == "vllm@0.11"
    assert release_engine("sglang", "unlabelled") == "sglang+mixed-chunk"


def test_a_disaggregated_worker_takes_the_row_layout():
    row = {"backend": "trtllm", "precision": "fp4", "isl": "8000", "osl": "1000",
           "decode_tp_size": "4", "decode_pp_size": "", "decode_attention_dp_size": "8",
           "decode_moe_ep_size": "32", "decode_batch_size": "64"}
    d = disagg_worker_options(row, "decode")
    assert (d.tp, d.pp, d.attention_dp, d.expert_parallel) == (4, 1, 8, 32)
    assert (d.max_num_seqs, d.max_model_len, d.kv_dtype) == (64, 9016, "fp8")
    p = disagg_worker_options({k.replace("decode", "prefill"): v for k, v in row.items()},
                              "prefill")
    assert (p.tp, p.attention_dp, p.max_num_seqs) == (4, 8, 64)  # its own columns


def test_a_whole_prompt_worker_gets_a_budget_that_holds_its_prompt():
    # TensorRT-LLM prefills whole prompts: a 9,000-token prompt needs max_num_tokens >= 9000
    # (its default, 8192, does not hold it)
    row = {"backend": "trtllm", "model_path": "meta-llama/Llama-3.1-8B-Instruct",
           "system": "h200_sxm", "precision": "fp8", "isl": "9000", "osl": "200",
           "prefill_tp_size": "1", "prefill_pp_size": "", "prefill_attention_dp_size": "",
           "prefill_moe_ep_size": "", "prefill_batch_size": "1"}
    dep = disagg_worker(CAT, row, "prefill")
    assert not dep.profile.scheduler.chunked_prefill
    assert dep.settings.max_num_batched_tokens >= 9000


def test_the_replay_runs_an_attention_dp_replica_at_its_limits():
    # 2 ranks of 8 running sequences: 16 clients all decode together after the start-up wave
    # (at one rank's cap of 8, half of them would queue: batch <= 8; tests/sim/test_dp_replay.py)
    dep = capplan.deployment("gpt-oss-120b", "b200", attention_dp=2, expert_parallel=2,
                             max_num_seqs=8)
    assert benchmark_replay(dep, 16, 256, 64, 48)["mean_running_batch"] > 12
