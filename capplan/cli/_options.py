"""Options shared by several commands, and the ParamTypes that reject bad values (exit 2)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import click

from capplan import limits
from capplan.cli._render import FORMATS
from capplan.errors import InputError
from capplan.limits import Bound
from capplan.models.engine import (
    ENGINES,
    KV_DTYPES,
    PROFILE_OPTIONS,
    WEIGHT_DTYPES,
    engine_profile,
)
from capplan.units import parse_seconds


class EngineSpec(click.ParamType):
    """An engine, optionally a release and profile options: vllm, vllm@0.11,
    sglang@0.5+mixed-chunk (capplan.models.engine.engine_profile); the canonical name@version
    spec of the profile it names."""

    name = "ENGINE[@VERSION][+OPTION]"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        try:
            return engine_profile(str(value)).spec
        except InputError as e:
            self.fail(str(e), param, ctx)


ENGINE = EngineSpec()
ENGINE_HELP = ("Serving engine and release whose memory accounting, scheduler, host costs and "
               "defaults apply: " + ", ".join(ENGINES) + ", optionally @VERSION (vllm@0.11; "
               "default the newest) and +OPTION (" + ", ".join(f"+{o}" for o in PROFILE_OPTIONS)
               + ", those the release has; docs/engines.md).")


class FiniteFloat(click.ParamType):
    """A finite float within (lo, hi] or [lo, hi]; NaN and inf are rejected by name. With a
    `bound` (capplan.limits), the bound's interval and reason apply."""

    name = "number"

    def __init__(self, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
                 bound: Bound | None = None):
        self.lo, self.hi, self.lo_open, self.bound = lo, hi, lo_open, bound

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if isinstance(value, float | int) and not isinstance(value, bool) and self.bound is None:
            x = float(value)
        else:
            try:
                x = float(str(value).strip())
            except (ValueError, OverflowError):
                self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(x):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if self.bound is not None:
            try:
                return float(self.bound.check(value, ""))
            except InputError as e:
                self.fail(str(e), param, ctx)
        if self.lo is not None and (x < self.lo or (self.lo_open and x == self.lo)):
            bound = f"> {self.lo:g}" if self.lo_open else f">= {self.lo:g}"
            self.fail(f"{value} must be {bound}", param, ctx)
        if self.hi is not None and x > self.hi:
            self.fail(f"{value} must be <= {self.hi:g}", param, ctx)
        return x


class BoundedInt(click.ParamType):
    """A whole number inside a capplan.limits Bound (e.g. a seed >= 0, a TP size <= 128)."""

    name = "integer"

    def __init__(self, bound: Bound):
        self.bound = bound

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            x: Any = value
        else:
            text = str(value).strip()
            try:
                x = int(text)
            except ValueError:
                self.fail(f"{value!r} is not a whole number", param, ctx)
        try:
            return int(self.bound.check(x, ""))
        except InputError as e:
            self.fail(str(e), param, ctx)


