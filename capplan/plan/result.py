"""What the planner says, typed: recommendations with their predictions, margins, cost,
binding constraint and engine flags; the Pareto front, curves and pool comparison.

Dicts appear only in `to_dict()`, which produces the JSON keys DESIGN.md promises (the edge
the exporters and `--format json` read).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from capplan.models.engine import engine_profile
from capplan.models.layout import describe
from capplan.plan.bands import attach_bands
from capplan.plan.bench_cmds import for_lane
from capplan.plan.features_plan import features_dict
from capplan.plan.launch import deepep_launch
from capplan.plan.schema import Lane
from capplan.plan.search import Candidate, SearchSpace

LATENCY_KEYS = ("ttft_s", "tbt_s", "e2e_s")


@dataclass(frozen=True)
class Quantiles:
    """Mean and percentiles of one latency, seconds."""

    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, d: Mapping[str, float]) -> Quantiles:
        return cls(d["mean"], d["p50"], d["p90"], d["p99"])


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """The analytic model's steady state of one replica at its planned rate."""

    ttft_s: Quantiles
    tbt_s: Quantiles
    e2e_s: Quantiles
    output_tokens_per_s: float
    input_tokens_per_s: float
    requests_per_s: float
    mean_running_batch: float
    preemptions: float
    kv_peak_utilization: float

    @classmethod
    def of(cls, summary: Mapping[str, Any]) -> Prediction:
        """From the plain-float summary of a QueueModel result (queueing.summarize)."""
        lat = {k: Quantiles.of(summary[k]) for k in LATENCY_KEYS}
        return cls(**lat, **{k: float(summary[k]) for k in (
            "output_tokens_per_s", "input_tokens_per_s", "requests_per_s",
            "mean_running_batch", "preemptions", "kv_peak_utilization")})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Verification:
    """The simulator's check of one replica of a recommendation at a per-replica rate (what
    the plan claims a replica carries: verified._verify)."""

    ok: bool
    reason: str
    requests: int
    simulated: dict[str, Any]
    """The simulator's contract keys (ttft_s, tbt_s, e2e_s, throughput...)."""
    rate_per_s: float | None = None
    """The per-replica arrival rate replayed (req/s); None where the verifier did not say."""

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "reason": self.reason, "requests": self.requests,
                "rate_per_s": self.rate_per_s, "simulated": self.simulated}


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    """One fleet the planner proposes: a candidate, replicated, with what it will do."""

    candidate: Candidate
    per_replica_rate_per_s: float
    predicted: Prediction
    slo_margins: dict[str, float]
    verified: Verification | None = None
    why_not_first: str = ""
    engine_flags: dict[str, str] = field(default_factory=dict)
    calibration: str = ""
    rank: int = 0
    resolved_dtypes: tuple[str, str] = ("", "")
    """What `auto` weight and KV dtypes mean for this checkpoint (from the memory model)."""
    speculation: dict[str, Any] | None = None
    """Speculative decoding's decode speed-up by batch and where it stops paying (None: off)."""
    relaunch: Callable[..., dict[str, str]] | None = field(default=None, compare=False,
                                                           repr=False)
    """engine_flags with this recommendation's inputs, taking `out=` (its place among the fleets
    of an output: capplan.plan.flags.place_together); None: not planned here."""

    @property
    def replicas(self) -> int:
        return self.candidate.replicas

    @property
    def gpus_total(self) -> int:
        return self.candidate.gpus_total

    @property
    def cost_per_hour(self) -> float | None:
        return self.candidate.cost_per_hour

    @property
    def label(self) -> str:
        s = self.candidate.settings
        if s.attention_dp > 1 or s.expert_parallel > 1:
            layout = describe(s.tp, s.pp, s.attention_dp, s.expert_parallel,
                              self.candidate.gpu.interconnect.max_gpus_per_node)
            return f"{self.candidate.gpu.key} {layout} ({s.weight_dtype})"
        return f"{self.candidate.gpu.key} TP {s.tp} ({s.weight_dtype})"

    def with_(self, **changes: Any) -> Recommendation:
        return replace(self, **changes)

    def settings_dict(self) -> dict[str, Any]:
        """The engine settings as the launch-line builder and the JSON name them."""
        s = self.candidate.settings
        return {"tp": s.tp, "pp": s.pp, "attention_dp": s.attention_dp,
                "expert_parallel": s.expert_parallel, "max_num_seqs": s.max_num_seqs,
                "max_num_batched_tokens": s.max_num_batched_tokens,
                "weight_dtype": s.weight_dtype, "kv_dtype": s.kv_dtype,
                "max_model_len": s.max_model_len,
                "gpu_memory_utilization": s.gpu_memory_utilization, "engine": s.profile.name,
                "engine_profile": s.profile.pinned, "replicas": self.replicas,
                "per_replica_rate_per_s": self.per_replica_rate_per_s,
                "deepep": deepep_launch(s, self.candidate.gpu), **features_dict(s)}

    def head(self) -> dict[str, Any]:
        """The few keys a pool comparison shows."""
        s = self.candidate.settings
        return {"gpu": self.candidate.gpu.key, "tp": s.tp, "replicas": self.replicas,
                "gpus_total": self.gpus_total, "cost_per_hour": self.cost_per_hour,
                "max_num_seqs": s.max_num_seqs,
                "max_num_batched_tokens": s.max_num_batched_tokens}

    def to_dict(self) -> dict[str, Any]:
        c, s = self.candidate, self.candidate.settings
        return {
            "gpu": c.gpu.key, "tp": s.tp, "pp": s.pp, "attention_dp": s.attention_dp,
            "expert_parallel": s.expert_parallel, "replicas": self.replicas,
            "gpus_per_replica": s.tp * s.pp * s.attention_dp,
            "layout": describe(s.tp, s.pp, s.attention_dp, s.expert_parallel,
                               c.gpu.interconnect.max_gpus_per_node),
            "gpus_total": self.gpus_total, "max_num_seqs": s.max_num_seqs,
            "max_num_batched_tokens": s.max_num_batched_tokens,
            "weight_dtype": s.weight_dtype, "kv_dtype": s.kv_dtype,
            "weight_dtype_resolved": self.resolved_dtypes[0] or s.weight_dtype,
            "kv_dtype_resolved": self.resolved_dtypes[1] or s.kv_dtype,
            "engine": s.profile.name, "engine_profile": s.profile.pinned,
            "max_model_len": s.max_model_len, "gpu_memory_utilization": s.gpu_memory_utilization,
            "predicted": attach_bands(self.predicted.to_dict(), s.profile.name, None),
            "capacity_per_replica_rps": c.max_rate_per_s,
            "stable_capacity_per_replica_rps": c.capacity_per_s,
            "per_replica_rate_per_s": self.per_replica_rate_per_s,
            "binding_constraint": c.binding_constraint, "slo_margins": dict(self.slo_margins),
            "cost_per_hour": self.cost_per_hour, "price_per_gpu_hour": c.gpu.price_per_hour_usd,
            "kv_cache_tokens": c.kv_cache_tokens,
            "verified": self.verified.to_dict() if self.verified else None,
            "why_not_first": self.why_not_first, "engine_flags": dict(self.engine_flags),
            "calibration": self.calibration, "rank": self.rank,
            "features": features_dict(s), "speculation": self.speculation,
        }


