"""Hybrid, MoE and quantized architectures imported from real config.json files
(tests/data/configs, provenance in SOURCES.md): parameter counts against the published totals,
KV and recurrent-state bytes against hand calculations written out here."""

from __future__ import annotations

from pathlib import Path

import pytest

from capplan.catalog.hf_import import import_config
from capplan.catalog.loader import load_catalog
from capplan.errors import InputError
from capplan.models import layers
from capplan.models.engine import EngineSettings
from capplan.models.memory import memory_report
from capplan.models.perf import build_step_model

CONFIGS = Path(__file__).resolve().parent.parent / "data" / "configs"

# config -> (published total parameters, where it is published). Tolerance 3%.
PUBLISHED = {
    "nemotron-h-56b-base-8k": (56e9, "Nemotron-H paper (arXiv 2504.03624) Table 1: 56B"),
    "nemotron-3-nano-30b-a3b": (31.6e9, "HF model card: 31.6B total parameters"),
    "qwen3-next-80b-a3b-thinking": (80e9, "HF model card: 80B total, 3B activated"),
    "qwen3.5-27b": (27e9, "HF model card Qwen/Qwen3.5-27B: 27B"),
    "qwen3.5-35b-a3b": (35e9, "HF model card Qwen/Qwen3.5-35B-A3B: 35B total, 3B active"),
    "qwen3.5-397b-a17b": (397e9, "HF model card Qwen/Qwen3.5-397B-A17B: 397B total"),
    "kimi-k2-instruct": (1.0e12, "HF model card: 1T total, 32B activated"),
    "deepseek-v3.2": (671e9, "DeepSeek-V3 report: 671B main model (685B with the MTP module)"),
    "llama-4-scout-17b-16e-instruct": (109e9, "Llama 4 model card: 109B total, 17B active"),
    "nvidia-llama-3.1-70b-instruct-fp8": (70.6e9, "Llama 3.1 model card: 70.6B"),
    "llama-3.1-8b-instruct": (8.03e9, "Llama 3.1 model card: 8.03B"),
    "llama-3.3-70b-instruct": (70.6e9, "Llama 3.3 model card: 70.6B"),
    "qwen2.5-7b-instruct": (7.61e9, "Qwen2.5 model card: 7.61B"),
    "qwen3-32b": (32.8e9, "Qwen3 model card: 32.8B"),
    "mixtral-8x7b": (46.7e9, "Mixtral paper: 47B (46.7B) total"),
    "gpt-oss-120b": (116.8e9, "gpt-oss model card: 116.8B total"),
    "lfm2.5-vl-1.6b": (1.6e9, "LFM2.5-VL-1.6B model card: 1.6B (1.2B LFM2 + 400M SigLIP2)"),
    "llama-3.3-nemotron-super-49b-v1": (49e9, "model card: 49B (NAS of Llama-3.3-70B)"),
    "glm-4.5-air": (106e9, "GLM-4.5 model card: GLM-4.5-Air 106B total, 12B active"),
    "glm-5-fp8": (750e9, "SiliconFlow model page of GLM-5: 750B total, 40B activated"),
    "mistral-nemo-base-2407": (12e9, "Mistral NeMo announcement (2024-07-18): a 12B model"),
    "granite-4.0-h-350m": (340e6, "Ollama library granite4:350m-h (its GGUF): 340M"),
    "phi-1": (1.42e9, "HF model page of microsoft/phi-1: 1.42B params in its safetensors "
                      "(the card's '1.3B' is rounded)"),
}
HYBRID_OR_NON_GATED = {"nemotron-h-56b-base-8k", "nemotron-3-nano-30b-a3b",
                       "qwen3-next-80b-a3b-thinking", "qwen3.5-27b", "qwen3.5-35b-a3b",
                       "qwen3.5-397b-a17b", "lfm2.5-vl-1.6b", "phi-1", "granite-4.0-h-350m"}


def _spec(name: str):
    return import_config(CONFIGS / f"{name}.config.json")


def test_acceptance_set_size():
    assert len(PUBLISHED) >= 12
    assert all((CONFIGS / f"{n}.config.json").is_file() for n in PUBLISHED)
    assert HYBRID_OR_NON_GATED <= set(PUBLISHED) and len(HYBRID_OR_NON_GATED) >= 6


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_total_parameters_within_3_percent_of_published(name):
    want, _source = PUBLISHED[name]
    assert _spec(name).params_total == pytest.approx(want, rel=0.03)


