"""Turn a Hugging Face config.json into a catalog entry (Llama, Mistral, Qwen2/3, Mixtral,
Qwen3-MoE, Gemma 1/2/3, DeepSeek-V2/V3, gpt-oss, Llama-4 text, Phi-3 families)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from capplan.catalog.loader import validation_message
from capplan.catalog.schema import ModelSpec
from capplan.errors import InputError
from capplan.limits import read_text

_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "half": "fp16"}
_REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")

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
    return {**_MODEL_TYPE_DEFAULTS.get(mt, {}), **c}


def _vision_params(cfg: dict[str, Any], text_hidden: int) -> float:
    """ViT encoder + projector estimate from vision_config: per layer 4h^2 (q, k, v, o) plus
    2*h*i (fc1, fc2), plus a linear projector h*text_hidden. Embeddings and norms are ignored
    (<2% of a SigLIP-So400m encoder)."""
    v = cfg.get("vision_config")
    if not isinstance(v, dict):
        return 0.0
    try:
        h, i, n = int(v["hidden_size"]), int(v["intermediate_size"]), int(v["num_hidden_layers"])
    except (KeyError, TypeError, ValueError):
        return 0.0
    return float(n * (4 * h * h + 2 * h * i) + h * text_hidden)


def _quantization(q: dict[str, Any] | None) -> dict[str, Any] | None:
    if not q:
        return None
    method = str(q.get("quant_method", "")).lower()
    if method == "mxfp4":
        return {"format": "mxfp4", "modules": "experts", "group_size": 32}
    if method == "fp8":
        block = q.get("weight_block_size")
        return {"format": "fp8", "modules": "all_linear",
                "group_size": int(block[0]) if block else None}
    if method in ("awq", "gptq"):
        bits = int(q.get("bits", 4))
        return {"format": "int4" if bits == 4 else "int8", "modules": "all_linear",
                "group_size": int(q.get("group_size", 128))}
    if method == "compressed-tensors":
        return {"format": "int4", "modules": "experts", "group_size": 32}
    raise InputError(f"quantization_config.quant_method {method!r} is not supported "
                     "(fp8, mxfp4, awq, gptq, compressed-tensors)")


def _moe(c: dict[str, Any], layers: int) -> dict[str, Any] | None:
    experts = c.get("num_local_experts") or c.get("num_experts") or c.get("n_routed_experts")
    if not experts:
        return None
    topk = (c.get("num_experts_per_tok") or c.get("experts_per_token")
            or c.get("num_experts_per_token"))
    inter = c.get("moe_intermediate_size") or c.get("intermediate_size")
    shared_n = c.get("n_shared_experts") or (1 if c.get("shared_expert_intermediate_size") else 0)
    shared_i = c.get("shared_expert_intermediate_size") or (inter if shared_n else 0)
    if c.get("model_type", "").startswith("llama4"):
        shared_n, shared_i = 1, c.get("intermediate_size")
    dense = int(c.get("first_k_dense_replace") or 0)
    step = c.get("interleave_moe_layer_step") or c.get("decoder_sparse_step") or 1
    if step and step > 1:
        dense = layers - layers // step
    dense += len(c.get("mlp_only_layers") or [])
    if topk is None or inter is None:
        raise InputError("MoE config lacks num_experts_per_tok or moe_intermediate_size")
    return {"num_experts": int(experts), "num_experts_per_tok": int(topk),
            "moe_intermediate_size": int(inter), "num_shared_experts": int(shared_n),
            "shared_expert_intermediate_size": int(shared_i or 0), "num_dense_layers": dense}


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


def _count(c: dict[str, Any], key: str) -> int:
    """A positive whole number from the config (a 0 head count divided by zero)."""
    v = c[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not v < 2**40 or v < 1 \
            or v != int(v):
        raise InputError(f"config field {key} must be a positive integer")
    return int(v)


def config_to_entry(cfg: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    """A catalog mapping for ModelSpec from a config.json mapping."""
    c = _text_config(cfg)
    missing = [k for k in _REQUIRED if k not in c]
    if missing:
        raise InputError(f"config lacks required field(s): {', '.join(missing)}")
    arch = (cfg.get("architectures") or [c.get("model_type", "unknown")])[0]
    layers, heads, hidden = (_count(c, k) for k in ("num_hidden_layers", "num_attention_heads",
                                                     "hidden_size"))
    mla = None
    if c.get("kv_lora_rank"):
        mla = {k: c.get(k) for k in ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim",
                                     "qk_nope_head_dim", "v_head_dim")}
        head_dim = int(mla["qk_nope_head_dim"]) + int(mla["qk_rope_head_dim"])
        kv_heads = heads
    else:
        head_dim = int(c.get("head_dim") or hidden // heads)
        kv_heads = int(c.get("num_key_value_heads") or heads)
    window, n_sliding = _sliding(c, layers)
    moe = _moe(c, layers)
    inter = c.get("intermediate_size_mlp") or c.get("intermediate_size") or c.get("ffn_dim")
    if inter is None:
        raise InputError("config lacks intermediate_size")
    dtype = _DTYPES.get(str(c.get("torch_dtype") or c.get("dtype") or "bfloat16"), "bf16")
    entry: dict[str, Any] = {
        "key": key, "name": key, "hf_id": str(cfg.get("_name_or_path") or key),
        "aliases": [], "architecture": str(arch), "torch_dtype": dtype,
        "quantization": _quantization(c.get("quantization_config")),
        "num_layers": layers, "hidden_size": hidden, "intermediate_size": int(inter),
        "num_attention_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim,
        "vocab_size": int(c["vocab_size"]),
        "max_position_embeddings": int(c.get("max_position_embeddings") or 4096),
        "tie_word_embeddings": bool(c.get("tie_word_embeddings", False)),
        "mlp_gated": str(c.get("hidden_act", c.get("activation_function", "silu"))) != "relu"
        and c.get("model_type") not in ("opt", "phi"),
        "sliding_window": window, "num_sliding_layers": n_sliding,
        "moe": moe, "mla": mla, "vision_params": _vision_params(cfg, hidden),
        "params_total": 1.0, "params_active": 1.0,
        "source": {"config": source, "params": "computed by capplan from the architecture"},
    }
    return entry


def import_config(path: Path, key: str | None = None) -> ModelSpec:
    """Read config.json and return a validated ModelSpec with computed parameter counts."""
    from capplan.models.memory import param_counts

    cfg = read_config(path)
    name = key or re.sub(r"[^a-z0-9.]+", "-",
                         str(cfg.get("_name_or_path") or path.stem).split("/")[-1].lower())
    name = name.removesuffix(".config").removesuffix("-config").strip("-") or "imported"
    try:
        entry = config_to_entry(cfg, name, str(path))
        spec = ModelSpec.model_validate(entry)
    except (TypeError, ValueError, KeyError) as e:
        if isinstance(e, InputError):
            raise InputError(f"{path}: {e}") from e
        msg = validation_message(e) if isinstance(e, ValidationError) else str(e)
        raise InputError(f"{path}: {msg}") from e
    counts = param_counts(spec)
    active = counts.total
    if spec.moe is not None:
        m = spec.moe
        routed = counts.num_moe_layers * m.num_experts_per_tok * counts.expert_size
        active -= counts.experts - routed
    return spec.model_copy(update={"params_total": counts.total, "params_active": active})
