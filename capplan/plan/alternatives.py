"""The fp8-weights alternative a plan shows beside itself when the user did not allow fp8.

Many fleets halve with fp8 weights (half the weight bytes per GPU, more KV cache, faster decode
on fp8 tensor cores), so a plan searched in bf16 only says what allowing fp8 would change: the
best fp8 fleet on the first GPU types of the plan's ranked list that have fp8 tensor cores,
planned the same way (analytic search, no simulation: the plan itself is what was verified),
its GPUs and cost against the plan's, and the accuracy caveat.
"""

from __future__ import annotations

from typing import Any

from capplan.errors import CapplanError
from capplan.plan.deployment import device_for

ACCURACY_CAVEAT = ("fp8 weights (e4m3, quantized when the engine loads a bf16 checkpoint, or a "
                   "published FP8 checkpoint) change outputs slightly; FP8 checkpoints report "
                   "near-identical benchmark scores, but check your own evaluation before "
                   "switching")


ALT_GPU_TYPES = 3

PLAN_NOTES = ("prefix_cache", "fp8_alternative", "scheduler_alternative")
"""Keys of a plan's JSON whose `note` says what the plan assumed or left out (this module's
findings; every renderer prints them)."""


def wants_fp8_alternative(plan: Any, resolved: Any, cat: Any) -> bool:
    """fp8 was not allowed, the checkpoint is not already quantized, and some candidate GPU has
    fp8 tensor cores."""
    wds = set(plan.candidates.weight_dtypes)
    if "fp8" in wds or not wds <= {"auto", "bf16", "fp16"}:
        return False
    m = resolved.spec
    if m.quantization is not None or resolved.implied_weight_dtype:
        return False
    gpus = [device_for(cat, g, plan.calibration) for g in plan.candidates.gpus] \
        if plan.candidates.gpus else list(cat.gpus.values())
    return any(g.supports("fp8") for g in gpus)


def fp8_alternative(plan_pool: Any, cat: Any, plan: Any, resolved: Any, lanes: list[Any],
                    ranked: list[Any]) -> dict[str, Any] | None:
    """The best fp8 plan's fleet beside the plan's best (`ranked`: its Recommendations, best
    first), or None when no fp8 fleet exists among the groups `_searched_best` searches: the
    GPU types among the first ALT_GPU_TYPES of the ranked list that have fp8 tensor cores
    (the types that came closest in bf16; a search over every type would add half the plan's
    time). Like is compared with like: when the replay sized the plan's best
    (`Candidate.sized_by_replay`), the fp8 fleet (analytic) is set against the analytic screen's
    fleet without fp8, and the note says what the replay sized."""
    alt = _searched_best(plan_pool, cat, plan, resolved, lanes, ranked,
                         {"candidates": {"weight_dtypes": ["fp8"]}}, lambda g: g.supports("fp8"))
    if alt is None:
        return None
    best = screened = ranked[0]
    if best.candidate.sized_by_replay:  # like with like: the fp8 fleet is the screen's too
        try:
            screened = plan_pool(cat, plan, resolved, lanes, None).best
        except CapplanError:
            screened = best
    fleet = _fleet_versus(alt, screened)
    note = f"fp8 weights were not allowed: with them, {fleet['text']}"
    if screened is not best:
        note += (f" (both as the analytic screen plans them: {screened.replicas} x "
                 f"{screened.candidate.gpu.key} TP {screened.candidate.settings.tp} without "
                 f"fp8; the simulator's replay then sized this plan at {best.gpus_total} GPUs)")
    note += ("; add fp8 to candidates.weight_dtypes (or --weight-dtype fp8) to plan it. "
             + ACCURACY_CAVEAT)
    return {**fleet["figures"], "accuracy_caveat": ACCURACY_CAVEAT, "note": note}


