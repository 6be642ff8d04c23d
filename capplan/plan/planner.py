"""The main job: from a plan (model, candidates, lanes with SLOs) to ranked recommendations with
their binding constraint, margins, engine flags, simulator verification, Pareto front and curves.

The steps, each a function below: pool the lanes' traffic, resolve the search space, search
every candidate analytically (search.py), keep the best candidate of each (GPU, TP, dtypes),
rank, check the best with the simulator (verified.py), explain the ranking.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np

from capplan.catalog.loader import Catalog, ResolvedModel
from capplan.catalog.schema import ModelSpec
from capplan.errors import CapplanError, InfeasibleError, InputError
from capplan.models.engine import engine_profile
from capplan.models.layout import describe
from capplan.models.memory import checkpoint_bytes, memory_report
from capplan.models.perf import build_step_model, knee_batch
from capplan.models.prefix import PrefixCache
from capplan.models.queueing import summarize
from capplan.plan.deployment import device_for
from capplan.plan.features_plan import feature_space, image_lanes, speculation_note
from capplan.plan.flags import engine_flags, place_together
from capplan.plan.launch import layout_of, max_model_len_choice
from capplan.plan.lengths import length_stats, pooled_stats
from capplan.plan.result import (
    Curve,
    CurvePoint,
    ParetoPoint,
    PlanInputs,
    PlanResult,
    PoolComparison,
    Prediction,
    Recommendation,
    SeparatePool,
)
from capplan.plan.schema import Lane, PlanFile
from capplan.plan.search import (
    DEFAULT_CHUNKS,
    DEFAULT_SEQS,
    DEFAULT_TPS,
    Candidate,
    ConfigGroup,
    Keep,
    RankKey,
    SearchResult,
    SearchSpace,
    Traffic,
    _tp_ok,
    build_candidates,
    check_calibration_candidate,
    nearest_miss,
    rank_key,
    refused,
    searched_budgets,
)
from capplan.plan.search_bound import MAX_REPLICAS, NEAR_FLOOR_FRAC, planner_search
from capplan.plan.slo import SloSet
from capplan.plan.verified import (
    Meanwhile,
    PlanPool,
    VerifyFn,
    near_floor,
    prepare,
    verified,
)
from capplan.plan.verified import queue_model as _queue_model  # burst.py reads it here
from capplan.plan.verify import PARALLEL_MIN_REQUESTS

OVERSIZED_GPUS, OVERSIZED_COST = 4.0, 3.0
"""Runner-ups needing more than 4x the best's GPUs (and 8 more) or 3x its cost are not shown."""


def traffic_for(lanes: Sequence[Lane], max_model_len: int | None = None) -> Traffic:
    """Pool lanes: lengths mixed in proportion to rates; the strictest SLO of each kind.
    Prompts are cut so that prompt + output fit max_model_len, as vLLM requires."""
    total = sum(lane.rate_per_s for lane in lanes)
    scv = sum(lane.rate_per_s / total / lane.burstiness for lane in lanes)
    if any(ln.prefix is not None for ln in lanes):
        from capplan.plan.prefix import pooled_prefix

        i_s, o_s, pc = pooled_prefix([(ln.rate_per_s, ln.prefix.spec() if ln.prefix else None,
                                       ln.input_len, ln.output_len) for ln in lanes],
                                     max_model_len)
        inp, out = length_stats(i_s, o_s)
    else:
        inp, out = pooled_stats([(ln.rate_per_s, ln.input_len, ln.output_len) for ln in lanes],
                                max_model_len)
        pc = PrefixCache()
    return Traffic(total, inp, out, scv, SloSet.strictest(SloSet.of(ln.slo) for ln in lanes),
                   tuple(lane.name for lane in lanes),
                   priority_scheduling=len({ln.priority for ln in lanes}) > 1, prefix=pc,
                   lane_slos=tuple((ln.name, SloSet.of(ln.slo)) for ln in lanes))


def served_traffic(lanes: Sequence[Lane], plan: PlanFile, model: ModelSpec) -> Traffic:
    """The lanes' traffic as the planned servers take it: lengths cut to fit the max-model-len
    the plan launches (the plan's own, else twice the p99 request: max_model_len_choice), as
    the server rejects a longer request; the model's context when that is the shorter."""
    context = model.context_len(plan.engine.max_model_len)
    t = traffic_for(lanes, context)
    launched, _ = max_model_len_choice(model.max_position_embeddings, t.inp.q["p99"],
                                       t.out.q["p99"], plan.engine.max_model_len)
    return traffic_for(lanes, launched) if launched < context else t