def test_nemotron_h_56b_layers_kv_and_state():
    s = _spec("nemotron-h-56b-base-8k")
    # hybrid_override_pattern: 54 M (Mamba2), 10 * (attention), 54 - (relu2 MLP), 118 layers
    assert s.layer_kinds.count("mamba2") == 54 and s.layer_kinds.count("full_attention") == 10
    assert s.mlp_kinds.count("dense") == 54 and not s.mlp_gated and s.hidden_act == "relu2"
    # KV per token, TP 1, bf16: 10 attention layers * 2 (K, V) * 8 kv heads * 128 * 2 B
    assert layers.kv_bytes_per_token(s, 1, 2) == 10 * 2 * 8 * 128 * 2 == 40_960
    # Mamba2 state per layer: conv (4-1) * (16384 inner + 2*8 groups*256) * 2 B = 122,880
    # plus SSM 256 heads * 64 * 256 state * 4 B (vLLM's float32 default for NemotronH)
    page = 3 * (256 * 64 + 2 * 8 * 256) * 2 + 256 * 64 * 256 * 4
    assert page == 16_900_096 and layers.state_page_bytes(s, 1) == page
    # block size: 16 * cdiv(16,900,096, 16 * 4096 B per token per attention layer) = 4128
    assert layers.effective_block_size(s, 1, 2, 16) == 16 * 258 == 4128
    # vLLM groups layers by spec in groups of min(10 attention, 54 Mamba) = 10 layers: 1
    # attention group, cdiv(54, 10) = 6 Mamba groups (the last padded with 6 empty slots). A
    # sequence holds one block per Mamba group, a block being one page padded to 4128 * 4096 B
    # in each of the 10 slots: 60 pages, 6 blocks of the pool
    assert layers.state_pages_per_seq(s) == 60 and layers.state_blocks_per_seq(s) == 6
    assert layers.state_bytes_per_seq(s, 1, 2, 4128) == 60 * 4128 * 4096
    # TP 8: groups 8/8, heads 256/8: conv 3 * 20480/8 * 2 + 32 * 64 * 256 * 4
    assert layers.state_page_bytes(s, 8) == 3 * 20480 / 8 * 2 + 32 * 64 * 256 * 4


def test_qwen3_next_gated_deltanet_state():
    s = _spec("qwen3-next-80b-a3b-thinking")
    # full_attention_interval 4: 12 of 48 layers are full attention, 36 gated DeltaNet
    assert s.layer_kinds.count("full_attention") == 12
    assert s.layer_kinds.count("linear_attention") == 36
    assert layers.kv_bytes_per_token(s, 1, 2) == 12 * 2 * 2 * 256 * 2 == 24_576
    # conv (4-1) * (2*16*128 + 32*128) * 2 B + recurrent 32 v-heads * 128 * 128 * 2 B
    page = 3 * (2 * 16 * 128 + 32 * 128) * 2 + 32 * 128 * 128 * 2
    assert page == 1_097_728 and layers.state_page_bytes(s, 1) == page
    # 16 * cdiv(1,097,728, 16 * 2048) = 16 * 34 = 544 tokens per block
    assert layers.effective_block_size(s, 1, 2, 16) == 544
    seq = layers.sequence_bytes(s, 1000, 1, 2, 544)
    # 1000 tokens: 2 blocks of 544 in each of 12 attention layers, plus 36 padded state pages
    assert seq == 12 * 2 * 544 * 2048 + 36 * 544 * 2048


def test_qwen35_fp32_recurrent_state_and_vision_depth():
    s = _spec("qwen3.5-27b")
    assert s.ssm_state_dtype == "fp32"  # text_config.mamba_ssm_dtype float32
    page = 3 * (2 * 16 * 128 + 48 * 128) * 2 + 48 * 128 * 128 * 4
    assert layers.state_page_bytes(s, 1) == page == 3_207_168
    assert s.vision_params > 0  # vision_config describes its tower with `depth`


def test_nemotron3_nano_moe_hybrid_active_parameters():
    s = _spec("nemotron-3-nano-30b-a3b")
    # Model card: 3.6B active parameters including embeddings
    assert s.params_active == pytest.approx(3.6e9, rel=0.03)
    assert s.mlp_kinds.count("moe") == 23 and s.layer_kinds.count("full_attention") == 6


