"""The peak window's plan for a day (plan/day.py): the plan file at the peak rate (trace
lanes with the trace's own lengths, burstiness and prefix hits), the replica rule, and the
peak plan's configurations ranked by what their autoscaled day costs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from capplan.plan.rate_curve import WindowSeries, per_day
from capplan.plan.result import PlanResult, Recommendation
from capplan.plan.schema import PlanFile, Prefix
from capplan.plan.search import cost_per_hour, replay_found
from capplan.sim.workload import Requests

HOUR_S = 3600.0
LENGTH_SAMPLE = 20_000
"""Prompt / output lengths of a trace handed to the planner (a uniform sample: quantiles to
~1% at p99, as plan/lengths.LENGTH_SAMPLES)."""
LENGTH_SEED = 12345
"""Seed of that sample (fixed: the peak plan and `capplan verify` draw the same lengths)."""


def replicas_for(offered_rps: np.ndarray, capacity_rps: float | np.ndarray, headroom: float,
                 min_replicas: int) -> np.ndarray:
    """ceil(offered * (1 + headroom) / capacity), at least min_replicas (search.py's rule)."""
    rate = np.asarray(offered_rps, float)
    need = np.ceil(rate * (1 + headroom) / capacity_rps - 1e-9)
    need = np.where(rate > 0, np.maximum(need, 1), need)  # any traffic needs a replica
    return np.maximum(need, min_replicas).astype(np.int64)


def scaled_counts(rate_rps: np.ndarray, capacity_rps: np.ndarray, headroom: float,
                  min_replicas: int, needed: dict[int, int]) -> tuple[np.ndarray, float]:
    """Replica counts for every window when the replay found that windows `needed` (index:
    replicas) need more than replicas_for gave them: each replica's capacity scaled by the
    largest factor that still gives every such window its count, the least over them of
    rate_k (1 + headroom) / ((n_k - 1) capacity_k) (just below it: at that factor window k
    needs n_k - 1 replicas and a hair more; a window needing one replica bounds nothing),
    at most 1. Returns (counts, factor); counts never fall below replicas_for's."""
    rate = np.asarray(rate_rps, float)
    cap = np.broadcast_to(np.asarray(capacity_rps, float), rate.shape)
    factors = [rate[k] * (1 + headroom) / ((n - 1) * cap[k]) / (1 + 1e-6)
               for k, n in needed.items() if n > 1 and cap[k] > 0]
    scale = min([1.0, *factors])
    base = replicas_for(rate, cap, headroom, min_replicas)
    return np.maximum(base, replicas_for(rate, cap * scale, headroom, min_replicas)), scale


def length_sample(reqs: Requests, rng: np.random.Generator | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """A trace's prompt and output lengths, a uniform sample of LENGTH_SAMPLE requests at
    most: the length distribution the peak plan sizes a trace lane with (and `capplan verify`
    draws a day plan's requests from); `rng` default: seeded with LENGTH_SEED."""
    rng = np.random.default_rng(LENGTH_SEED) if rng is None else rng
    n = len(reqs)
    pick = rng.choice(n, size=min(n, LENGTH_SAMPLE), replace=False)
    return np.asarray(reqs.input_tokens)[pick], np.asarray(reqs.output_tokens)[pick]


def _trace_lengths(days: Sequence[Any], tmp: Path) -> dict[str, tuple[str, str]]:
    """Each trace lane's prompt and output lengths as `empirical:` files (length_sample, each
    lane's sample drawn afresh from LENGTH_SEED, as `capplan verify` draws it), so the planner
    sees the trace's own length distribution."""
    out = {}
    for i, d in enumerate(days):
        if d.requests is None:
            continue
        paths = []
        for kind, arr in zip(("input", "output"), length_sample(d.requests), strict=True):
            p = tmp / f"lane{i}_{kind}.txt"
            p.write_text("\n".join(str(int(x)) for x in arr) + "\n")
            paths.append(f"empirical:{p}")
        out[d.name] = (paths[0], paths[1])
    return out


PREFIX_SAMPLE = 50_000
"""Requests of a trace whose prefix hits are counted (the first ones: hits follow the order)."""


def trace_hit_rate(reqs: Requests, block_size: int | None) -> float:
    """The fraction of prompt tokens a trace's shared content (Mooncake `hash_ids`) lets an
    unbounded prefix cache serve (sim.workload.trace_prefix_hits, vLLM's full-block rule;
    block size 16, vLLM's default, unless the plan sets one), over its first PREFIX_SAMPLE
    requests. The planner then applies the KV cache's size (models/prefix.py)."""
    from capplan.sim.workload import trace_prefix_hits

    head = _head(reqs, PREFIX_SAMPLE)
    inp = np.asarray(head.input_tokens, float)
    hits = np.minimum(trace_prefix_hits(head, block_size or 16), np.maximum(inp - 1, 0))
    return float(hits.sum() / max(inp.sum(), 1.0))


def _head(reqs: Requests, n: int) -> Requests:
    if len(reqs) <= n:
        return reqs
    return Requests(reqs.arrival_at_s[:n], reqs.input_tokens[:n], reqs.output_tokens[:n],
                    reqs.lane[:n], hash_ids=None if reqs.hash_ids is None else
                    reqs.hash_ids[:n], hash_block_tokens=reqs.hash_block_tokens)


def lane_rates(days: Sequence[Any], total: WindowSeries, k: int) -> list[float]:
    """Each lane's rate in window k as the window is sized: at the instant its sizing rate is
    reached (`total.lane_rps`), else the lane's offered rate there."""
    if total.lane_rps is not None:
        return [float(x) for x in total.lane_rps[:, k]]
    return [float(d.series.offered_rps[k]) if k < len(d.series) else 0.0 for d in days]


def peak_traffic(days: Sequence[Any], total: WindowSeries) -> dict[str, Any]:
    """The peak window and each lane's traffic there, as the peak plan sizes it: its rate at
    the instant the window's sizing rate is reached (a lane at 0 gets a trickle, so that its
    SLOs still count) and arrival process (gamma at the lane's request-weighted gap SCV,
    Poisson within 5%); a trace lane names its trace. JSON `day.peak`: `capplan verify` of a
    day plan draws its requests from these lanes."""
    k = total.peak_index
    floor = 1e-3 * float(total.sized[k])
    lanes = []
    for d, rate in zip(days, lane_rates(days, total, k), strict=True):
        burst = 1.0 / max(d.series.mean_scv(), 1e-3)
        lanes.append({"name": d.name, "rate_per_s": max(rate, floor),
                      "arrival": "poisson" if abs(burst - 1) < 0.05 else "gamma",
                      "burstiness": float(np.clip(burst, 1e-3, 1e3)),
                      **({"trace": d.trace, "time_unit": d.time_unit} if d.trace else {})})
    return {"window": k, "start_s": float(total.start_s[k]), "end_s": float(total.end_s[k]),
            "rate_per_s": float(total.sized[k]), "lanes": lanes}


def peak_plan(plan: PlanFile, days: Sequence[Any], total: WindowSeries, tmp: Path
               ) -> PlanFile:
    """The plan file at the peak window: each lane at its traffic there (peak_traffic),
    trace lanes with the trace's lengths."""
    lengths = _trace_lengths(days, tmp)
    lanes = []
    peak = peak_traffic(days, total)["lanes"]
    for ln, d, at in zip(plan.workloads, days, peak, strict=True):
        upd: dict[str, Any] = {"rate_per_s": at["rate_per_s"], "trace": None,
                               "rate_curve": None, "burstiness": at["burstiness"],
                               "arrival": at["arrival"]}
        if d.name in lengths:
            upd["input_len"], upd["output_len"] = lengths[d.name]
        if d.requests is not None and d.requests.has_prefix and ln.prefix is None:
            upd["prefix"] = Prefix(hit_rate=trace_hit_rate(d.requests, plan.engine.block_size))
        lanes.append(ln.model_copy(update=upd))
    return plan.model_copy(update={"workloads": lanes})


def _day_key(r: Recommendation, total: WindowSeries, headroom: float, min_replicas: int
             ) -> tuple[float, float]:
    """(cost per day, GPU-hours over the span) of recommendation r's configuration autoscaled
    over the windows, the cost scaled to 24 h as the day's totals are (`cost_per_day`);
    unpriced GPUs rank after priced ones, as in the planner."""
    c = r.candidate
    reps = replicas_for(total.sized, c.max_rate_per_s, headroom, min_replicas)
    gpu_h = float((reps * (total.end_s - total.start_s)).sum()) / HOUR_S * (
        c.gpus_total // max(c.replicas, 1))
    price = cost_per_hour(c.gpu, 1)
    span = float(total.end_s[-1] - total.start_s[0])
    return (math.inf if price is None else per_day(gpu_h * price, span), gpu_h)


def replayed(r: Recommendation) -> bool:
    """Whether the planner's simulator replayed recommendation r: it verified it, or its
    replay sized its replicas or confirmed its capacity (a binding the replay found)."""
    c = r.candidate
    return (r.verified is not None or c.sized_by_replay
            or replay_found(c.binding_constraint))


def rank_for_day(result: PlanResult, total: WindowSeries, headroom: float, min_replicas: int,
                 day_replayed: bool = False) -> tuple[PlanResult, list[str]]:
    """The peak plan with its recommendation that costs least over the day first (the peak's
    cheapest may not be: a replica of fewer GPUs follows the trough more closely), and a note
    when the order changed (saying when nothing simulated the new first: no replay of the
    planner's, and `day_replayed` False, the day's capacity check does not replay it)."""
    recs = result.recommendations
    keys = [_day_key(r, total, headroom, min_replicas) for r in recs]
    i = min(range(len(recs)), key=lambda k: (keys[k], k))
    if i == 0:
        return result, []
    best, old = recs[i], recs[0]
    how = (f"${keys[i][0]:,.2f} vs ${keys[0][0]:,.2f} per day" if math.isfinite(keys[0][0])
           else f"{keys[i][1]:,.1f} vs {keys[0][1]:,.1f} GPU-hours")
    order = [best.with_(why_not_first="", rank=1), old.with_(
        why_not_first=f"costs more over the day (${keys[0][0]:,.2f} vs ${keys[i][0]:,.2f} per "
                      "day); cheapest at the peak", rank=2)]
    order += [r.with_(rank=k + 3) for k, r in enumerate(x for j, x in enumerate(recs)
                                                        if j not in (0, i))]
    # the ranking's costs are each configuration's capacity at the peak applied to every
    # window: an estimate, before the windows' burstiness and the replay's corrections that
    # the schedule's totals include
    note = (f"{best.label} costs least over the day ({how} for {old.label}, the cheapest at "
            "the peak, estimated at each one's capacity per replica; the day's totals add the "
            "windows' burstiness and the replay): it comes first")
    if not replayed(best) and not day_replayed and replayed(old):
        note += (f"; it was not simulated (the simulator checked {old.label}): replay it with "
                 "`capplan plan` limited to its GPU and TP, or raise verify.top")
    return replace(result, recommendations=order), [note]