def _as_tuple(v: list[int] | int | None, default: tuple[int, ...]) -> tuple[int, ...]:
    if v is None:
        return default
    return tuple(v) if isinstance(v, list) else (v,)


def search_space(cat: Catalog, plan: PlanFile, model: ModelSpec, t: Traffic,
                 implied_dtype: str | None) -> SearchSpace:
    # a CPU calibration's host key names its device with that file (deployment.device_for)
    gpus = [device_for(cat, g, plan.calibration) for g in plan.candidates.gpus] \
        if plan.candidates.gpus else sorted(cat.gpus.values(), key=lambda g: g.key)
    check_calibration_candidate(plan.calibration, gpus)
    gpus = list({g.key: g for g in gpus}.values())  # one GPU named twice (an alias, NVML name)
    prices = {device_for(cat, name, plan.calibration).key: usd
              for name, usd in plan.candidates.prices.items()}
    gpus = [g.model_copy(update={
        "price_per_hour_usd": prices[g.key],
        "source": {**g.source, "price_per_hour_usd": "given in the plan (candidates.prices)"}})
        if g.key in prices else g for g in gpus]
    max_len, len_reason = max_model_len_choice(model.max_position_embeddings, t.inp.q["p99"],
                                               t.out.q["p99"], plan.engine.max_model_len)
    for key in ("attention_dp", "expert_parallel"):
        if getattr(plan.engine, key) != 1:
            raise InputError(f"engine.{key} {getattr(plan.engine, key)}: recommend and plan "
                             "choose layouts themselves (plain TP; for MoE models attention DP "
                             "+ EP over each world); size a given layout with `capplan latency "
                             "--attention-dp N --expert-parallel N` or disaggregated_layout:")
    if max_len > model.max_position_embeddings:
        raise InputError(f"engine.max_model_len {max_len} exceeds {model.key}'s "
                         f"{model.max_position_embeddings}")
    wds = tuple(plan.candidates.weight_dtypes)
    if wds == ("auto",) and implied_dtype:
        wds = (implied_dtype,)
    return SearchSpace(
        gpus=gpus, tps=tuple(plan.candidates.tp or DEFAULT_TPS), weight_dtypes=wds,
        kv_dtypes=tuple(plan.candidates.kv_dtypes),
        max_num_seqs=_as_tuple(plan.engine.max_num_seqs, DEFAULT_SEQS),
        max_num_batched_tokens=_as_tuple(plan.engine.max_num_batched_tokens, DEFAULT_CHUNKS),
        gpu_memory_utilization=plan.engine.gpu_memory_utilization, max_model_len=max_len,
        block_size=plan.engine.block_size, engine=plan.engine.profile_spec,
        calibration=plan.calibration, max_model_len_reason=len_reason,
        **_features(plan, t, model))


def _features(plan: PlanFile, t: Traffic, model: ModelSpec) -> dict[str, Any]:
    """The SearchSpace fields of speculative decoding, LoRA and images (features_plan)."""
    fs = feature_space(plan, t.lanes, model)
    return {"features": tuple(sorted(fs["fixed"].items())), "spec_tokens": fs["spec_tokens"],
            "max_loras": fs["max_loras"],
            "prefill_extra_flops_per_token": fs["prefill_extra_flops_per_token"]}


def _finish(r: Recommendation, i: int, model: ModelSpec, t: Traffic) -> Recommendation:
    """Rank, launch lines (each engine's memory fraction from the planned memory) and what
    `auto` dtypes mean for this checkpoint."""
    mem = memory_report(model, r.candidate.gpu, r.candidate.settings)
    kvd = r.candidate.settings.kv_dtype
    kv_label = kvd if kvd != "auto" else ("fp8" if mem.kv_dtype_bytes == 1 else
                                          "fp16" if model.torch_dtype == "fp16" else "bf16")
    relaunch = partial(engine_flags, model, r.settings_dict(), t, mem,
                       gpus_per_node=r.candidate.gpu.host_gpus)
    return r.with_(rank=i + 1, engine_flags=relaunch(), relaunch=relaunch,
                   resolved_dtypes=(mem.weight_dtype, kv_label),
                   speculation=_speculation(model, r, t))


def _speculation(model: ModelSpec, r: Recommendation, t: Traffic) -> dict[str, Any] | None:
    """Where speculative decoding stops paying on the recommendation's own step model."""
    c = r.candidate
    s = c.settings
    if not s.speculative or s.spec_tokens == 0:
        return None
    plain = build_step_model(model, c.gpu, s.with_(speculative=None), c.group.calibration)
    return speculation_note(c.step, plain, s.max_num_seqs, t.inp.mean + t.out.mean / 2)