def _searched_best(plan_pool: Any, cat: Any, plan: Any, resolved: Any, lanes: list[Any],
                   ranked: list[Any], changes: dict[str, dict[str, Any]],
                   gpu_ok: Any = None) -> Any:
    """The best fleet of the plan with `changes` to its "candidates" and "engine" fields,
    searched
    analytically (no simulation: the plan itself is what was verified) over the first
    ALT_GPU_TYPES GPU types of `ranked` (its Recommendations, best first) that `gpu_ok`
    allows, and only the groups whose best could be shown (`_could_show`); None when there is
    none. `plan_pool(cat, plan, resolved, lanes, verify, keep)` plans one pool over the (GPU,
    settings) groups `keep` allows."""
    keys = list(dict.fromkeys(r.candidate.gpu.key for r in ranked))
    devices = {r.candidate.gpu.key: r.candidate.gpu for r in ranked}  # a host CPU's too
    gpus = [g for g in keys if gpu_ok is None or gpu_ok(devices[g])][:ALT_GPU_TYPES]
    if not gpus:
        return None
    alt_plan = plan.model_copy(update={
        "candidates": plan.candidates.model_copy(
            update={**changes.get("candidates", {}), "gpus": gpus}),
        "engine": plan.engine.model_copy(update=changes.get("engine", {}))})
    try:
        return plan_pool(cat, alt_plan, resolved, lanes, None,
                         _could_show(ranked[0], plan.objective, [devices[g] for g in gpus])
                         ).best
    except CapplanError:
        return None


def _fleet_versus(alt: Any, best: Any) -> dict[str, Any]:
    """An alternative's fleet against the plan's best: its figures (GPU, TP, replicas, GPUs,
    cost, savings) and a sentence."""
    base_cost, cost = best.cost_per_hour, alt.cost_per_hour
    saving = (1 - cost / base_cost) if base_cost and cost is not None else None
    gpu_saving = 1 - alt.gpus_total / best.gpus_total
    text = (f"{alt.replicas} x {alt.candidate.gpu.key} TP {alt.candidate.settings.tp} = "
            f"{alt.gpus_total} GPU{'' if alt.gpus_total == 1 else 's'}"
            + (f" (${cost:,.2f}/h)" if cost is not None else "")
            + f" instead of {best.gpus_total} {best.candidate.gpu.key}"
            + (f" (${base_cost:,.2f}/h)" if base_cost is not None else "")
            + (f": {saving:.0%} cheaper" if saving is not None else
               f": {gpu_saving:.0%} fewer GPUs"))
    return {"text": text, "figures": {
        "gpu": alt.candidate.gpu.key, "tp": alt.candidate.settings.tp,
        "replicas": alt.replicas, "gpus_total": alt.gpus_total, "cost_per_hour": cost,
        "saving_frac": saving, "gpu_saving_frac": gpu_saving}}


def shown(alt: dict[str, Any] | None, best: Any) -> bool:
    """Whether a plan shows the fp8 alternative `alt` beside its best: no more GPUs and, where
    both costs are known, cheaper."""
    return alt is not None and alt["gpus_total"] <= best.gpus_total and (
        alt["saving_frac"] is None or alt["saving_frac"] > 0)


def _could_show(best: Any, objective: str, gpus: list[Any]) -> Any:
    """The fp8 groups whose best could be shown, as a `keep(gpu, settings)` for the search,
    or None (all of them). The alternative is shown only with no more GPUs than the plan's
    best and, where both costs are known, a lower cost (`shown`); one replica of a group
    sets its least GPUs and cost. Under min_cost (every fp8 GPU priced, the plan's cost
    known) a group whose replica costs the plan's best or more cannot be cheaper; under
    min_gpus one with more GPUs cannot have fewer. Either way, when the search's best is
    shown it ranks before every group dropped (rank_key's first figure is lower), so it is
    the same; when it is not, the best of the groups kept is not shown either."""
    cost = best.cost_per_hour
    if objective == "min_cost" and cost is not None and all(
            g.price_per_hour_usd is not None for g in gpus):
        return lambda gpu, s: gpu.price_per_hour_usd * _per_replica(s) < cost
    if objective == "min_gpus":
        return lambda _gpu, s: _per_replica(s) <= best.gpus_total
    return None


def _per_replica(s: Any) -> int:
    """GPUs of one replica (Candidate.gpus_total at one replica)."""
    return s.tp * s.pp * s.attention_dp