def test_state_bounds_concurrency_in_memory_report(catalog):
    s = _spec("qwen3-next-80b-a3b-thinking")
    gpu = catalog.gpu("h200")
    r = memory_report(s, gpu, EngineSettings(tp=4, max_model_len=32768))
    per_token = layers.kv_bytes_per_token(s, 4, 2)  # 12 * 2 * max(1, 2/4) * 256 * 2
    assert per_token == 12 * 2 * 1 * 256 * 2
    bs = r.block_size
    assert bs == 16 * -(-layers.state_page_bytes(s, 4) // (16 * 1024)) and bs > 16
    state = 36 * bs * 1024
    assert r.state_bytes_per_seq_per_gpu == state
    seq = 12 * -(-32768 // bs) * bs * 1024 + state
    assert r.kv_bytes_per_max_len_seq == seq
    assert r.max_concurrency == pytest.approx(r.num_gpu_blocks * bs * per_token / seq)


def test_step_time_reads_state_once_per_sequence(catalog):
    s = _spec("qwen3-next-80b-a3b-thinking")
    m = build_step_model(s, catalog.gpu("h100-sxm"), EngineSettings(tp=2))
    assert m.state_bytes_per_seq == 36 * layers.recurrent_state_bytes(s, "linear_attention", 2)
    assert m.full_layers == 12 and m.window_layers == 0
    # the state does not grow with context: only attention KV does
    t1 = m.decode_step(64, 1000)["memory_s"]
    t2 = m.decode_step(64, 2000)["memory_s"]
    kv = 64 * 1000 * 12 * m.kv_bytes_per_token_layer / m.kv_bytes_per_s
    assert float(t2 - t1) == pytest.approx(kv, rel=1e-9)


@pytest.mark.parametrize(("name", "fragment"), [
    ("nemotron-3-super-120b-a12b-fp8", "moe_latent_size"),
])
def test_unsized_configs_refused_naming_the_field(run_cli, name, fragment):
    path = CONFIGS / f"{name}.config.json"
    with pytest.raises(InputError, match=fragment):
        import_config(path)
    res = run_cli("models", "import", str(path))
    assert res.exit_code == 2 and len(res.stderr_lines) == 1 and fragment in res.stderr


def test_unknown_layer_type_refused(tmp_path):
    import json
    cfg = json.loads((CONFIGS / "qwen3.5-27b.config.json").read_text())
    cfg["text_config"]["layer_types"][0] = "retention"
    cfg["text_config"]["layer_types"][1] = "linear_attention"
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="'retention' is not handled"):
        import_config(bad)


def test_modelopt_fp8_from_hf_quant_config():
    s = _spec("nvidia-llama-3.1-70b-instruct-fp8")
    assert s.quantization is not None and s.quantization.format == "fp8"
    assert s.quantization.exclude == ["lm_head"]


def test_catalog_loads():
    assert load_catalog().models


def test_model_path_everywhere(run_cli, tmp_path):
    # a folder holding config.json and hf_quant_config.json, as a downloaded checkpoint has
    folder = tmp_path / "Llama-3.1-70B-Instruct-FP8"
    folder.mkdir()
    stem = "nvidia-llama-3.1-70b-instruct-fp8"
    (folder / "config.json").write_bytes((CONFIGS / f"{stem}.config.json").read_bytes())
    (folder / "hf_quant_config.json").write_bytes(
        (CONFIGS / f"{stem}.hf_quant_config.json").read_bytes())
    res = run_cli("memory", "--model", str(folder), "--gpu", "h100-sxm", "--tp", "2",
                  "--max-model-len", "8192", "--format", "json")
    assert res.exit_code == 0, res.stderr
    assert res.json()["weight_dtype"] == "fp8"
    # a config.json: Qwen3-Next, 12 attention layers at TP 4: 12 * 2 * 1 * 256 * 2 B per token
    cfg = CONFIGS / "qwen3-next-80b-a3b-thinking.config.json"
    res = run_cli("memory", "--model", str(cfg), "--gpu", "h200", "--tp", "4",
                  "--max-model-len", "32768", "--format", "json")
    assert res.exit_code == 0, res.stderr
    assert res.json()["kv_bytes_per_token_per_gpu"] == 12 * 2 * 1 * 256 * 2


def test_max_model_len_over_the_checkpoint_limit_is_one_line(run_cli):
    res = run_cli("memory", "--model", "Qwen/Qwen2.5-72B-Instruct", "--gpu", "h200",
                  "--tp", "4", "--max-model-len", "65536")
    assert res.exit_code == 2 and len(res.stderr_lines) == 1
    assert "Qwen/Qwen2.5-72B-Instruct's 32768" in res.stderr


def test_lfm2_short_conv_layers():
    s = _spec("lfm2.5-vl-1.6b")
    # layer_types: 10 conv, 6 full_attention; block_auto_adjust_ff_dim: 2/3 of 12288 = 8192
    assert s.layer_kinds.count("short_conv") == 10 and s.intermediate_size == 8192
    assert s.tie_word_embeddings  # Lfm2Config ties by default; the config omits the key
    # KV per token: 6 attention layers * 2 * 8 KV heads * 64 head_dim * 2 B = 12,288
    assert layers.kv_bytes_per_token(s, 1, 2) == 6 * 2 * 8 * 64 * 2 == 12_288
    # conv state: (conv_L_cache 3 - 1) * 2048 hidden * 2 B = 8,192 per conv layer
    assert layers.state_page_bytes(s, 1) == 2 * 2048 * 2 == 8192
    # an attention page of 16 tokens (16 * 2048 B) already holds it: no block size change
    assert layers.effective_block_size(s, 1, 2, 16) == 16
    # groups of min(6, 10) = 6 layers: cdiv(10, 6) = 2 conv groups (12 slots), 2 pool blocks
    assert layers.state_blocks_per_seq(s) == 2
    assert layers.state_bytes_per_seq(s, 1, 2, 16) == 12 * 16 * 2 * 8 * 64 * 2


def test_glm45_air_moe_gqa_kv():
    s = _spec("glm-4.5-air")
    # first_k_dense_replace 1: one dense layer (10944), 45 MoE layers of 128 experts top-8 + 1
    # shared (1408 each)
    assert s.num_moe_layers == 45 and s.moe.num_dense_layers == 1
    assert (s.moe.num_experts, s.moe.num_experts_per_tok, s.moe.num_shared_experts) == (128, 8, 1)
    # head_dim 128 is given (96 heads x 128 = 12288 != hidden 4096); KV per token, bf16:
    # 46 layers * 2 (K, V) * 8 KV heads * 128 * 2 B = 188,416
    assert layers.kv_bytes_per_token(s, 1, 2) == 46 * 2 * 8 * 128 * 2 == 188_416
    # TP 8: one KV head per rank
    assert layers.kv_bytes_per_token(s, 8, 2) == 46 * 2 * 1 * 128 * 2
    # parameters by hand: embeddings + untied head 2 * 151552 * 4096 = 1,241,513,984;
    # attention per layer q 4096*12288 + k,v 2 * 4096*1024 + o 12288*4096 + biases
    # (12288 + 2048) = 109,065,216; dense MLP 3 * 4096 * 10944 = 134,479,872; MoE layer
    # 129 experts * 3 * 4096 * 1408 + router 128 * 4096 = 2,232,418,304 (norms and the
    # router's bias are below 0.01%)
    attn = 4096 * 12288 + 2 * 4096 * 1024 + 12288 * 4096 + 12288 + 2048
    total = (2 * 151552 * 4096 + 46 * attn + 3 * 4096 * 10944
             + 45 * (129 * 3 * 4096 * 1408 + 128 * 4096))
    assert s.params_total == pytest.approx(total, rel=1e-4)


def test_granite4_h_350m_mamba2_hybrid():
    s = _spec("granite-4.0-h-350m")
    # layer_types: 28 "mamba" (Mamba2), 4 "attention"; every layer has a dense gated MLP of
    # shared_intermediate_size 2048 (num_local_experts 0)
    assert s.layer_kinds.count("mamba2") == 28 and s.layer_kinds.count("full_attention") == 4
    assert s.moe is None and s.intermediate_size == 2048 and s.tie_word_embeddings
    # KV per token: 4 attention layers * 2 * 4 KV heads * 64 (768 / 12) * 2 B = 4,096
    assert layers.kv_bytes_per_token(s, 1, 2) == 4 * 2 * 4 * 64 * 2 == 4096
    # Mamba2 state per layer, bf16: conv (4 - 1) * (1536 inner + 2 * 1 group * 128) * 2 B
    # = 10,752 plus SSM 48 heads * 32 * 128 state * 2 B = 393,216
    page = 3 * (1536 + 2 * 128) * 2 + 48 * 32 * 128 * 2
    assert page == 403_968 and layers.state_page_bytes(s, 1) == page
    # block: 16 * cdiv(403,968, 16 * 1,024 B per token per attention layer: 2 * 4 * 64 * 2)
    # = 16 * 25 = 400 tokens
    assert layers.effective_block_size(s, 1, 2, 16) == 400
    # parameters by hand: tied embedding 100352 * 768; attention layer q,o 2 * 768^2 +
    # k,v 2 * 768 * 256; Mamba2 layer in_proj 768 * (2*1536 + 2*128 + 48) + conv (1536 +
    # 256) * 4 + bias 1792 + dt_bias, A, D 3 * 48 + norm 1536 + out_proj 1536 * 768; MLP
    # 3 * 768 * 2048 per layer; two RMSNorms per layer and a final one
    attn = 2 * 768 * 768 + 2 * 768 * 256
    mamba = 768 * (2 * 1536 + 2 * 128 + 48) + 1792 * 4 + 1792 + 3 * 48 + 1536 + 1536 * 768
    total = 100352 * 768 + 4 * attn + 28 * mamba + 32 * (3 * 768 * 2048 + 2 * 768) + 768
    assert s.params_total == pytest.approx(total, rel=1e-3)


def test_mistral_nemo_head_dim_not_hidden_over_heads():
    s = _spec("mistral-nemo-base-2407")
    assert s.head_dim == 128 and s.hidden_size // s.num_attention_heads == 160
    # 40 layers * 2 * 8 KV heads * 128 * 2 B = 163,840 per token
    assert layers.kv_bytes_per_token(s, 1, 2) == 40 * 2 * 8 * 128 * 2 == 163_840
    # embeddings + head 2 * 131072 * 5120; per layer q,o 2 * 5120 * 4096, k,v 2 * 5120 * 1024,
    # MLP 3 * 5120 * 14336 (norms 2 * 5120 per layer + 5120 final)
    layer = 2 * 5120 * 4096 + 2 * 5120 * 1024 + 3 * 5120 * 14336 + 2 * 5120
    assert s.params_total == pytest.approx(2 * 131072 * 5120 + 40 * layer + 5120, rel=1e-6)


def test_phi1_non_gated_fp32_served_in_bf16():
    s = _spec("phi-1")
    assert not s.mlp_gated and s.torch_dtype == "bf16"  # vLLM --dtype auto: fp32 -> bf16
    # 24 layers * (4 * 2048^2 attention + 2 * 2048 * 8192 MLP) = 1,207,959,552
    counts_mlp_attn = 24 * (4 * 2048**2 + 2 * 2048 * 8192)
    assert counts_mlp_attn == 1_207_959_552
    assert layers.kv_bytes_per_token(s, 1, 2) == 24 * 2 * 32 * 64 * 2


# ---------------------------------------------------------------------------------------------
# Field conventions of other families (inline configs: the fields each family's config class
# reads; sizes hand-computed here)
# ---------------------------------------------------------------------------------------------

def _import_dict(tmp_path, cfg):
    import json
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return import_config(p)


def test_falcon_multi_query_and_old_names(tmp_path):
    # Falcon-7B style: n_layer/n_head names, multi_query -> one KV head, MLP 4h not gated,
    # FalconConfig ties the embeddings by default
    s = _import_dict(tmp_path, {"model_type": "falcon", "hidden_size": 4544, "n_head": 71,
                                "n_layer": 32, "multi_query": True, "vocab_size": 65024,
                                "parallel_attn": True})
    assert (s.num_layers, s.num_attention_heads, s.num_kv_heads) == (32, 71, 1)
    assert s.intermediate_size == 4 * 4544 and not s.mlp_gated and s.tie_word_embeddings
    assert layers.kv_bytes_per_token(s, 1, 2) == 32 * 2 * 1 * 64 * 2


def test_qwen1_intermediate_is_doubled(tmp_path):
    s = _import_dict(tmp_path, {"model_type": "qwen", "hidden_size": 4096,
                                "num_hidden_layers": 32, "num_attention_heads": 32,
                                "intermediate_size": 22016, "vocab_size": 151936,
                                "kv_channels": 128, "seq_length": 8192})
    assert s.intermediate_size == 11008 and s.max_position_embeddings == 8192


@pytest.mark.parametrize("mt", ["starcoder2", "cohere"])
def test_family_default_tied_embeddings(tmp_path, mt):
    s = _import_dict(tmp_path, {"model_type": mt, "hidden_size": 1024, "num_hidden_layers": 2,
                                "num_attention_heads": 8, "intermediate_size": 4096,
                                "vocab_size": 1000, "hidden_act": "gelu_pytorch_tanh"})
    assert s.tie_word_embeddings
    assert s.mlp_gated is (mt == "cohere")  # Starcoder2MLP is c_fc/c_proj (no gate)


def test_all_moe_without_dense_intermediate(tmp_path):
    s = _import_dict(tmp_path, {"model_type": "qwen3_moe", "hidden_size": 2048,
                                "num_hidden_layers": 4, "num_attention_heads": 16,
                                "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 1000,
                                "num_experts": 8, "num_experts_per_tok": 2,
                                "moe_intermediate_size": 768})
    assert s.intermediate_size == 768 and s.num_moe_layers == 4


def test_named_vision_tower(tmp_path):
    # Phi-3-vision describes its tower by name: CLIP ViT-L/14-336, 303.5M (Radford et al.)
    s = _import_dict(tmp_path, {"model_type": "phi3_v", "hidden_size": 3072,
                                "num_hidden_layers": 32, "num_attention_heads": 32,
                                "intermediate_size": 8192, "vocab_size": 32064,
                                "embd_layer": {"img_processor": {
                                    "model_name": "openai/clip-vit-large-patch14-336"}}})
    assert s.vision_params == pytest.approx(303.5e6 + 1024 * 3072)


def test_nemotron_super_block_configs():
    s = _spec("llama-3.3-nemotron-super-49b-v1")
    # 80 blocks: 49 keep GQA attention (64 heads in groups of 8 -> 8 KV heads), 31 no_op
    assert s.layer_kinds.count("full_attention") == 49 and s.num_kv_heads == 8
    assert layers.kv_bytes_per_token(s, 1, 2) == 49 * 2 * 8 * 128 * 2 == 200_704
    # ffn_mult 5.25 -> int(2 * 5.25 * 8192 / 3) = 28672 (a multiple of 256)
    assert s.mlp_intermediate_sizes is not None and max(s.mlp_intermediate_sizes) == 28672


def test_block_configs_with_mixed_kv_groups_refused(tmp_path):
    import json
    cfg = json.loads((CONFIGS / "llama-3.3-nemotron-super-49b-v1.config.json").read_text())
    cfg["block_configs"][0]["attention"]["n_heads_in_group"] = 4
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="different n_heads_in_group"):
        import_config(bad)


