"""Turn a Hugging Face config.json into a catalog entry (Llama, Mistral, Qwen1/2/3, Mixtral,
Qwen3-MoE, Gemma 1/2/3, DeepSeek-V2/V3, gpt-oss, Llama-4 text, Phi-3/4, Falcon, StarCoder2,
Cohere; hybrids: Nemotron-H, Qwen3-Next / Qwen3.5, Granite-4, Jamba, LFM2).

Per-layer kinds are read from layer_types, hybrid_override_pattern, full_attention_interval or
the Jamba periods; a field or layer kind capplan cannot size is refused with one line naming it
(never sized as a full-attention transformer). Derivations: docs/architectures.md."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from capplan import limits as L
from capplan.catalog.schema import ModelSpec, VisionSpec
from capplan.errors import InputError, validation_error_line
from capplan.limits import read_text

_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "half": "fp16"}
_REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
FP8_LATENT_BYTES = {"DeepseekV32ForCausalLM": 656}
"""Architectures whose fp8 KV cache stores its own MLA latent layout, bytes per token per layer:
DeepSeek-V3.2's fp8_ds_mla, 512 fp8 + 4 fp32 scales + 64 bf16 rope (vLLM
model_executor/models/config.py DeepseekV32ForCausalLM.verify_and_update_config)."""
# Older config schemas name the same fields differently (Falcon n_layer/n_head, GPT-2 style).
_ALIASES = {"n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
            "n_embd": "hidden_size", "num_layers": "num_hidden_layers",
            "n_head_kv": "num_key_value_heads", "num_kv_heads": "num_key_value_heads",
            "n_inner": "intermediate_size", "ffn_hidden_size": "intermediate_size",
            "attention_head_dim": "head_dim", "seq_length": "max_position_embeddings"}
# MLPs without a gate (up, act, down): HF Starcoder2MLP (gelu), NemotronMLP / NemotronH
# (relu2), FalconMLP, GPT-2 / BigCode / NeoX / OPT / Phi-1/2 / BLOOM / MPT.
_NON_GATED = {"starcoder2", "nemotron", "nemotron_h", "falcon", "gpt2", "gpt_bigcode",
              "gpt_neox", "gptj", "opt", "phi", "bloom", "mpt"}
# Fields describing layouts capplan does not size: refused by name, never approximated.
_UNHANDLED = {
    "layers_block_type": "the layer layout layers_block_type (NemotronH's per-layer block list "
                         "in place of num_hidden_layers and hybrid_override_pattern)",
    "swa_num_key_value_heads": "different heads for sliding-window layers (MiMo-V2)",
    "hybrid_layer_pattern": "hybrid_layer_pattern (MiMo-V2 per-layer attention kinds)",
    "parallel_attn_mamba": "parallel attention + Mamba in one layer (Falcon-H1)",
    "moe_latent_size": "latent MoE (experts in a moe_latent_size projection, Nemotron-3 Super)",
}
_LAYER_TYPE = {"full_attention": "full_attention", "attention": "full_attention",
               "global": "full_attention", "sliding_attention": "sliding_attention",
               "chunked_attention": "chunked_attention", "linear_attention": "linear_attention",
               "mamba": "mamba2", "mamba2": "mamba2", "conv": "short_conv"}

# transformers config-class defaults for fields that published config.json files often omit
# (a missing key means "the class default", not "absent"). PretrainedConfig itself defaults
# tie_word_embeddings to True; the Llama/Mistral/Qwen/DeepSeek/gpt-oss classes override it
# with False, so only the families below tie by default.
_MODEL_TYPE_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma": {"tie_word_embeddings": True},   # GemmaConfig
    "gemma2": {"tie_word_embeddings": True},  # Gemma2Config
    # Gemma3TextConfig: vocab_size=262_208, max_position_embeddings=131_072,
    # sliding_window_pattern=6, tie_word_embeddings=True (gemma-3-27b-it's text_config omits them)
    "gemma3_text": {"tie_word_embeddings": True, "vocab_size": 262208,
                    "max_position_embeddings": 131072, "sliding_window_pattern": 6},
    "opt": {"tie_word_embeddings": True},     # OPTConfig
    "cohere": {"tie_word_embeddings": True},  # CohereConfig
    "cohere2": {"tie_word_embeddings": True},  # Cohere2Config
    "starcoder2": {"tie_word_embeddings": True},  # Starcoder2Config
    "falcon": {"tie_word_embeddings": True, "vocab_size": 65024},  # FalconConfig
    "gpt_bigcode": {"tie_word_embeddings": True},  # GPTBigCodeConfig
    "lfm2": {"tie_word_embeddings": True},  # Lfm2Config
    "jamba": {"tie_word_embeddings": False, "mamba_d_state": 16, "mamba_d_conv": 4,
              "mamba_expand": 2, "attn_layer_period": 8, "attn_layer_offset": 4,
              "expert_layer_period": 2, "expert_layer_offset": 1},  # JambaConfig
}


def read_config(path: Path) -> dict[str, Any]:
    try:
        text = read_text(path, "config.json")
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror or e})") from e
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{e.lineno}: malformed JSON: {e.msg}") from e
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object")
    return data


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Multimodal configs nest the language model under text_config / llm_config."""
    for key in ("text_config", "llm_config", "language_config"):
        sub = cfg.get(key)
        if isinstance(sub, dict) and "hidden_size" in sub:
            merged = {**sub}
            for k in ("torch_dtype", "tie_word_embeddings", "quantization_config"):
                if cfg.get(k) is not None:
                    merged.setdefault(k, cfg.get(k))
            return _with_defaults(merged)
    return _with_defaults(cfg)


