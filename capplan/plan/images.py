"""Images in prompts: a deployment and a prompt length with the images' tokens and encoder work
(capplan/models/vision.py; docs/features.md, "Vision inputs")."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from capplan.errors import InputError
from capplan.models.vision import plan_vision


def with_images(dep: Any, input_len: str | int) -> tuple[Any, str]:
    """(deployment, prompt length) for requests carrying `images_per_request` images each.

    The prompt grows by the images' tokens; the step model charges the encoder's FLOPs over the
    prompt's prefill tokens (vLLM V1 runs the encoder in the step that schedules the image's
    tokens). A text-only setting returns both unchanged. The prompt length must be a number
    (the text tokens): a distribution's text/image split is not modelled."""
    vl = plan_vision(dep.model, dep.settings)
    if vl is None:
        return dep, str(input_len)
    text = str(input_len).strip()
    if not text.isdigit():
        raise InputError(f"--input-len {input_len!r} with --images-per-request: give the text "
                         "tokens as a number (image tokens are added to it)")
    n_text = int(text)
    step = replace(dep.step, prefill_extra_flops_per_token=(
        vl.prefill_flops_per_token(n_text) / dep.settings.tp))
    return replace(dep, step=step), str(n_text + vl.tokens_per_request)
