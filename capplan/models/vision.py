"""Vision inputs: image tokens per image, the encoder's work per image, its memory.

Image tokens (Qwen2-VL / Qwen2.5-VL processor, transformers
models/qwen2_vl/image_processing_qwen2_vl.py `smart_resize`): with f = patch_size x
spatial_merge_size (14 x 2 = 28 px), an H x W image is resized to
    H' = round(H / f) f, W' = round(W / f) f,
scaled down to floor(H / b / f) f (b = sqrt(H W / max_pixels)) when H' W' > max_pixels, up to
ceil(H b / f) f (b = sqrt(min_pixels / (H W))) when below min_pixels; it becomes
(H'/p)(W'/p) patches of p x p px and (H'/p)(W'/p) / merge^2 tokens for the language model
(the 2 x 2 merger). 1024 x 1024: H' = W' = 37 x 28 = 1036 px, 74 x 74 = 5476 patches,
1369 tokens.

Encoder work per image (a ViT of depth L, width D, MLP width I over P patches; Qwen2.5-VL
vision_config; FLOPs = 2 x multiply-adds):
    patch embedding   2 P (3 t p^2) D                      (Conv3d over t = temporal_patch_size)
    linear layers     2 P L (4 D^2 + m D I)                 (qkv + proj; m = 3 gated, 2 plain)
    attention         4 D (n_full P^2 + n_window P w)       (QK^T and PV per query-key pair;
                                                             window layers see w patches)
    merger            2 (P / merge^2) (merge^4 D^2 + merge^2 D out)
vLLM V1 runs the encoder in the engine step that schedules the image's first tokens
(vllm/v1/core/sched/scheduler.py `_try_schedule_encoder_inputs`, v0.10), so its time is part of
that prefill step: the step model charges the encoder FLOPs over the prompt's prefill tokens
(`prefill_extra_flops_per_token`), and the simulator and queueing model see TTFT grow with
images per request without a second scheduler.

Memory: the encoder's weights are in the model's weights (`vision_params`); vLLM's profile run
feeds the encoder the largest image the processor allows (`get_image_size_with_most_features`,
vllm/multimodal/profiling.py), so its activation peak is the ViT forward over max_pixels
patches, P_max (m I + 4 D) x 2 bytes, plus the encoder cache (`compute_encoder_budget`,
vllm/v1/core/encoder_cache_manager.py: max(max_num_batched_tokens, tokens of the largest item)
tokens of the language model's width).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from capplan.errors import InputError


def resized(height: int, width: int, vision: Any) -> tuple[int, int]:
    """(H', W') in pixels after the processor's smart_resize (module docstring)."""
    f = vision.patch_size * vision.spatial_merge_size
    if height < 1 or width < 1:
        raise InputError(f"image {width}x{height}: both sides must be >= 1 px")
    if max(height, width) / min(height, width) > 200:
        raise InputError(f"image {width}x{height}: aspect ratio over 200 (the processor "
                         "refuses it)")
    h = max(f, round(height / f) * f)
    w = max(f, round(width / f) * f)
    if h * w > vision.max_pixels:
        beta = math.sqrt(height * width / vision.max_pixels)
        h = max(f, math.floor(height / beta / f) * f)
        w = max(f, math.floor(width / beta / f) * f)
    elif h * w < vision.min_pixels:
        beta = math.sqrt(vision.min_pixels / (height * width))
        h = math.ceil(height * beta / f) * f
        w = math.ceil(width * beta / f) * f
    return h, w


def image_patches(height: int, width: int, vision: Any) -> int:
    h, w = resized(height, width, vision)
    return (h // vision.patch_size) * (w // vision.patch_size)


def image_tokens(height: int, width: int, vision: Any) -> int:
    """Language-model tokens of one image (patches / merge^2)."""
    return image_patches(height, width, vision) // vision.spatial_merge_size ** 2


def _mlp_mats(vision: Any) -> int:
    return 3 if vision.mlp_gated else 2


def encoder_flops(patches: float, vision: Any) -> float:
    """FLOPs of the vision encoder over one image of `patches` patches (module docstring)."""
    p, d, i = float(patches), vision.hidden_size, vision.intermediate_size
    m = vision.spatial_merge_size ** 2
    embed = 2 * p * 3 * vision.temporal_patch_size * vision.patch_size ** 2 * d
    linear = 2 * p * vision.depth * (4 * d * d + _mlp_mats(vision) * d * i)
    n_full = len(vision.fullatt_block_indexes) if vision.window_size else vision.depth
    n_win = vision.depth - n_full
    w = (vision.window_size / vision.patch_size) ** 2 if vision.window_size else 0.0
    attn = 4 * d * (n_full * p * p + n_win * p * min(w, p))
    merger = 2 * (p / m) * (m * m * d * d + m * d * vision.out_hidden_size)
    return embed + linear + attn + merger


def encoder_params(vision: Any) -> float:
    """Parameters of the encoder (patch embedding, blocks, merger), biases and norms left out."""
    d, i, m = vision.hidden_size, vision.intermediate_size, vision.spatial_merge_size ** 2
    embed = 3 * vision.temporal_patch_size * vision.patch_size ** 2 * d
    blocks = vision.depth * (4 * d * d + _mlp_mats(vision) * d * i)
    merger = m * m * d * d + m * d * vision.out_hidden_size
    return embed + blocks + merger


@dataclass(frozen=True)
class VisionLoad:
    """Images per request at one resolution, as the step and memory models use them."""

    images_per_request: int
    tokens_per_image: int
    patches_per_image: int
    encoder_flops_per_image: float

    @property
    def tokens_per_request(self) -> int:
        return self.images_per_request * self.tokens_per_image

    def prefill_flops_per_token(self, text_tokens: float) -> float:
        """Encoder FLOPs spread over a prompt of `text_tokens` text plus the image tokens."""
        total = text_tokens + self.tokens_per_request
        if total <= 0:
            return 0.0
        return self.images_per_request * self.encoder_flops_per_image / total


def plan_vision(model: Any, settings: Any) -> VisionLoad | None:
    """The VisionLoad of engine settings (None without images)."""
    n = int(getattr(settings, "images_per_request", 0) or 0)
    if n == 0:
        return None
    if n < 0:
        raise InputError(f"--images-per-request {n}: must be >= 0")
    v = getattr(model, "vision", None)
    if v is None:
        raise InputError(f"--images-per-request {n}: {model.key} has no vision encoder in the "
                         "catalog (a `vision:` section read from its config.json)")
    h, w = settings.image_height, settings.image_width
    patches = image_patches(h, w, v)
    return VisionLoad(n, patches // v.spatial_merge_size ** 2, patches,
                      encoder_flops(patches, v))


def encoder_activation_bytes(model: Any, max_num_batched_tokens: int, act_bytes: float
                             ) -> tuple[float, float]:
    """(encoder forward peak, encoder cache) in bytes for the profiled activation peak (module
    docstring); (0, 0) for a text-only model."""
    v = getattr(model, "vision", None)
    if v is None:
        return 0.0, 0.0
    p_max = v.max_pixels // v.patch_size ** 2
    forward = p_max * (_mlp_mats(v) * v.intermediate_size + 4 * v.hidden_size) * act_bytes
    cache_tokens = max(max_num_batched_tokens, p_max // v.spatial_merge_size ** 2)
    return forward, cache_tokens * model.hidden_size * act_bytes