@dataclass(frozen=True)
class ParetoPoint:
    gpu: str
    tp: int
    replicas: int
    weight_dtype: str
    kv_dtype: str
    cost_per_hour: float
    ttft_p99_s: float
    tbt_p99_s: float


@dataclass(frozen=True)
class CurvePoint:
    rate_per_s: float
    output_tokens_per_s: float
    ttft_p99_s: float
    tbt_p99_s: float
    tbt_mean_s: float


@dataclass(frozen=True)
class Curve:
    """p99 latencies of one configuration over per-replica rates up to its capacity."""

    label: str
    points: list[CurvePoint]
    gpus_per_replica: int


@dataclass(frozen=True)
class SeparatePool:
    """One lane planned on its own pool: its best fleet, or why there is none."""

    lane: str
    best: Recommendation | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.best is None:
            return {"lane": self.lane, "error": self.error}
        return {"lane": self.lane, **self.best.head(),
                "binding_constraint": self.best.candidate.binding_constraint,
                # what `capplan verify --lane` sends and compares (verify_endpoint.lane_plan)
                **{k: v for k, v in self.best.to_dict().items()
                   if k in ("per_replica_rate_per_s", "max_model_len", "predicted")},
                "engine_flags": for_lane(dict(self.best.engine_flags), self.lane)}