def _recommendation(c: Candidate, found: SearchResult, t: Traffic) -> Recommendation:
    """What the analytic model says about candidate c, replicated to carry the target rate."""
    pred = summarize(found.at_plan, c.index)
    return Recommendation(candidate=c, per_replica_rate_per_s=t.rate_per_s / c.replicas,
                          predicted=Prediction.of(pred), slo_margins=t.slos.margins(pred),
                          calibration=c.group.calibration.source)


def _pareto(recs: Sequence[Recommendation]) -> list[ParetoPoint]:
    pts = [(r, (r.cost_per_hour, r.predicted.ttft_s.p99, r.predicted.tbt_s.p99))
           for r in recs if r.cost_per_hour is not None]

    def dominated(a: tuple[float, ...]) -> bool:
        return any(all(x <= y for x, y in zip(b, a, strict=True))
                   and any(x < y for x, y in zip(b, a, strict=True)) for _, b in pts)

    # the dtypes `auto` resolved to (_finish), as the recommendations show them
    front = [ParetoPoint(r.candidate.gpu.key, r.candidate.settings.tp, r.replicas,
                         r.resolved_dtypes[0] or r.candidate.settings.weight_dtype,
                         r.resolved_dtypes[1] or r.candidate.settings.kv_dtype, *a)
             for r, a in pts if not dominated(a)]
    return sorted(front, key=lambda p: p.cost_per_hour)


def _curve(r: Recommendation, t: Traffic) -> Curve:
    c, s = r.candidate, r.candidate.settings
    rates = np.linspace(0.1, 1.0, 10) * max(c.capacity_per_s, 1e-6) * 0.98
    res = _queue_model(c, t).at_rate(rates)
    pts = [CurvePoint(float(x), float(x * t.out.mean), float(res["ttft_s"]["p99"][k]),
                      float(res["tbt_s"]["p99"][k]), float(res["tbt_s"]["mean"][k]))
           for k, x in enumerate(rates)]
    label = (f"{c.gpu.key} tp{s.tp} {s.weight_dtype} seqs{s.max_num_seqs} "
             f"chunk{s.max_num_batched_tokens}")
    return Curve(label, pts, s.tp * s.pp * s.attention_dp)


def point_warnings(r: Recommendation, ctx_mean: float) -> list[str]:
    """What to warn about recommendation r at its planned rate (a concurrency cap far above
    what it keeps running, a point past the throughput knee)."""
    out = []
    running = r.predicted.mean_running_batch
    seqs = r.candidate.settings.max_num_seqs
    # At capacity the cap binds when it is the binding constraint: then it matters, whatever
    # the planned load keeps running.
    cap_binds = r.candidate.binding_constraint.startswith("concurrency cap")
    if seqs > 4 * max(running, 1) and not cap_binds:
        out.append(f"max_num_seqs {seqs} far exceeds the ~{running:.0f} sequences "
                   f"the planned {r.per_replica_rate_per_s:.3g} req/s keeps running per replica "
                   "(it only costs sampler and CUDA-graph memory, but says nothing about "
                   "capacity)")
    batches = 2 ** np.arange(0, 12)
    tps = batches / r.candidate.step.decode_step(batches, ctx_mean)["step_s"]
    knee = knee_batch(batches, tps)
    if knee is not None and running > knee:
        out.append(f"the recommended point runs ~{running:.0f} sequences per replica, past the "
                   f"throughput knee at batch {knee}: latency grows faster than throughput")
    return out


def run_plan(cat: Catalog, plan: PlanFile, verify: VerifyFn | None = None,
             progress: Callable[[int, int], object] | None = None,
             disagg: bool = False) -> PlanResult:
    """Plan every pool layout asked for (see PlanResult.to_dict for the JSON);
    `progress(done, total)` is called after each pool is planned. `disagg`: also size a
    disaggregated prefill/decode layout for the shared pool and say which wins."""
    resolved = cat.resolve_model(plan.model)
    written = list(plan.workloads)
    if any(ln.images_per_request for ln in written):
        plan = plan.model_copy(update={"workloads": image_lanes(resolved.spec, written)})
    lanes = list(plan.workloads)
    per_lane = len(lanes) > 1 and plan.pools in ("separate", "both")
    total = 1 + len(lanes) * per_lane
    early: dict[str, Any] = {}

    def pd_meanwhile(guess: Recommendation) -> None:
        """The disaggregated plan for the GPU type of the best before verification, sized
        while the workers simulate (the verified best nearly always keeps that type)."""
        key = guess.candidate.gpu.key
        with contextlib.suppress(CapplanError):  # raised again if that type is the one read
            early[key] = _disaggregated_plan(cat, plan, resolved, lanes, key)

    try:
        result = _plan_pool(cat, plan, resolved, lanes, verify,
                            meanwhile=pd_meanwhile if disagg else None)
    except InfeasibleError as e:  # a P/D layout may meet what no aggregated fleet does
        if not disagg:
            raise
        raise InfeasibleError(str(e) + _disagg_hint(cat, plan, resolved, lanes)) from None
    if progress is not None:
        progress(1, total)
    if per_lane:
        result = _per_lane_pools(cat, plan, resolved, result, progress)
    if disagg:
        result = replace(result, disaggregated=_disaggregated(
            cat, plan, resolved, lanes, result, early,
            replay=verify is not None and plan.verify.top > 0
            and all(ln.rate_per_s for ln in lanes)))
    result = _alternatives(cat, plan, resolved, result)
    if written != list(plan.workloads):  # the lanes as written: text tokens, images beside
        result = replace(result, lanes=written, image_tokens={
            a.name: int(str(b.input_len)) - int(str(a.input_len))
            for a, b in zip(written, plan.workloads, strict=True)
            if a.images_per_request})
    return result


