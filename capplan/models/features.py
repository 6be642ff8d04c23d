"""Speculative decoding, LoRA and vision in one place for the memory and step models.

`feature_memory` gives what the features add to the per-GPU memory terms; `feature_step` the
constants they add to the step model (capplan.models.perf.step_parts). Derivations:
capplan/models/speculative.py, lora.py, vision.py and docs/features.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from capplan.errors import InputError
from capplan.models import lora as lora_mod
from capplan.models import speculative as spec_mod
from capplan.models import vision as vision_mod

FEATURE_FIELDS = ("speculative", "spec_tokens", "spec_topk", "spec_draft_tokens",
                  "acceptance_length", "spec_workload", "max_loras", "max_lora_rank",
                  "lora_adapters", "lora_popularity", "images_per_request", "image_width",
                  "image_height")
"""EngineSettings / EngineOptions fields of the features (same names in both)."""


@dataclass(frozen=True)
class FeatureMemory:
    """Bytes per GPU the features add: weights (counted in the engine's budget like weights),
    activation peak, and KV bytes per token (the drafter's cache pages)."""

    draft_weights_bytes: float = 0.0
    lora_bytes: float = 0.0
    draft_kv_bytes_per_token: float = 0.0
    encoder_forward_bytes: float = 0.0
    """The vision encoder's forward peak over the largest image (vLLM's profile run)."""
    encoder_cache_bytes: float = 0.0
    """The encoder cache, alive while the language model's profile forward runs."""

    @property
    def weights_bytes(self) -> float:
        return self.draft_weights_bytes + self.lora_bytes


def resolve_draft_model(catalog: Any, settings: Any) -> Any:
    """Settings with the ModelSpec of a draft:MODEL drafter looked up in the catalog."""
    spec = getattr(settings, "speculative", None)
    if not spec:
        return settings
    method, name = spec_mod.parse_method(spec)
    if method != "draft" or name is None:
        return settings
    return replace(settings, draft_model=catalog.resolve_model(name).spec)


def validate_features(settings: Any) -> None:
    """InputError for feature settings no engine runs."""
    if settings.spec_workload not in spec_mod.WORKLOAD_KINDS:
        raise InputError(f"--spec-workload {settings.spec_workload!r}: expected one of "
                         f"{', '.join(spec_mod.WORKLOAD_KINDS)}")
    if settings.speculative and settings.pp > 1:
        raise InputError("--speculative with --pp > 1: vLLM does not run speculative decoding "
                         "with pipeline parallelism")
    profile = getattr(settings, "profile", None)
    if settings.speculative and settings.spec_tokens != 0 and profile is not None:
        why = profile.speculative_refusal(spec_mod.parse_method(settings.speculative)[0],
                                          int(settings.spec_topk or 1))
        if why:
            raise InputError(why)


def feature_memory(model: Any, settings: Any, kv_bytes_per_token_layer: float,
                   weight_bytes_per_param: float, act_bytes: float,
                   linear_bytes_per_param: float | None = None) -> FeatureMemory:
    """Per-GPU memory the features add (docstrings of the feature modules).

    `weight_bytes_per_param`: the checkpoint dtype (EAGLE heads, adapters, draft models ship
    in it); `linear_bytes_per_param`: the target's quantised linear layers, which an MTP module
    (a layer of the checkpoint itself) shares."""
    validate_features(settings)
    parts: dict[str, float] = {}
    sp = spec_mod.plan_speculation(model, settings, need_accept_len=False)
    if sp is not None:
        # The drafter runs at the target's TP (vLLM draft_tensor_parallel_size default) and in
        # the target's dtype; its KV pages sit in the same pool, per token.
        per_param = (linear_bytes_per_param if sp.method == "mtp" and linear_bytes_per_param
                     else weight_bytes_per_param)
        parts.update(draft_weights_bytes=sp.resident_params * per_param / settings.tp,
                     draft_kv_bytes_per_token=sp.draft_kv_layers * kv_bytes_per_token_layer)
    lp = lora_mod.plan_lora(model, settings, model.dtype_bytes)
    if lp is not None:
        parts.update(lora_bytes=lp.memory_bytes_per_gpu)
    vision_mod.plan_vision(model, settings)  # refuses images for a model without an encoder
    fwd, cache = vision_mod.encoder_activation_bytes(model, settings.max_num_batched_tokens,
                                                     act_bytes)
    return FeatureMemory(**parts, encoder_forward_bytes=fwd, encoder_cache_bytes=cache)

    # NOTE: the activation peak becomes max(text peak + encoder cache, encoder forward): vLLM
    # V1's profile_run runs the encoder on dummy images first, keeps its outputs in the encoder
    # cache, then runs the language model's dummy forward.
