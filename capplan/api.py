"""The Python API: what every CLI command calls, for notebooks and scripts.

    >>> import capplan
    >>> m = capplan.memory("llama-3.1-8b", "h100-sxm", max_model_len=8192)
    >>> m.fits, m.kv_cache_tokens
    >>> lat = capplan.latency("llama-3.1-8b", "h100-sxm", rate=10, input_len=1024,
    ...                       output_len=256)
    >>> lat.ttft_s["p99"], lat.output_tokens_per_s, lat.bound

Each function takes catalog names (or Hugging Face ids / NVML names), the engine options of the
CLI as keyword arguments (`engine`, `tp`, `pp`, `weight_dtype`, `kv_dtype`, `max_model_len`,
`gpu_memory_utilization`, `block_size`, `max_num_seqs`, `max_num_batched_tokens`; the
features of docs/features.md: `speculative`, `spec_tokens`, `acceptance_length`, `max_loras`,
`max_lora_rank`, `images_per_request`...) and an optional `calibration` (a file path or a
Calibration). Unset options take the engine profile's
defaults for the GPU, through the same resolver the CLI and the planner use
(capplan.plan.deployment.resolve_deployment). Results are typed; `.to_dict()` gives the CLI's
JSON (SI units, the keys DESIGN.md lists).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from capplan.api_checks import check_kwargs, check_names
from capplan.catalog.loader import Catalog, load_catalog
from capplan.errors import InputError, one_line_error
from capplan.export.json_export import jsonable as _jsonable
from capplan.plan.deployment import Deployment, EngineOptions, resolve_deployment
from capplan.plan.images import with_images

if TYPE_CHECKING:  # the planner's result: imported by the functions that plan
    from capplan.plan.result import PlanResult

_ENGINE_KEYS = tuple(f.name for f in fields(EngineOptions))


def deployment(model: str, gpu: str, *, calibration: str | Path | Any = None,
               catalog: Catalog | None = None, catalog_dirs: tuple[str, ...] = (),
               require_fit: bool = True, engine_notation: bool = False,
               memory_only: bool = False, **options: Any) -> Deployment:
    """Resolve a deployment: names + engine options (unset = the engine's defaults).

    `tp` is capplan's attention TP per data-parallel rank (a replica stage is tp x
    attention_dp GPUs); with `engine_notation=True` it is read as the engine writes it
    (SGLang `--tp 8 --dp 8` and TensorRT-LLM `tensor_parallel_size 8` with attention DP are 8
    GPUs; capplan.models.layout.tp_from_engine_notation), as the CLI does."""
    unknown = sorted(set(options) - set(_ENGINE_KEYS))
    if unknown:
        raise InputError(f"unknown engine option(s) {', '.join(unknown)}: expected "
                         f"{', '.join(_ENGINE_KEYS)}")
    check_names(model=model, gpu=gpu)
    check_kwargs(**options)  # the CLI's bounds (capplan.limits), with its reasons
    if engine_notation and options.get("tp"):
        from capplan.models.engine import engine_profile
        from capplan.models.layout import tp_from_engine_notation

        name = engine_profile(options.get("engine") or "vllm").name
        options["tp"] = tp_from_engine_notation(name, int(options["tp"]),
                                                int(options.get("attention_dp") or 1))
    opts = EngineOptions(**{k: v for k, v in options.items() if v is not None})
    cat = catalog or load_catalog(catalog_dirs)
    return resolve_deployment(cat, model, gpu, opts, calibration, require_fit=require_fit,
                              memory_only=memory_only)


@dataclass(frozen=True)
class MemoryResult:
    """VRAM per GPU of one deployment (capplan.models.memory.MemoryReport plus settings)."""

    deployment: Deployment = field(repr=False)

    @property
    def fits(self) -> bool:
        return self.deployment.memory.fits

    @property
    def kv_cache_tokens(self) -> int:
        return self.deployment.memory.kv_cache_tokens

    @property
    def max_concurrency(self) -> float:
        return self.deployment.memory.max_concurrency

    @property
    def warnings(self) -> list[str]:
        return self.deployment.warnings()

    def to_dict(self) -> dict[str, Any]:
        """`capplan memory --format json` (plan.deployment.Deployment.memory_json)."""
        return _jsonable(self.deployment.memory_json())


def memory(model: str, gpu: str, **kw: Any) -> MemoryResult:
    """Weights, activations, overheads and the paged KV cache per GPU (never raises for a
    model that does not fit: `.fits` says so)."""
    return MemoryResult(deployment(model, gpu, require_fit=False, memory_only=True, **kw))


@dataclass(frozen=True)
class SpeedResult:
    """Decode step time over batch and context, and prefill times."""

    rows: list[dict[str, Any]]
    knee_batch: dict[int, int | None]
    excluded: list[dict[str, Any]]
    max_batch: dict[int, int]
    prefill: list[dict[str, Any]]
    deployment: Deployment = field(repr=False)
    knee_checked_up_to: dict[int, int | None] = field(default_factory=dict)
    """Per context, the largest batch the knee search evaluated (what fits, up to 4096)."""

    def to_dict(self) -> dict[str, Any]:
        d = self.deployment
        return _jsonable({"model": d.model.key, "gpu": d.gpu.key, "tp": d.settings.tp,
                          **d.resolved_dtypes(),
                          "calibration": d.calibration.source, "rows": self.rows,
                          "knee_batch": self.knee_batch,
                          "knee_checked_up_to": self.knee_checked_up_to,
                          "excluded": self.excluded,
                          "max_batch": self.max_batch, "prefill": self.prefill,
                          "engine_settings": d.settings_summary()})


def speed(model: str, gpu: str, *, batch: list[int] | tuple[int, ...] = (1, 8, 32, 64, 128),
          context: list[int] | tuple[int, ...] = (1024,),
          prefill: list[int] | tuple[int, ...] = (), **kw: Any) -> SpeedResult:
    """Decode curve (step time, tokens/s, bound) and prefill times (with the request overhead,
    the TTFT floor one client measures)."""
    from capplan.plan.speed import decode_curve, prefill_rows

    checked = check_kwargs(batch=batch, context=context, prefill=prefill or None)
    batch, context = checked["batch"], checked["context"]
    prefill = checked["prefill"] or []
    dep = deployment(model, gpu, **kw)
    curve = decode_curve(dep, list(batch), list(context))
    if not curve["rows"]:
        s = dep.settings
        raise InputError(f"no batch in {list(batch)} fits: at most {curve['max_batch']} "
                         f"sequences (max_num_seqs {s.max_num_seqs}, KV cache "
                         f"{dep.memory.kv_cache_tokens} tokens)")
    pre = prefill_rows(dep, list(prefill)) if prefill else []
    return SpeedResult(curve["rows"], curve["knee_batch"], curve["excluded"],
                       curve["max_batch"], pre, dep, curve["knee_checked_up_to"])


@dataclass(frozen=True)
class LatencyResult:
    """Latency and throughput side by side, and what bound them (analytic or simulated)."""

    ttft_s: dict[str, float]
    tbt_s: dict[str, float]
    e2e_s: dict[str, float]
    output_tokens_per_s: float | None
    requests_per_s: float | None
    bound: str
    data: dict[str, Any] = field(repr=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LatencyResult:
        return cls(d["ttft_s"], d["tbt_s"], d["e2e_s"], d.get("output_tokens_per_s"),
                   d.get("requests_per_s"), str(d.get("bound", "")), d)

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(self.data)


def latency(model: str, gpu: str, *, rate: float | None = None, concurrency: int | None = None,
            trace: str | None = None, input_len: str | int = 512, output_len: str | int = 256,
            burstiness: float = 1.0, num_prompts: int | None = None, warmup_prompts: int = 0,
            benchmark: str | None = None, seed: int = 0, time_unit: str = "auto",
            window_s: float | None = None, **kw: Any) -> LatencyResult:
    """TTFT / TBT / E2E (mean, p50, p90, p99) and throughput under an open-loop rate, a closed
    loop of `concurrency` clients (a benchmark of `num_prompts`; `benchmark` names a tool's
    protocol, capplan.sim.protocol.PRESETS), or a trace. Closed loops and traces are answered
    by the simulator's replay; a rate by the analytic queue where it agrees with a 2,000-request
    replay within capplan.plan.replay.SCREEN_TOLERANCE, else by the replay.
    `.data["answered_by"]` says which (capplan.plan.replay)."""
    from capplan.plan.load import load_spec_from_options
    from capplan.plan.replay import WINDOW_S, ReplayLoad, answer

    check_kwargs(rate=rate, concurrency=concurrency, burstiness=burstiness,
                 num_prompts=num_prompts, warmup_prompts=warmup_prompts, seed=seed,
                 window_s=window_s)
    dep, input_len = with_images(deployment(model, gpu, **kw), input_len)
    spec = None
    if rate is not None:
        spec = load_spec_from_options(rate, concurrency, trace, str(input_len), str(output_len),
                                      burstiness, dep.model.context_len(dep.settings.max_model_len),
                                      num_prompts, warmup_prompts, time_unit=time_unit)
    load = ReplayLoad(rate=rate, concurrency=concurrency, trace=trace, input_len=str(input_len),
                      output_len=str(output_len), burstiness=burstiness,
                      num_prompts=num_prompts, warmup_prompts=warmup_prompts,
                      time_unit=time_unit, benchmark=benchmark, seed=seed,
                      window_s=window_s or WINDOW_S)
    from capplan.plan.bands import attach_bands

    return LatencyResult.from_dict({**attach_bands(answer(dep, load, spec), dep.profile.name,
                                                   concurrency), **dep.resolved_dtypes()})


def simulate(model: str, gpu: str, *, rate: float | None = None,
             concurrency: int | None = None, trace: str | None = None,
             input_len: str | int = 512, output_len: str | int = 256, burstiness: float = 1.0,
             requests: int = 1000, seed: int = 0, scheduler: str = "continuous",
             batch_size: int | None = None, batch_timeout_s: float = 0.05,
             chunked_prefill: bool | None = None, progress: Any = None,
             replicas: int = 1, router: str = "least-outstanding",
             schedule: list[tuple[float, int]] | tuple[tuple[float, int], ...] = (),
             startup_lag_s: float = 0.0, benchmark: str | None = None,
             warmup_prompts: int | None = None, **kw: Any) -> LatencyResult:
    """Simulate the engine step by step (same step model); the result adds the simulator's
    keys (tpot_s, queue_s, goodput, time series) to the latency keys. `replicas` > 1 or a
    `schedule` of (start_s, replicas) windows replays the requests over a fleet behind
    `router` (round-robin, least-outstanding, prefix-affinity; docs/fleet.md): fleet-wide
    keys plus `per_replica` (and `windows` for a schedule). `benchmark` names a tool's
    protocol (capplan.sim.protocol.PRESETS): its warm-ups, measured requests, random lengths
    and metric definitions (the `benchmark` key)."""
    from capplan.plan.fleet_sim import FleetOptions
    from capplan.plan.simulation import run_simulation
    from capplan.sim.protocol import BenchmarkRun, preset

    check_kwargs(rate=rate, concurrency=concurrency, burstiness=burstiness, requests=requests,
                 seed=seed, batch_size=batch_size, batch_timeout_s=batch_timeout_s,
                 replicas=replicas, startup_lag_s=startup_lag_s)
    fleet = FleetOptions(replicas=replicas, router=router,
                         schedule=tuple((float(a), int(b)) for a, b in schedule),
                         startup_lag_s=startup_lag_s)
    dep, input_len = with_images(deployment(model, gpu, **kw), input_len)
    bench = (BenchmarkRun.of(preset(benchmark), concurrency, None, warmup_prompts, requests)
             if benchmark is not None else None)
    res = run_simulation(dep, rate=rate, concurrency=concurrency, trace=trace,
                         input_len=str(input_len), output_len=str(output_len),
                         burstiness=burstiness, requests=requests, seed=seed,
                         schedulers=(scheduler,), batch_size=batch_size,
                         batch_timeout_s=batch_timeout_s, chunked_prefill=chunked_prefill,
                         progress=progress, fleet=fleet, benchmark=bench)
    from capplan.plan.bands import attach_bands

    return LatencyResult.from_dict({**res["head"], **dep.resolved_dtypes(), **attach_bands(
        res["results"][scheduler], dep.profile.name, concurrency)})


def run_plan(path_or_plan: str | Path | dict[str, Any], *, verify: bool = True,
             catalog_dirs: tuple[str, ...] = (), disagg: bool = False) -> PlanResult:
    """Run a plan file (a path, or the same content as a dict), as `capplan plan` does;
    `disagg`: also size a disaggregated prefill/decode layout and say which wins (as
    `capplan recommend` does by default; JSON `disaggregated`).

    (Named run_plan because `capplan.plan` is the planner's package.)"""
    from capplan.plan.planner import run_plan as _run_plan
    from capplan.plan.schema import PlanFile, load_plan
    from capplan.plan.verify import simulate_recommendation

    if isinstance(path_or_plan, dict):
        try:
            spec = PlanFile.model_validate(path_or_plan)
        except ValueError as e:  # a ValidationError: "key.path: reason", as the CLI says it
            raise InputError(f"plan: {one_line_error(e)}") from e
    else:
        spec = load_plan(path_or_plan)
        base = Path(path_or_plan).parent
        if spec.calibration and not Path(spec.calibration).is_absolute():
            spec = spec.model_copy(update={"calibration": str(base / spec.calibration)})
    verify_fn = simulate_recommendation if verify and spec.verify.top > 0 else None
    if spec.is_day:  # lanes with trace: / rate_curve:, or models: -> a day plan
        from capplan.plan.day_run import run_day_plan

        base = None if isinstance(path_or_plan, dict) else Path(path_or_plan).parent
        return run_day_plan(load_catalog(catalog_dirs), spec, verify_fn, base=base)
    return _run_plan(load_catalog(catalog_dirs), spec, verify_fn, disagg=disagg)


def _as_list(v: Any) -> list[Any] | None:
    """A searched option: one value or several (None: the plan's default)."""
    if v is None:
        return None
    return [v] if isinstance(v, str | int | float) else list(v)


def _refuse_unknown(fn: str, unknown: dict[str, Any], known: list[str]) -> None:
    """InputError naming keywords `fn` does not take (not a TypeError from deep inside)."""
    if unknown:
        raise InputError(f"{fn}: unknown keyword(s) {', '.join(sorted(unknown))}: expected "
                         f"{', '.join(known)}")


def recommend(model: str, *, rate: float | None = None, input_len: str | int = 512,
              output_len: str | int = 256, ttft_p99_s: float | None = None,
              tbt_p99_s: float | None = None, e2e_p99_s: float | None = None,
              gpus: str | list[str] | tuple[str, ...] = (), engine: str = "vllm",
              verify: bool = True, catalog_dirs: tuple[str, ...] = (),
              tpot_p99_s: float | None = None, tpot_mean_s: float | None = None,
              trace: str | Path | None = None, rate_curve: Any = None,
              day: dict[str, Any] | None = None, disagg: bool = True,
              tp: int | list[int] | None = None, weight_dtype: str | list[str] | None = None,
              kv_dtype: str | list[str] | None = None, max_model_len: int | None = None,
              max_num_seqs: int | list[int] | None = None,
              max_num_batched_tokens: int | list[int] | None = None,
              headroom: float | str | None = None, objective: str = "min_cost",
              prices: dict[str, float] | None = None, calibration: str | None = None,
              **unknown: Any) -> Any:
    """GPU type and count, TP, replicas and engine settings for one lane of traffic, as
    `capplan recommend` plans them (the same plan dict, capplan.plan.recommend_doc).

    Give `rate` (requests/s), or a day of traffic: `trace` (a trace file) or `rate_curve` (a
    list of {at: 'HH:MM', rate_per_s} or a CSV path); then the result is a DayPlan (replicas
    per window, GPU-hours and cost autoscaled vs a fixed fleet; docs/day-planning.md) and
    `day` takes the plan file's `day:` settings (window_s, min_replicas, load_from,
    load_gb_per_s, engine_startup_s, replay, timezone). `gpus`: one GPU name or a list. The search
    options are the CLI's: `tp`, `weight_dtype`, `kv_dtype`, `max_num_seqs`,
    `max_num_batched_tokens` (a value or a list of values to search), `max_model_len`,
    `headroom` (a fraction or "auto"), `objective`, `prices` ({gpu: USD per GPU-hour}),
    `calibration`; `disagg` (default True, as the CLI's --disagg): also size a disaggregated
    prefill/decode layout and say which wins (`--no-disagg`: disagg=False)."""
    from capplan.plan.recommend_doc import SearchOptions, recommend_doc

    _refuse_unknown("recommend", unknown, [  # its own keywords, in their order
        k for k in inspect.signature(recommend).parameters if k not in ("model", "unknown")])
    check_names(model=model)
    check_kwargs(rate=rate, ttft_p99_s=ttft_p99_s, tbt_p99_s=tbt_p99_s, e2e_p99_s=e2e_p99_s,
                 engine=engine, max_model_len=max_model_len)
    if sum(x is not None for x in (rate, trace, rate_curve)) != 1:
        raise InputError("give exactly one of rate, trace or rate_curve")
    load: dict[str, Any] = ({"rate_per_s": rate} if rate is not None else
                            {"trace": str(trace)} if trace is not None else
                            {"rate_curve": rate_curve if isinstance(rate_curve, list)
                             else str(rate_curve)})
    lane = {"name": "default", **load, "input_len": str(input_len),
            "output_len": str(output_len),
            "slo": {k: v for k, v in (("ttft_p99_s", ttft_p99_s), ("tbt_p99_s", tbt_p99_s),
                                      ("e2e_p99_s", e2e_p99_s), ("tpot_p99_s", tpot_p99_s),
                                      ("tpot_mean_s", tpot_mean_s)) if v is not None}}
    opts = SearchOptions(
        gpus=tuple(_as_list(gpus) or ()), tp=_as_list(tp), prices=dict(prices or {}),
        weight_dtypes=tuple(_as_list(weight_dtype) or ()),
        kv_dtypes=tuple(_as_list(kv_dtype) or ()), max_num_seqs=_as_list(max_num_seqs),
        max_num_batched_tokens=_as_list(max_num_batched_tokens), max_model_len=max_model_len,
        engine=engine, calibration=None if calibration is None else str(calibration),
        objective=objective, **({} if headroom is None else {"headroom": headroom}))
    return run_plan(recommend_doc(model, lane, opts, day), verify=verify,
                    catalog_dirs=catalog_dirs, disagg=disagg)


def disaggregated(model: str, gpu: str, *, prefill_workers: int, decode_workers: int,
                  prefill: dict[str, Any] | None = None, decode: dict[str, Any] | None = None,
                  kv_link: str = "auto", calibration: str | Path | Any = None,
                  catalog_dirs: tuple[str, ...] = (), engine_notation: bool = False,
                  catalog: Catalog | None = None, prefill_router: str = "round-robin",
                  decode_router: str = "round-robin", **options: Any) -> Any:
    """A fixed disaggregated layout (capplan.plan.pd.PdLayout): `prefill_workers` x the
    deployment of `options` updated by `prefill` (e.g. {"tp": 8}), `decode_workers` x the same
    updated by `decode` (a pool may name its own "gpu"); the KV link `auto`, `nvlink` or
    `network`; `prefill_router`, `decode_router`: how the replay's frontend places requests
    on each pool's workers (capplan.sim.pd.ROUTERS: round-robin, random, least-outstanding;
    capplan.sim.routers aliases such as least_loaded accepted)."""
    from capplan.plan.pd import PdPools, build_layout

    for extra in (options, prefill or {}, decode or {}):
        unknown = sorted(set(extra) - set(_ENGINE_KEYS) - {"gpu"})
        if unknown:
            raise InputError(f"unknown engine option(s) {', '.join(unknown)}: expected "
                             f"{', '.join(_ENGINE_KEYS)}")
    pools = PdPools(prefill_workers=prefill_workers, decode_workers=decode_workers,
                    prefill=dict(prefill or {}), decode=dict(decode or {}), kv_link=kv_link,
                    prefill_router=prefill_router, decode_router=decode_router)
    return build_layout(catalog or load_catalog(catalog_dirs), model, gpu, pools,
                        calibration=calibration, engine_notation=engine_notation, **options)


def pd_latency(model: str, gpu: str, *, prefill_workers: int | None = None,
               decode_workers: int | None = None,
               prefill: dict[str, Any] | None = None, decode: dict[str, Any] | None = None,
               kv_link: str = "auto", rate: float | None = None,
               concurrency: int | None = None, trace: str | None = None,
               input_len: str | int = 512, output_len: str | int = 256,
               burstiness: float = 1.0, num_prompts: int | None = None,
               check: bool = True, seed: int = 0, peak_concurrency: int | None = None,
               benchmark: str | None = None, time_unit: str = "auto",
               **kw: Any) -> LatencyResult:
    """Latency of a fixed disaggregated layout (open loop, closed loop or a trace's rate and
    lengths): TTFT = prefill queue + prefill + KV transfer + decode admission, TBT from the
    decode pool; `data["pools"]` holds each pool's figures and `data["saturated_pools"]` names
    a pool that cannot keep up (then `stable` is False). The analytic solve answers, checked
    against the replay of the same load when `check` (`data["answered_by"]` says which; a
    closed loop is answered by the replay of its benchmark, capplan.plan.pd_sim.
    closed_loop_latency: `num_prompts` requests, default 1000, or the protocol of the tool
    `benchmark` names; `seed`: the replay's arrivals and lengths). Neither worker count: a
    closed loop's implied counts, sized for `peak_concurrency` clients (default
    `concurrency`; capplan.plan.pd.implied_workers; `data["implied_workers"]`).
    `prefill_router`, `decode_router` (in `kw`): the replay's, as `disaggregated` takes them;
    `time_unit`: a trace's arrival times' unit (auto, s, ms, us), as `latency` reads it."""
    from capplan.plan.load import load_spec_from_options
    from capplan.plan.pd import implied_layout
    from capplan.plan.pd import pd_latency as _pd_latency
    from capplan.plan.pd_sim import PdLoad, pd_latency_checked

    check_kwargs(rate=rate, concurrency=concurrency, burstiness=burstiness,
                 num_prompts=num_prompts, seed=seed)
    implied = prefill_workers is None and decode_workers is None
    if implied and concurrency is None:
        raise InputError("a layout without worker counts needs a concurrency (the counts are "
                         "implied from it)")
    if peak_concurrency is not None and not implied:
        raise InputError("peak_concurrency sizes implied worker counts: give it without "
                         "prefill_workers and decode_workers")
    lay = disaggregated(model, gpu, prefill_workers=1 if implied else prefill_workers,
                        decode_workers=1 if implied else decode_workers, prefill=prefill,
                        decode=decode, kv_link=kv_link, **kw)
    load = load_spec_from_options(rate, concurrency, trace, str(input_len), str(output_len),
                                  burstiness, lay.decode.memory.max_model_len,
                                  num_prompts=num_prompts, time_unit=time_unit)
    note = None
    if implied:
        lay, note = implied_layout(lay, load, kv_link, peak_concurrency)
    res = _pd_latency(lay, load) if not check else pd_latency_checked(
        lay, load, PdLoad(trace=trace, input_len=str(input_len), output_len=str(output_len),
                          burstiness=burstiness, seed=seed, time_unit=time_unit),
        benchmark=benchmark)
    if note:
        res["implied_workers"] = note
    return LatencyResult.from_dict(res)


def pd_simulate(model: str, gpu: str, *, prefill_workers: int, decode_workers: int,
                prefill: dict[str, Any] | None = None, decode: dict[str, Any] | None = None,
                kv_link: str = "auto", rate: float | None = None,
                concurrency: int | None = None, trace: str | None = None,
                input_len: str | int = 512, output_len: str | int = 256,
                burstiness: float = 1.0, requests: int = 1000, seed: int = 0,
                sim_engine: str = "auto", time_unit: str = "auto",
                **kw: Any) -> LatencyResult:
    """Replay a fixed disaggregated layout step by step (capplan.sim.pd): the prefill pool runs
    the prompts, the KV moves over the link, the decode pool runs the outputs; open loop,
    closed loop (clients across both pools) or a trace. `data["pools"]` holds each pool's
    figures and `data["saturated_pools"]` the pools that could not keep up.
    `prefill_router`, `decode_router` (in `kw`): as `disaggregated` takes them."""
    from capplan.plan.pd_sim import PdLoad, pd_requests, simulate_pd

    check_kwargs(rate=rate, concurrency=concurrency, burstiness=burstiness, requests=requests,
                 seed=seed)
    lay = disaggregated(model, gpu, prefill_workers=prefill_workers,
                        decode_workers=decode_workers, prefill=prefill, decode=decode,
                        kv_link=kv_link, **kw)
    spec = PdLoad(rate=rate, concurrency=concurrency, trace=trace, input_len=str(input_len),
                  output_len=str(output_len), burstiness=burstiness, requests=requests,
                  seed=seed, time_unit=time_unit)
    reqs, _ = pd_requests(lay, spec)
    return LatencyResult.from_dict(simulate_pd(lay, reqs, sim_engine, spec))


def verify(plan: str | Path | dict[str, Any], *, endpoint: str | None = None,
           write_dataset: str | None = None, client: str = "capplan", **kw: Any) -> Any:
    """Run a plan's workload (a plan JSON/YAML path or the dict `run_plan(...).to_dict()` gives)
    against a running server and/or write it as a client's dataset file; `.rows()` holds
    predicted vs measured (capplan.plan.verify_endpoint.VerifyResult). A day plan is verified
    at its peak window; a plan of several models needs `model`. Further keywords:
    VerifyOptions' fields (model, served_model, requests, seed, trace, timeout_s,
    calibration_out, layout, lane: a plan of a pool per lane's lane)."""
    from capplan.plan.verify_endpoint import VerifyOptions, verify_plan

    known = [f.name for f in fields(VerifyOptions)]
    _refuse_unknown("verify", {k: v for k, v in kw.items() if k not in known}, known)
    return verify_plan(plan, VerifyOptions(endpoint=endpoint, write_dataset=write_dataset,
                                           client=client, **kw))
