"""capplan's KV capacity against the KV-cache sizes vLLM 0.15-0.19 logged at startup.

Source: github:llm-d-incubation/llm-d-planner at d3121e059da8, accuracy/results/v0.19.0/logs
(vLLM 0.19.0, one H100-80GB per TP/PP rank, --gpu-memory-utilization 0.95, --max-model-len
8192, the V1 defaults of 8192 tokens and 1024 sequences, bf16 unless stated; the line
"[v1/core/kv_cache_utils.py] GPU KV cache size: N tokens") and accuracy/results/version-sweep
(Qwen3-14B on one H100 at 0.95 over vLLM 0.15-0.18). Each case's release picks its profile:
0.14's native sampler up to 0.16, 0.17's Triton sampler, 0.19's all-reduce workspace at
TP/PP > 1 (capplan.models.engine VLLM_0_17, VLLM_0_19).
"""

from __future__ import annotations

import pytest

from capplan import api

TOLERANCE = 0.01
"""Per-case relative error: each case is one log line of a known configuration."""

CASES = [
    # (model, options, release, logged tokens)
    ("llama-3.1-8b", {}, "0.19.0", 476_016),
    ("llama-3.1-8b", {"tp": 2}, "0.19.0", 1_044_688),
    ("llama-3.1-8b", {"tp": 4}, "0.19.0", 2_209_792),
    ("llama-3.1-8b", {"pp": 2}, "0.19.0", 1_075_312),
    ("llama-3.1-8b", {"kv_dtype": "fp8"}, "0.19.0", 952_032),
    ("qwen2.5-7b", {}, "0.19.0", 1_096_000),
    ("qwen3-8b", {}, "0.19.0", 418_688),
    ("mixtral-8x7b", {"tp": 2}, "0.19.0", 465_936),
    ("qwen3-14b", {}, "0.15.0", 274_848),
    ("qwen3-14b", {}, "0.16.0", 274_848),
    ("qwen3-14b", {}, "0.17.0", 297_152),
    ("qwen3-14b", {}, "0.18.0", 296_400),
]


@pytest.mark.parametrize(("model", "opts", "release", "logged"), CASES,
                         ids=[f"{m}-{r}-{'-'.join(f'{k}{v}' for k, v in o.items())}"
                              for m, o, r, _ in CASES])
def test_kv_tokens_within_one_percent_of_the_log(model, opts, release, logged):
    d = api.memory(model, "h100-sxm", engine=f"vllm@{release}", max_model_len=8192,
                   gpu_memory_utilization=0.95, engine_notation=True, **opts).to_dict()
    assert d["kv_cache_tokens"] == pytest.approx(logged, rel=TOLERANCE)


def test_the_default_profile_is_the_newest_logged_release():
    """`--engine vllm` plans for 0.19: its KV matches the 0.19 log, not 0.14's (-4.7%)."""
    new = api.memory("llama-3.1-8b", "h100-sxm", engine="vllm", max_model_len=8192,
                     gpu_memory_utilization=0.95).to_dict()["kv_cache_tokens"]
    old = api.memory("llama-3.1-8b", "h100-sxm", engine="vllm@0.14", max_model_len=8192,
                     gpu_memory_utilization=0.95).to_dict()["kv_cache_tokens"]
    assert new == pytest.approx(476_016, rel=TOLERANCE)
    assert old / 476_016 - 1 < -0.04
