"""Plan files (YAML): schema, loading with file:line errors, and the JSON Schema for editors."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from capplan import limits as L
from capplan.errors import InputError, plain_errors, validation_error_line
from capplan.models.engine import ENGINE_PATTERN
from capplan.units import CLOCK_PATTERN, ci, parse_seconds

_STRICT = ConfigDict(extra="forbid", frozen=True)
_COUNT = L.ENGINE_COUNT.field()
_Whole = BeforeValidator(L.whole)
"""A whole float (2.0, an integer to JSON Schema) as the integer, before a strict int check."""
_CATALOG_GPUS_ESTIMATE = 25
"""GPUs a plan without `candidates.gpus` may search (the catalog holds 23)."""


def _seconds(v: Any) -> float | None:
    if v is None:
        return None
    try:
        x = parse_seconds(v)
    except ValueError as e:
        raise ValueError(str(e)) from e
    if not math.isfinite(x) or x <= 0:
        raise ValueError(f"{v!r} must be a positive duration (e.g. 1.0, '800ms')")
    x = float(L.DURATION_S.check(x, ""))
    if isinstance(v, str) and not re.match(DURATION_PATTERN, v):
        # the schema's own pattern: what an editor accepts, the planner accepts
        raise ValueError(f"{v!r}: write a duration as a number with a unit ('90s', '1.5h'), "
                         "an exponent only below one ('5e-2s')")
    return x


def _int_below(n: int) -> str:
    """A regex of the digit strings (maybe empty) of the whole numbers below `n` >= 1."""
    d = str(n)
    alts = [f"[0-9]{{0,{len(d) - 1}}}"]
    for i, c in enumerate(d):
        if c != "0" and (i or c != "1"):
            low = f"[{'0' if i else '1'}-{int(c) - 1}]"
            alts.append(d[:i] + low + f"[0-9]{{{len(d) - i - 1}}}")
    return "(" + "|".join(alts) + ")"


def _at_most(n: int) -> str:
    """A regex of a decimal mantissa (no sign) of at most `n`, leading zeros allowed."""
    return rf"0*({_int_below(n)}(\.[0-9]*)?|{n}(\.0*)?)"


def _duration_pattern() -> str:
    from capplan.units import _TIME_UNITS

    units: dict[int, list[str]] = {}
    for unit, factor in _TIME_UNITS.items():
        units.setdefault(round(L.DURATION_S.hi / factor), []).append(ci(unit))
    units[round(L.DURATION_S.hi)].append("")  # a bare number is seconds
    forms = "|".join(rf"{_at_most(n)}([eE](-[0-9]+|\+?0+))?\s*({'|'.join(us)})"
                     for n, us in sorted(units.items()))
    # a nonzero digit before any exponent ('0ms' is no duration)
    return rf"^\s*\+?(?=[0-9.]*[1-9])({forms})\s*$"


DURATION_PATTERN = _duration_pattern()
"""A duration string as the planner takes it: a positive number of at most a day
(L.DURATION_S) in its unit, any case; an exponent only to scale down (bounded by its
mantissa). Both the JSON Schema and `_seconds` check it."""
_Duration = Annotated[float | None, WithJsonSchema({
    "anyOf": [{"type": "number", "exclusiveMinimum": 0, "maximum": L.DURATION_S.hi},
              {"type": "string", "pattern": DURATION_PATTERN},
              {"type": "null"}],
    "description": "seconds: a number, or a string with a unit in any case ('60ms', '1.5s'); "
                   f"at most {L.DURATION_S.hi:g} s"})]
"""A duration as the file may write it: the JSON Schema says what the validator accepts
(capplan.units.parse_seconds), so an editor does not flag the demo's own '60ms'."""


def _length(v: Any) -> Any:
    """A token length: a whole number or a distribution string, checked by parse_length (the
    edge's bounds) so that a plan file fails where the CLI does; a whole float (500.0, an
    integer to JSON Schema) is the integer."""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int | str):
        raise ValueError(f"a length is a number of tokens or a distribution string, not a "
                         f"{type(v).__name__}")
    from capplan.sim.workload import parse_length

    parse_length(v)
    return v


