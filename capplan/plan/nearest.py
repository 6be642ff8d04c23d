"""The nearest miss of a plan no configuration meets, as the replay finds it: the analytic
screen's closest configurations (one per layout family) replayed at the lightest load a fleet of
each runs, and the SLO each would need (README, "Unsatisfiable SLOs exit 2 with the nearest
miss").

The screen names its closest miss from its latency floor at negligible load; where the
analytic floor is optimistic (TPOT under TensorRT-LLM: 7.2 ms analytic against 8.4 ms in the
replay for Qwen3-30B-A3B at TP 1) it named the wrong configuration and an SLO at which the plan
still failed. A fleet never runs its replicas at negligible load either: more than one replica
runs each at NEAR_FLOOR_FRAC of its capacity at least.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from capplan.models.queueing import summarize
from capplan.plan.result import Prediction, Recommendation
from capplan.plan.schema import PlanFile
from capplan.plan.search import Candidate, SearchResult, Traffic
from capplan.plan.search_bound import MAX_REPLICAS, NEAR_FLOOR_FRAC
from capplan.plan.slo import SloTarget
from capplan.plan.verified import PlanPool, VerifyFn, queue_model, replays, verify_job

MISS_REPLAYS = 4
"""Configurations replayed to name the nearest miss: the analytic screen's closest, one per
(GPU, layout, dtypes) family."""
MISS_MARGIN = 1.05
"""The SLO suggested is this much over what the closest configuration reaches."""


def lightest_rate(c: Candidate, need_per_s: float) -> float:
    """The lowest per-replica rate at which a fleet of c carries `need_per_s` (the plan's rate
    with its headroom): one replica at all of it, or replicas each at NEAR_FLOOR_FRAC of its
    capacity at least (fewer than MAX_REPLICAS), as the planner runs them."""
    return min(need_per_s, max(NEAR_FLOOR_FRAC * c.capacity_per_s, need_per_s / MAX_REPLICAS))


def _floor_ratio(found: SearchResult, c: Candidate, t: Traffic) -> float:
    """How far c's analytic latency floor is over the SLOs (value / objective, the worst)."""
    i, j = c.index
    at: dict[str, dict[str, Any]] = {}
    for tgt in t.slos:
        at.setdefault(tgt.metric, {})[tgt.stat] = found.at_floor[tgt.metric][tgt.stat][i, j]
    return t.slos.worst(at)[0]


def replayed_miss(found: SearchResult, pool: PlanPool, plan: PlanFile, verify: VerifyFn
                  ) -> str | None:
    """The nearest-miss sentence by the replay, or None where the screen's own applies (the
    SLOs hold at low load and only the rate is too high, or nothing fits)."""
    t = pool.traffic
    ratios = {c.index: _floor_ratio(found, c, t) for c in found.candidates}
    best: dict[tuple[Any, ...], Candidate] = {}
    for c in sorted(found.candidates, key=lambda c: ratios[c.index]):
        best.setdefault(c.family, c)
    closest = list(best.values())[:MISS_REPLAYS]
    if not closest or ratios[closest[0].index] < 1:
        return None
    need = t.rate_per_s * (1 + plan.headroom)
    at = [_at(c, lightest_rate(c, need), t) for c in closest]
    runs = replays(verify, [verify_job(r, pool, plan.verify.requests_per_check,
                                       r.per_replica_rate_per_s) for r, _ in at])
    rows = [(r, *_worst(ana, v.simulated, t)) for (r, ana), v in zip(at, runs, strict=True)]
    r, ratio, target, got, analytic = min(rows, key=lambda x: x[1])
    if target is None or not math.isfinite(ratio):
        return None
    c = r.candidate
    return (f"no configuration meets the SLOs: the closest, {r.label}, reaches "
            f"{target.stat} {target.label} {got * 1e3:.3g} ms in simulation (analytic "
            f"{analytic * 1e3:.3g} ms) at {r.per_replica_rate_per_s:.3g} req/s per replica, "
            f"the lightest load a fleet of it runs "
            f"({r.per_replica_rate_per_s / c.capacity_per_s:.0%} of its capacity), against "
            f"{target.limit_s * 1e3:.3g} ms (binding: {target.label} SLO); loosen it to "
            f">= {got * MISS_MARGIN * 1e3:.3g} ms (more load adds to it), shorten "
            "prompts/outputs, or use a faster GPU or more TP")


def _at(c: Candidate, rate_per_s: float, t: Traffic
        ) -> tuple[Recommendation, dict[str, Any]]:
    """Candidate c with one replica at `rate_per_s`, and the analytic model's figures there."""
    pred = summarize(queue_model(c, t).at_rate(np.float64(rate_per_s)))
    return Recommendation(candidate=replace(c, replicas=1), per_replica_rate_per_s=rate_per_s,
                          predicted=Prediction.of(pred), slo_margins={}), pred


def _worst(pred: dict[str, Any], simulated: dict[str, Any], t: Traffic
           ) -> tuple[float, SloTarget | None, float, float]:
    """(ratio, objective, value, analytic value) of the objective furthest over, each
    objective's value the higher of the replay's and the analytic model's."""
    out: tuple[float, SloTarget | None, float, float] = (0.0, None, 0.0, 0.0)
    for tgt in t.slos:
        got = (simulated.get(tgt.metric) or {}).get(tgt.stat)
        ana = (pred.get(tgt.metric) or {}).get(tgt.stat)
        got = math.inf if got is None else float(got)
        ana = math.inf if ana is None else float(ana)
        ratio = max(got, ana) / tgt.limit_s
        if out[1] is None or ratio > out[0]:
            out = (ratio, tgt, max(got, ana), ana)
    return out