def _per_lane_pools(cat: Catalog, plan: PlanFile, resolved: ResolvedModel, result: PlanResult,
                    progress: Callable[[int, int], object] | None) -> PlanResult:
    """A pool per lane beside the shared one, and which costs less."""
    lanes = list(plan.workloads)
    total = 1 + len(lanes)
    separate = []
    for i, ln in enumerate(lanes, 2):
        separate.append(_separate(cat, plan, resolved, ln))
        if progress is not None:
            progress(i, total)
    separate = _placed_together(separate)
    pools = PoolComparison(result.best, separate)
    cost, cheaper = pools.separate_cost_per_hour, pools.cheaper
    note = (f"pools: one shared pool costs {_money(result.best.cost_per_hour)}/h, a pool per "
            f"lane {_money(cost)}/h: " + ("they cost the same (shared keeps spare capacity "
                                          "for either lane)" if cheaper == "equal"
                                          else f"{cheaper} is cheaper"))
    return replace(result, pools=pools, warnings=[*result.warnings, note])


def _alternatives(cat: Catalog, plan: PlanFile, resolved: ResolvedModel, result: PlanResult
                  ) -> PlanResult:
    """What the prefix cache saves, the FP8 alternative where it is cheaper, and the fixed
    disaggregated layout the plan names."""
    from capplan.plan.alternatives import (
        fp8_alternative,
        prefix_savings,
        scheduler_alternative,
        scheduler_option,
        shown,
        wants_fp8_alternative,
    )

    lanes = list(plan.workloads)
    t = served_traffic(lanes, plan, resolved.spec)
    tau = float(np.max(result.best.candidate.step.spec_accept_len))
    if tau > 1.0 and any(ln.slo.tbt_p99_s for ln in lanes):  # docs/features.md, speculation
        result = replace(result, warnings=[*result.warnings, (
            f"speculation: TBT is the mean gap per accepted token; a stream receives about "
            f"{tau:.2f} tokens per speculative step, so a client timing each streamed chunk "
            f"(vllm bench serve's ITL) sees gaps up to {tau:.2f}x those, and every chunk's "
            "prefill stall whole: check the TBT SLO against what your client measures")])
    saved = prefix_savings(_best_pool, cat, plan, resolved, lanes, result.best, t)
    if saved is not None:
        result = replace(result, prefix_cache=saved)

    if wants_fp8_alternative(plan, resolved, cat):
        alt = fp8_alternative(_best_pool, cat, plan, resolved, lanes, result.recommendations)
        if shown(alt, result.best):
            result = replace(result, fp8_alternative=alt)
    option = scheduler_option(plan)
    if option is not None:
        alt = scheduler_alternative(_best_pool, cat, plan, resolved, lanes,
                                    result.recommendations, option)
        if shown(alt, result.best):
            result = replace(result, scheduler_alternative=alt)
    if plan.disaggregated_layout is not None:
        from capplan.plan.pd import fixed_layout_for_plan

        result = replace(result, fixed_disaggregated=fixed_layout_for_plan(
            cat, plan, resolved, t))
    return result