@dataclass(frozen=True)
class PoolComparison:
    shared: Recommendation
    separate: list[SeparatePool]

    @property
    def separate_cost_per_hour(self) -> float | None:
        costs = [p.best.cost_per_hour if p.best else None for p in self.separate]
        return sum(c for c in costs if c is not None) if all(c is not None for c in costs) \
            else None

    @property
    def cheaper(self) -> str:
        """'equal' (to the cent), 'separate' or 'shared'."""
        total, shared = self.separate_cost_per_hour, self.shared.cost_per_hour
        if total is not None and shared is not None and abs(total - shared) < 0.005:
            return "equal"
        return "separate" if total is not None and shared is not None and total < shared \
            else "shared"

    def to_dict(self) -> dict[str, Any]:
        return {"shared": self.shared.head(),
                "separate": {"lanes": [p.to_dict() for p in self.separate],
                             "cost_per_hour": self.separate_cost_per_hour,
                             "gpus_total": sum(p.best.gpus_total for p in self.separate
                                               if p.best)},
                "cheaper": self.cheaper}


def _lane_row(ln: Lane, image_tokens: int = 0) -> dict[str, Any]:
    """A lane as the plan gave it; `image_tokens`: its images' tokens per request, which the
    plan added to the prompt's text tokens (`input_len`)."""
    return {"name": ln.name, "rate_per_s": ln.rate_per_s, "input_len": str(ln.input_len),
            "output_len": str(ln.output_len), "ttft_p99_s": ln.slo.ttft_p99_s,
            "tbt_p99_s": ln.slo.tbt_p99_s, "e2e_p99_s": ln.slo.e2e_p99_s,
            "tpot_p99_s": ln.slo.tpot_p99_s, "tpot_mean_s": ln.slo.tpot_mean_s,
            "priority": ln.priority, "arrival": ln.arrival, "burstiness": ln.burstiness,
            **({"prefix": ln.prefix.model_dump()} if getattr(ln, "prefix", None) else {}),
            **({"trace": ln.trace} if getattr(ln, "trace", None) else {}),
            **({"rate_curve": ln.rate_curve if isinstance(ln.rate_curve, str) else
                [p.model_dump() for p in ln.rate_curve]}
               if getattr(ln, "rate_curve", None) else {}),
            **({"adapters": ln.adapters, "popularity": ln.popularity}
               if getattr(ln, "adapters", 0) else {}),
            **({"images_per_request": ln.images_per_request, "image_width": ln.image_width,
                "image_height": ln.image_height, "image_tokens_per_request": image_tokens}
               if getattr(ln, "images_per_request", 0) else {})}


@dataclass(frozen=True, kw_only=True)
class PlanInputs:
    """What was searched: the plan's model name, the resolved space, the objective."""

    model: str
    space: SearchSpace
    objective: str
    headroom: float
    pools: str
    configurations_searched: int

    def to_dict(self) -> dict[str, Any]:
        sp = self.space
        return {"model": self.model, "gpus": [g.key for g in sp.gpus], "tp": list(sp.tps),
                "weight_dtypes": list(sp.weight_dtypes), "kv_dtypes": list(sp.kv_dtypes),
                "max_num_seqs": list(sp.max_num_seqs),
                "max_num_batched_tokens": list(sp.max_num_batched_tokens),
                "max_model_len": sp.max_model_len,
                "max_model_len_reason": sp.max_model_len_reason,
                "gpu_memory_utilization": sp.gpu_memory_utilization,
                "engine": engine_profile(sp.engine).name, "calibration": sp.calibration,
                "objective": self.objective, "headroom": self.headroom, "pools": self.pools,
                "configurations_searched": self.configurations_searched}