_Length = Annotated[str | int, WithJsonSchema({
    "anyOf": [{"type": "integer", "minimum": L.TOKENS.lo, "maximum": L.TOKENS.hi},
              {"type": "string", "minLength": 1}],
    "description": "tokens: a number, or a distribution ('lognormal:mean=800,p99=4000')"})]
EXPORT_PATTERN = (r"^(?![/\\])(?!(.*[/\\])?\.\.([/\\]|$))(.*[/\\])?[^/\\]+\.("
                  + "|".join(ci(x.lstrip(".")) for x in (
                      ".csv", ".json", ".md", ".xlsx", ".k8s.yaml", ".llm-d.yaml", ".html"))
                  + ")$")
"""A plan file's export: a relative path (no `..`) whose file name has a stem before an export
suffix in any case
(capplan.export.EXPORT_SUFFIXES; plan.load.plan_output_path refuses the others)."""


class Slo(BaseModel):
    """Latency objectives of a lane; a number is seconds, a string may carry a unit ('60ms')."""

    model_config = _STRICT
    ttft_p99_s: _Duration = None
    """p99 time to first token."""
    tbt_p99_s: _Duration = None
    """p99 time between tokens (every inter-token gap, as vllm bench serve's ITL)."""
    e2e_p99_s: _Duration = None
    """p99 end-to-end latency."""
    tpot_p99_s: _Duration = None
    """p99 over requests of TPOT, a request's mean gap (E2E - TTFT) / (output tokens - 1), as
    vllm bench serve and AIConfigurator report it; at most TBT p99 (plan/slo.py)."""
    tpot_mean_s: _Duration = None
    """Mean TPOT over requests."""

    @field_validator("ttft_p99_s", "tbt_p99_s", "e2e_p99_s", "tpot_p99_s", "tpot_mean_s",
                     mode="before")
    @classmethod
    def _parse(cls, v: Any) -> float | None:
        return _seconds(v)


class Prefix(BaseModel):
    """How a lane's prompts share content, for automatic prefix caching (one form):
    a shared prefix (`shared_tokens` on a fraction `share` of requests), multi-turn sessions
    (`turns`, `think_s` apart; the lane's input_len is each turn's new message), or an
    explicit `hit_rate` (fraction of prompt tokens found cached). docs/prefix_caching.md."""

    model_config = _STRICT
    shared_tokens: L.TOKENS.field(integer=True) | None = None  # type: ignore[valid-type]
    """Tokens at the start of the prompt (part of input_len) shared by `share` of requests."""
    share: L.SHARE_FRAC.field() = 1.0  # type: ignore[valid-type]
    turns: L.TURNS.field() | None = None  # type: ignore[valid-type]
    think_s: L.THINK_S.field() = 0.0  # type: ignore[valid-type]
    hit_rate: L.HIT_RATE.field() | None = None  # type: ignore[valid-type]

    @model_validator(mode="after")
    def _one_form(self) -> Prefix:
        forms = [self.shared_tokens is not None, self.turns is not None,
                 self.hit_rate is not None]
        if sum(forms) != 1:
            raise ValueError("give one of shared_tokens, turns or hit_rate")
        # a field of another form would be ignored in silence: refused
        stray = [(k, form) for k, form in (("share", "shared_tokens"), ("think_s", "turns"))
                 if k in self.model_fields_set and getattr(self, form) is None]
        if stray:
            key, form = stray[0]
            raise ValueError(f"{key} applies with {form} only; drop it or use {form}")
        return self

    def spec(self) -> Any:
        from capplan.models.prefix import PrefixSpec

        return PrefixSpec(shared_tokens=self.shared_tokens or 0,
                          share_frac=self.share if self.shared_tokens else 0.0,
                          turns=self.turns or 1, think_s=self.think_s, hit_rate=self.hit_rate)


