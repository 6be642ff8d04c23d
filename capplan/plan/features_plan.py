"""Speculative decoding, LoRA and images in plans: what recommend searches and reports.

- `engine.speculative` turns the search over draft lengths on: `engine.spec_tokens` (default
  0..4, 0 = off) is a search dimension like max_num_seqs, so each candidate GPU/TP gets the
  draft length (or none) that serves the traffic cheapest; the recommendation reports the
  batch at which speculation stops paying on its step model (`speculation`).
- `engine.max_loras` (a value or a list to search) and the lanes' `adapters` / `popularity`
  size the adapter slots and the per-step adapter reads (capplan/models/lora.py).
- Lanes' `images_per_request` and image size: each lane's prompt grows by its images' tokens
  (`image_lanes`, before the traffic is pooled), the candidates' step models charge the
  encoder's FLOPs over prefill tokens (rate-weighted over the lanes), and the largest lane's
  count and size set the memory and the launch line's --limit-mm-per-prompt.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from capplan.errors import InputError
from capplan.models import vision
from capplan.models.speculative import DEFAULT_SPEC_TOKENS as DEFAULT_DRAFT_LENGTH
from capplan.models.speculative import parse_method

DEFAULT_SPEC_TOKENS = (0, 1, 2, 3, 4)
"""Draft lengths recommend tries when the plan names a method but no spec_tokens (vLLM issue
20780: EAGLE-3 on Llama-3.1-8B is fastest at K = 4, EAGLE-1 at K = 3)."""
DEFAULT_MAX_LORAS = (1, 2, 4, 8, 16)
"""Slot counts tried (up to the lanes' adapter count) when lanes use adapters."""


def _as_tuple(v: Any) -> tuple[Any, ...]:
    return tuple(v) if isinstance(v, list | tuple) else (v,)


def _spec_space(eng: Any, fixed: dict[str, Any]) -> tuple[Any, ...]:
    """Draft lengths to search (None: speculation off); its fixed fields into `fixed`."""
    if not eng.speculative:
        return (None,)
    spec_tokens = _as_tuple(eng.spec_tokens) if eng.spec_tokens is not None else \
        DEFAULT_SPEC_TOKENS
    if eng.acceptance_length is not None and len([k for k in spec_tokens if k]) > 1:
        raise InputError("engine.acceptance_length holds for one draft length: give one "
                         "engine.spec_tokens value with it")
    fixed.update(speculative=eng.speculative, acceptance_length=eng.acceptance_length,
                 spec_workload=eng.acceptance_kind, spec_topk=eng.spec_topk,
                 spec_draft_tokens=eng.spec_draft_tokens)
    return spec_tokens


def _lora_space(eng: Any, lanes: list[Any], fixed: dict[str, Any]) -> tuple[int, ...]:
    """Adapter slot counts to search (0: LoRA off); its fixed fields into `fixed`."""
    adapters = sum(ln.adapters for ln in lanes)
    max_loras: tuple[int, ...] = (0,)
    if eng.max_loras is not None:
        max_loras = _as_tuple(eng.max_loras)
    elif adapters:
        max_loras = tuple(n for n in DEFAULT_MAX_LORAS if n <= adapters) or (1,)
    if adapters or eng.max_loras:
        fixed.update(max_lora_rank=eng.max_lora_rank, lora_adapters=adapters,
                     lora_popularity="zipf" if any(ln.popularity == "zipf" for ln in lanes)
                     else "uniform")
    return max_loras


def feature_space(plan: Any, lane_names: tuple[str, ...], model: Any) -> dict[str, Any]:
    """{"fixed": EngineOptions feature fields, "spec_tokens": tuple, "max_loras": tuple,
    "prefill_extra_flops_per_token": encoder FLOPs per prefill token on one GPU at TP 1}."""
    eng = plan.engine
    lanes = [ln for ln in plan.workloads if ln.name in lane_names] or list(plan.workloads)
    fixed: dict[str, Any] = {}
    spec_tokens = _spec_space(eng, fixed)
    max_loras = _lora_space(eng, lanes, fixed)
    images = max((ln.images_per_request for ln in lanes), default=0)
    if images:
        big = max(lanes, key=lambda ln: ln.image_width * ln.image_height)
        fixed.update(images_per_request=images, image_width=big.image_width,
                     image_height=big.image_height)
    return {"fixed": fixed, "spec_tokens": spec_tokens, "max_loras": max_loras,
            "prefill_extra_flops_per_token": encoder_flops_per_prompt_token(model, lanes)}


def _lane_images(model: Any, lane: Any) -> tuple[int, float]:
    """(image tokens, encoder FLOPs) of one request of a lane."""
    n = lane.images_per_request
    if not n:
        return 0, 0.0
    if model.vision is None:
        raise InputError(f"lane {lane.name!r}: workloads.images_per_request {n} but {model.key} "
                         "has no "
                         "vision encoder in the catalog")
    patches = vision.image_patches(lane.image_height, lane.image_width, model.vision)
    return (n * (patches // model.vision.spatial_merge_size ** 2),
            n * vision.encoder_flops(patches, model.vision))


def image_lanes(model: Any, lanes: list[Any]) -> list[Any]:
    """Lanes whose prompts carry their images' tokens (input_len must be a number: the text)."""
    out = []
    for ln in lanes:
        tokens, _ = _lane_images(model, ln)
        if tokens:
            text = str(ln.input_len).strip()
            if not text.isdigit():
                raise InputError(f"lane {ln.name!r}: workloads.input_len {ln.input_len!r} with "
                                 "workloads.images_per_request: give the text tokens as a "
                                 "number")
            ln = ln.model_copy(update={"input_len": str(int(text) + tokens)})
        out.append(ln)
    return out


def encoder_flops_per_prompt_token(model: Any, lanes: list[Any]) -> float:
    """Encoder FLOPs per prefill token over lanes already carrying image tokens (image_lanes),
    weighted by rate: sum(rate x FLOPs per request) / sum(rate x prompt tokens)."""
    flops = tokens = 0.0
    for ln in lanes:
        _, f = _lane_images(model, ln)
        text = str(ln.input_len).strip()
        flops += ln.rate_per_s * f
        tokens += ln.rate_per_s * (float(text) if text.replace(".", "", 1).isdigit() else 0.0)
    return flops / tokens if flops and tokens else 0.0


def features_dict(s: Any) -> dict[str, Any]:
    """The feature settings of EngineSettings `s` (for JSON and launch lines)."""
    out: dict[str, Any] = {}
    if s.speculative and s.spec_tokens != 0:
        k = s.spec_tokens if s.spec_tokens is not None else \
            DEFAULT_DRAFT_LENGTH[parse_method(s.speculative)[0]]
        out.update(speculative=s.speculative, spec_tokens=k, spec_topk=s.spec_topk,
                   spec_draft_tokens=s.spec_draft_tokens)
        draft = getattr(s, "draft_model", None)
        if draft is not None:  # draft:MODEL's checkpoint, which the launch lines load
            out["draft_hf_id"] = draft.hf_id
    if s.max_loras:
        out.update(max_loras=s.max_loras, max_lora_rank=s.max_lora_rank,
                   lora_adapters=s.lora_adapters, lora_popularity=s.lora_popularity)
    if s.images_per_request:
        out.update(images_per_request=s.images_per_request, image_width=s.image_width,
                   image_height=s.image_height)
    return out


def speculation_note(step: Any, plain: Any, max_num_seqs: int, context: float
                     ) -> dict[str, Any] | None:
    """Decode speed-up of a speculative step model over the plain one by batch, and the first
    batch (powers of two up to max(max_num_seqs, 1024)) at which it falls to 1 or below (None:
    never; `stops_paying_checked_up_to_batch` is the largest batch checked)."""
    if float(np.max(step.spec_accept_len)) == 1.0:
        return None
    batches = 2.0 ** np.arange(0, int(np.log2(max(max_num_seqs, 1024))) + 1)
    ratio = (plain.decode_step(batches, context)["step_s"]
             / step.decode_step(batches, context)["step_s"])
    stops = next((int(b) for b, r in zip(batches, ratio, strict=True) if r <= 1.0), None)
    return {"speedup_at_batch_1": float(ratio[0]),
            "speedup_by_batch": {int(b): round(float(r), 3) for b, r in zip(batches, ratio,
                                                                             strict=True)},
            "stops_paying_at_batch": stops,
            "stops_paying_checked_up_to_batch": int(batches[-1]),
            "acceptance": step.spec_source}

