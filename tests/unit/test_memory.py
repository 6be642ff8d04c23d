"""capplan.models.memory against figures computed by hand (arithmetic in the comments).

Every expected number here is written out independently of the code under test: from the
model's config.json shapes, vLLM's block arithmetic, and vLLM's own log lines.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from capplan.catalog.hf_import import import_config
from capplan.errors import InputError
from capplan.models.engine import EngineSettings
from capplan.models.memory import (
    activation_peak_bytes,
    kv_bytes_for_sequence,
    kv_bytes_per_token,
    kv_dtype_bytes,
    memory_report,
    param_counts,
    quantized_bytes_per_param,
    validate_settings,
    weight_bytes,
    weight_dtypes,
)

GIB = 2**30
MIB = 2**20


@pytest.fixture(scope="module")
def llama8b(catalog):
    return catalog.models["llama-3.1-8b"]


@pytest.fixture(scope="module")
def h100(catalog):
    return catalog.gpus["h100-sxm"]


# ---------------------------------------------------------------------------------------------
# KV bytes per token
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tp", "expected"),
    [
        (1, 131_072),  # 2 (K,V) * 32 layers * 8 kv heads * 128 head_dim * 2 B = 131072
        (2, 65_536),   # 2 * 32 * (8/2 = 4) * 128 * 2
        (4, 32_768),   # 2 * 32 * 2 * 128 * 2
        (8, 16_384),   # 2 * 32 * 1 * 128 * 2
        (16, 16_384),  # 8 kv heads over 16 GPUs: each head replicated, 1 per GPU -> 2*32*1*128*2
        (32, 16_384),  # still 1 per GPU
    ],
)
def test_kv_bytes_per_token_llama31_8b(llama8b, tp, expected):
    assert kv_bytes_per_token(llama8b, tp, 2.0) == expected


def test_kv_fp8_halves_llama(llama8b):
    # fp8 KV: 1 byte per element -> 2 * 32 * 8 * 128 * 1 = 65536
    assert kv_dtype_bytes(llama8b, "fp8") == 1.0
    assert kv_bytes_per_token(llama8b, 1, kv_dtype_bytes(llama8b, "fp8")) == 65_536
    assert kv_dtype_bytes(llama8b, "auto") == 2.0  # bf16 checkpoint -> bf16 KV


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16, 32])
def test_kv_bytes_per_token_deepseek_v3_mla(catalog, tp):
    m = catalog.models["deepseek-v3"]
    # MLA latent (kv_lora_rank 512) + rope key (64), one copy per token per layer, no K/V
    # factor, replicated on every TP rank: 61 layers * (512 + 64) * 2 B = 70272
    assert kv_bytes_per_token(m, tp, 2.0) == 70_272
    # fp8 KV: 61 * 576 * 1 = 35136
    assert kv_bytes_per_token(m, tp, 1.0) == 35_136


def test_deepseek_v32_fp8_kv_stores_fp8_ds_mla(catalog):
    m = catalog.models["deepseek-v3.2"]
    # vLLM turns fp8 into fp8_ds_mla for V3.2 (DeepseekV32ForCausalLM.verify_and_update_config):
    # 512 fp8 + 4 fp32 scales (16 B) + 64 bf16 rope (128 B) = 656 B, plus the indexer's
    # 128 + 4 = 132 B: 788 B per layer, x 61 = 48,068 B per token (exact).
    assert kv_bytes_per_token(m, 8, 1.0) == 61 * 788 == 48_068
    # bf16 keeps the plain latent: 61 x (576 x 2 + 132) = 78,324 B.
    assert kv_bytes_per_token(m, 8, 2.0) == 78_324
    # The importer gives the same fact for the architecture.
    imported = import_config(Path(__file__).parents[1] / "data/configs/deepseek-v3.2.config.json")
    assert imported.mla.fp8_latent_bytes == 656


def test_kv_bytes_per_token_deepseek_v2_lite(catalog):
    # 27 layers * 576 * 2 B = 31104 (vLLM issue #15871: 0.95 GiB for 32768 tokens:
    # 31104 * 32768 = 1,019,215,872 B = 0.949 GiB)
    m = catalog.models["deepseek-v2-lite"]
    assert kv_bytes_per_token(m, 1, 2.0) == 31_104
    assert 31_104 * 32_768 / GIB == pytest.approx(0.949, abs=0.001)


def test_kv_dtype_rejects_unknown(llama8b):
    with pytest.raises(InputError, match="--kv-dtype"):
        kv_dtype_bytes(llama8b, "int3")


# ---------------------------------------------------------------------------------------------
# Sequence bytes: whole blocks, sliding windows
# ---------------------------------------------------------------------------------------------


def test_sequence_of_17_tokens_holds_two_blocks(llama8b):
    # 17 tokens -> cdiv(17, 16) = 2 blocks of 16 tokens in every layer:
    # 2 blocks * 16 tokens * 131072 B/token = 4,194,304 B (4 MiB)
    assert kv_bytes_for_sequence(llama8b, 17, 1, 2.0) == 4 * MIB
    assert kv_bytes_for_sequence(llama8b, 16, 1, 2.0) == 2 * MIB  # exactly one block
    assert kv_bytes_for_sequence(llama8b, 1, 1, 2.0) == 2 * MIB   # a partial block is whole


def test_sliding_window_gemma2_9b(catalog):
    m = catalog.models["gemma-2-9b"]
    # 42 layers, 21 sliding (window 4096), 8 kv heads * 256 head_dim:
    # per layer per token 2 * 8 * 256 * 2 B = 8192 B
    # 8192-token sequence: full layers cdiv(8192, 16) = 512 blocks; sliding layers at most
    # cdiv(4096 - 1, 16) + 1 = 256 + 1 = 257 blocks.
    # blocks = 21 * 512 + 21 * 257 = 10752 + 5397 = 16149; bytes = 16149 * 16 * 8192
    assert kv_bytes_for_sequence(m, 8192, 1, 2.0) == 16_149 * 16 * 8192 == 2_116_681_728
    # Below the window every layer holds cdiv(1000, 16) = 63 blocks: 42 * 63 * 16 * 8192
    assert kv_bytes_for_sequence(m, 1000, 1, 2.0) == 42 * 63 * 16 * 8192 == 346_816_512


def test_sliding_window_gpt_oss_120b(catalog):
    m = catalog.models["gpt-oss-120b"]
    # 36 layers, 18 sliding (window 128); 2 * 8 kv heads * 64 head_dim * 2 B = 2048 B/layer/token
    # 131072 tokens: full 18 * 8192 blocks; sliding 18 * (cdiv(127, 16) + 1 = 9) blocks
    # blocks = 147456 + 162 = 147618; bytes = 147618 * 16 * 2048 = 4,837,146,624
    assert kv_bytes_for_sequence(m, 131_072, 1, 2.0) == 147_618 * 16 * 2048
    # The "as if all full" per-token unit vLLM logs tokens in: 36 * 2048 = 73728 B
    assert kv_bytes_per_token(m, 1, 2.0) == 73_728


# ---------------------------------------------------------------------------------------------
# Block arithmetic exactly like vLLM
# ---------------------------------------------------------------------------------------------


def _gpu_with_total(gpu, total_bytes: float):
    return gpu.model_copy(update={"cuda_total_memory_gib": total_bytes / GIB})


def test_block_arithmetic_floor(llama8b, h100):
    """Give the KV cache exactly 11.5 blocks' worth of bytes: vLLM's
    num_blocks = available // (block_size * bytes_per_token) = 11, and 11 * 16 = 176 tokens."""
    s = EngineSettings(gpu_memory_utilization=1.0, max_model_len=17, max_num_seqs=256,
                       max_num_batched_tokens=2048)
    probe = memory_report(llama8b, h100, s)
    fixed = (probe.weights_bytes_per_gpu + probe.activation_peak_bytes_per_gpu
             + probe.runtime_overhead_bytes_per_gpu)
    block = 16 * 131_072  # 2 MiB per 16-token block over all 32 layers
    r = memory_report(llama8b, _gpu_with_total(h100, fixed + 11.5 * block), s)
    assert r.kv_cache_bytes_per_gpu == pytest.approx(11.5 * block, abs=64)
    assert r.num_gpu_blocks == 11
    assert r.kv_cache_tokens == 11 * 16 == 176
    # A 17-token sequence holds 2 blocks -> 11 blocks serve 11 / 2 = 5.5 such sequences
    assert r.kv_bytes_per_max_len_seq == 2 * block
    assert r.max_concurrency == pytest.approx(5.5)
    # Contiguous pre-allocation of exactly 17 tokens: floor(11.5 * 2 MiB / (17 * 131072))
    # = floor(24,117,248 / 2,228,224) = floor(10.82) = 10
    assert r.contiguous_max_concurrency == 10