def _disaggregated(cat: Catalog, plan: PlanFile, resolved: ResolvedModel, lanes: list[Lane],
                   result: PlanResult, early: dict[str, Any], replay: bool = False
                   ) -> dict[str, Any]:
    """The disaggregated plan beside the aggregated one, and which wins; `early`: plans sized
    already, by GPU type (`run_plan`'s pd_meanwhile); `replay`: a layout that could win (it,
    or it with one prefill replica fewer, costs less than the aggregated best) is replayed at
    the plan's rate plus the headroom, with fewer prefill replicas while the replay has margin
    (disagg.verified_layout), and wins only if the replay meets the SLOs too."""
    from capplan.plan.disagg import compare, verified_layout

    key = result.best.candidate.gpu.key
    d = early[key] if key in early else _disaggregated_plan(cat, plan, resolved, lanes, key)
    best = result.best
    agg = (best.gpus_total, best.cost_per_hour, best.candidate.binding_constraint)
    checked = None
    if d and replay:  # only a layout that could win needs the check
        d, checked = verified_layout(
            d, lanes, served_traffic(lanes, plan, resolved.spec),
            plan.verify.requests_per_check, plan.headroom,
            lambda x: compare(*agg, x).startswith("disaggregated"))
    verdict = compare(*agg, d, checked)
    return {**(d.to_dict() if d else {}), **(_disagg_verify(d, lanes) if d else {}),
            **({"replay": checked} if checked else {}),
            "verdict": verdict, "winner": verdict.split(" wins")[0]}


def _disagg_verify(d: Any, lanes: list[Lane]) -> dict[str, str]:
    """The verify steps of a disaggregated layout: the plan's whole workload (every lane's
    rate) sent to the front end, on the port its router or proxy listens on (pd_front_port)."""
    from capplan.plan.bench_cmds import verify_lines
    from capplan.plan.launch import pd_front_port

    engine = d.decode.dep.profile.name
    t = traffic_for(lanes)
    return verify_lines(d.decode.dep.served_id, t.rate_per_s, engine, pd_front_port(engine),
                        t, layout="disaggregated")


def _disaggregated_plan(cat: Catalog, plan: PlanFile, resolved: ResolvedModel,
                        lanes: list[Lane], gpu_key: str) -> Any:
    """plan_disaggregated on one GPU type (each pool picks its layout): the aggregated
    recommendation's, side by side with it (every catalog GPU would cost ~0.2 s each)."""
    from capplan.plan.disagg import plan_disaggregated

    model = resolved.spec
    t = served_traffic(lanes, plan, model)
    space = search_space(cat, plan, model, t, resolved.implied_weight_dtype)
    space = replace(space, gpus=[g for g in space.gpus if g.key == gpu_key])
    def top(v: Any) -> int | None:  # a pinned value or the largest of a searched list
        return max(v) if isinstance(v, list) and v else (v if isinstance(v, int) else None)

    pinned = {"max_num_seqs": top(plan.engine.max_num_seqs),
              "max_num_batched_tokens": top(plan.engine.max_num_batched_tokens)}
    return plan_disaggregated(cat, model, space, t, plan.headroom, plan.model, pinned)


def _disagg_hint(cat: Catalog, plan: PlanFile, resolved: ResolvedModel, lanes: list[Lane]
                 ) -> str:
    """When no aggregated fleet meets the SLOs: the cheapest disaggregated layout that does
    on the analytic screen (each candidate GPU type), as the fixed-layout flags `latency` and
    `simulate` take to predict and replay it; "" when none does."""
    from capplan.plan.pd import pool_flags

    model = resolved.spec
    space = search_space(cat, plan, model, served_traffic(lanes, plan, model),
                         resolved.implied_weight_dtype)
    found = []
    for gpu in space.gpus:
        with contextlib.suppress(CapplanError):
            d = _disaggregated_plan(cat, plan, resolved, lanes, gpu.key)
            if d is not None:
                found.append(d)
    if not found:
        return ""
    d = min(found, key=lambda x: (math.inf if x.cost_per_hour is None else x.cost_per_hour,
                                  x.gpus))

    def flags(role: str, pool: Any) -> str:
        return f"--{role}-workers {pool.replicas} {pool_flags(role, pool.dep)}"

    dep = d.decode.dep
    same = (f"--engine {dep.profile.spec} --max-model-len {dep.memory.max_model_len}"
            + "".join(f" --{k}-dtype {v}" for k, v in (("weight", dep.settings.weight_dtype),
                                                       ("kv", dep.settings.kv_dtype))
                      if v != "auto"))
    cost = "" if d.cost_per_hour is None else f", ${d.cost_per_hour:,.2f}/h"
    return (f"; a disaggregated layout meets them on the analytic screen: {d.gpus} "
            f"{dep.gpu.key} GPUs{cost} (`capplan latency` or `simulate` with --gpu "
            f"{dep.gpu.key} {same} {flags('prefill', d.prefill)} {flags('decode', d.decode)} "
            "predicts and replays it)")


