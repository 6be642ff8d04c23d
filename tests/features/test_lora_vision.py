"""LoRA adapter memory and step cost; Qwen2.5-VL image tokens, memory and TTFT, by hand."""

import numpy as np
import pytest

import capplan
from capplan.catalog.loader import load_catalog
from capplan.models import vision

MODEL, GPU = "llama-3.1-8b", "h100-sxm"


def test_lora_kv_tokens_drop_by_the_adapter_bytes():
    plain = capplan.memory(MODEL, GPU, max_model_len=8192).deployment.memory
    lora = capplan.memory(MODEL, GPU, max_model_len=8192, max_loras=4,
                          max_lora_rank=64).deployment.memory
    # Per slot and layer (r = 64, h = 4096, q = 4096, kv = 1024, I = 14336, TP 1):
    # qkv 3 x 64 x 4096 (one lora_a per q, k, v slice) + 64 x 6144 = 1,179,648;
    # o 64 x 4096 + 4096 x 64 = 524,288; gate_up 2 x 64 x 4096 + 2 x 14336 x 64 = 2,359,296;
    # down 64 x 14336 + 4096 x 64 = 1,179,648; sum 5,242,880 x 32 layers x 4 slots x 2 B
    # = 1,342,177,280 B (1.25 GiB).
    adapters = 5_242_880 * 32 * 4 * 2
    assert lora.weights_bytes_per_gpu - plain.weights_bytes_per_gpu == adapters
    assert plain.kv_cache_bytes_per_gpu - lora.kv_cache_bytes_per_gpu == pytest.approx(adapters)
    block = 16 * 131072  # bytes of one 16-token block
    lost = plain.kv_cache_tokens - lora.kv_cache_tokens
    assert abs(lost - adapters / 131072) <= 16  # the blocks' floor
    assert plain.num_gpu_blocks - lora.num_gpu_blocks == pytest.approx(adapters / block, abs=1)


def test_lora_slots_count_one_lora_a_per_qkv_slice():
    # vLLM MergedQKVParallelLinearWithLoRA (vllm/lora/layers/column_parallel_linear.py): n_slices
    # = 3, one lora_a (rank x 4096) each. Per slot, layer and rank: qkv 3 x 4096 + 6144 = 18,432;
    # o 8192; gate_up 2 x 4096 + 2 x 14336 = 36,864; down 18,432; total 81,920. Rank 16,
    # 32 layers, 2 B, 4 slots: 81,920 x 16 x 32 x 2 x 4 = 335,544,320 B (was 301,989,888 with
    # one qkv lora_a). Exact: the formula has no rounding.
    rep = capplan.memory(MODEL, GPU, max_loras=4, max_lora_rank=16)
    assert rep.deployment.memory.lora_bytes_per_gpu == 335_544_320


def test_lora_step_time_grows_with_distinct_adapters():
    steps = []
    for n in (1, 4, 16):
        dep = capplan.deployment(MODEL, GPU, max_model_len=8192, max_loras=16,
                                 max_lora_rank=64, lora_adapters=n)
        steps.append(float(dep.step.decode_step(64, 1024)["step_s"]))
    assert steps[0] < steps[1] < steps[2]
    # 16 adapters drawn uniformly by 64 sequences: 16 (1 - (15/16)^64) = 15.7 distinct adapters
    # read per step, each 5,242,880 x 32 x 2 B = 335,544,320 B, against 1 adapter: the step
    # grows by 14.7 adapters' bytes over the achievable bandwidth.
    dep = capplan.deployment(MODEL, GPU, max_model_len=8192, max_loras=16, max_lora_rank=64,
                             lora_adapters=16)
    slot = 5_242_880 * 32 * 2
    distinct = 16 * (1 - (15 / 16) ** 64)
    extra = (distinct - 1) * slot / dep.step.mem_bytes_per_s
    assert steps[2] - steps[0] == pytest.approx(extra, rel=1e-6)
    zipf = capplan.deployment(MODEL, GPU, max_model_len=8192, max_loras=16, max_lora_rank=64,
                              lora_adapters=16, lora_popularity="zipf")
    assert float(zipf.step.decode_step(64, 1024)["step_s"]) < steps[2]


def _vl():
    return load_catalog(()).resolve_model("qwen2.5-vl-7b").spec


def test_image_tokens_by_hand():
    v = _vl().vision
    # 1024 / 28 = 36.57 -> 37 x 28 = 1036 px a side; 1036 / 14 = 74 patches a side:
    # 5476 patches, / (2 x 2) merge = 1369 tokens.
    assert vision.resized(1024, 1024, v) == (1036, 1036)
    assert vision.image_patches(1024, 1024, v) == 5476
    assert vision.image_tokens(1024, 1024, v) == 1369
    # Below min_pixels (3136 = 56 x 56): scaled up to 56 x 56 -> 16 patches, 4 tokens.
    assert vision.image_tokens(20, 20, v) == 4


