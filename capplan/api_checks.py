"""The Python API's argument checks: the same `capplan.limits` objects the CLI's ParamTypes
use, so `capplan.speed(..., batch=[0])` is refused with the reason `capplan speed --batch 0`
gives (InputError, "KEYWORD: reason") instead of a ZeroDivisionError deep in the models.

Each keyword maps to (the CLI flag it mirrors, its Bound); lists to `limits.check_int_list`.
"""

from __future__ import annotations

from typing import Any

from capplan import limits as L
from capplan.errors import InputError

SCALARS: dict[str, L.Bound] = {
    "rate": L.RATE_PER_S, "concurrency": L.CONCURRENCY, "burstiness": L.BURSTINESS,
    "num_prompts": L.ENGINE_COUNT, "warmup_prompts": L.WARMUP_PROMPTS,
    "requests": L.REQUESTS, "seed": L.SEED, "batch_size": L.ENGINE_COUNT,
    "batch_timeout_s": L.DURATION_OR_0_S, "startup_lag_s": L.DURATION_OR_0_S,
    "window_s": L.WINDOW_S, "replicas": L.REPLICAS,
    # feature options (cli/_features.feature_options)
    "spec_tokens": L.SPEC_TOKENS, "spec_topk": L.SPEC_TOPK,
    "spec_draft_tokens": L.SPEC_DRAFT_TOKENS, "acceptance_length": L.ACCEPTANCE_LENGTH,
    "max_loras": L.MAX_LORAS, "max_lora_rank": L.LORA_RANK, "lora_adapters": L.LORA_ADAPTERS,
    "images_per_request": L.IMAGES, "image_width": L.IMAGE_PIXELS,
    "image_height": L.IMAGE_PIXELS,
    # engine options (cli/_options.engine_options: POS_INT = ENGINE_COUNT, FRACTION)
    "tp": L.ENGINE_COUNT, "pp": L.ENGINE_COUNT, "attention_dp": L.ENGINE_COUNT,
    "expert_parallel": L.ENGINE_COUNT, "max_model_len": L.ENGINE_COUNT,
    "max_num_seqs": L.ENGINE_COUNT, "max_num_batched_tokens": L.ENGINE_COUNT,
    "gpu_memory_utilization": L.FRACTION,
    "ttft_p99_s": L.DURATION_S, "tbt_p99_s": L.DURATION_S, "e2e_p99_s": L.DURATION_S,
}
"""Keyword -> the bound its CLI option checks."""
LISTS: dict[str, L.Bound] = {"batch": L.BATCH, "context": L.TOKENS, "prefill": L.TOKENS}
BLOCK_SIZES = (1, 8, 16, 32, 64, 128)
NOT_NONE = frozenset({"burstiness", "requests", "seed", "batch_timeout_s", "warmup_prompts",
                      "batch", "context"})
"""Keywords whose default is a value, not "unset": None there is refused, not skipped."""
_FLAG_NAMES = {"batch_timeout_s": "--batch-timeout", "startup_lag_s": "--startup-lag",
               "window_s": "--window", "ttft_p99_s": "--ttft-p99",
               "tbt_p99_s": "--tbt-p99", "e2e_p99_s": "--e2e-p99"}


def label(key: str) -> str:
    """'max_num_seqs (--max-num-seqs)': the keyword and the CLI option it mirrors."""
    return f"{key} ({_FLAG_NAMES.get(key, '--' + key.replace('_', '-'))})"


def _choices() -> dict[str, tuple[Any, ...]]:
    from capplan.models.engine import KV_DTYPES, WEIGHT_DTYPES

    # engine: not here (names may carry a release, 'vllm@0.11'; the resolver checks them)
    return {"weight_dtype": tuple(WEIGHT_DTYPES),
            "kv_dtype": tuple(KV_DTYPES), "block_size": BLOCK_SIZES}


def check_names(**names: Any) -> None:
    """model / gpu: non-empty strings (`latency(model, None)` raised AttributeError)."""
    for key, v in names.items():
        if isinstance(v, str) and not v.strip():
            raise InputError(f"{label(key)}: the name is empty; give a catalog name, Hugging "
                             "Face id or NVML name")
        if not isinstance(v, str):
            raise InputError(f"{label(key)}: expected a catalog name, Hugging Face id or NVML "
                             f"name, got {type(v).__name__}")


def check_kwargs(**kw: Any) -> dict[str, Any]:
    """InputError("KEYWORD (--FLAG): reason") for the first value the CLI would refuse (the
    reason is the CLI's); None = unset. Returns the keywords with lists as whole numbers."""
    choices = _choices()
    out = dict(kw)
    for key, v in kw.items():
        if v is None and key in NOT_NONE:
            raise InputError(f"{label(key)}: None is not a value (leave it out for the default)")
        if v is None:
            continue
        if key in SCALARS:
            if isinstance(v, str | bytes):  # the API takes numbers (a CLI value is text)
                raise InputError(f"{label(key)}: {str(v)[:40]!r} is not a number")
            SCALARS[key].check(v, label(key))
        elif key in LISTS:  # the values as the CLI parses them ('5' -> 5)
            out[key] = L.check_int_list(v, LISTS[key], label(key))
        elif key in choices and v not in choices[key]:
            raise InputError(f"{label(key)}: {v!r} is not one of "
                             f"{', '.join(str(c) for c in choices[key])}")
    if kw.get("batch") is not None and kw.get("context") is not None:
        L.check_cap("speed_rows", len(kw["batch"]) * len(kw["context"])
                    + len(kw.get("prefill") or ()), "batch x context")
    return out