def _placed_together(pools: list[SeparatePool]) -> list[SeparatePool]:
    """The lanes' pools, which run at once, with their launch lines placed as one
    (flags.place_together)."""
    planned = [p for p in pools if p.best is not None]
    placed = iter(place_together([p.best for p in planned]))
    return [replace(p, best=next(placed)) if p.best is not None else p for p in pools]


def _separate(cat: Catalog, plan: PlanFile, resolved: ResolvedModel, lane: Lane
              ) -> SeparatePool:
    try:
        return SeparatePool(lane.name, best=_best_pool(cat, plan, resolved, [lane], None).best)
    except InfeasibleError as e:
        return SeparatePool(lane.name, error=str(e))


def _money(x: float | None) -> str:
    return "unknown" if x is None else f"${x:,.2f}"


def _groups(cat: Catalog, model: ModelSpec, space: SearchSpace, keep: Keep | None = None
            ) -> list[ConfigGroup]:
    """Step models of every (GPU, TP, dtypes) that can hold the model (of those `keep`
    allows); one line if none."""
    groups = build_candidates(cat, model, space, keep=keep)
    if not any(_tp_ok(model, tp, g) for g in space.gpus for tp in space.tps):
        raise InputError(
            f"no TP size in {list(space.tps)} works for {model.key} on "
            f"{', '.join(g.key for g in space.gpus)}: TP must divide the "
            f"{model.num_attention_heads} attention heads (and divide or be a multiple of the "
            f"{model.num_kv_heads} KV heads) and fit in one node")
    if not groups:
        why, every = refused(cat, model, space)
        if every:
            raise InfeasibleError(f"no configuration of {model.key} to search on "
                                  f"{', '.join(g.key for g in space.gpus)}: {'; '.join(why)}")
        raise InfeasibleError(
            f"{model.key} does not fit on any candidate GPU ({', '.join(g.key for g in space.gpus)}"
            f") with TP in {list(space.tps)} at max_model_len {space.max_model_len}: add larger "
            "GPUs, more TP, or a smaller dtype" + _refused_note(cat, model, space))
    return groups


def _refused_note(cat: Catalog, model: ModelSpec, space: SearchSpace) -> str:
    """"; not searched: ..." for configurations the engine cannot run (search.refused)."""
    why, _ = refused(cat, model, space)
    return f"; not searched: {'; '.join(why)}" if why else ""


def _near_floor_note(c: Candidate, found: SearchResult, t: Traffic, headroom: float) -> str:
    """The floor, what one replica carries within the SLOs, and what relaxing them buys."""
    i, j = c.index
    s = c.settings
    floor = "; ".join(f"{tgt.stat} {tgt.label} "
                      f"{float(found.at_floor[tgt.metric][tgt.stat][i, j]) * 1e3:.0f}"
                      f" ms (SLO {tgt.limit_s * 1e3:.0f} ms)" for tgt in t.slos)
    half_rate = 0.5 * c.capacity_per_s
    with np.errstate(all="ignore"):
        half = _queue_model(c, t).at_rate(np.asarray(half_rate))
    relax = ", ".join(f"{tgt.label} {tgt.stat} to >= "
                      f"{float(half[tgt.metric][tgt.stat]) * 1e3:.0f} ms"
                      for tgt in t.slos if float(half[tgt.metric][tgt.stat]) > tgt.limit_s)
    reps = max(1, math.ceil(t.rate_per_s * (1 + headroom) / half_rate - 1e-9))
    layout = layout_of({"tp": s.tp, "pp": s.pp, "attention_dp": s.attention_dp,  # its GPUs
                        "expert_parallel": s.expert_parallel,
                        "layout": describe(s.tp, s.pp, s.attention_dp, s.expert_parallel,
                                           c.gpu.interconnect.max_gpus_per_node)})
    return (f"the SLOs are near the latency floor of {c.gpu.key} {layout} ({s.weight_dtype}), "
            f"unloaded {floor}: within them one replica carries "
            f"{c.max_rate_per_s:.3g} req/s, {c.max_rate_per_s / c.capacity_per_s:.0%} of the "
            f"{c.capacity_per_s:.3g} req/s it sustains, so {c.replicas} replicas "
            f"({c.gpus_total} GPUs) would be needed; relaxing {relax or 'them'} lets replicas "
            f"run at half their capacity ({reps} replicas, {reps * s.tp * s.pp * s.attention_dp} "
            f"GPUs), "
            "as may a faster GPU or more TP")