def _with_defaults(c: dict[str, Any]) -> dict[str, Any]:
    mt = str(c.get("model_type", ""))
    out = {**_MODEL_TYPE_DEFAULTS.get(mt, {}), **c}
    for old, new in _ALIASES.items():
        if out.get(new) is None and out.get(old) is not None:
            out[new] = out[old]
    return out


# Vision towers named rather than described (Phi-3-vision img_processor): published sizes.
_NAMED_TOWERS = {"openai/clip-vit-large-patch14-336": 303.5e6}  # CLIP ViT-L/14 (Radford 2021)


def _vision_params(cfg: dict[str, Any], text_hidden: int) -> float:
    """ViT encoder + projector estimate from vision_config: per layer 4h^2 (q, k, v, o) plus
    2*h*i (fc1, fc2), plus a linear projector h*text_hidden. Embeddings and norms are ignored
    (<2% of a SigLIP-So400m encoder). Layers are num_hidden_layers or depth (Qwen2-VL, Qwen3.5)."""
    proc = cfg.get("img_processor") or (cfg.get("embd_layer") or {}).get("img_processor")
    if isinstance(proc, dict) and proc.get("model_name") in _NAMED_TOWERS:
        return _NAMED_TOWERS[proc["model_name"]] + 1024 * text_hidden
    v = cfg.get("vision_config")
    if not isinstance(v, dict):
        return 0.0
    try:
        h = int(v.get("hidden_size") or v["embed_dim"])
        n = int(v.get("num_hidden_layers") or v["depth"])
        i = int(v.get("intermediate_size") or h * float(v.get("mlp_ratio", 4)))
    except (KeyError, TypeError, ValueError):
        return 0.0
    out = int(v.get("out_hidden_size") or h)
    return float(n * (4 * h * h + 2 * h * i) + h * out + out * text_hidden)


def _vision_fields(cfg: dict[str, Any], text_hidden: int) -> dict[str, Any]:
    """vision_params, and the vision section when the encoder is one capplan describes."""
    spec = _vision_spec(cfg)
    if spec is None:
        return {"vision_params": _vision_params(cfg, text_hidden)}
    from capplan.models.vision import encoder_params

    return {"vision_params": float(encoder_params(VisionSpec(**spec))), "vision": spec}