@pytest.mark.parametrize(("name", "fmt", "modules", "group"), [
    # ModelOpt NVFP4 in quantization_config (config_groups, float 4-bit, group 16); the ignore
    # list keeps linear_attn/self_attn and the shared experts in bf16 -> routed experts only
    ("nvidia-qwen3.5-397b-a17b-nvfp4", "nvfp4", "experts", 16),
    # compressed-tensors pack-quantized int4, group 32; ignores self_attn, shared_experts and
    # the dense mlp projections -> routed experts only
    ("kimi-k2.5", "int4", "experts", 32),
    ("gpt-oss-120b", "mxfp4", "experts", 32),
    # hf_quant_config.json beside config.json: ModelOpt FP8 per-tensor, lm_head excluded
    ("nvidia-llama-3.1-70b-instruct-fp8", "fp8", "all_linear", None),
])
def test_checkpoint_quantization(name, fmt, modules, group):
    q = _spec(name).quantization
    assert q is not None and (q.format, q.modules, q.group_size) == (fmt, modules, group)
    assert "lm_head" in q.exclude


def test_jamba_mamba1_moe_hybrid(tmp_path):
    # JambaConfig's defaults are the Jamba-v0.1 architecture (published: 52B total, 12B
    # active, AI21 Jamba paper): 32 layers, attention every 8th from layer 4, MoE every 2nd
    # from layer 1 (16 experts top-2), Mamba-1 d_state 16, d_conv 4, expand 2
    s = _import_dict(tmp_path, {"model_type": "jamba", "hidden_size": 4096,
                                "num_hidden_layers": 32, "num_attention_heads": 32,
                                "num_key_value_heads": 8, "intermediate_size": 14336,
                                "vocab_size": 65536, "num_experts": 16,
                                "num_experts_per_tok": 2, "mamba_dt_rank": 256})
    assert s.layer_kinds.count("full_attention") == 4 and s.layer_kinds.count("mamba") == 28
    assert s.num_moe_layers == 16
    assert s.params_total == pytest.approx(52e9, rel=0.03)
    assert s.params_active == pytest.approx(12e9, rel=0.03)
    # Mamba-1 state per layer: conv (4-1) * 8192 * 2 B + SSM 8192 * 16 * 2 B = 311,296
    assert layers.state_page_bytes(s, 1) == 3 * 8192 * 2 + 8192 * 16 * 2 == 311_296