def _shortlist(found: SearchResult, t: Traffic, plan: PlanFile, key: RankKey
               ) -> tuple[list[Candidate], list[str]]:
    """The best feasible candidate of each (GPU, TP, weight dtype, KV dtype), ranked, and
    warnings about what was left out. Raises InfeasibleError when nothing is left."""
    # A configuration needing thousands of replicas is a rounding artefact of the bisection
    # near zero rate, not a plan.
    feasible = [c for c in found.candidates
                if c.max_rate_per_s > 0 and c.replicas <= MAX_REPLICAS]
    near = [c for c in feasible if near_floor(c)]
    usable = feasible if plan.allow_near_floor else [c for c in feasible if not near_floor(c)]
    if not usable:
        raise _nothing_usable(near, found, t, plan, key)
    warnings = []
    left_out = {c.family for c in near} - {c.family for c in usable}
    if left_out:
        warnings.append(f"{len(left_out)} configuration(s) left out: their SLOs are near the "
                        f"latency floor and keep each replica under {NEAR_FLOOR_FRAC:.0%} of "
                        "its capacity (allow_near_floor: true shows them)")
    return _best_per_family(usable, key), warnings


def _nothing_usable(near: list[Candidate], found: SearchResult, t: Traffic, plan: PlanFile,
                    key: RankKey) -> InfeasibleError:
    """Why no candidate is left: the best one near the latency floor, else the nearest miss."""
    if near:
        return InfeasibleError(
            "no fleet of sensible size meets the SLOs: "
            + _near_floor_note(min(near, key=key), found, t, plan.headroom)
            + " (allow_near_floor: true in the plan, or recommend --allow-near-floor, "
            "shows that fleet anyway)")
    return _NearestMiss(nearest_miss(found, t))


class _NearestMiss(InfeasibleError):
    """No configuration meets the SLOs even at negligible load (the screen's nearest miss,
    which the replay refines where it runs: nearest.replayed_miss)."""


def _best_per_family(usable: list[Candidate], key: RankKey) -> list[Candidate]:
    best: dict[tuple[str, int, str, str], Candidate] = {}
    for c in usable:
        if c.family not in best or key(c) < key(best[c.family]):
            best[c.family] = c
    return sorted(best.values(), key=key)


def _plan_pool(cat: Catalog, plan: PlanFile, resolved: ResolvedModel, lanes: list[Lane],
               verify: VerifyFn | None, best_only: bool = False,
               keep: Keep | None = None, meanwhile: Meanwhile | None = None) -> PlanResult:
    """One pool planned. `best_only`: the caller reads only `.best` (its other
    recommendations and warnings are those of the configurations searched exactly); `keep`:
    the (GPU, settings) groups searched (build_candidates); `meanwhile(best before
    verification)` runs in this process while verification workers simulate (verified.py)."""
    model = resolved.spec
    t = served_traffic(lanes, plan, model)
    pool = PlanPool(model, lanes, t, search_space(cat, plan, model, t,
                                                  resolved.implied_weight_dtype))
    groups = _groups(cat, model, pool.space, keep)
    if verify is not None and hasattr(verify, "prepare") and \
            plan.verify.top * plan.verify.requests_per_check >= PARALLEL_MIN_REQUESTS:
        prepare(verify, groups, pool)  # workers load the compiled engine meanwhile
    found = planner_search(groups, t, plan.headroom, plan.objective, best_only,
                           submit=getattr(verify, "submit", None))
    key = rank_key(plan.objective)
    try:
        shortlist, warnings = _shortlist(found, t, plan, key)
    except InfeasibleError as e:  # say what the search left out, if anything
        why = str(e)
        if isinstance(e, _NearestMiss) and verify is not None and plan.verify.top > 0:
            from capplan.plan.nearest import replayed_miss  # the replay's, where it runs

            why = replayed_miss(found, pool, plan, verify) or why
        raise InfeasibleError(why + _refused_note(cat, model, pool.space)) from None
    ranked = [_recommendation(c, found, t) for c in shortlist]
    curves: dict[tuple[int, int], Curve] = {}

    def while_replaying(best: Recommendation) -> None:
        """`meanwhile`, then the curves of the three best before verification (those shown,
        unless a replay drops one), while the verification workers simulate."""
        if meanwhile is not None:
            meanwhile(best)
        for r in ranked[:3]:
            curves[r.candidate.index] = _curve(r, t)

    ranked = verified(ranked, pool, plan, verify, warnings, key, while_replaying)
    ranked, pruned = _prune(ranked)
    if pruned:
        warnings.append(f"{pruned} configuration(s) not listed: they need over "
                        f"{OVERSIZED_GPUS:g}x the GPUs or {OVERSIZED_COST:g}x the cost of the "
                        "best")
    if near_floor(ranked[0].candidate):  # only when the plan allows it
        warnings.append("near the floor: " + _near_floor_note(ranked[0].candidate, found, t,
                                                               plan.headroom))
    ranked = _explain(ranked)
    warnings += point_warnings(ranked[0], _queue_model(ranked[0].candidate, t).ctx_mean)
    warnings += _default_lengths(lanes) + _budgets_raised(plan, pool.space)
    ranked = [_finish(r, i, model, t) for i, r in enumerate(ranked)]
    return PlanResult(
        model=model.key, hf_id=model.hf_id, checkpoint_bytes=round(checkpoint_bytes(model)),
        objective=plan.objective, headroom=plan.headroom,
        target_rate_per_s=t.rate_per_s, lanes=list(lanes),
        inputs=PlanInputs(model=plan.model, space=pool.space, objective=plan.objective,
                          headroom=plan.headroom, pools=plan.pools,
                          configurations_searched=found.configurations_searched),
        configurations_searched=found.configurations_searched, recommendations=ranked,
        pareto=_pareto(ranked), warnings=warnings,
        curves=[curves[r.candidate.index] if r.candidate.index in curves else _curve(r, t)
                for r in ranked[:3]])