def _vision_spec(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The `vision:` section for Qwen2-VL / Qwen2.5-VL style encoders (a ViT of `depth` blocks
    over patch_size patches, a spatial_merge_size^2 merger): the fields capplan.models.vision
    reads. Qwen2-VL names the ViT width embed_dim (its hidden_size is the merger's output) and
    uses a plain MLP of mlp_ratio x width; Qwen2.5-VL a gated one of intermediate_size. The
    pixel limits are the processors' defaults (Qwen2VLImageProcessor: 56 x 56 to 28 x 28 x
    16384 px; preprocessor_config.json may set others). None for other encoders."""
    v = cfg.get("vision_config")
    if not isinstance(v, dict) or "depth" not in v or "spatial_merge_size" not in v:
        return None
    try:
        if "embed_dim" in v:  # Qwen2-VL
            width, out = int(v["embed_dim"]), int(v.get("hidden_size") or v["embed_dim"])
            inter, gated = int(width * float(v.get("mlp_ratio", 4))), False
        else:  # Qwen2.5-VL
            width, out = int(v["hidden_size"]), int(v["out_hidden_size"])
            inter, gated = int(v["intermediate_size"]), True
        spec = {"depth": int(v["depth"]), "hidden_size": width, "intermediate_size": inter,
                "num_heads": int(v["num_heads"]), "patch_size": int(v["patch_size"]),
                "spatial_merge_size": int(v["spatial_merge_size"]),
                "temporal_patch_size": int(v.get("temporal_patch_size", 2)),
                "out_hidden_size": out, "mlp_gated": gated}
    except (KeyError, TypeError, ValueError):
        return None
    if v.get("window_size"):
        spec.update(window_size=int(v["window_size"]),
                    fullatt_block_indexes=[int(i) for i in v.get("fullatt_block_indexes", [])])
    return spec


def _quantization(q: dict[str, Any] | None) -> dict[str, Any] | None:
    """Weight format and quantized modules from quantization_config (or hf_quant_config.json's
    "quantization" section): vLLM reads the same fields (Fp8Config, ModelOptFp8Config,
    ModelOptNvFp4Config, AWQConfig, GPTQConfig, CompressedTensorsConfig, Mxfp4Config)."""
    if not q:
        return None
    method = str(q.get("quant_method") or ("modelopt" if q.get("quant_algo") else "")).lower()
    exclude = [str(m) for m in (q.get("modules_to_not_convert") or q.get("ignore")
                                or q.get("exclude_modules") or [])]
    out: dict[str, Any]
    if method == "mxfp4":
        out = {"format": "mxfp4", "modules": "experts", "group_size": 32}
    elif method == "fp8":
        block = q.get("weight_block_size")
        out = {"format": "fp8", "group_size": int(block[0]) if block else None}
    elif method in ("awq", "gptq"):
        bits = int(q.get("bits", q.get("w_bit", 4)))
        if bits not in (4, 8):
            raise InputError(f"quantization_config.bits {bits} is not supported (4 or 8)")
        out = {"format": "int4" if bits == 4 else "int8",
               "group_size": int(q.get("group_size", q.get("q_group_size", 128)))}
    elif method == "modelopt":
        algo = str(q.get("quant_algo", "")).upper()
        if not algo and q.get("config_groups"):
            out = _compressed_tensors(q)
            out.setdefault("modules", _modules(exclude))
            out["exclude"] = exclude
            return out
        if algo not in ("FP8", "NVFP4"):
            raise InputError(f"quant_algo {algo!r} is not supported (FP8, NVFP4)")
        out = ({"format": "fp8", "group_size": None} if algo == "FP8"
               else {"format": "nvfp4", "group_size": int(q.get("group_size") or 16)})
        if algo == "NVFP4" and q.get("config_groups"):
            out["group_size"] = _compressed_tensors(q)["group_size"] or 16
    elif method == "compressed-tensors":
        out = _compressed_tensors(q)
    else:
        raise InputError(f"quantization_config.quant_method {method!r} is not supported "
                         "(fp8, mxfp4, awq, gptq, compressed-tensors, modelopt)")
    out.setdefault("modules", _modules(exclude))
    out["exclude"] = exclude
    return out


def _modules(exclude: list[str]) -> str:
    """Which linear layers stay quantized, from the excluded module names (patterns as the
    checkpoint lists them): token mixers excluded -> the MLPs only ("mlp"); mixers and the
    shared experts or dense MLPs excluded too -> the routed experts only ("experts")."""
    text = " ".join(exclude).lower()
    mixers = any(w in text for w in ("self_attn", "attn", "mixer"))
    rest = "shared_expert" in text or re.search(r"mlp\W{0,3}\(?(gate|up|down)", text)
    if mixers and rest:
        return "experts"
    if mixers:
        return "mlp"
    return "all_linear"


def _compressed_tensors(q: dict[str, Any]) -> dict[str, Any]:
    """compressed-tensors: the first config group's weights (num_bits, type, group_size)."""
    groups = q.get("config_groups") or {}
    weights = next((g.get("weights") for g in groups.values()
                    if isinstance(g, dict) and g.get("weights")), None)
    if not weights:
        raise InputError("quantization_config.config_groups has no weights entry")
    bits, kind = int(weights.get("num_bits", 0)), str(weights.get("type", "int"))
    fmt = {(8, "float"): "fp8", (4, "float"): "nvfp4", (8, "int"): "int8",
           (4, "int"): "int4"}.get((bits, kind))
    if fmt is None:
        raise InputError(f"compressed-tensors weights {kind}{bits} are not supported")
    group = weights.get("group_size")
    if fmt == "fp8":
        block = weights.get("block_structure")
        group = int(block[0]) if block else None
    targets = " ".join(str(t) for g in groups.values() if isinstance(g, dict)
                       for t in g.get("targets") or [])
    out: dict[str, Any] = {"format": fmt, "group_size": int(group) if group else None}
    if "expert" in targets.lower() and "Linear" not in targets:
        out["modules"] = "experts"
    return out


def _moe(c: dict[str, Any], layers: int) -> dict[str, Any] | None:
    experts = c.get("num_local_experts") or c.get("num_experts") or c.get("n_routed_experts")
    if not experts:
        return None
    topk = (c.get("num_experts_per_tok") or c.get("experts_per_token")
            or c.get("num_experts_per_token"))
    inter = c.get("moe_intermediate_size") or c.get("intermediate_size")
    shared_w = (c.get("shared_expert_intermediate_size")
                or c.get("moe_shared_expert_intermediate_size")
                or c.get("shared_intermediate_size"))  # GraniteMoeHybrid shared_mlp
    shared_n = c.get("n_shared_experts") or (1 if shared_w else 0)
    shared_i = shared_w or (inter if shared_n else 0)
    if c.get("model_type", "").startswith("llama4"):
        shared_n, shared_i = 1, c.get("intermediate_size")
    dense = int(c.get("first_k_dense_replace") or 0)
    step = c.get("interleave_moe_layer_step") or c.get("decoder_sparse_step") or 1
    if step and step > 1:
        dense = layers - layers // step
    dense += len(c.get("mlp_only_layers") or [])
    freq = c.get("moe_layer_freq")
    if isinstance(freq, list):  # one flag per layer (MiMo-V2, MiniMax-M3): 0 = dense MLP
        if len(freq) != layers:
            raise InputError(f"moe_layer_freq lists {len(freq)} layers, num_hidden_layers "
                             f"{layers}")
        dense = sum(1 for f in freq if not f)
    elif isinstance(freq, int) and freq > 1:  # DeepSeek-V2: MoE where i >= k and i % freq == 0
        k = int(c.get("first_k_dense_replace") or 0)
        dense = sum(1 for i in range(layers) if not (i >= k and i % freq == 0))
    if topk is None or inter is None:
        raise InputError("MoE config lacks num_experts_per_tok or moe_intermediate_size")
    return {"num_experts": int(experts), "num_experts_per_tok": int(topk),
            "moe_intermediate_size": int(inter), "num_shared_experts": int(shared_n),
            "shared_expert_intermediate_size": int(shared_i or 0), "num_dense_layers": dense,
            "n_group": int(c.get("n_group") or 1), "topk_group": int(c.get("topk_group") or 1)}


def _sliding(c: dict[str, Any], layers: int) -> tuple[int | None, int]:
    types = c.get("layer_types")
    window = c.get("sliding_window") or c.get("attention_chunk_size")
    if c.get("use_sliding_window") is False and "layer_types" not in c:
        return None, 0
    if isinstance(types, list) and types:
        n = sum(1 for t in types if "sliding" in str(t) or "chunked" in str(t))
        return (int(window), n) if n and window else (None, 0)
    if not window:
        return None, 0
    mt = c.get("model_type", "")
    if mt == "gemma2":
        return int(window), layers // 2
    if mt in ("gemma3", "gemma3_text"):
        pattern = int(c.get("sliding_window_pattern") or 6)
        return int(window), layers - layers // pattern
    if mt.startswith("llama4"):
        step = int(c.get("no_rope_layer_interval") or 4)
        return int(window), layers - layers // step
    return int(window), layers


# The config fields sized before anything is built per layer, with their bounds (a 10**9-layer
# config hung the import); the schema checks the same bounds on the entry it becomes.
_BOUNDS = {"num_hidden_layers": L.MODEL_LAYERS, "num_attention_heads": L.MODEL_HEADS,
           "hidden_size": L.MODEL_WIDTH, "num_key_value_heads": L.MODEL_HEADS,
           "head_dim": L.MODEL_HEAD_DIM, "intermediate_size": L.MODEL_FFN,
           "moe_intermediate_size": L.MODEL_FFN, "vocab_size": L.MODEL_VOCAB,
           "max_position_embeddings": L.MODEL_CONTEXT, "num_local_experts": L.MODEL_EXPERTS,
           "n_routed_experts": L.MODEL_EXPERTS, "num_experts": L.MODEL_EXPERTS}


def _count(c: dict[str, Any], key: str) -> int:
    """A positive whole number from the config (a 0 head count divided by zero), inside its
    bound (limits.MODEL_*)."""
    v = c[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not v < 2**40 or v < 1 \
            or v != int(v):
        raise InputError(f"config field {key} must be a positive integer")
    return int(_BOUNDS[key].check(int(v), f"config field {key}")) if key in _BOUNDS else int(v)


def _check_bounds(c: dict[str, Any]) -> None:
    """Every bounded field the config sets, checked before the layers are laid out."""
    for key in _BOUNDS:
        if c.get(key):  # 0 / null: absent (a dense model's num_experts: 0)
            _count(c, key)


_PATTERN = {"M": ("mamba2", "none"), "*": ("full_attention", "none"), "-": ("none", "dense"),
            "E": ("none", "moe")}  # NemotronH hybrid_override_pattern characters


def _mixers_and_mlps(c: dict[str, Any], layers: int) -> tuple[list[str] | None,
                                                                list[str] | None]:
    """Per-layer mixer and MLP kinds from whichever per-layer description the config has."""
    mt = str(c.get("model_type", ""))
    pattern = c.get("hybrid_override_pattern")
    types = c.get("layer_types")
    if pattern:
        bad = sorted(set(pattern) - set(_PATTERN))
        if bad:
            raise InputError(f"hybrid_override_pattern: layer type {bad[0]!r} is not handled "
                             "(M, *, -, E)")
        return [_PATTERN[ch][0] for ch in pattern], [_PATTERN[ch][1] for ch in pattern]
    if isinstance(types, list) and any(t in ("linear_attention", "mamba", "mamba2", "conv")
                                       for t in types):
        unknown = [t for t in types if t not in _LAYER_TYPE]
        if unknown:
            raise InputError(f"layer_types: layer type {unknown[0]!r} is not handled")
        return [_LAYER_TYPE[t] for t in types], None
    if c.get("full_attention_interval") and c.get("linear_num_value_heads"):
        k = int(c["full_attention_interval"])  # Qwen3-Next: every k-th layer is full attention
        return ["full_attention" if (i + 1) % k == 0 else "linear_attention"
                for i in range(layers)], None
    if mt == "jamba":  # JambaConfig attn/expert layer period and offset
        ap, ao = int(c["attn_layer_period"]), int(c["attn_layer_offset"])
        ep, eo = int(c["expert_layer_period"]), int(c["expert_layer_offset"])
        return (["full_attention" if i % ap == ao else "mamba" for i in range(layers)],
                ["moe" if i % ep == eo else "dense" for i in range(layers)])
    if mt in ("mamba", "falcon_mamba", "mamba2"):
        return ["mamba2" if mt == "mamba2" else "mamba"] * layers, None
    if c.get("block_configs"):
        return (["none" if (b.get("attention") or {}).get("no_op") else "full_attention"
                 for b in c["block_configs"]],
                ["none" if (b.get("ffn") or {}).get("no_op") else "dense"
                 for b in c["block_configs"]])
    return None, None


def _block_configs(c: dict[str, Any], hidden: int, heads: int) -> dict[str, Any]:
    """DeciLM / Nemotron-NAS per-layer blocks: attention kept (GQA, n_heads_in_group) or
    skipped (no_op), MLP width from ffn_mult (HF DeciLM _ffn_mult_to_intermediate_size:
    int(2 * ffn_mult * hidden / 3) rounded up to a multiple of 256)."""
    groups, widths = set(), []
    for i, b in enumerate(c["block_configs"]):
        att, ffn = b.get("attention") or {}, b.get("ffn") or {}
        for part, d in (("attention", att), ("ffn", ffn)):
            for field in ("replace_with_linear", "sparsify", "window_length",
                          "num_sink_tokens"):
                if d.get(field):
                    raise InputError(f"block_configs[{i}].{part}.{field} is not handled")
        if not att.get("no_op"):
            groups.add(int(att.get("n_heads_in_group") or 1))
        w = int(2 * float(ffn.get("ffn_mult") or 0) * hidden / 3)
        widths.append(0 if ffn.get("no_op") else 256 * ((w + 255) // 256))
    if len(groups) > 1:
        raise InputError(f"block_configs: attention layers with different n_heads_in_group "
                         f"{sorted(groups)} are not handled")
    kv = heads // (groups.pop() if groups else 1)
    return {"num_key_value_heads": kv, "intermediate_size": max(widths),
            "mlp_intermediate_sizes": [w or max(widths) for w in widths]}


def _check_attn_type_list(types: Any, layers: int) -> None:
    """MiniMax's per-layer attention kinds: 0 is lightning (linear) attention, 1 softmax
    attention (vLLM minimax_text_01.py: attention_type 0 builds MiniMaxText01LinearAttention,
    1 MiniMaxText01Attention, anything else is refused). A list of ones (MiniMax-M2.x: every
    layer softmax attention) is a plain transformer; a lightning layer is not sized."""
    if types is None:
        return
    if not isinstance(types, list) or len(types) != layers:
        raise InputError(f"attn_type_list: expected one entry per layer ({layers})")
    for i, t in enumerate(types):
        if isinstance(t, bool) or t not in (0, 1):
            raise InputError(f"attn_type_list[{i}]: {str(t)[:20]!r} is not 0 (lightning) or "
                             "1 (softmax attention)")
    if 0 in types:
        raise InputError(f"attn_type_list: {types.count(0)} of {layers} layers are MiniMax "
                         "lightning (linear) attention (0), which is not handled; capplan "
                         "cannot size this model")


def _layer_plan(c: dict[str, Any], layers: int) -> dict[str, Any]:
    """Per-layer mixer and MLP kinds, and the recurrent-layer dimensions, for hybrid configs.

    Empty for a plain transformer (its sliding/MoE layers are counted by _sliding/_moe).
    """
    _check_attn_type_list(c.get("attn_type_list"), layers)
    mixers, mlps = _mixers_and_mlps(c, layers)
    if mixers is None:
        return {}
    if len(mixers) != layers:
        raise InputError(f"per-layer types list {len(mixers)} layers, num_hidden_layers "
                         f"{layers}")
    plan: dict[str, Any] = {"layer_types": mixers, "mlp_types": mlps}
    kinds = set(mixers)
    if kinds & {"mamba", "mamba2"}:
        plan["ssm"] = _ssm(c, "mamba" in kinds)
    if "linear_attention" in kinds:
        plan["linear_attention"] = {
            "num_k_heads": int(c["linear_num_key_heads"]),
            "num_v_heads": int(c["linear_num_value_heads"]),
            "head_k_dim": int(c["linear_key_head_dim"]),
            "head_v_dim": int(c["linear_value_head_dim"]),
            "conv_kernel": int(c.get("linear_conv_kernel_dim") or 4)}
    if "short_conv" in kinds:
        plan["conv_kernel"] = int(c.get("conv_L_cache") or c.get("conv_kernel") or 3)
    ssm_dtype = c.get("mamba_ssm_cache_dtype") or c.get("mamba_ssm_dtype")
    if ssm_dtype is None and c.get("model_type") == "nemotron_h":
        # vLLM NemotronHForCausalLMConfig: SSM cache float32 unless the config says otherwise.
        ssm_dtype = "float32"
    if ssm_dtype and kinds & {"mamba", "mamba2", "linear_attention"}:
        plan["ssm_state_dtype"] = _DTYPES.get(str(ssm_dtype), "bf16")
    return plan


def _ssm(c: dict[str, Any], v1: bool) -> dict[str, Any]:
    """Mamba dimensions: Mamba2 (NemotronH, GraniteMoeHybrid) or Mamba1 (Jamba) field names."""
    h = int(c["hidden_size"])
    try:
        if v1:
            expand = int(c.get("mamba_expand") or c.get("expand") or 2)
            state = int(c.get("mamba_d_state") or c.get("state_size") or 16)
            rank = c.get("mamba_dt_rank") or c.get("time_step_rank") or "auto"
            return {"version": 1, "num_heads": 1, "head_dim": expand * h, "state_size": state,
                    "conv_kernel": int(c.get("mamba_d_conv") or c.get("conv_kernel") or 4),
                    "dt_rank": math.ceil(h / 16) if rank == "auto" else int(rank)}
        heads = int(c.get("mamba_num_heads") or c.get("mamba_n_heads"))
        head_dim = int(c.get("mamba_head_dim") or c.get("mamba_d_head"))
        return {"version": 2, "num_heads": heads, "head_dim": head_dim,
                "state_size": int(c.get("ssm_state_size") or c.get("mamba_d_state")),
                "n_groups": int(c.get("n_groups") or c.get("mamba_n_groups") or 1),
                "conv_kernel": int(c.get("conv_kernel") or c.get("mamba_d_conv") or 4)}
    except (TypeError, ValueError) as e:
        raise InputError("Mamba layers need mamba_num_heads, mamba_head_dim, ssm_state_size "
                         "(or Jamba's mamba_d_state/mamba_expand)") from e


# Heads of decoder-only text generators (HF's *ForCausalLM, multimodal *ForConditionalGeneration,
# GPT-2 style *LMHeadModel) and the generative models some checkpoints name by their base class.
_GENERATIVE_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")
_GENERATIVE_NAMES = {"ChatGLMModel"}  # THUDM chatglm*: vLLM registers it as a causal LM


def _check_generative(cfg: dict[str, Any], c: dict[str, Any]) -> None:
    """An encoder (BertModel), a classifier head or an encoder-decoder (T5, Whisper) is not
    a model capplan plans token generation for: refused rather than sized as a decoder."""
    archs = cfg.get("architectures")
    if cfg.get("is_encoder_decoder") or c.get("is_encoder_decoder"):
        name = archs[0] if isinstance(archs, list) and archs else cfg.get("model_type")
        raise InputError(f"architectures: {str(name)[:60]} is an encoder-decoder model; capplan "
                         "plans decoder-only text generation")
    if not isinstance(archs, list) or not archs:
        return
    name = str(archs[0])
    if not name.endswith(_GENERATIVE_SUFFIXES) and name not in _GENERATIVE_NAMES:
        raise InputError(f"architectures: {name[:60]} is not a causal language model (a "
                         "...ForCausalLM or ...ForConditionalGeneration); capplan plans text "
                         "generation")


def config_to_entry(cfg: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    """A catalog mapping for ModelSpec from a config.json mapping."""
    c = _text_config(cfg)
    _check_generative(cfg, c)
    for field, what in _UNHANDLED.items():  # before the required fields a layout replaces
        if c.get(field):
            raise InputError(f"{field}: {what} is not handled; capplan cannot size this model")
    missing = [k for k in _REQUIRED if c.get(k) is None]
    if missing:
        raise InputError(f"config lacks required field(s): {', '.join(missing)}")
    _check_bounds(c)
    mt = str(c.get("model_type", ""))
    arch = (cfg.get("architectures") or [mt or "unknown"])[0]
    layers, heads, hidden = (_count(c, k) for k in ("num_hidden_layers", "num_attention_heads",
                                                     "hidden_size"))
    plan = _layer_plan(c, layers)
    if c.get("block_configs"):
        nas = _block_configs(c, hidden, heads)
        c = {**c, "num_key_value_heads": nas["num_key_value_heads"],
             "intermediate_size": nas["intermediate_size"]}
        plan["mlp_intermediate_sizes"] = nas["mlp_intermediate_sizes"]
    mla = None
    if c.get("kv_lora_rank"):
        mla = {k: c.get(k) for k in ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim",
                                     "qk_nope_head_dim", "v_head_dim", "index_n_heads",
                                     "index_head_dim", "index_topk")}
        mla["fp8_latent_bytes"] = FP8_LATENT_BYTES.get(arch)
        head_dim = int(mla["qk_nope_head_dim"]) + int(mla["qk_rope_head_dim"])
        kv_heads = heads
    else:
        head_dim = int(c.get("head_dim") or c.get("kv_channels") or hidden // heads)
        kv_heads = int(c.get("num_key_value_heads") or (1 if c.get("multi_query") else heads))
    window, n_sliding = _sliding(c, layers)
    if plan.get("layer_types"):
        n_sliding = sum(t in ("sliding_attention", "chunked_attention")
                        for t in plan["layer_types"])
        window = window if n_sliding else None
    moe = _moe(c, layers)
    if moe is not None and plan.get("mlp_types"):
        moe["num_dense_layers"] = sum(t == "dense" for t in plan["mlp_types"])
    inter = (c.get("dense_intermediate_size") or c.get("intermediate_size_mlp")
             or c.get("intermediate_size") or c.get("ffn_dim"))
    if mt == "qwen":
        inter = int(inter) // 2  # Qwen1's w1/w2 are each intermediate_size / 2 wide (QWenMLP)
    if mt == "lfm2" and c.get("block_auto_adjust_ff_dim"):
        inter = _lfm2_ff_dim(c)
    if inter is None and mt == "falcon":
        inter = 4 * hidden  # FalconMLP: dense_h_to_4h
    if inter is None and moe is not None and (moe["num_dense_layers"] == 0 and not any(
            t == "dense" for t in plan.get("mlp_types") or [])):
        inter = moe["moe_intermediate_size"]  # every layer is MoE: no dense width needed
    if inter is None:
        raise InputError("config lacks intermediate_size")
    dtype = _DTYPES.get(str(c.get("torch_dtype") or c.get("dtype") or "bfloat16"), "bf16")
    if dtype == "fp32":
        dtype = "bf16"  # vLLM --dtype auto serves a float32 checkpoint in bfloat16
    act = str(c.get("mlp_hidden_act") or c.get("hidden_act") or c.get("hidden_activation")
              or c.get("activation_function") or "silu")
    gated = mt not in _NON_GATED and act not in ("relu2", "relu")
    entry: dict[str, Any] = {
        "key": key, "name": key, "hf_id": _hf_id(cfg.get("_name_or_path")) or key,
        "aliases": [], "architecture": str(arch), "torch_dtype": dtype,
        "quantization": _quantization(c.get("quantization_config")),
        "num_layers": layers, "hidden_size": hidden, "intermediate_size": int(inter),
        "num_attention_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim,
        "vocab_size": int(c["vocab_size"]),
        "max_position_embeddings": int(c.get("max_position_embeddings") or 4096),
        "tie_word_embeddings": bool(c.get("tie_word_embeddings", False)),
        "mlp_gated": gated, "hidden_act": act,
        "sliding_window": window, "num_sliding_layers": n_sliding,
        "moe": moe, "mla": mla, **_vision_fields(cfg, hidden),
        "mtp_layers": int(c.get("num_nextn_predict_layers") or 0),
        "attn_output_gate": bool(c.get("attn_output_gate", mt.startswith("qwen3_next"))),
        "params_total": 1.0, "params_active": 1.0,
        "source": {"config": source, "params": "computed by capplan from the architecture"},
        **plan,
    }
    return entry


_HF_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_KEY = re.compile(r"[a-z0-9][a-z0-9._-]*")
# Checkpoint names that say the weights are quantized (the loader's -FP8, -NVFP4... suffixes)
_QUANT_NAME = re.compile(r"(fp8|fp4|mxfp4|int4|int8|awq|gptq|w4a16|w8a8|w8a16)", re.I)


def _hf_id(name_or_path: Any) -> str | None:
    """config.json's _name_or_path when it is a Hugging Face id (ORG/NAME); None for a local
    path (`/opt/ckpts/Llama-3.1-70B-Instruct/`, what a checkpoint saved from disk records)."""
    text = str(name_or_path or "")
    return text if _HF_ID.fullmatch(text) else None


def check_key(key: str) -> str:
    """A catalog key: lower-case letters, digits, '.', '_' and '-' (it becomes a file name and
    a --model name; `../evil` is neither)."""
    if not _KEY.fullmatch(key) or len(key) > 100:
        raise InputError(f"name {key[:60]!r}: a catalog key is lower-case letters, digits, "
                         "'.', '_' and '-', starting with a letter or digit (no path "
                         "separators)")
    return key


def quantization_note(path: Path, spec: ModelSpec) -> str | None:
    """A note when the checkpoint's name says it is quantized but neither config.json's
    quantization_config nor an hf_quant_config.json beside it says how (the weights were
    recorded in the config's dtype)."""
    if spec.quantization is not None or not _QUANT_NAME.search(f"{path.name} {spec.hf_id}"):
        return None
    return (f"{path} names a quantized checkpoint but has no quantization_config (and no "
            f"hf_quant_config.json beside it): weights recorded as {spec.torch_dtype}; put the "
            "checkpoint's hf_quant_config.json beside config.json")


def _lfm2_ff_dim(c: dict[str, Any]) -> int:
    """HF Lfm2MLP with block_auto_adjust_ff_dim: 2/3 of block_ff_dim, times the multiplier,
    rounded up to block_multiple_of (LFM2-1.2B: 12288 -> 8192)."""
    ff = int(2 * int(c.get("block_ff_dim") or c["intermediate_size"]) / 3)
    if c.get("block_ffn_dim_multiplier") is not None:
        ff = int(float(c["block_ffn_dim_multiplier"]) * ff)
    m = int(c.get("block_multiple_of") or 256)
    return m * ((ff + m - 1) // m)


def read_hf_quant_config(config_path: Path) -> dict[str, Any] | None:
    """ModelOpt checkpoints (NVFP4, FP8) describe quantization in hf_quant_config.json beside
    config.json (vLLM ModelOptFp8Config / ModelOptNvFp4Config read it)."""
    for name in ("hf_quant_config.json", config_path.name.replace("config.json",
                                                                  "hf_quant_config.json")):
        p = config_path.parent / name
        if p != config_path and p.is_file():
            data = read_config(p)
            q = data.get("quantization")
            if not isinstance(q, dict):
                raise InputError(f"{p}: no quantization section")
            return {"quant_method": "modelopt", **q}
    return None


def import_config(path: Path, key: str | None = None) -> ModelSpec:
    """Read config.json and return a validated ModelSpec with computed parameter counts."""
    from capplan.models.memory import param_counts

    if path.is_dir():
        path = path / "config.json"
    cfg = read_config(path)
    hfq = read_hf_quant_config(path)
    if hfq is not None and not cfg.get("quantization_config"):
        cfg = {**cfg, "quantization_config": hfq}
    if key is not None:
        check_key(key)
    name = key or re.sub(r"[^a-z0-9.]+", "-", str(cfg.get("_name_or_path") or path.stem)
                         .rstrip("/").split("/")[-1].lower())
    name = name.removesuffix(".config").removesuffix("-config").strip("-") or "imported"
    try:
        entry = config_to_entry(cfg, name, str(path))
        spec = ModelSpec.model_validate(entry)
    except (TypeError, ValueError, KeyError) as e:
        if isinstance(e, InputError):
            raise InputError(f"{path}: {e}") from e
        msg = (validation_error_line(e, [])[1] if isinstance(e, ValidationError)
               else f"config lacks {e.args[0]}" if isinstance(e, KeyError) else str(e))
        raise InputError(f"{path}: {msg}") from e
    counts = param_counts(spec)
    active = counts.total
    if spec.moe is not None:
        m = spec.moe
        routed = counts.num_moe_layers * m.num_experts_per_tok * counts.expert_size
        active -= counts.experts - routed
    return spec.model_copy(update={"params_total": counts.total, "params_active": active})
