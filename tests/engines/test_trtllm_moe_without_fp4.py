"""TensorRT-LLM's MoE layers on GPUs without fp4 tensor cores (Hopper and older): a GPU cost
per MoE layer per step beyond the step model's (EngineProfile.moe_layer_step_s_without_fp4;
docs/engines.md, "MoE layers on Hopper"), and only there."""

from __future__ import annotations

import pytest

from capplan.models.engine import EngineSettings, engine_profile
from capplan.models.perf import build_step_model

# The profile's value, by hand from github:NVIDIA/TensorRT-LLM issue 5929 (DeepSeek-R1 ITL p50
# at batch 1, TP 8, v0.21.0rc2) and capplan's TensorRT-LLM step at batch 1 without the term
# (H200 FP8 6.67 / 6.79 ms, B200 FP4 5.79 / 5.86 ms at 1,900 / 8,492 tokens of context, with 20
# us per layer of fixed cost, which cancels in the difference):
# (H200 ITL - 6.67) - (B200 ITL - 5.79) over 58 MoE layers, in us:
#   1,600-token prompts: EP 1 (13.78, 6.78) 105.5; EP 4 (10.81, 6.61) 57.2; EP 8 (11.00, 6.81) 57.1
#   8,192-token prompts: EP 1 (14.53, 7.14) 111.3; EP 4 (11.59, 6.97) 63.6; EP 8 (11.78, 7.17) 63.4
# median of the six: (63.4 + 63.6) / 2 = 63.5 us.
ISSUE_5929_US = sorted([105.5, 57.2, 57.1, 111.3, 63.6, 63.4])


def _layer_cost(catalog, model: str, gpu: str, engine: str) -> float:
    s = EngineSettings(engine=engine, tp=8)
    return build_step_model(catalog.models[model], catalog.gpus[gpu], s).layer_overhead_s


def test_the_profile_value_is_the_median_of_the_issue_figures():
    med = (ISSUE_5929_US[2] + ISSUE_5929_US[3]) / 2
    assert engine_profile("trtllm").moe_layer_step_s_without_fp4 == pytest.approx(med * 1e-6)
    assert engine_profile("trtllm@1.0").moe_layer_step_s_without_fp4 == pytest.approx(
        med * 1e-6)


def test_only_tensorrt_llm_moe_layers_on_gpus_without_fp4_pay_it(catalog):
    # Mixtral-8x7B: 32 layers, all MoE -> 32 x 63.5 us = 2.032 ms per step on H200 (no fp4
    # tensor cores), nothing on B200 (fp4), nothing for vLLM or SGLang, nothing for a dense model.
    extra = 32 * 63.5e-6
    h200_trt = _layer_cost(catalog, "mixtral-8x7b", "h200", "trtllm")
    h200_vllm = _layer_cost(catalog, "mixtral-8x7b", "h200", "vllm")
    assert h200_trt - h200_vllm == pytest.approx(extra, rel=1e-9)
    assert _layer_cost(catalog, "mixtral-8x7b", "h200", "sglang") == pytest.approx(h200_vllm)
    assert _layer_cost(catalog, "mixtral-8x7b", "b200", "trtllm") == pytest.approx(
        _layer_cost(catalog, "mixtral-8x7b", "b200", "vllm"))
    assert _layer_cost(catalog, "llama-3.1-70b", "h200", "trtllm") == pytest.approx(
        _layer_cost(catalog, "llama-3.1-70b", "h200", "vllm"))