def _budgets_raised(plan: PlanFile, space: SearchSpace) -> list[str]:
    """Say so when token budgets the plan file gave were raised to max-model-len (an engine
    that prefills whole prompts runs with one that holds the longest: searched_budgets)."""
    asked = plan.engine.max_num_batched_tokens
    given = [asked] if isinstance(asked, int) else list(asked or [])
    low = sorted(c for c in given if c < space.max_model_len)
    if not low or set(searched_budgets(space)) & set(given) == set(given):
        return []
    return [f"token budget{'s' if len(low) > 1 else ''} {', '.join(map(str, low))} raised to "
            f"max-model-len {space.max_model_len}: {engine_profile(space.engine).name} "
            "prefills whole prompts and rejects one over its budget (set engine.max_model_len "
            "lower, or use its chunked-prefill option, to plan a smaller budget)"]


def _best_pool(cat: Catalog, plan: PlanFile, resolved: ResolvedModel, lanes: list[Lane],
               verify: VerifyFn | None, keep: Keep | None = None) -> PlanResult:
    """_plan_pool for a caller that reads only the best plan."""
    return _plan_pool(cat, plan, resolved, lanes, verify, best_only=True, keep=keep)


def _prune(ranked: list[Recommendation]) -> tuple[list[Recommendation], int]:
    """Drop runner-ups no one would run instead of the best (4x its GPUs, 3x its cost)."""
    best = ranked[0]

    def oversized(r: Recommendation) -> bool:
        gpus = (r.gpus_total > OVERSIZED_GPUS * best.gpus_total
                and r.gpus_total > best.gpus_total + 8)
        cost = (r.cost_per_hour is not None and best.cost_per_hour is not None
                and r.cost_per_hour > OVERSIZED_COST * best.cost_per_hour)
        return gpus or cost

    kept = [best] + [r for r in ranked[1:] if not oversized(r)]
    return kept, len(ranked) - len(kept)


def _default_lengths(lanes: Sequence[Lane]) -> list[str]:
    """Say so when a lane's lengths are the defaults rather than the user's."""
    out = []
    for ln in lanes:
        missing = [k for k in ("input_len", "output_len") if k not in ln.model_fields_set]
        if missing:
            got = ", ".join(f"{k} {getattr(ln, k)}" for k in missing)
            out.append(f"lane {ln.name}: no {' or '.join(missing)} given, so {got} tokens are "
                       "assumed; give your traffic's lengths, they change the answer")
    return out


def _explain(ranked: list[Recommendation]) -> list[Recommendation]:
    """Say why each runner-up is not first."""
    best = ranked[0]
    out = [best]
    for r in ranked[1:]:
        reasons = []
        if r.cost_per_hour is not None and best.cost_per_hour:
            d = r.cost_per_hour / best.cost_per_hour - 1
            if d > 0.005:
                reasons.append(f"costs {d:.0%} more")
        elif r.cost_per_hour is None:
            reasons.append("no public price for this GPU")
        if r.gpus_total > best.gpus_total:
            reasons.append(f"needs {r.gpus_total} GPUs vs {best.gpus_total}")
        reasons.append(f"limited by {r.candidate.binding_constraint} at "
                       f"{r.candidate.max_rate_per_s:.2f} req/s per replica")
        if r.verified is None and r.candidate.sized_by_replay:
            reasons[-1] += (f", its share plus the headroom at {r.replicas} replicas, which no "
                            "replay confirmed (fewer replicas missed the SLOs in simulation)")
        out.append(r.with_(why_not_first="; ".join(reasons)))
    return out
