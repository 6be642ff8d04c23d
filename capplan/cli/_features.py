"""CLI options of speculative decoding, LoRA and vision (docs/features.md); their names are the
EngineOptions fields, so they reach the one deployment resolver unchanged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
from click.core import ParameterSource

from capplan import limits as L
from capplan.cli._options import BoundedInt, FiniteFloat
from capplan.errors import InputError
from capplan.models.lora import POPULARITIES
from capplan.models.speculative import WORKLOAD_KINDS


def feature_options(f: Callable) -> Callable:
    opts = [
        click.option("--speculative", default=None, metavar="METHOD",
                     help="Speculative decoding: eagle3, eagle, mtp, ngram or draft:MODEL."),
        click.option("--spec-tokens", type=BoundedInt(L.SPEC_TOKENS), default=None,
                     help="Draft tokens per step (vLLM num_speculative_tokens; 0 = off). "
                          "Default: the method's."),
        click.option("--spec-topk", type=BoundedInt(L.SPEC_TOPK), default=1, show_default=True,
                     help="Draft tree branching (SGLang --speculative-eagle-topk)."),
        click.option("--spec-draft-tokens", type=BoundedInt(L.SPEC_DRAFT_TOKENS), default=None,
                     help="Tokens verified per step (SGLang --speculative-num-draft-tokens). "
                          "Default: spec tokens + 1."),
        click.option("--acceptance-length", type=FiniteFloat(bound=L.ACCEPTANCE_LENGTH),
                     default=None,
                     help="Measured mean tokens per step (1 + accepted / drafts); default: "
                          "the published figure for the method and --spec-workload."),
        click.option("--spec-workload", type=click.Choice(WORKLOAD_KINDS), default="chat",
                     show_default=True, help="Workload kind for the default acceptance."),
        click.option("--max-loras", type=BoundedInt(L.MAX_LORAS), default=0, show_default=True,
                     help="LoRA adapter slots on the GPU (vLLM --max-loras; 0 = no LoRA)."),
        click.option("--max-lora-rank", type=BoundedInt(L.LORA_RANK), default=16,
                     show_default=True, help="Largest adapter rank (vLLM --max-lora-rank)."),
        click.option("--lora-adapters", type=BoundedInt(L.LORA_ADAPTERS), default=0,
                     help="Distinct adapters in the traffic (default: --max-loras)."),
        click.option("--lora-popularity", type=click.Choice(POPULARITIES), default="uniform",
                     show_default=True, help="How requests pick their adapter."),
        click.option("--images-per-request", type=BoundedInt(L.IMAGES), default=0,
                     show_default=True, help="Images in each prompt (vision models)."),
        click.option("--image-width", type=BoundedInt(L.IMAGE_PIXELS), default=1024,
                     show_default=True, help="Image width in pixels."),
        click.option("--image-height", type=BoundedInt(L.IMAGE_PIXELS), default=1024,
                     show_default=True, help="Image height in pixels."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


class CountList(click.ParamType):
    """'0,2,3': integers in [0, hi] (0 allowed: speculation or LoRA off)."""

    name = "list"

    def __init__(self, hi: int):
        self.hi = hi

    def convert(self, value: Any, param: Any, ctx: Any) -> list[int]:
        if isinstance(value, list):
            return value
        try:
            out = [int(p) for p in str(value).split(",")]
        except ValueError:
            self.fail(f"{str(value)[:40]!r} is not a list of integers like 0,2,3", param, ctx)
        if not out or any(not 0 <= x <= self.hi for x in out) or len(out) > 64:
            self.fail(f"{str(value)[:40]!r}: 1-64 integers in [0, {self.hi}]", param, ctx)
        return out


def recommend_feature_options(f: Callable) -> Callable:
    """recommend's feature options: draft lengths and slot counts are searched."""
    opts = [
        click.option("--speculative", default=None, metavar="METHOD",
                     help="Consider speculative decoding (eagle3, eagle, mtp, ngram, "
                          "draft:MODEL): the draft length (0 = off) is searched per candidate."),
        click.option("--spec-tokens", type=CountList(16), default=None,
                     help="Draft lengths to search (default 0..4; 0 = off)."),
        click.option("--acceptance-length", type=click.FloatRange(min=1.0), default=None,
                     help="Measured tokens per step (one --spec-tokens value)."),
        click.option("--spec-workload", type=click.Choice(WORKLOAD_KINDS), default="chat",
                     show_default=True, help="Workload kind for the default acceptance."),
        click.option("--max-loras", type=CountList(1024), default=None,
                     help="LoRA slot counts to search (default: searched up to --adapters)."),
        click.option("--max-lora-rank", type=click.Choice(
            ["1", "8", "16", "32", "64", "128", "256", "320", "512"]), default="16",
            show_default=True, help="Largest adapter rank."),
        click.option("--adapters", type=click.IntRange(min=0), default=0,
                     help="Distinct LoRA adapters the traffic uses."),
        click.option("--popularity", type=click.Choice(POPULARITIES), default="uniform",
                     show_default=True, help="How requests pick their adapter."),
        click.option("--images-per-request", type=click.IntRange(0, 64), default=0,
                     help="Images in each prompt (vision models; --input-len is the text)."),
        click.option("--image-width", type=click.IntRange(1, 16384), default=1024,
                     show_default=True, help="Image width in pixels."),
        click.option("--image-height", type=click.IntRange(1, 16384), default=1024,
                     show_default=True, help="Image height in pixels."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def refuse_orphan_features(ctx: click.Context, kw: dict) -> None:
    """InputError for a recommend feature option that would be silently ignored: speculation
    settings without --speculative, adapter settings without LoRA, or a slot count of 0 for
    traffic that uses adapters."""
    def given(name: str) -> bool:
        return ctx.get_parameter_source(name) is not ParameterSource.DEFAULT

    def flag(name: str) -> str:
        return "--" + name.replace("_", "-")

    if not kw.get("speculative"):
        spec = [flag(n) for n in ("spec_tokens", "acceptance_length", "spec_workload")
                if given(n)]
        if spec:
            raise InputError(f"{', '.join(spec)} without --speculative METHOD: speculative "
                             "decoding is off, so they would be ignored; add --speculative")
    slots, adapters = kw.get("max_loras") or [], int(kw.get("adapters") or 0)
    if not adapters and not any(slots):
        lora = [flag(n) for n in ("max_lora_rank", "popularity") if given(n)]
        if lora:
            raise InputError(f"{', '.join(lora)} without --adapters N (or --max-loras): LoRA "
                             "is off, so they would be ignored; add --adapters")
    if adapters and 0 in slots:
        raise InputError(f"--max-loras {','.join(map(str, slots))} with --adapters {adapters}: "
                         "0 slots runs without LoRA while the traffic uses adapters; give "
                         "slot counts of 1 or more")


def pop_plan_features(kw: dict) -> tuple[dict, dict]:
    """(engine section, lane keys) of a plan from recommend's feature options (popped)."""
    engine = {"speculative": kw.pop("speculative", None),
              "spec_tokens": kw.pop("spec_tokens", None),
              "acceptance_length": kw.pop("acceptance_length", None),
              "acceptance_kind": kw.pop("spec_workload", "chat"),
              "max_loras": kw.pop("max_loras", None),
              "max_lora_rank": int(kw.pop("max_lora_rank", 16))}
    lane = {"adapters": kw.pop("adapters", 0), "popularity": kw.pop("popularity", "uniform"),
            "images_per_request": kw.pop("images_per_request", 0),
            "image_width": kw.pop("image_width", 1024),
            "image_height": kw.pop("image_height", 1024)}
    return engine, lane


def echo_features(dep: Any, fmt: str) -> None:
    """One stderr line naming the features in effect (table output only)."""
    if fmt != "table":
        return
    f = dep.features_summary()
    parts = []
    if f.get("speculative"):
        src = str(f["spec_acceptance_source"]).split(", ", 1)[-1]
        origin = ("given" if src.startswith("given") else "measured" if
                  src.startswith("measured") else "published default, docs/features.md")
        parts.append(f"speculative {f['speculative']} K={f['spec_tokens']}, acceptance length "
                     f"{f['spec_acceptance_length']:.2f} ({origin}); step times are per "
                     "emitted token")
    if f.get("max_loras"):
        parts.append(f"LoRA {f['max_loras']} slots of rank {f['max_lora_rank']}")
    if f.get("image_tokens_per_image"):
        parts.append(f"{f['images_per_request']} image(s) of {f['image_width']}x"
                     f"{f['image_height']} px per request, {f['image_tokens_per_image']} tokens "
                     "each")
    if parts:
        click.echo("features: " + "; ".join(parts), err=True)