def test_jamba_catalog_entry_is_the_config_class_defaults(catalog):
    # model_catalog/jamba-v0.1.yaml was imported from JambaConfig's defaults (its source): the
    # same architecture as the inline dict above, KV over its 4 attention layers only
    entry = catalog.model("jamba-v0.1")
    assert entry.layer_kinds.count("full_attention") == 4 and entry.num_moe_layers == 16
    # 4 attention layers * 2 * 8 KV heads * 128 * 2 B = 16,384 per token (a dense 32-layer
    # model of the same shape would hold 131,072)
    assert layers.kv_bytes_per_token(entry, 1, 2) == 4 * 2 * 8 * 128 * 2 == 16_384
    assert layers.state_page_bytes(entry, 1) == 3 * 8192 * 2 + 8192 * 16 * 2


def test_state_blocks_per_sequence(catalog):
    # Qwen3-Next at TP 4: 36 state pages of one block each over 12 attention layers' block
    # (a block spans every attention layer): 36 / 12 = 3 blocks per running sequence
    s = _spec("qwen3-next-80b-a3b-thinking")
    r = memory_report(s, catalog.gpu("h200"), EngineSettings(tp=4, max_model_len=32768))
    assert r.state_blocks_per_seq == 3 and isinstance(r.state_blocks_per_seq, int)