def test_block_size_32_halves_block_count(llama8b, h100):
    s16 = EngineSettings(max_model_len=8192, max_num_seqs=1024, max_num_batched_tokens=8192)
    r16 = memory_report(llama8b, h100, s16)
    r32 = memory_report(llama8b, h100, s16.with_(block_size=32))
    # Same bytes, twice as many tokens per block: blocks halve (floor), tokens within a block
    assert r32.num_gpu_blocks == r16.num_gpu_blocks // 2
    assert r16.kv_cache_tokens - r32.kv_cache_tokens in (0, 16)


def test_kv_cache_tokens_follow_blocks(llama8b, h100):
    r = memory_report(llama8b, h100, EngineSettings(max_model_len=8192))
    assert r.num_gpu_blocks == int(r.kv_cache_bytes_per_gpu // (16 * 131_072))
    assert r.kv_cache_tokens == r.num_gpu_blocks * 16


# ---------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------

# Llama-3.1-8B parameters, counted by hand from config.json:
#   embedding = lm_head = 128256 * 4096                         =   525,336,576 each
#   per layer: q,o 2*4096*4096 = 33,554,432; k,v 2*4096*1024 = 8,388,608;
#              gate,up,down 3*4096*14336 = 176,160,768; 2 RMSNorms 2*4096 = 8,192
#              -> 218,112,000 per layer; * 32 layers             = 6,979,584,000
#   final norm                                                   =         4,096
#   total = 2 * 525,336,576 + 6,979,584,000 + 4,096             = 8,030,261,248
LLAMA8B_PARAMS = 8_030_261_248
LLAMA8B_LINEAR = 32 * (33_554_432 + 8_388_608 + 176_160_768)  # 6,979,321,856
LLAMA8B_NORMS = 32 * 8_192 + 4_096  # 266,240
LLAMA8B_TABLES = 2 * 525_336_576  # embedding + lm_head


def test_llama8b_param_count(llama8b):
    c = param_counts(llama8b)
    assert c.total == LLAMA8B_PARAMS
    assert c.linear == LLAMA8B_LINEAR
    assert c.norms == LLAMA8B_NORMS
    assert c.embedding + c.lm_head == LLAMA8B_TABLES


def test_llama8b_bf16_weights_match_vllm_log(llama8b):
    # 8,030,261,248 * 2 B = 16,060,522,496 B = 14.957 GiB.
    # vLLM PR #10511 (https://github.com/vllm-project/vllm/pull/10511), Meta-Llama-3-8B (same
    # shapes), H100: "model weights take   14.96GiB"
    w = weight_bytes(param_counts(llama8b), weight_dtypes(llama8b, "auto"))
    assert w == LLAMA8B_PARAMS * 2
    assert w / GIB == pytest.approx(14.96, rel=0.005)


def test_llama8b_tp2_halves_weights_except_norms(llama8b):
    # Everything splits over 2 GPUs except the 266,240 RMSNorm weights (replicated):
    # (8,030,261,248 - 266,240) / 2 + 266,240 = 4,015,263,744 params per GPU.
    # vLLM PR #10511 TP=2: "model weights take   7.48GiB" = 14.96 / 2.
    c2 = param_counts(llama8b, tp=2)
    assert c2.total == (LLAMA8B_PARAMS - LLAMA8B_NORMS) / 2 + LLAMA8B_NORMS == 4_015_263_744
    w2 = weight_bytes(c2, weight_dtypes(llama8b, "bf16"))
    assert w2 / GIB == pytest.approx(7.48, rel=0.005)


@pytest.mark.parametrize(
    ("fmt", "group", "expected"),
    [
        ("int4", None, 0.5 + 2.5 / 128),   # AWQ/GPTQ g128: fp16 scale + 4-bit zero per 128
        ("mxfp4", None, 0.5 + 1 / 32),     # OCP MX: one e8m0 byte per 32 elements
        ("nvfp4", None, 0.5 + 1 / 16),     # NVFP4: one fp8 scale per 16 elements
        ("fp8", 128, 1 + 4 / (128 * 128)),  # DeepSeek fp8: one fp32 scale per 128x128 block
        ("int8", None, 1.0),
    ],
)
def test_quantized_bytes_per_param(fmt, group, expected):
    assert quantized_bytes_per_param(fmt, group) == pytest.approx(expected, rel=1e-12)


def test_llama8b_int4_weights(llama8b):
    # Linear layers at 0.5 + 2.5/128 = 0.51953125 B/param; tables and norms stay bf16:
    # 6,979,321,856 * 0.51953125 + (1,050,673,152 + 266,240) * 2 = 5,727,854,592 B (5.33 GiB)
    expected = LLAMA8B_LINEAR * (0.5 + 2.5 / 128) + (LLAMA8B_TABLES + LLAMA8B_NORMS) * 2
    assert expected == 5_727_854_592
    w = weight_bytes(param_counts(llama8b), weight_dtypes(llama8b, "int4"))
    assert w == pytest.approx(expected, rel=1e-9)


def test_llama8b_fp8_weights(llama8b):
    # fp8 linear layers (1 B + negligible scales), bf16 tables and norms:
    # 6,979,321,856 * 1 + 1,050,939,392 * 2 = 9,081,200,640 B (8.46 GiB)
    w = weight_bytes(param_counts(llama8b), weight_dtypes(llama8b, "fp8"))
    assert w == pytest.approx(9_081_200_640, rel=1e-3)


def test_gpt_oss_120b_auto_is_mxfp4_experts_bf16_rest(catalog):
    m = catalog.models["gpt-oss-120b"]
    dt = weight_dtypes(m, "auto")
    assert dt.experts == 0.5 + 1 / 32  # MXFP4 group 32
    assert dt.linear == 2.0 and dt.unquantized == 2.0  # attention, router, tables stay bf16
    # experts: 36 layers * 128 experts * 3 * 2880 * 2880 = 114,661,785,600 params * 0.53125 B
    #        = 60,914,073,600 B
    # bf16 rest: embedding + lm_head 2 * 201088 * 2880 = 1,158,266,880
    #          attention 36 * (2 * 2880*64*64 + 2 * 2880*8*64) = 36 * 26,542,080 = 955,514,880
    #          router 36 * 2880 * 128 = 13,271,040; norms (2*36 + 1) * 2880 = 210,240
    #          = 2,127,263,040 params * 2 B = 4,254,526,080 B
    expected = 114_661_785_600 * 0.53125 + 2_127_263_040 * 2  # 65,168,599,680 B = 60.69 GiB
    w = weight_bytes(param_counts(m), dt)
    assert w == pytest.approx(expected, rel=1e-9)
    # vLLM logs for gpt-oss-120b on 1x H100: "Model loading took 65.9651 GiB" (issue #23278)
    # and "Model loading took 64.38 GiB" (issue #33155); the checkpoint is ~60.8 GiB on disk.
    assert 60 <= w / GIB <= 66


def test_deepseek_v3_auto_is_fp8_blocks(catalog):
    m = catalog.models["deepseek-v3"]
    dt = weight_dtypes(m, "auto")
    assert dt.linear == dt.experts == pytest.approx(1 + 4 / 16384)
    assert dt.unquantized == 2.0


def test_weight_dtype_rejects_unknown(llama8b):
    with pytest.raises(InputError, match="--weight-dtype"):
        weight_dtypes(llama8b, "int3")


def test_mixtral_tp2_replicates_router(catalog):
    m = catalog.models["mixtral-8x7b"]
    c1, c2 = param_counts(m, 1), param_counts(m, 2)
    # router: 32 layers * 4096 * 8 experts = 1,048,576 params, replicated on every GPU
    assert c1.router == c2.router == 32 * 4096 * 8
    # experts: 32 * 8 * 3 * 4096 * 14336 = 45,097,156,608, split over TP
    assert c1.experts == 45_097_156_608
    assert c2.experts == 45_097_156_608 / 2


# ---------------------------------------------------------------------------------------------
# Activation peak (vLLM V1 profile_run)
# ---------------------------------------------------------------------------------------------


def test_activation_peak_llama8b(llama8b):
    s = EngineSettings(max_num_batched_tokens=8192, max_num_seqs=1024)
    # forward: 8192 tokens * (3 * 14336 + 4 * 4096) * 2 B = 8192 * 59392 * 2 = 973,078,528
    # native sampler (docs/research/vllm_v1_profile_peak.md): hidden states of all tokens plus
    # two [S, H] buffers, (8192 + 2 * 1024) * 4096 * 2 = 83,886,080, plus 1024 seqs * 128256
    # vocab * (2 + 36) B = 4,990,697,472 -> 5,074,583,552 (the larger one is the peak)
    assert activation_peak_bytes(llama8b, s, 2.0) == 5_074_583_552
    # FlashInfer sampler: (2 + 12) B per logit -> 83,886,080 + 1,838,678,016 = 1,922,564,096
    assert activation_peak_bytes(llama8b, s, 2.0, "flashinfer") == 1_922_564_096
    # 2048 tokens, 256 seqs: forward 2048*59392*2 = 243,269,632;
    # sampler (2048 + 512) * 4096 * 2 + 256 * 128256 * 38 = 20,971,520 + 1,247,674,368
    #         = 1,268,645,888; plus an 8 MiB cuBLAS workspace = 1,277,034,496
    s2 = s.with_(max_num_batched_tokens=2048, max_num_seqs=256)
    assert activation_peak_bytes(llama8b, s2, 2.0, workspace_bytes=8 * 2**20) == 1_277_034_496


def test_activation_does_not_depend_on_max_model_len(llama8b, h100):
    a = memory_report(llama8b, h100, EngineSettings(max_model_len=4096))
    b = memory_report(llama8b, h100, EngineSettings(max_model_len=131_072))
    assert a.activation_peak_bytes_per_gpu == b.activation_peak_bytes_per_gpu
    assert a.kv_cache_tokens == b.kv_cache_tokens
    # 32x the context -> 1/32 the sequences (both are multiples of 16: no block rounding)
    assert a.max_concurrency == pytest.approx(32 * b.max_concurrency)


# ---------------------------------------------------------------------------------------------
# Paged vs contiguous concurrency, fits
# ---------------------------------------------------------------------------------------------


def test_paged_equals_contiguous_for_full_attention(llama8b, h100):
    r = memory_report(llama8b, h100, EngineSettings(max_model_len=8192))
    # 8192 is a whole number of blocks: paged = tokens / 8192; contiguous = floor(bytes/(8192*B))
    assert r.max_concurrency == pytest.approx(r.kv_cache_tokens / 8192)
    assert r.contiguous_max_concurrency == math.floor(r.max_concurrency)


def test_window_layers_count_at_their_window(catalog, h100):
    m = catalog.models["gemma-2-9b"]
    # vLLM sizes a sliding-window layer of a max_model_len sequence at
    # cdiv(min(W - 1 + max_num_batched_tokens, L), 16) + 1 blocks (SlidingWindowSpec).
    # max_num_batched_tokens 512: min(4095 + 512, 8192) = 4607 -> 288 + 1 = 289 blocks; the 21
    # full layers hold 8192 / 16 = 512 each: 21 * 512 + 21 * 289 = 16821 blocks per sequence,
    # against 42 * 512 = 21504 for a full-length reservation of every layer: 1.2784x more.
    r = memory_report(m, h100, EngineSettings(max_model_len=8192, max_num_batched_tokens=512))
    full_exact = r.kv_cache_bytes_per_gpu / (8192 * 42 * 8192)
    usable_ratio = r.num_gpu_blocks * 16 * 42 * 8192 / r.kv_cache_bytes_per_gpu
    assert r.max_concurrency == pytest.approx(full_exact * usable_ratio * 21504 / 16821)
    # Contiguous pre-allocation counts the window layers at their window too, token by token:
    # 21 x 8192 + 21 x (4607 + 1) = 268,800 token-layers of 8192 B, not 42 x 8192 = 344,064
    # (which left 20 sequences where 25 fit).
    contiguous = math.floor(r.kv_cache_bytes_per_gpu / ((21 * 8192 + 21 * 4608) * 8192))
    assert contiguous == math.floor(full_exact * 344_064 / 268_800) == 25
    assert r.contiguous_max_concurrency == contiguous
    assert r.max_concurrency >= r.contiguous_max_concurrency
    # With 8192 batched tokens the window reservation covers the whole sequence:
    # min(4095 + 8192, 8192) = 8192 -> 513 blocks: 21 * 512 + 21 * 513 = 21525 blocks.
    r2 = memory_report(m, h100, EngineSettings(max_model_len=8192, max_num_batched_tokens=8192))
    assert r2.kv_bytes_per_max_len_seq == 21525 * 16 * 8192


def test_does_not_fit_weights(catalog):
    # Llama-3.1-70B bf16 is 70.55e9 * 2 B = 131 GiB: more than an L4 (22 GiB) has.
    r = memory_report(catalog.models["llama-3.1-70b"], catalog.gpus["l4"], EngineSettings())
    assert not r.fits
    assert r.num_gpu_blocks == r.kv_cache_tokens == 0
    assert r.kv_cache_bytes_per_gpu == 0
    assert "weights" in r.reason


def test_does_not_fit_one_max_len_sequence(llama8b, catalog):
    # L4: 22.05 GiB * 0.9 = 19.85 GiB budget - 14.96 GiB weights - ~0.7 GiB -> ~4 GiB of KV,
    # but one 131072-token sequence needs 131072 * 128 KiB = 16 GiB.
    r = memory_report(llama8b, catalog.gpus["l4"], EngineSettings(max_model_len=131_072))
    assert r.kv_bytes_per_max_len_seq == 16 * GIB
    assert not r.fits and r.max_concurrency < 1
    assert "max_model_len" in r.reason


def test_fits_at_short_context(llama8b, catalog):
    r = memory_report(llama8b, catalog.gpus["l4"], EngineSettings(max_model_len=8192))
    assert r.fits and r.max_concurrency >= 1


# ---------------------------------------------------------------------------------------------
# Settings vLLM would reject
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"gpu_memory_utilization": 0.0}, "gpu-memory-utilization"),
        ({"gpu_memory_utilization": 1.5}, "gpu-memory-utilization"),
        ({"gpu_memory_utilization": math.nan}, "gpu-memory-utilization"),
        ({"gpu_memory_utilization": -1.0}, "gpu-memory-utilization"),
        ({"tp": 0}, "--tp"),
        ({"tp": 3}, "--tp 3: must divide the 32 attention heads"),
        ({"block_size": 0}, "--block-size"),
        ({"max_model_len": -5}, "--max-model-len"),
        ({"pp": 33}, "--pp 33"),
    ],
)
def test_validate_settings_rejects(llama8b, changes, match):
    with pytest.raises(InputError, match=match):
        validate_settings(llama8b, EngineSettings().with_(**changes))


