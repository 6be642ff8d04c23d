"""CLI options of speculative decoding, LoRA and vision (docs/features.md); their names are the
EngineOptions fields, so they reach the one deployment resolver unchanged."""

from __future__ import annotations

from collections.abc import Callable

import click

from capplan.models.lora import POPULARITIES
from capplan.models.speculative import WORKLOAD_KINDS


def feature_options(f: Callable) -> Callable:
    opts = [
        click.option("--speculative", default=None, metavar="METHOD",
                     help="Speculative decoding: eagle3, eagle, mtp, ngram or draft:MODEL."),
        click.option("--spec-tokens", type=click.IntRange(min=0), default=None,
                     help="Draft tokens per step (vLLM num_speculative_tokens; 0 = off). "
                          "Default: the method's."),
        click.option("--spec-topk", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Draft tree branching (SGLang --speculative-eagle-topk)."),
        click.option("--spec-draft-tokens", type=click.IntRange(min=2), default=None,
                     help="Tokens verified per step (SGLang --speculative-num-draft-tokens). "
                          "Default: spec tokens + 1."),
        click.option("--acceptance-length", type=click.FloatRange(min=1.0), default=None,
                     help="Measured mean tokens per step (1 + accepted / drafts); default: "
                          "the published figure for the method and --spec-workload."),
        click.option("--spec-workload", type=click.Choice(WORKLOAD_KINDS), default="chat",
                     show_default=True, help="Workload kind for the default acceptance."),
        click.option("--max-loras", type=click.IntRange(min=0), default=0, show_default=True,
                     help="LoRA adapter slots on the GPU (vLLM --max-loras; 0 = no LoRA)."),
        click.option("--max-lora-rank", type=click.IntRange(min=1), default=16,
                     show_default=True, help="Largest adapter rank (vLLM --max-lora-rank)."),
        click.option("--lora-adapters", type=click.IntRange(min=0), default=0,
                     help="Distinct adapters in the traffic (default: --max-loras)."),
        click.option("--lora-popularity", type=click.Choice(POPULARITIES), default="uniform",
                     show_default=True, help="How requests pick their adapter."),
        click.option("--images-per-request", type=click.IntRange(min=0), default=0,
                     show_default=True, help="Images in each prompt (vision models)."),
        click.option("--image-width", type=click.IntRange(min=1), default=1024,
                     show_default=True, help="Image width in pixels."),
        click.option("--image-height", type=click.IntRange(min=1), default=1024,
                     show_default=True, help="Image height in pixels."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f