def _range_size(a: int, b: int, step: int) -> int:
    return max(0, (b - a) // step + 1)


class IntList(click.ParamType):
    """'1,8,32' or a range '1-64' (powers of two), '8:64:8' (start:stop:step); at most
    MAX_LIST_ITEMS values, each inside `bound` (sized before the list is built)."""

    name = "list"

    def __init__(self, bound: Bound = limits.ENGINE_COUNT):
        self.bound = bound

    def _expand(self, part: str, budget: int) -> list[int]:
        if ":" in part:
            a, b, *step = (int(p) for p in part.split(":"))
            st = step[0] if step else 1
            if st < 1:
                raise ValueError("step")
            if _range_size(a, b, st) > budget:
                raise OverflowError
            return list(range(a, b + 1, st))
        if "-" in part.lstrip("-") and not part.startswith("-"):
            a, b = (int(p) for p in part.split("-"))
            out, x = [], a
            while x <= b and x >= 1:
                out.append(x)
                x *= 2
            return out
        return [int(part)]

    def convert(self, value: Any, param: Any, ctx: Any) -> list[int]:
        if isinstance(value, list):
            return value
        out: list[int] = []
        try:
            for part in str(value).split(","):
                out += self._expand(part.strip(), limits.MAX_LIST_ITEMS - len(out))
                if len(out) > limits.MAX_LIST_ITEMS:
                    raise OverflowError
        except OverflowError:
            self.fail(f"{str(value)[:40]!r} expands to more than {limits.MAX_LIST_ITEMS:,} "
                      "values", param, ctx)
        except ValueError:
            self.fail(f"{str(value)[:40]!r} is not a list of integers like 1,8,32 or 1-256",
                      param, ctx)
        try:
            return limits.check_int_list(out, self.bound)  # the API checks the same way
        except InputError as e:
            self.fail(str(e), param, ctx)


POSITIVE = FiniteFloat(0, lo_open=True)
NON_NEGATIVE = FiniteFloat(0)
FRACTION = FiniteFloat(bound=limits.FRACTION)
POS_INT = BoundedInt(limits.ENGINE_COUNT)
RATE = FiniteFloat(bound=limits.RATE_PER_S)
"""--rate: requests per second within limits.RATE_PER_S."""
class Duration(FiniteFloat):
    """A duration: seconds, or a number with a unit ('50ms', '1.5s', '2m'), read by the parser
    plan files use (capplan.units.parse_seconds), then bounded as a number of seconds."""

    name = "duration"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if isinstance(value, str) and value.strip().lower() not in ("nan", "inf", "-inf",
                                                                     "+inf", "infinity"):
            try:
                value = parse_seconds(value)
            except ValueError:
                self.fail(f"{value!r} is not a duration (seconds, or with a unit: 50ms, 1.5s)",
                          param, ctx)
        return super().convert(value, param, ctx)


SECONDS = Duration(bound=limits.DURATION_S)
"""SLOs and timeouts in seconds (0, 1 day], or with a unit ('50ms')."""
SECONDS_OR_0 = Duration(bound=limits.DURATION_OR_0_S)
BURSTINESS = FiniteFloat(bound=limits.BURSTINESS)
class Headroom(FiniteFloat):
    """A headroom fraction, or "auto": from the engine's error band (capplan.plan.bands)."""

    name = "number|auto"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        return super().convert(value, param, ctx)


HEADROOM = Headroom(bound=limits.HEADROOM)
CONCURRENCY = BoundedInt(limits.CONCURRENCY)
REQUESTS = BoundedInt(limits.REQUESTS)
SEED = BoundedInt(limits.SEED)


def format_option(f: Callable) -> Callable:
    return click.option("--format", "fmt", type=click.Choice(FORMATS), default="table",
                        show_default=True, help="Output format (JSON in SI units).")(f)


def catalog_option(f: Callable) -> Callable:
    return click.option("--catalog-dir", multiple=True, type=click.Path(file_okay=False),
                        help="Extra catalog folder (gpus/, models/, calibrations/) on top.")(f)


def model_gpu_options(f: Callable) -> Callable:
    f = click.option("--gpu", required=True, help="GPU: catalog key, alias or NVML name.")(f)
    f = click.option("--model", required=True,
                     help="Model: catalog key or Hugging Face id (suffixes like -FP8 allowed).")(f)
    return f


def engine_options(f: Callable) -> Callable:
    """Engine options with vLLM's flag names; unset values take the engine profile's default
    for the GPU (capplan.plan.deployment.resolve_settings)."""
    opts = [
        click.option("--engine", type=ENGINE, default="vllm", show_default=True,
                     help=ENGINE_HELP),
        click.option("--tp", type=POS_INT, default=1, show_default=True,
                     help="Tensor-parallel size as the engine writes it: vLLM's per DP rank; "
                          "SGLang's and TensorRT-LLM's the world that --attention-dp splits "
                          "(SGLang --tp 8 --dp 8 is 8 GPUs)."),
        click.option("--pp", type=POS_INT, default=1, show_default=True,
                     help="Pipeline-parallel size."),
        click.option("--attention-dp", type=POS_INT, default=1, show_default=True,
                     help="Attention data-parallel ranks per replica, each with its own batch "
                          "and KV pool (vLLM --data-parallel-size: tp x dp GPUs; SGLang "
                          "--enable-dp-attention --dp and TensorRT-LLM enable_attention_dp: "
                          "ranks inside --tp)."),
        click.option("--expert-parallel", type=POS_INT, default=1, show_default=True,
                     help="Expert-parallel size of the MoE layers over the tp x attention-dp "
                          "GPUs (must divide them and the experts; MoE models only)."),
        click.option("--weight-dtype", type=click.Choice(WEIGHT_DTYPES), default="auto",
                     show_default=True, help="auto: the checkpoint's own (or the -FP8... suffix)."),
        click.option("--kv-dtype", type=click.Choice(KV_DTYPES), default="auto",
                     show_default=True, help="KV-cache dtype."),
        click.option("--max-model-len", type=POS_INT, default=None,
                     help="Context limit (default: the model's max_position_embeddings)."),
        click.option("--gpu-memory-utilization", type=FRACTION, default=None,
                     help="The engine's memory fraction, in its own meaning (vLLM "
                          "--gpu-memory-utilization, SGLang --mem-fraction-static, TensorRT-LLM "
                          "free_gpu_memory_fraction). Default: the engine's (vLLM 0.9)."),
        click.option("--block-size", type=click.Choice(["1", "8", "16", "32", "64", "128"]),
                     default=None, callback=lambda _ctx, _param, v: None if v is None else int(v),
                     help="KV block (page) size in tokens. Default: the engine's (vLLM 16, "
                          "SGLang 1, TensorRT-LLM 32)."),
        click.option("--max-num-seqs", type=POS_INT, default=None,
                     help="Running-sequence cap. Default: the engine's for the GPU (vLLM 1024 "
                          "on >=70 GiB non-A100, else 256)."),
        click.option("--max-num-batched-tokens", type=POS_INT, default=None,
                     help="Prefill chunk / token budget. Default: the engine's for the GPU "
                          "(vLLM 8192 on >=70 GiB non-A100, else 2048)."),
        click.option("--calibration", type=click.Path(dir_okay=False), default=None,
                     help="Calibration YAML (default: a measured one for the GPU, else "
                          "datasheet defaults)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def options_from(kw: dict[str, Any]) -> Any:
    """EngineOptions from parsed engine options (pops them from kw)."""
    from dataclasses import fields

    from capplan.plan.deployment import EngineOptions

    return EngineOptions(**{f.name: kw.pop(f.name) for f in fields(EngineOptions)
                            if f.name in kw})


def deployment_from_options(catalog_dir: tuple[str, ...], model: str, gpu: str,
                            kw: dict[str, Any], require_fit: bool = True,
                            memory_only: bool = False) -> Any:
    """The Deployment a model/GPU command works on, through the one resolver
    (capplan.plan.deployment.resolve_deployment); its warnings go to stderr. memory_only: the
    memory command's (no speculative acceptance length demanded)."""
    from dataclasses import asdict

    from capplan.api import deployment

    cal_path = kw.pop("calibration", None)
    dep = deployment(model, gpu, calibration=cal_path, catalog_dirs=catalog_dir,
                     require_fit=require_fit, engine_notation=True, memory_only=memory_only,
                     **asdict(options_from(kw)))
    for w in dep.warnings():
        click.echo(f"warning: {w}", err=True)
    return dep