def test_moe_layer_freq_list(tmp_path):
    # one flag per layer: 3 dense then MoE (MiniMax-M3 style); the dense MLP width is
    # dense_intermediate_size, the experts' moe width intermediate_size
    freq = [0, 0, 0] + [1] * 5
    s = _import_dict(tmp_path, {"model_type": "x", "hidden_size": 1024, "num_hidden_layers": 8,
                                "num_attention_heads": 8, "vocab_size": 1000,
                                "intermediate_size": 512, "dense_intermediate_size": 4096,
                                "num_local_experts": 8, "num_experts_per_tok": 2,
                                "moe_layer_freq": freq})
    assert s.num_moe_layers == 5 and s.moe is not None and s.moe.num_dense_layers == 3
    assert s.intermediate_size == 4096 and s.moe.moe_intermediate_size == 512


def test_glm5_catalog_entry_matches_its_config_and_kv_by_hand():
    """The catalog's GLM-5 (model_catalog/glm-5.yaml) is its config.json's architecture; KV per
    token by hand: MLA latent (kv_lora_rank 512 + rope 64) x 2 B = 1,152 B per layer, plus the
    sparse-attention indexer's fp8 key (128 B + a 4-byte scale) = 132 B per layer, x 78 layers."""
    imported = _spec("glm-5-fp8")
    entry = load_catalog().model("zhipuai/GLM-5")
    assert entry.key == "glm-5"
    for f in ("num_layers", "hidden_size", "intermediate_size", "num_attention_heads",
              "head_dim", "vocab_size", "max_position_embeddings", "moe", "mla"):
        assert getattr(entry, f) == getattr(imported, f), f
    assert entry.params_total == pytest.approx(imported.params_total, rel=0.005)
    assert layers.kv_bytes_per_token(entry, 1, 2) == 78 * (576 * 2 + 132) == 100_152

