"""The main job: from a plan (model, candidates, lanes with SLOs) to ranked recommendations with
their binding constraint, margins, engine flags, simulator verification, Pareto front and curves.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from capplan.catalog.loader import Catalog
from capplan.catalog.schema import ModelSpec
from capplan.errors import InfeasibleError, InputError
from capplan.models.perf import knee_batch
from capplan.models.queueing import LengthStats, Limits, QueueModel, summarize
from capplan.plan.flags import engine_flags
from capplan.plan.schema import Lane, PlanFile
from capplan.plan.search import (
    DEFAULT_CHUNKS,
    DEFAULT_SEQS,
    DEFAULT_TPS,
    Evaluated,
    SearchSpace,
    Traffic,
    _tp_ok,
    analytic_search,
    build_candidates,
    cost_per_hour,
    nearest_miss,
    rank_key,
    replicas_for,
)

_SEED = 20240601  # fixed: the analytic plan must not depend on a user seed
_SAMPLES = 20_000

VerifyFn = Callable[[dict[str, Any], "PoolContext"], dict[str, Any]]


@dataclass
class PoolContext:
    """What a verifier needs to simulate one recommendation."""

    model: ModelSpec
    lanes: list[Lane]
    traffic: Traffic
    step: Any
    num_gpu_blocks: int
    block_size: int
    requests: int


def lane_samples(lane: Lane, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    from capplan.sim.workload import parse_length

    i = parse_length(str(lane.input_len)).sample(rng, n)
    o = parse_length(str(lane.output_len)).sample(rng, n)
    return np.asarray(i, float), np.asarray(o, float)


def traffic_for(lanes: list[Lane], max_model_len: int | None = None) -> Traffic:
    """Pool lanes: lengths mixed in proportion to rates; the strictest SLO of each kind.
    Prompts are cut so that prompt + output fit max_model_len, as vLLM requires."""
    rng = np.random.default_rng(_SEED)
    total = sum(lane.rate_per_s for lane in lanes)
    ins, outs = [], []
    for lane in lanes:
        n = max(200, int(_SAMPLES * lane.rate_per_s / total))
        i, o = lane_samples(lane, rng, n)
        if max_model_len:
            from capplan.sim.workload import clip_lengths

            i, o = clip_lengths(i, o, max_model_len)
        ins.append(i)
        outs.append(o)
    scv = sum(lane.rate_per_s / total / lane.burstiness for lane in lanes)

    def strictest(attr: str) -> float | None:
        vals = [getattr(lane.slo, attr) for lane in lanes if getattr(lane.slo, attr)]
        return min(vals) if vals else None

    return Traffic(total, LengthStats.from_samples(np.concatenate(ins)),
                   LengthStats.from_samples(np.concatenate(outs)), scv,
                   strictest("ttft_p99_s"), strictest("tbt_p99_s"), strictest("e2e_p99_s"),
                   tuple(lane.name for lane in lanes))


def _as_tuple(v: list[int] | int | None, default: tuple[int, ...]) -> tuple[int, ...]:
    if v is None:
        return default
    return tuple(v) if isinstance(v, list) else (v,)


def search_space(cat: Catalog, plan: PlanFile, model: ModelSpec, t: Traffic,
                 implied_dtype: str | None) -> SearchSpace:
    gpus = [cat.gpu(g) for g in plan.candidates.gpus] if plan.candidates.gpus else sorted(
        cat.gpus.values(), key=lambda g: g.key)
    prices = {cat.gpu(name).key: usd for name, usd in plan.candidates.prices.items()}
    gpus = [g.model_copy(update={
        "price_per_hour_usd": prices[g.key],
        "source": {**g.source, "price_per_hour_usd": "given in the plan (candidates.prices)"}})
        if g.key in prices else g for g in gpus]
    need = t.inp.q["p99"] + t.out.q["p99"]
    auto_len = min(model.max_position_embeddings, max(4096, 2 ** math.ceil(math.log2(2 * need))))
    max_len = plan.engine.max_model_len or auto_len
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
        block_size=plan.engine.block_size)


def _single_qm(step: Any, e: Evaluated, t: Traffic) -> QueueModel:
    s = e.settings
    return QueueModel(step, t.inp, t.out, Limits(s.max_num_seqs, s.max_num_batched_tokens,
                                                 e.kv_cache_tokens), t.arrival_scv)


def _rank_stub(e: Evaluated) -> dict[str, Any]:
    """Just what rank_key reads, to pick the best configuration of each group cheaply."""
    gpus = e.replicas * e.settings.tp * e.settings.pp
    return {"cost_per_hour": cost_per_hour(e.gpu, gpus), "gpus_total": gpus,
            "replicas": e.replicas, "capacity_per_replica_rps": e.max_rate_per_s,
            "max_num_seqs": e.settings.max_num_seqs,
            "predicted": {"ttft_s": {"p99": e.ttft_p99_s}}}


def _describe(e: Evaluated, t: Traffic, headroom: float, steps: list[Any],
              pred_arrays: dict[str, Any] | None = None) -> dict[str, Any]:
    s = e.settings
    replicas = e.replicas or replicas_for(t.rate_per_s, e.max_rate_per_s, headroom)
    gpus_total = replicas * s.tp * s.pp
    per_replica = t.rate_per_s / replicas
    if pred_arrays is not None:
        pred = summarize(pred_arrays, (e.step_index, e.combo_index))
    else:
        qm = _single_qm(steps[e.step_index], e, t)
        pred = summarize(qm.at_rate(np.asarray(per_replica)))
    margins = {}
    for key, slo, name in (("ttft_s", t.ttft_p99_s, "ttft_p99"), ("tbt_s", t.tbt_p99_s,
                                                                 "tbt_p99"),
                           ("e2e_s", t.e2e_p99_s, "e2e_p99")):
        if slo is not None:
            margins[name] = 1 - pred[key]["p99"] / slo
    return {
        "gpu": e.gpu.key, "tp": s.tp, "pp": s.pp, "replicas": replicas, "gpus_total": gpus_total,
        "max_num_seqs": s.max_num_seqs, "max_num_batched_tokens": s.max_num_batched_tokens,
        "weight_dtype": s.weight_dtype, "kv_dtype": s.kv_dtype,
        "max_model_len": s.max_model_len, "gpu_memory_utilization": s.gpu_memory_utilization,
        "predicted": {k: pred[k] for k in ("ttft_s", "tbt_s", "e2e_s", "output_tokens_per_s",
                                            "input_tokens_per_s", "requests_per_s",
                                            "mean_running_batch", "preemptions",
                                            "kv_peak_utilization")},
        "capacity_per_replica_rps": e.max_rate_per_s,
        "stable_capacity_per_replica_rps": e.capacity_per_s,
        "per_replica_rate_per_s": per_replica,
        "binding_constraint": e.binding_constraint, "slo_margins": margins,
        "cost_per_hour": cost_per_hour(e.gpu, gpus_total),
        "price_per_gpu_hour": e.gpu.price_per_hour_usd,
        "kv_cache_tokens": e.kv_cache_tokens, "verified": None, "why_not_first": "",
        "_eval": e,
    }


def _pareto(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    pts = [r for r in recs if r["cost_per_hour"] is not None]
    front = []
    for r in pts:
        a = (r["cost_per_hour"], r["predicted"]["ttft_s"]["p99"], r["predicted"]["tbt_s"]["p99"])
        dominated = False
        for o in pts:
            b = (o["cost_per_hour"], o["predicted"]["ttft_s"]["p99"],
                 o["predicted"]["tbt_s"]["p99"])
            if all(x <= y for x, y in zip(b, a, strict=True)) and any(
                    x < y for x, y in zip(b, a, strict=True)):
                dominated = True
                break
        if not dominated:
            front.append({"gpu": r["gpu"], "tp": r["tp"], "replicas": r["replicas"],
                          "weight_dtype": r["weight_dtype"], "kv_dtype": r["kv_dtype"],
                          "cost_per_hour": a[0],
                          "ttft_p99_s": a[1], "tbt_p99_s": a[2]})
    return sorted(front, key=lambda x: x["cost_per_hour"])


def _curve(r: dict[str, Any], steps: list[Any], t: Traffic) -> dict[str, Any]:
    e: Evaluated = r["_eval"]
    qm = _single_qm(steps[e.step_index], e, t)
    rates = np.linspace(0.1, 1.0, 10) * max(e.capacity_per_s, 1e-6) * 0.98
    res = qm.at_rate(rates)
    pts = [{"rate_per_s": float(x), "output_tokens_per_s": float(x * t.out.mean),
            "ttft_p99_s": float(res["ttft_s"]["p99"][k]), "tbt_p99_s": float(
                res["tbt_s"]["p99"][k]), "tbt_mean_s": float(res["tbt_s"]["mean"][k])}
           for k, x in enumerate(rates)]
    label = (f"{r['gpu']} tp{r['tp']} {r['weight_dtype']} seqs{r['max_num_seqs']} "
             f"chunk{r['max_num_batched_tokens']}")
    return {"label": label, "points": pts, "gpus_per_replica": r["tp"] * r.get("pp", 1)}


def _warnings(r: dict[str, Any], steps: list[Any], t: Traffic, qm_ctx: float) -> list[str]:
    out = []
    running = r["predicted"]["mean_running_batch"]
    if r["max_num_seqs"] > 4 * max(running, 1):
        out.append(f"max_num_seqs {r['max_num_seqs']} far exceeds the ~{running:.0f} sequences "
                   "this traffic keeps running per replica (it only costs sampler and "
                   "CUDA-graph memory, but says nothing about capacity)")
    e: Evaluated = r["_eval"]
    batches = 2 ** np.arange(0, 12)
    tps = batches / steps[e.step_index].decode_step(batches, qm_ctx)["step_s"]
    knee = knee_batch(batches, tps)
    if knee is not None and running > knee:
        out.append(f"the recommended point runs ~{running:.0f} sequences per replica, past the "
                   f"throughput knee at batch {knee}: latency grows faster than throughput")
    return out


def run_plan(cat: Catalog, plan: PlanFile, verify: VerifyFn | None = None) -> dict[str, Any]:
    """Plan every pool layout asked for and return the result dict (see export/)."""
    resolved = cat.resolve_model(plan.model)
    model = resolved.spec
    lanes = list(plan.workloads)
    result = _plan_pool(cat, plan, model, lanes, resolved.implied_weight_dtype, verify)
    if len(lanes) > 1 and plan.pools in ("separate", "both"):
        separate = []
        for lane in lanes:
            try:
                sub = _plan_pool(cat, plan, model, [lane], resolved.implied_weight_dtype, None)
                separate.append({"lane": lane.name, **_head(sub)})
            except InfeasibleError as e:
                separate.append({"lane": lane.name, "error": str(e)})
        costs = [s.get("cost_per_hour") for s in separate]
        total = sum(costs) if all(c is not None for c in costs) else None
        shared = _head(result)
        sc = shared["cost_per_hour"]
        cheaper = ("equal" if total is not None and sc is not None and abs(total - sc) < 0.005
                   else "separate" if (total is not None and sc is not None and total < sc)
                   else "shared")
        result["pools"] = {"shared": shared, "separate": {"lanes": separate,
                                                           "cost_per_hour": total,
                                                           "gpus_total": sum(
                                                               s.get("gpus_total", 0)
                                                               for s in separate)},
                           "cheaper": cheaper}
        result["warnings"].append(
            f"pools: one shared pool costs {_money(shared['cost_per_hour'])}/h, a pool per "
            f"lane {_money(total)}/h: " + ("they cost the same (shared keeps spare capacity "
                                           "for either lane)" if cheaper == "equal"
                                           else f"{cheaper} is cheaper"))
    return result


def _money(x: float | None) -> str:
    return "unknown" if x is None else f"${x:,.2f}"


def _head(res: dict[str, Any]) -> dict[str, Any]:
    r = res["recommendations"][0]
    return {k: r[k] for k in ("gpu", "tp", "replicas", "gpus_total", "cost_per_hour",
                              "max_num_seqs", "max_num_batched_tokens")}


def _plan_pool(cat: Catalog, plan: PlanFile, model: ModelSpec, lanes: list[Lane],
               implied: str | None, verify: VerifyFn | None) -> dict[str, Any]:
    t = traffic_for(lanes, plan.engine.max_model_len or model.max_position_embeddings)
    space = search_space(cat, plan, model, t, implied)
    steps, meta = build_candidates(cat, model, space)
    if not any(_tp_ok(model, tp, g) for g in space.gpus for tp in space.tps):
        raise InputError(
            f"no TP size in {list(space.tps)} works for {model.key} on "
            f"{', '.join(g.key for g in space.gpus)}: TP must divide the "
            f"{model.num_attention_heads} attention heads (and divide or be a multiple of the "
            f"{model.num_kv_heads} KV heads) and fit in one node")
    if not steps:
        raise InfeasibleError(
            f"{model.key} does not fit on any candidate GPU ({', '.join(g.key for g in space.gpus)}"
            f") with TP in {list(space.tps)} at max_model_len {space.max_model_len}: add larger "
            "GPUs, more TP, or a smaller dtype")
    evals, qm, extra = analytic_search(steps, meta, t, plan.headroom)
    # A configuration needing thousands of replicas is a rounding artefact of the bisection
    # near zero rate, not a plan.
    feasible = [e for e in evals if e.max_rate_per_s > 0 and e.replicas <= 4096]
    if not feasible:
        raise InfeasibleError(nearest_miss(evals, qm, extra["floor"], t))
    key = rank_key(plan.objective)
    best_by_group: dict[tuple, tuple[tuple, Evaluated]] = {}
    for e in feasible:
        s = e.settings
        g = (e.gpu.key, s.tp, s.weight_dtype, s.kv_dtype)
        k = key(_rank_stub(e))
        if g not in best_by_group or k < best_by_group[g][0]:
            best_by_group[g] = (k, e)
    described = [_describe(e, t, plan.headroom, steps, extra["pred"])
                 for _, e in best_by_group.values()]
    ranked = sorted(described, key=key)
    warnings: list[str] = []
    if verify is not None and plan.verify.top > 0:
        ranked = _verify(ranked, described, plan, model, lanes, t, steps, meta, verify, key,
                         warnings)
    if not ranked:
        raise InfeasibleError("every configuration that met the SLOs analytically missed them "
                              "in simulation; loosen the SLOs or lower the rate")
    _explain(ranked, key)
    best = ranked[0]
    curves = [_curve(r, steps, t) for r in ranked[:3]]
    warnings += _warnings(best, steps, t, QueueModel(steps[0], t.inp, t.out,
                                                     Limits(1, 1, 1)).ctx_mean)
    recs = []
    for i, r in enumerate(ranked):
        m = meta[r["_eval"].step_index]
        r["engine_flags"] = engine_flags(model, r, t)
        r["calibration"] = m["calibration"].source
        r["rank"] = i + 1
        recs.append({k: v for k, v in r.items() if not k.startswith("_")})
    lane_rows = [{"name": ln.name, "rate_per_s": ln.rate_per_s, "input_len": str(ln.input_len),
                  "output_len": str(ln.output_len), "ttft_p99_s": ln.slo.ttft_p99_s,
                  "tbt_p99_s": ln.slo.tbt_p99_s, "e2e_p99_s": ln.slo.e2e_p99_s,
                  "priority": ln.priority, "arrival": ln.arrival, "burstiness": ln.burstiness}
                 for ln in lanes]
    return {
        "model": model.key, "hf_id": model.hf_id, "objective": plan.objective,
        "headroom": plan.headroom, "target_rate_per_s": t.rate_per_s, "lanes": lane_rows,
        "inputs": {"model": plan.model, "gpus": [g.key for g in space.gpus],
                   "tp": list(space.tps), "weight_dtypes": list(space.weight_dtypes),
                   "kv_dtypes": list(space.kv_dtypes), "max_num_seqs": list(space.max_num_seqs),
                   "max_num_batched_tokens": list(space.max_num_batched_tokens),
                   "max_model_len": space.max_model_len,
                   "gpu_memory_utilization": space.gpu_memory_utilization,
                   "objective": plan.objective, "headroom": plan.headroom,
                   "configurations_searched": len(evals)},
        "configurations_searched": len(evals),
        "recommendations": recs, "pareto": _pareto(ranked), "curves": curves,
        "warnings": warnings,
    }


def _verify(ranked, described, plan, model, lanes, t, steps, meta, verify, key, warnings):
    kept, tried = [], 0
    for r in ranked:
        if tried >= plan.verify.top:
            kept.append(r)
            continue
        tried += 1
        e: Evaluated = r["_eval"]
        # The simulator's cost is its steps: about requests * E[O] / running batch. At light
        # load (small batches) cap that at ~40k steps; at least 300 requests either way.
        batch = max(r["predicted"]["mean_running_batch"], 1.0)
        n_req = int(min(plan.verify.requests, max(300, 40_000 * batch / max(t.out.mean, 1.0))))
        ctx = PoolContext(model, lanes, t, steps[e.step_index], e.kv_cache_tokens //
                          e.settings.block_size, e.settings.block_size, n_req)
        v = verify(r, ctx)
        r["verified"] = v
        if v.get("ok", True):
            kept.append(r)
        else:
            warnings.append(f"{r['gpu']} TP {r['tp']} ({r['weight_dtype']}) met the SLOs "
                            f"analytically but missed them in simulation ({v.get('reason')}); "
                            "dropped")
    return kept


def _explain(ranked: list[dict[str, Any]], key) -> None:
    best = ranked[0]
    for r in ranked[1:]:
        reasons = []
        if r["cost_per_hour"] is not None and best["cost_per_hour"]:
            d = r["cost_per_hour"] / best["cost_per_hour"] - 1
            if d > 0.005:
                reasons.append(f"costs {d:.0%} more")
        elif r["cost_per_hour"] is None:
            reasons.append("no public price for this GPU")
        if r["gpus_total"] > best["gpus_total"]:
            reasons.append(f"needs {r['gpus_total']} GPUs vs {best['gpus_total']}")
        reasons.append(f"limited by {r['binding_constraint']} at "
                       f"{r['capacity_per_replica_rps']:.2f} req/s per replica")
        r["why_not_first"] = "; ".join(reasons)