def prefix_savings(plan_pool: Any, cat: Any, plan: Any, resolved: Any, lanes: list[Any],
                   best: Any, traffic: Any) -> dict[str, Any] | None:
    """What prefix caching gives the plan: prompt tokens served from the cache per request
    (models/prefix.py PrefixCache, the pooled lanes) and the fleet planned without the cache
    (the same lanes with no prefix, analytic search only). Like is compared with like: when
    the replay sized the plan's best (`Candidate.sized_by_replay`), the fleet without the cache
    is set against the analytic screen's fleet with it, not against the replayed one."""
    pc = getattr(traffic, "prefix", None)
    if pc is None or not pc.active:
        return None
    plain = [ln.model_copy(update={"prefix": None}) for ln in lanes]
    try:
        without = plan_pool(cat, plan, resolved, plain, None).best
    except CapplanError:
        without = None
    screened = best
    if best.candidate.sized_by_replay and without is not None:
        try:
            screened = plan_pool(cat, plan, resolved, lanes, None).best
        except CapplanError:
            screened = best
    mean_in = float(traffic.inp.mean)  # whole prompts; the cache serves part of each
    frac = pc.cached_tokens_mean / mean_in if mean_in > 0 else 0.0
    note = (f"prefix cache: {pc.cached_tokens_mean:.0f} of {mean_in:.0f} prompt tokens per "
            f"request ({frac:.0%}) are served from the cache on average; ")
    if without is None:
        note += "without the cache no fleet meets the SLOs"
    else:
        note += (f"without it the fleet would be {without.replicas} x "
                 f"{without.candidate.gpu.key} TP {without.candidate.settings.tp} = "
                 f"{without.gpus_total} GPUs instead of {screened.gpus_total}")
        if screened is not best:
            note += (f" (both as the analytic screen plans them: {screened.replicas} x "
                     f"{screened.candidate.gpu.key} TP {screened.candidate.settings.tp} with "
                     f"the cache; the simulator's replay then sized this plan at "
                     f"{best.gpus_total} GPUs)")
    return {"cached_tokens_per_request": float(pc.cached_tokens_mean),
            "prompt_tokens_per_request": mean_in, "cached_frac": frac,
            "gpus_total_without_cache": None if without is None else without.gpus_total,
            "cost_per_hour_without_cache": None if without is None else without.cost_per_hour,
            "note": note}


STALL_OPTIONS = (("mixed-chunk", lambda sch: sch.prefill_first),
                 ("chunked-prefill", lambda sch: not sch.chunked_prefill))
"""Engine options that let a prompt's work share steps with the running decodes, each with
the scheduler it applies to: SGLang's prefill-first default runs each prompt chunk alone
while the decodes wait (`--enable-mixed-chunk` rides it with them); TensorRT-LLM's default
runs each prompt whole in one step (`enable_chunked_prefill` splits it into the budget the
decodes leave). Either default stalls every running decode for a prompt's work, so a TBT SLO
can bind far below the replica's throughput."""


def scheduler_option(plan: Any) -> str | None:
    """The stall-removing option (STALL_OPTIONS) the plan's engine offers and does not run."""
    from capplan.models.engine import engine_profile

    return stall_option(engine_profile(plan.engine.profile_spec))


def stall_option(p: Any) -> str | None:
    """The option (STALL_OPTIONS) profile `p`'s engine offers against its stalls, if it does
    not run it already."""
    return next((opt for opt, applies in STALL_OPTIONS
                 if applies(p.scheduler) and opt in p.option_flags and opt not in p.options),
                None)


def scheduler_alternative(plan_pool: Any, cat: Any, plan: Any, resolved: Any,
                          lanes: list[Any], ranked: list[Any], option: str
                          ) -> dict[str, Any] | None:
    """The plan with the engine's `option`, searched as `fp8_alternative` is
    (`_searched_best`), its fleet against the plan's best, or None when it plans nothing."""
    name = f"{plan.engine.name}+{option}"
    alt = _searched_best(plan_pool, cat, plan, resolved, lanes, ranked,
                         {"engine": {"name": name}})
    if alt is None:
        return None
    best = ranked[0]
    flag = alt.candidate.settings.profile.option_flags[option]
    fleet = _fleet_versus(alt, best)
    note = (f"{flag} (prompt work shares steps with the running decodes; by default it stops "
            f"them): {fleet['text']}, limited by {alt.candidate.binding_constraint} where the "
            f"plan is limited by {best.candidate.binding_constraint} (screened, not replayed); "
            f"plan it with engine {name} (--engine {alt.candidate.settings.engine})")
    return {"option": option, "engine": alt.candidate.settings.engine, "flag": flag,
            **fleet["figures"], "binding_constraint": alt.candidate.binding_constraint,
            "note": note}