class CurvePoint(BaseModel):
    """One point of a daily rate curve (linear between points, wrapping at midnight)."""

    model_config = _STRICT
    at: Annotated[str, WithJsonSchema({"type": "string", "pattern": CLOCK_PATTERN})]
    """Time of day, 'HH:MM' (or 'HH:MM:SS'); a number (`at: 900`) is refused, not read as
    seconds after midnight."""
    rate_per_s: float = Field(ge=0, allow_inf_nan=False)

    @field_validator("at", mode="before")
    @classmethod
    def _time_of_day(cls, v: Any) -> Any:
        from capplan.plan.rate_curve import clock_text

        return clock_text(v)  # its InputError is a ValueError: pydantic names the field


class Lane(BaseModel):
    """One class of traffic with its own rate, lengths, SLOs and priority."""

    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra={
        "oneOf": [{"required": ["rate_per_s"]}, {"required": ["trace"]},
                  {"required": ["rate_curve"]}]})
    name: str = Field(default="default", json_schema_extra={"minLength": 1, "pattern": r"\S"})
    """The lane's name (not empty: outputs, pools and Kubernetes objects are named after it)."""
    rate_per_s: L.RATE_PER_S.field() | None = None  # type: ignore[valid-type]
    """Mean arrival rate, requests per second (for the whole fleet); or give `trace` or
    `rate_curve` for a day of traffic (docs/day-planning.md)."""
    trace: str | None = None
    """A trace file (any format `simulate --trace` reads), relative to the plan file: the plan
    becomes a day plan, replicas per window (docs/day-planning.md)."""
    rate_curve: str | list[CurvePoint] | None = None
    """A daily rate curve: a list of {at: 'HH:MM', rate_per_s} or a CSV (at,rate_per_s),
    with this lane's lengths: the plan becomes a day plan."""
    time_unit: Literal["auto", "s", "ms", "us"] = "auto"
    """A trace's numeric arrival times: seconds, ms or us (auto: as `simulate --time-unit`)."""
    arrival: Literal["poisson", "gamma"] = "poisson"
    burstiness: L.BURSTINESS.field() = 1.0  # type: ignore[valid-type]
    """Gamma shape (1 = Poisson; < 1 burstier), as vllm bench serve --burstiness."""
    input_len: _Length = 512
    """Prompt tokens: a number or a distribution ('lognormal:mean=800,p99=4000')."""
    output_len: _Length = 256
    slo: Slo = Slo()
    priority: L.PRIORITY.field() = 0  # type: ignore[valid-type]
    """Lower is served first when lanes share a pool (vLLM priority scheduling)."""
    prefix: Prefix | None = None
    """Prompt content shared between requests (automatic prefix caching)."""
    adapters: Annotated[int, _Whole] = Field(default=0, ge=0, le=100_000, strict=True)
    """Distinct LoRA adapters this lane's requests use (0: the base model)."""
    popularity: Literal["uniform", "zipf"] = "uniform"
    """How the lane's requests pick their adapter."""
    images_per_request: Annotated[int, _Whole] = Field(default=0, ge=0, le=64, strict=True)
    """Images in each prompt (vision models); their tokens are not in input_len."""
    image_width: Annotated[int, _Whole] = Field(default=1024, ge=1, le=16384, strict=True)
    image_height: Annotated[int, _Whole] = Field(default=1024, ge=1, le=16384, strict=True)

    @field_validator("input_len", "output_len", mode="before")
    @classmethod
    def _lengths(cls, v: Any) -> Any:
        return _length(v)

    @field_validator("name")
    @classmethod
    def _named(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("the lane's name is empty: name it (pools, exports and Kubernetes "
                             "objects are named after their lane)")
        return v

    @model_validator(mode="after")
    def _one_rate(self) -> Lane:
        given = [k for k in ("rate_per_s", "trace", "rate_curve") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give one of rate_per_s, trace or rate_curve"
                             + (f" (got {', '.join(given)})" if given else ""))
        return self

    @property
    def is_day(self) -> bool:
        """Traffic over a day (a trace or a rate curve) rather than one rate."""
        return self.trace is not None or self.rate_curve is not None


def _some(item: Any) -> Any:
    """A candidate list of `item`s: at least one (an empty list would search nothing, or
    everything, by accident; the JSON Schema says minItems 1)."""
    return Annotated[list[item], Field(min_length=1)]


class Candidates(BaseModel):
    model_config = _STRICT
    gpus: _some(str) | None = None  # type: ignore[valid-type]
    """GPU types to consider (default: every catalog GPU that can hold the model)."""
    tp: _some(L.PARALLEL.field()) | None = None  # type: ignore[valid-type]
    """Tensor-parallel sizes (default: 1, 2, 4, 8 where they divide the heads and fit)."""
    weight_dtypes: _some(Literal["auto", "fp32", "bf16", "fp16", "fp8", "int8", "int4",
                                 "fp4"]) = ["auto"]  # type: ignore[valid-type]
    kv_dtypes: _some(Literal["auto", "bf16", "fp16", "fp8"]) = ["auto"]  # type: ignore[valid-type]
    prices: dict[str, L.PRICE_PER_HOUR.field()] = {}  # type: ignore[valid-type]
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
    name: Annotated[str, WithJsonSchema({"type": "string", "pattern": ENGINE_PATTERN})] = "vllm"
    """The serving engine: vllm, sglang or trtllm, optionally with its release and profile
    options (`vllm@0.11`, `sglang@0.5+mixed-chunk`); its memory accounting, scheduler, host
    costs and defaults apply (docs/engines.md, "Profiles by version")."""
    version: str | None = None
    """The engine's release (e.g. "0.11"); default: the newest profile. Same as name@version."""

    @model_validator(mode="after")
    def _known_engine(self) -> EngineSpec:
        from capplan.models.engine import engine_profile

        spec = self.name
        if self.version is not None:
            if "@" in spec:
                raise ValueError(f"engine: give the release once, in name ({spec!r}) or "
                                 f"version ({self.version!r})")
            head, plus, opts = spec.partition("+")
            spec = f"{head}@{self.version}{plus}{opts}"
        try:
            engine_profile(spec)
        except InputError as e:
            raise ValueError(str(e)) from None
        return self

    @property
    def profile_spec(self) -> str:
        """The engine spec string the engine settings carry (name@version+options)."""
        from capplan.models.engine import engine_profile

        if self.version is None:
            return engine_profile(self.name).spec
        head, plus, opts = self.name.partition("+")
        return engine_profile(f"{head}@{self.version}{plus}{opts}").spec
    max_num_seqs: _some(_COUNT) | _COUNT | None = None  # type: ignore[valid-type]
    """Values to search (default 64..1024)."""
    max_num_batched_tokens: _some(_COUNT) | _COUNT | None = None  # type: ignore[valid-type]
    """Prefill chunk sizes to search (default 512..16384)."""
    gpu_memory_utilization: L.FRACTION.field() | None = None  # type: ignore[valid-type]
    """The engine's memory fraction in its own meaning; default: the engine's for the GPU."""
    max_model_len: _COUNT | None = None  # type: ignore[valid-type]
    block_size: Literal[1, 8, 16, 32, 64, 128] | None = None
    """KV block (page) size, one of the CLI's --block-size choices; default: the engine's."""
    attention_dp: _COUNT = 1  # type: ignore[valid-type]
    """Attention data-parallel ranks per replica (docs/perf.md, "Layouts"). recommend/plan
    choose layouts themselves (for MoE models attention DP + EP over each world): values above
    1 are refused there (memory, latency and simulate take them)."""
    expert_parallel: _COUNT = 1  # type: ignore[valid-type]
    """Expert-parallel size of the MoE layers; as attention_dp, 1 in recommend/plan."""
    speculative: str | None = None
    """Speculative decoding method: eagle3, eagle, mtp, ngram or draft:MODEL (docs/features.md);
    recommend then searches spec_tokens per candidate."""
    spec_tokens: _some(Annotated[int, Field(ge=0, le=16)]) | Annotated[  # type: ignore[valid-type]
        int, Field(ge=0, le=16)] | None = None
    """Draft lengths to search (0 = off); default 0..4."""
    spec_topk: Annotated[int, _Whole] = Field(default=1, ge=1, le=64, strict=True)
    spec_draft_tokens: int | None = Field(default=None, ge=2, le=1024)
    acceptance_length: float | None = Field(default=None, ge=1, le=65)
    """Measured tokens per step (1 + accepted / drafts); default: the published figure."""
    acceptance_kind: Literal["chat", "code", "math", "summarisation"] = "chat"
    """Workload kind whose published acceptance length is the default."""
    max_loras: _some(Annotated[int, Field(ge=0, le=1024)]) | Annotated[  # type: ignore[valid-type]
        int, Field(ge=0, le=1024)] | None = None
    """LoRA adapter slots (a value or a list to search); default: searched when lanes use
    adapters."""
    max_lora_rank: Literal[1, 8, 16, 32, 64, 128, 256, 320, 512] = 16


class PdPool(BaseModel):
    """One pool of a fixed disaggregated layout (docs/disaggregation.md)."""

    model_config = _STRICT
    workers: _COUNT  # type: ignore[valid-type]
    """Workers (replicas) of this pool."""
    tp: _COUNT = 1  # type: ignore[valid-type]
    """TP of a worker in the engine's notation (SGLang/TensorRT-LLM: the world)."""
    pp: _COUNT = 1  # type: ignore[valid-type]
    attention_dp: _COUNT = 1  # type: ignore[valid-type]
    expert_parallel: _COUNT = 1  # type: ignore[valid-type]
    gpu: str | None = None
    """GPU of this pool (default: the plan's first candidate GPU)."""
    max_num_seqs: _COUNT | None = None  # type: ignore[valid-type]
    max_num_batched_tokens: _COUNT | None = None  # type: ignore[valid-type]


class FixedDisaggregated(BaseModel):
    """A given prefill/decode layout to predict for the plan's lanes (not searched)."""

    model_config = _STRICT
    prefill: PdPool
    decode: PdPool
    kv_link: Literal["auto", "nvlink", "network"] = "auto"


class VerifySpec(BaseModel):
    model_config = _STRICT
    top: Annotated[int, _Whole] = Field(default=5, ge=0, le=100, strict=True)
    """How many of the best configurations the simulator checks."""
    requests: Annotated[int, _Whole] = Field(default=10_000, ge=50, le=1_000_000, strict=True)
    """Requests per simulated check at most (a lightly loaded replica's check takes fewer,
    at least 2,000: verified.verify_job); left at its default, at most the sim_requests cap
    over `top`."""

    @property
    def requests_per_check(self) -> int:
        """`requests` as given; the default kept within the sim_requests cap over `top` (so
        that `--verify-top 100` stays within it)."""
        if "requests" in self.model_fields_set or self.top == 0:
            return self.requests
        return max(50, min(self.requests, int(L.cap("sim_requests")) // self.top))


class DaySpec(BaseModel):
    """How a day plan is cut and how replicas start (lanes with `trace` or `rate_curve`)."""

    model_config = _STRICT
    window_s: float = Field(default=900.0, ge=60, le=86_400, allow_inf_nan=False)
    """Window length in seconds (replicas are decided per window)."""
    min_replicas: Annotated[int, _Whole] = Field(default=1, ge=0, le=100_000, strict=True)
    """Replicas kept in every window (0 lets the fleet go to zero)."""
    load_from: Literal["nvme", "network"] = "nvme"
    """Where a starting replica reads its weights (docs/day-planning.md gives the rates)."""
    load_gb_per_s: float | None = Field(default=None, gt=0, le=1000, allow_inf_nan=False)
    """Your storage's read rate (GB/s), over load_from's stated one."""
    engine_startup_s: float = Field(default=60.0, ge=0, le=86_400, allow_inf_nan=False)
    """Engine start-up after the weights load (CUDA graphs, profiling), seconds."""
    replay: Literal["none", "peak", "all"] = "peak"
    """Which windows a trace replay over the fleet verifies."""
    timezone: str = "UTC"
    """The IANA time zone of the day's clock times (a rate curve's `at`, the schedule's windows,
    the Kubernetes CronJobs' spec.timeZone); a trace's first arrival is 00:00 in it."""

    @field_validator("timezone", mode="before")
    @classmethod
    def _zone(cls, v: Any) -> str:
        from capplan.plan.clock_zone import check_zone

        return check_zone(v)


class ModelEntry(BaseModel):
    """One model of a shared pool: its name, lanes and (optionally) its own candidates."""

    model_config = _STRICT
    model: str
    workloads: list[Lane] = Field(min_length=1)
    candidates: Candidates | None = None
    engine: EngineSpec | None = None


class PlanFile(BaseModel):
    """A capacity plan: model, candidates, engine settings, lanes, objective, exports."""

    # one model and its lanes, or several models (a shared pool over a day)
    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra={
        "oneOf": [{"required": ["model", "workloads"]}, {"required": ["models"]}]})
    version: Literal[1] = 1
    model: str = ""
    candidates: Candidates = Candidates()
    engine: EngineSpec = EngineSpec()
    workloads: _some(Lane) = []  # type: ignore[valid-type]
    pools: Literal["shared", "separate", "both"] = "both"
    """Several lanes: one shared pool with priorities, a pool per lane, or plan both."""
    objective: Literal["min_cost", "min_gpus", "max_goodput_per_dollar"] = "min_cost"
    headroom: L.HEADROOM.field() | Annotated[  # type: ignore[valid-type]
        Literal["auto"], WithJsonSchema({"type": "string", "pattern": rf"^\s*{ci('auto')}\s*$"})
    ] = L.DEFAULT_HEADROOM
    """Extra capacity for bursts and model error: replicas cover rate * (1 + headroom). "auto"
    in the file: the headroom that covers the engine's optimistic predictions, from its error
    band (capplan.plan.bands.auto_headroom; docs/validation.md section 4b)."""

    @model_validator(mode="before")
    @classmethod
    def _auto_headroom(cls, data: Any) -> Any:
        if isinstance(data, dict) and str(data.get("headroom", "")).strip().lower() == "auto":
            from capplan.models.engine import engine_profile
            from capplan.plan.bands import auto_headroom

            eng = data.get("engine") or {}
            name = eng.get("name", "vllm") if isinstance(eng, dict) else "vllm"
            try:
                engine = engine_profile(str(name)).name
            except InputError:
                engine = "vllm"  # the engine's own validator reports it
            data = {**data, "headroom": round(auto_headroom(engine), 3)}
        return data

    verify: VerifySpec = VerifySpec()
    calibration: str | None = None
    """Calibration YAML for every candidate GPU (relative to the plan file); default: a
    measured one for each GPU, else datasheet defaults. A file for another device is refused."""
    allow_near_floor: bool = Field(default=False, strict=True)
    """Recommend fleets whose SLOs keep each replica under 10% of the load it sustains (SLOs
    just above the unloaded latency floor); by default they are left out and the floor and the
    trade-off are reported instead."""
    export: list[Annotated[str, WithJsonSchema({"type": "string",
                                                "pattern": EXPORT_PATTERN})]] = []
    """Files to write (.csv, .json, .md, .xlsx, .k8s.yaml, .llm-d.yaml, .html), relative to the
    plan file."""
    disaggregated_layout: FixedDisaggregated | None = None
    """A fixed prefill/decode layout predicted for the lanes' pooled traffic beside the
    search (JSON `fixed_disaggregated`: per-pool figures, a saturated pool named)."""
    day: DaySpec = DaySpec()
    """Day plans (lanes with `trace` or `rate_curve`): windows and replica start-up."""
    models: _some(ModelEntry) | None = None  # type: ignore[valid-type]
    """Several models on one GPU pool over the day (then `model` and `workloads` are left
    out): each model's lanes, GPUs per window, the pool's peak (docs/day-planning.md)."""

    @property
    def is_day(self) -> bool:
        return self.models is not None or any(ln.is_day for ln in self.workloads)

    @model_validator(mode="after")
    def _bounded_search(self) -> PlanFile:
        """Configurations to search, estimated before the search (the planner evaluates every
        GPU x TP x dtype x max_num_seqs x chunk combination as one array)."""
        def n(v: Any, default: int) -> int:
            return default if v is None else len(v) if isinstance(v, list) else 1
        c, e = self.candidates, self.engine
        total = (n(c.gpus, _CATALOG_GPUS_ESTIMATE) * n(c.tp, 4) * len(c.weight_dtypes)
                 * len(c.kv_dtypes) * n(e.max_num_seqs, 5) * n(e.max_num_batched_tokens, 6))
        L.check_cap("plan_configurations", total, "candidates x engine values")
        L.check_cap("sim_requests", self.verify.top * self.verify.requests_per_check,
                    "verify.top x verify.requests (simulated to check the best)")
        return self

    @model_validator(mode="after")
    def _model_or_models(self) -> PlanFile:
        if self.models is not None:
            if self.model or self.workloads:
                raise ValueError("give either model + workloads or models, not both")
            if not self.models:
                raise ValueError("models: list at least one model")
            L.check_cap("plan_lanes", sum(len(m.workloads) for m in self.models), "workloads")
            return self
        if self.model is not None and not self.model.strip():
            raise ValueError("model: the name is empty (the model to plan, e.g. llama-3.1-8b)")
        if not self.model:
            raise ValueError("model: missing (the model to plan, e.g. llama-3.1-8b)")
        if not self.workloads:
            raise ValueError("workloads: list at least one lane")
        return self

    @field_validator("workloads")
    @classmethod
    def _unique_lane_names(cls, v: list[Lane]) -> list[Lane]:
        names = [lane.name for lane in v]
        L.check_cap("plan_lanes", len(v), "workloads")
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise ValueError(f"two lanes are named {dup!r}; give each lane its own name")
        return v


def _keys_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys valid where `loc` points (the fields of the object that holds loc[-1]), so a
    suggestion names a sibling ('tbt_p99_s' under slo:, not 'tp' of candidates:)."""
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        f = model.model_fields.get(str(part))
        if f is None:
            return []
        subs = [t for t in _flat_args(f.annotation)
                if isinstance(t, type) and issubclass(t, BaseModel)]
        if not subs:
            return []
        model = subs[0]
    return list(model.model_fields)


def _flat_args(ann: Any) -> list[Any]:
    args = getattr(ann, "__args__", None)
    if not args:
        return [ann]
    return [x for a in args for x in _flat_args(a)]


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
    text = L.read_text(p, "plan file")
    try:
        plan = PlanFile.model_validate(data)
    except ValidationError as e:
        err = next((x for x in plain_errors(e) if x["type"] == "extra_forbidden"), None)
        keys = _keys_at(PlanFile, tuple(err["loc"])) if err else []
        loc, msg = validation_error_line(e, keys or _all_keys(PlanFile))
        if keys and "did you mean" not in msg and len(keys) <= 8:  # a small object: its keys
            msg += f" (the keys here: {', '.join(keys)})"
        line = _line_of(text, loc)
        raise InputError(f"{p}:{line}: {msg}" if line else f"{p}: {msg}") from e
    if plan.day != DaySpec() and not plan.is_day:  # set, it would be ignored in silence
        raise InputError(f"{p}:{_line_of(text, ('day',))}: day: applies to a day plan, and no "
                         "lane has a rate_curve or trace: drop day:, or give a lane one")
    return plan


def plan_json_schema() -> dict[str, Any]:
    return PlanFile.model_json_schema()