@dataclass(frozen=True, kw_only=True)
class PlanResult:
    """Everything `capplan plan` answers for one plan file (or `capplan recommend`)."""

    model: str
    hf_id: str
    objective: str
    headroom: float
    target_rate_per_s: float
    lanes: list[Lane]
    """The lanes as the plan gave them (name, rate, lengths as written, SLOs, priority)."""
    inputs: PlanInputs
    """The search space as resolved (GPUs, TP, dtypes, engine values, max_model_len)."""
    configurations_searched: int
    recommendations: list[Recommendation]
    pareto: list[ParetoPoint]
    curves: list[Curve]
    warnings: list[str]
    pools: PoolComparison | None = None
    disaggregated: dict[str, Any] | None = None
    """The disaggregated layout searched beside the aggregated one (plan/disagg.py), with the
    verdict; None when not asked for."""
    prefix_cache: dict[str, Any] | None = None
    """What prefix caching gives: prompt tokens cached per request and the fleet without the
    cache (plan/alternatives.py prefix_savings); None when no lane shares prompts."""
    fp8_alternative: dict[str, Any] | None = None
    """The best fleet with fp8 weights when the plan did not allow them and they would save
    (plan/alternatives.py): GPUs, cost, saving, the accuracy caveat and a sentence."""
    scheduler_alternative: dict[str, Any] | None = None
    """The fleet with the engine's option that lets prompt work share steps with the decodes
    (SGLang mixed-chunk, TensorRT-LLM chunked-prefill) when its default stops them and the
    option would save (plan/alternatives.py): GPUs, cost, saving, a sentence."""
    fixed_disaggregated: dict[str, Any] | None = None
    """The plan file's fixed prefill/decode layout predicted (plan/pd.py); None if none."""
    checkpoint_bytes: int | None = None
    """The served checkpoint's weights in bytes as it ships them (models/memory.py
    checkpoint_bytes): what each pod downloads, sizing the llm-d export's model volume."""
    image_tokens: dict[str, int] = field(default_factory=dict)
    """Image tokens per request by lane name (lanes with images: their prompts are the text
    tokens `input_len` plus these)."""

    @property
    def best(self) -> Recommendation:
        return self.recommendations[0]

    def to_dict(self) -> dict[str, Any]:
        out = {
            "model": self.model, "hf_id": self.hf_id,
            **({"checkpoint_bytes": self.checkpoint_bytes}
               if self.checkpoint_bytes is not None else {}),
            "objective": self.objective,
            "headroom": self.headroom, "target_rate_per_s": self.target_rate_per_s,
            "lanes": [_lane_row(ln, self.image_tokens.get(ln.name, 0)) for ln in self.lanes],
            "inputs": self.inputs.to_dict(),
            "configurations_searched": self.configurations_searched,
            "recommendations": [r.to_dict() for r in self.recommendations],
            "pareto": [asdict(p) for p in self.pareto],
            "curves": [asdict(c) for c in self.curves],
            "warnings": list(self.warnings),
        }
        if self.pools is not None:
            out["pools"] = self.pools.to_dict()
        if self.disaggregated is not None:
            out["disaggregated"] = self.disaggregated
        if self.prefix_cache is not None:
            out["prefix_cache"] = self.prefix_cache
        if self.fp8_alternative is not None:
            out["fp8_alternative"] = self.fp8_alternative
        if self.scheduler_alternative is not None:
            out["scheduler_alternative"] = self.scheduler_alternative
        if self.fixed_disaggregated is not None:
            out["fixed_disaggregated"] = self.fixed_disaggregated
        return out
