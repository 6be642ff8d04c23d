"""Plan files (YAML): schema, loading with file:line errors, and the JSON Schema for editors."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from capplan.errors import InputError, validation_error_line
from capplan.units import parse_seconds

_STRICT = ConfigDict(extra="forbid", frozen=True)


def _seconds(v: Any) -> float | None:
    if v is None:
        return None
    try:
        x = parse_seconds(v)
    except ValueError as e:
        raise ValueError(str(e)) from e
    if not math.isfinite(x) or x <= 0:
        raise ValueError(f"{v!r} must be a positive duration (e.g. 1.0, '800ms')")
    return x


class Slo(BaseModel):
    """Latency objectives of a lane; a number is seconds, a string may carry a unit ('60ms')."""

    model_config = _STRICT
    ttft_p99_s: float | None = None
    """p99 time to first token."""
    tbt_p99_s: float | None = None
    """p99 time between tokens (every inter-token gap, as vllm bench serve's ITL)."""
    e2e_p99_s: float | None = None
    """p99 end-to-end latency."""

    @field_validator("ttft_p99_s", "tbt_p99_s", "e2e_p99_s", mode="before")
    @classmethod
    def _parse(cls, v: Any) -> float | None:
        return _seconds(v)


class Lane(BaseModel):
    """One class of traffic with its own rate, lengths, SLOs and priority."""

    model_config = _STRICT
    name: str = "default"
    rate_per_s: float = Field(gt=0, allow_inf_nan=False)
    """Mean arrival rate, requests per second (for the whole fleet)."""
    arrival: Literal["poisson", "gamma"] = "poisson"
    burstiness: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    """Gamma shape (1 = Poisson; < 1 burstier), as vllm bench serve --burstiness."""
    input_len: str | int = 512
    """Prompt tokens: a number or a distribution ('lognormal:mean=800,p99=4000')."""
    output_len: str | int = 256
    slo: Slo = Slo()
    priority: int = 0
    """Lower is served first when lanes share a pool (vLLM priority scheduling)."""


class Candidates(BaseModel):
    model_config = _STRICT
    gpus: list[str] | None = None
    """GPU types to consider (default: every catalog GPU that can hold the model)."""
    tp: list[int] | None = None
    """Tensor-parallel sizes (default: 1, 2, 4, 8 where they divide the heads and fit)."""
    weight_dtypes: list[Literal["auto", "fp32", "bf16", "fp16", "fp8", "int8", "int4",
                                "fp4"]] = ["auto"]
    kv_dtypes: list[Literal["auto", "bf16", "fp16", "fp8"]] = ["auto"]
    prices: dict[str, float] = {}
    """Your price per GPU-hour (USD) by GPU name, over the catalog's indicative prices; GPUs
    without any price rank after priced ones."""

    @field_validator("prices")
    @classmethod
    def _positive_prices(cls, v: dict[str, float]) -> dict[str, float]:
        for k, x in v.items():
            if not (x > 0 and x < float("inf")):
                raise ValueError(f"price of {k!r} must be a positive number")
        return v


class EngineSpec(BaseModel):
    model_config = _STRICT
    name: Literal["vllm", "sglang", "trtllm"] = "vllm"
    """The serving engine: its memory accounting, scheduler and defaults (docs/engines.md)."""
    max_num_seqs: list[int] | int | None = None
    """Values to search (default 64..1024)."""
    max_num_batched_tokens: list[int] | int | None = None
    """Prefill chunk sizes to search (default 512..16384)."""
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    """The engine's memory fraction in its own meaning; default: the engine's for the GPU."""
    max_model_len: int | None = Field(default=None, ge=1)
    block_size: int | None = Field(default=None, ge=1)
    """KV block (page) size; default: the engine's."""


class VerifySpec(BaseModel):
    model_config = _STRICT
    top: int = Field(default=5, ge=0)
    """How many of the best configurations the simulator checks."""
    requests: int = Field(default=1500, ge=50)


class PlanFile(BaseModel):
    """A capacity plan: model, candidates, engine settings, lanes, objective, exports."""

    model_config = _STRICT
    version: Literal[1] = 1
    model: str
    candidates: Candidates = Candidates()
    engine: EngineSpec = EngineSpec()
    workloads: list[Lane] = Field(min_length=1)
    pools: Literal["shared", "separate", "both"] = "both"
    """Several lanes: one shared pool with priorities, a pool per lane, or plan both."""
    objective: Literal["min_cost", "min_gpus", "max_goodput_per_dollar"] = "min_cost"
    headroom: float = Field(default=0.2, ge=0, le=10, allow_inf_nan=False)
    """Extra capacity for bursts: replicas cover rate * (1 + headroom)."""
    verify: VerifySpec = VerifySpec()
    calibration: str | None = None
    """Calibration YAML for every candidate GPU (relative to the plan file); default: a
    measured one for each GPU, else datasheet defaults. A file for another device is refused."""
    allow_near_floor: bool = False
    """Recommend fleets whose SLOs keep each replica under 10% of the load it sustains (SLOs
    just above the unloaded latency floor); by default they are left out and the floor and the
    trade-off are reported instead."""
    export: list[str] = []
    """Files to write (.csv, .json, .md, .xlsx), relative to the plan file."""

    @field_validator("workloads")
    @classmethod
    def _unique_lane_names(cls, v: list[Lane]) -> list[Lane]:
        names = [lane.name for lane in v]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise ValueError(f"two lanes are named {dup!r}; give each lane its own name")
        return v


def _all_keys(model: type[BaseModel]) -> list[str]:
    keys: list[str] = []
    for name, f in model.model_fields.items():
        keys.append(name)
        ann = f.annotation
        for sub in getattr(ann, "__args__", ()) or (ann,):
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                keys += _all_keys(sub)
    return keys


def _line_of(text: str, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the YAML node at a pydantic error location (deepest existing key)."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if node is None:
            break
        if isinstance(node, yaml.MappingNode):
            nxt = None
            for k, v in node.value:
                if k.value == str(part):
                    line, nxt = k.start_mark.line + 1, v
                    break
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(
                node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def load_plan(path: str | Path) -> PlanFile:
    """Read and validate a plan file; errors name the file, line and key."""
    from capplan.catalog.loader import read_yaml

    p = Path(path)
    data = read_yaml(p)
    if not isinstance(data, dict):
        raise InputError(f"{p}:1: a plan file is a YAML mapping (model:, workloads:, ...)")
    text = p.read_text(encoding="utf-8")
    try:
        return PlanFile.model_validate(data)
    except ValidationError as e:
        loc, msg = validation_error_line(e, _all_keys(PlanFile))
        line = _line_of(text, loc)
        raise InputError(f"{p}:{line}: {msg}" if line else f"{p}: {msg}") from e


def plan_json_schema() -> dict[str, Any]:
    return PlanFile.model_json_schema()