def test_tp_must_divide_or_multiply_kv_heads(catalog):
    # Qwen3-235B-A22B: 64 query heads, 4 KV heads. TP 8 (multiple of 4) is fine; a model with
    # 12 KV heads would reject TP 8 (neither divides the other).
    validate_settings(catalog.models["qwen3-235b-a22b"], EngineSettings(tp=8))
    m = catalog.models["llama-3.1-8b"].model_copy(
        update={"num_attention_heads": 24, "num_kv_heads": 12})
    with pytest.raises(InputError, match="KV heads"):
        validate_settings(m, EngineSettings(tp=8))


def test_contiguous_counts_window_layers_at_their_window(catalog, h100):
    # gpt-oss-120b on an H100 (vLLM defaults: 8192 batched tokens, max_model_len 131,072):
    # 18 full layers at 131,072 tokens and 18 window layers (W 128) at min(127 + 8192,
    # 131,072) + 1 = 8,320 tokens, 2,048 B per token-layer: 18 x 139,392 x 2,048 =
    # 5,138,546,688 B per sequence. Counting every layer at 131,072 tokens (9.66e9 B) left
    # 0 where the ~8.2e9 B cache holds one.
    m = catalog.models["gpt-oss-120b"]
    r = memory_report(m, h100, EngineSettings(max_model_len=131_072, max_num_seqs=1024,
                                              max_num_batched_tokens=8192))
    assert r.kv_bytes_per_token_per_gpu == 36 * 2048
    assert 0 < r.kv_cache_bytes_per_gpu < 131_072 * 36 * 2048  # under one full-length sequence
    assert r.contiguous_max_concurrency == math.floor(
        r.kv_cache_bytes_per_gpu / 5_138_546_688) == 1