def test_vl_memory_by_hand():
    vl = capplan.memory("qwen2.5-vl-7b", GPU, max_model_len=32768).deployment.memory
    text = capplan.memory("qwen2.5-7b", GPU, max_model_len=32768).deployment.memory
    # Encoder parameters by hand: patch embedding 3 x 2 x 14 x 14 x 1280 = 1,505,280;
    # 32 blocks x (4 x 1280^2 + 3 x 1280 x 3420) = 629,964,800; merger 16 x 1280^2 +
    # 4 x 1280 x 3584 = 44,564,480: 676,034,560 params, 2 B each, on top of the same LM.
    assert vision.encoder_params(_vl().vision) == 676_034_560
    assert vl.weights_bytes_per_gpu - text.weights_bytes_per_gpu == 676_034_560 * 2
    # Activation peak: the encoder forward over the largest image, 12,845,056 px / 196 =
    # 65,536 patches x (3 x 3420 + 4 x 1280) x 2 B = 2,015,887,360 B, against the language
    # model's peak plus the encoder cache, max(8192, 16384) tokens x 3584 x 2 B = 117,440,512.
    want = max(text.activation_peak_bytes_per_gpu + 117_440_512, 2_015_887_360)
    assert vl.activation_peak_bytes_per_gpu == want


def test_ttft_grows_with_images_per_request():
    ttft = [capplan.latency("qwen2.5-vl-7b", GPU, rate=0.5, input_len=200, output_len=64,
                            max_model_len=32768, images_per_request=n).ttft_s["mean"]
            for n in (0, 1, 2, 4)]
    assert np.all(np.diff(ttft) > 0)
    # One 1024 x 1024 image: the encoder's FLOPs (hand formula in capplan/models/vision.py)
    # add at least their compute-bound time at the calibrated GEMM rate.
    dep = capplan.deployment("qwen2.5-vl-7b", GPU, max_model_len=32768)
    flops = vision.encoder_flops(5476, _vl().vision)
    assert flops == pytest.approx(7.7e12, rel=0.05)
    assert ttft[1] - ttft[0] > flops / dep.step.gemm_flops_per_s


def test_launch_flags():
    from capplan.plan.feature_flags import feature_launch
    from capplan.plan.launch import BUILDERS, options_from
    from tests.plan.engine_args import parse_line

    rec = {"tp": 1, "max_num_seqs": 64, "max_num_batched_tokens": 8192, "max_model_len": 8192,
           "weight_dtype": "bf16", "kv_dtype": "auto", "speculative": "eagle3",
           "spec_tokens": 3, "max_loras": 4, "max_lora_rank": 64, "images_per_request": 2}
    extra, yaml_lines = feature_launch(rec, "org/m")
    assert extra["vllm"][:2] == ("--speculative-config", '{"method": "eagle3", '
                                 '"num_speculative_tokens": 3, "model": "<EAGLE3 draft head '
                                 'for org/m>"}')
    frac = {"vllm": 0.9, "sglang": 0.85, "trtllm": 0.9}
    opts = options_from(rec, "org/m", "bf16", frac)
    _, _, v, _ = parse_line(BUILDERS["vllm"](opts).command)
    assert v["--max-loras"] == "4" and v["--max-lora-rank"] == "64" and "--enable-lora" in v
    assert v["--limit-mm-per-prompt"] == '{"image": 2}'
    _, _, sg, _ = parse_line(BUILDERS["sglang"](opts).command)
    assert sg["--speculative-algorithm"] == "EAGLE3"
    assert sg["--speculative-num-draft-tokens"] == "4"  # K + 1 for a chain
    trt = BUILDERS["trtllm"](opts)
    parse_line(trt.command)
    assert "  max_draft_len: 3" in next(iter(trt.files.values())).splitlines()
    assert "speculative_config:" in yaml_lines
    assert feature_launch({"speculative": "eagle3", "spec_tokens": 0}, "m") == (
        {"vllm": (), "sglang": (), "trtllm": ()}, ())


@pytest.mark.parametrize("n", [16, 100, 1000])
def test_zipf_groups_match_the_exact_distinct_count(n):
    from capplan.models.lora import adapter_groups, expected_distinct

    p = 1 / np.arange(1, n + 1)
    p /= p.sum()
    groups = adapter_groups(n, "zipf")
    for s in (1, 8, 64, 512):
        exact = float((1 - (1 - p) ** s).sum())
        assert expected_distinct(s, groups, 10**9) == pytest.approx(exact, rel=0.045)


def test_import_reads_the_vision_encoder():
    from capplan.catalog.hf_import import config_to_entry

    # Qwen/Qwen2.5-VL-7B-Instruct config.json (the fields the importer reads; values as in the
    # catalog entry's source).
    cfg = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
           "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
           "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
           "max_position_embeddings": 128000, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16", "hidden_act": "silu",
           "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280,
                             "intermediate_size": 3420, "num_heads": 16, "in_chans": 3,
                             "out_hidden_size": 3584, "patch_size": 14,
                             "spatial_merge_size": 2, "spatial_patch_size": 14,
                             "temporal_patch_size": 2, "window_size": 112,
                             "fullatt_block_indexes": [7, 15, 23, 31]}}
    entry = config_to_entry(cfg, "qwen2.5-vl-test", "test")
    want = _vl()
    assert entry["vision"] == want.vision.model_dump(exclude={"min_pixels", "max_pixels"})
    assert entry["vision_params"] == want.vision_params
