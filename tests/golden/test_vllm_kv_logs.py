"""capplan's KV capacity against KV-cache sizes vLLM logged at startup.

Sources: docs/research/vllm_kv_logs.md (V0 and early V1) and docs/research/vllm_kv_logs_v1.md
(V1 0.9-0.11). Every case here names its model and GPU and quotes the log line. Settings are
what that vLLM version used for that run: logged flags, else the version's defaults
(V1: max_num_batched_tokens/max_num_seqs 8192/1024 on >=70 GiB non-A100 GPUs, 2048/256
otherwise; V0 without chunked prefill: max_num_batched_tokens = max(max_model_len, 2048);
V0 turns chunked prefill on above 32K context with a 2048-token budget).

Cases were chosen by one rule: every logged case whose model architecture is in the catalog and
whose GPU is named. Cases from unnamed GPUs, off-catalog or multimodal models, unknown
quantization or uncertain parallelism are left out (docs list them).

Run with -s to see the per-case table.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import pytest

from capplan.catalog.loader import load_catalog
from capplan.models.engine import EngineSettings
from capplan.models.memory import memory_report

GIB = 2**30
TOLERANCE = 0.03  # median relative error over the honest cases


@dataclass(frozen=True)
class Case:
    id: str
    model: str
    """What the user would type (resolution and -FP8 suffixes included)."""
    gpu: str
    settings: EngineSettings
    logged_tokens: int
    vllm: str
    url: str
    gpu_total_gib: float | None = None
    """Only for a GPU missing from the catalog: the total_gpu_memory vLLM logged for it."""


CASES = [
    # https://github.com/dariustanrd/tokenkaki (vllm_kv_logs_v1.md, V1-Case A), vLLM 0.9.2,
    # A100-SXM4-40GB, all defaults (A100: 2048 tokens, 256 seqs; max_model_len 40960):
    # "[kv_cache_utils.py:716] GPU KV cache size: 136,080 tokens"
    Case("V1-A qwen3-8b a100-40gb", "Qwen/Qwen3-8B", "a100-sxm-40gb",
         EngineSettings(max_model_len=40960, max_num_batched_tokens=2048, max_num_seqs=256),
         136_080, "0.9.2", "https://github.com/dariustanrd/tokenkaki"),
    # vllm_kv_logs_v1.md V1-Case B (index id 38962983769), vLLM 0.10.2, 8x L40S, TP 8 with
    # --enable-expert-parallel (same expert bytes per GPU as TP 8), fp8 checkpoint, util 0.90,
    # max_model_len 32768, L40S defaults 2048/256:
    # "[kv_cache_utils.py:864] GPU KV cache size: 238,208 tokens"
    # (breakdown: 27.72 GiB weight, 1.4 GiB peak activation, 0.21 GiB non-torch)
    Case("V1-B qwen3-235b-fp8 8xl40s", "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", "l40s",
         EngineSettings(tp=8, max_model_len=32768, max_num_batched_tokens=2048,
                        max_num_seqs=256),
         238_208, "0.10.2", "markdown 'Hosting Qwen3-235B-A22B-Instruct-2507-FP8 on 8xL40S'"),
    # https://github.com/vllm-project/vllm/issues/21348 (Case 9), vLLM ~0.9.2/0.10.0, 4x H100,
    # TP 4, fp8 checkpoint, defaults (H100: 8192 tokens, 1024 seqs; max_model_len 40960),
    # LMCacheConnectorV1 configured: "GPU KV cache size: 178,880 tokens"
    Case("9 qwen3-235b-fp8 4xh100", "Qwen/Qwen3-235B-A22B-FP8", "h100-sxm",
         EngineSettings(tp=4, max_model_len=40960, max_num_batched_tokens=8192,
                        max_num_seqs=1024),
         178_880, "0.9.2-0.10.0", "https://github.com/vllm-project/vllm/issues/21348"),
    # https://github.com/vllm-project/vllm/pull/17122 (Case 8), vLLM 0.8.4/0.8.5 V1, 1x L40S,
    # util 0.90, max_model_len 32768; 0.8.x gives the big defaults only to H100/H200 by name,
    # so 2048 tokens / 256 seqs: "[kv_cache_utils.py:634] GPU KV cache size: 158,656 tokens"
    Case("8 llama-3.1-8b l40s", "meta-llama/Llama-3.1-8B-Instruct", "l40s",
         EngineSettings(max_model_len=32768, max_num_batched_tokens=2048, max_num_seqs=256),
         158_656, "0.8.4", "https://github.com/vllm-project/vllm/pull/17122"),
    # https://github.com/vllm-project/vllm/issues/27508 (Case 15), vLLM ~0.11, 1x H100,
    # `--gpu-memory-utilization 0.95 --max-num-batched-tokens 1024` (max_num_seqs = min(1024,
    # 1024)): "[gpu_worker.py:298] Available KV cache memory: 1.71 GiB". Tokens are not in the
    # excerpt; vLLM's hybrid arithmetic gives them exactly from the bytes: page = 16 * 2 * 8 *
    # 64 * 2 = 32768 B, 18 layers per group, 2 groups:
    # blocks = floor(1.71 GiB / 32768 / 18) = 3112; tokens = 3112 // 2 * 16 = 24,896
    Case("15b gpt-oss-120b h100 util.95", "openai/gpt-oss-120b", "h100-sxm",
         EngineSettings(gpu_memory_utilization=0.95, max_num_batched_tokens=1024,
                        max_num_seqs=1024),
         24_896, "~0.11", "https://github.com/vllm-project/vllm/issues/27508"),
    # https://github.com/vllm-project/vllm/issues/15815 (Case 5), vLLM ~0.7 V0, 2x L40S, TP 2,
    # util 0.90, max_model_len 10000 (V0, no chunked prefill: 10000 batched tokens, 256 seqs):
    # "# CUDA blocks: 3947" -> 3947 * 16 = 63,152 tokens
    Case("5 qwen2.5-32b 2xl40s", "Qwen/Qwen2.5-32B-Instruct", "l40s",
         EngineSettings(tp=2, max_model_len=10000, max_num_batched_tokens=10000,
                        max_num_seqs=256),
         63_152, "~0.7 V0", "https://github.com/vllm-project/vllm/issues/15815"),
    # https://github.com/vllm-project/vllm/issues/13061 (Case 4), vLLM 0.7.x V0,
    # DeepSeek-R1-Distill-Qwen-14B (= Qwen2.5-14B architecture), 2x RTX 4090, TP 2, util 0.98,
    # max_model_len 131072 (> 32K: chunked prefill on, 2048 tokens, 256 seqs):
    # "maximum number of tokens that can be stored in KV cache (81536)"
    Case("4 r1-distill-qwen-14b 2x4090", "qwen2.5-14b", "rtx-4090",
         EngineSettings(tp=2, gpu_memory_utilization=0.98, max_model_len=131072,
                        max_num_batched_tokens=2048, max_num_seqs=256),
         81_536, "0.7.x V0", "https://github.com/vllm-project/vllm/issues/13061"),
    # https://github.com/vllm-project/vllm/issues/10517 (Case 3), vLLM ~0.6.4 V0, RTX 3090
    # (not in the catalog: "total_gpu_memory=23.58GiB" from the log), util 0.90,
    # max_model_len 20000 (no chunked prefill: 20000 batched tokens, 256 seqs):
    # "GPU blocks: 1952" -> 1952 * 16 = 31,232 tokens
    Case("3a llama-3.1-8b 3090 20k", "meta-llama/Llama-3.1-8B-Instruct", "rtx-4090",
         EngineSettings(max_model_len=20000, max_num_batched_tokens=20000, max_num_seqs=256),
         31_232, "~0.6.4 V0", "https://github.com/vllm-project/vllm/issues/10517", 23.58),
    # same issue, max_model_len 29000: "# GPU blocks: 1478" -> 23,648 tokens
    Case("3b llama-3.1-8b 3090 29k", "meta-llama/Llama-3.1-8B-Instruct", "rtx-4090",
         EngineSettings(max_model_len=29000, max_num_batched_tokens=29000, max_num_seqs=256),
         23_648, "~0.6.4 V0", "https://github.com/vllm-project/vllm/issues/10517", 23.58),
    # https://github.com/vllm-project/vllm/pull/10511 (Case 1), vLLM ~0.6.5 dev V0,
    # Meta-Llama-3-8B (Llama-3.1-8B shapes, max_model_len 8192), H100, TP 1, util 0.90,
    # no chunked prefill (8192 batched tokens, 256 seqs):
    # "available_kv_cache_memory    53.29GiB" -> floor(53.29 GiB / (16 * 131072 B)) = 27284
    # blocks -> 436,544 tokens
    Case("1 llama-3-8b h100", "llama-3.1-8b", "h100-sxm",
         EngineSettings(max_model_len=8192, max_num_batched_tokens=8192, max_num_seqs=256),
         436_544, "~0.6.5 V0", "https://github.com/vllm-project/vllm/pull/10511"),
    # https://github.com/vllm-project/vllm/pull/2031 (Case 16), vLLM 0.2.x, Llama-2-7B fp16,
    # 1x A100-80GB, util 0.90, max_model_len 4096 (4096 batched tokens, 256 seqs):
    # "This PR: # GPU blocks: 7351" -> 117,616 tokens
    Case("16a llama-2-7b a100-80gb", "meta-llama/Llama-2-7b-hf", "a100-sxm-80gb",
         EngineSettings(max_model_len=4096, max_num_batched_tokens=4096, max_num_seqs=256),
         117_616, "0.2.x", "https://github.com/vllm-project/vllm/pull/2031"),
    # same PR, Llama-2-70B fp16, 4x A100-80GB, TP 4: "This PR: # GPU blocks: **20865**"
    # -> 333,840 tokens
    Case("16b llama-2-70b 4xa100-80gb", "meta-llama/Llama-2-70b-hf", "a100-sxm-80gb",
         EngineSettings(tp=4, max_model_len=4096, max_num_batched_tokens=4096,
                        max_num_seqs=256),
         333_840, "0.2.x", "https://github.com/vllm-project/vllm/pull/2031"),
]


def _report(case: Case):
    cat = load_catalog()
    resolved = cat.resolve_model(case.model)
    gpu = cat.gpu(case.gpu)
    if case.gpu_total_gib is not None:
        gpu = gpu.model_copy(update={"cuda_total_memory_gib": case.gpu_total_gib})
    s = case.settings
    if s.engine == "vllm":  # every log here is from vLLM 0.11 or older: that release's profile
        s = s.with_(engine="vllm@0.11")
    if s.weight_dtype == "auto" and resolved.implied_weight_dtype:
        s = s.with_(weight_dtype=resolved.implied_weight_dtype)
    return memory_report(resolved.spec, gpu, s)


def _rel_err(case: Case) -> float:
    return (_report(case).kv_cache_tokens - case.logged_tokens) / case.logged_tokens


def _table() -> str:
    head = (f"{'case':32s} {'vLLM':12s} {'logged':>9s} {'capplan':>9s} {'err':>8s} "
            f"{'weights':>8s} {'act':>6s} {'ovh':>5s} {'KV GiB':>7s}")
    lines = [head, "-" * len(head)]
    for c in CASES:
        r = _report(c)
        err = (r.kv_cache_tokens - c.logged_tokens) / c.logged_tokens
        lines.append(
            f"{c.id:32s} {c.vllm:12s} {c.logged_tokens:9d} {r.kv_cache_tokens:9d} {err:+8.1%} "
            f"{r.weights_bytes_per_gpu / GIB:8.2f} {r.activation_peak_bytes_per_gpu / GIB:6.2f} "
            f"{r.runtime_overhead_bytes_per_gpu / GIB:5.2f} {r.kv_cache_bytes_per_gpu / GIB:7.2f}")
    errs = [abs(_rel_err(c)) for c in CASES]
    lines.append(f"median |relative error| over {len(CASES)} cases: {statistics.median(errs):.1%}")
    v1 = [abs(_rel_err(c)) for c in CASES if c.vllm.startswith(("0.9", "0.10", "~0.11"))]
    lines.append(f"  of which vLLM 0.9-0.11 (capplan's target), {len(v1)} cases: "
                 f"{statistics.median(v1):.1%}")
    return "\n".join(lines)


def test_at_least_six_cases():
    assert len(CASES) >= 6
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case_runs_and_fits(case):
    """Every logged run started, so capplan must not call it impossible."""
    r = _report(case)
    assert r.kv_cache_tokens > 0
    assert r.kv_cache_tokens % 16 == 0


# Measured 2.4% over the 12 cases (the misses over 20% have causes outside the model, each
# written in docs/validation.md: gpt-oss MXFP4 repacking on Hopper, an LMCache connector,
# vLLM 0.8's different accounting, vLLM 0.2's NCCL accounting).
def test_median_relative_error_within_3_percent():
    print("\n" + _table())
    errs = [abs(_rel_err(c)) for c in CASES]
    assert statistics.median(errs) <= TOLERANCE, _table()


@pytest.mark.xfail(
    strict=False,
    reason="vLLM ~0.10.1 could not start gpt-oss-120b on 1x H100 at util 0.90 ('Available KV "
           "cache memory: -2.14 GiB' with 65.97 GiB weights); capplan models 60.7 GiB weights "
           "and 3.1 GiB activation, so it predicts ~7.3 GiB of KV",
)
def test_gpt_oss_120b_h100_util_090_does_not_fit():
    # https://github.com/vllm-project/vllm/issues/23278 (Case 15), vLLM 0.10.1, defaults:
    # "Model loading took 65.9651 GiB" ... "Available KV cache memory: -2.14 GiB"
    cat = load_catalog()
    r = memory_report(cat.model("openai/gpt-oss-120b"), cat.gpu("h100-sxm"),
                      EngineSettings(max_num_batched_tokens=8192, max_num_seqs=1024))
    assert r.kv_cache_tokens == 0 and not r.fits
