"""A day plan's recommendation as its schedule's peak fleet (plan/day.py).

The steady-rate planner sizes the peak window with its own capacity per replica; the day then
settles that capacity (day_capacity's replay at the peak window, the day replay's corrections)
and may need more replicas at its peak than the planner's count. The recommendation a day plan
prints, whose launch lines, verify rate and exports describe one fleet, is restated here as the
schedule's: its replicas are the schedule's peak replicas (the fixed fleet its baseline runs),
its capacity per replica the one the windows are sized with, its planned rate the peak window's
rate over those replicas (the analytic prediction and SLO margins there), its confirmation the
day's capacity replay where it ran, and the warnings about the planner's rank 1 those of this
recommendation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from capplan.plan.result import Prediction, Recommendation


@dataclass(frozen=True)
class PeakFleet:
    """What restating the recommendation needs: the model, the peak window's traffic as the
    planner served it (planner.served_traffic), the planner's own rank 1 (whose warnings the
    plan carries) and the day's capacity check (day_capacity.CapacityCheck, or None)."""

    model: Any
    traffic: Any
    first: Recommendation
    check: Any = None


def _relaunched(r: Recommendation) -> Recommendation:
    """r with its launch lines and verify command rebuilt for its own replicas and rate (the
    planner's `relaunch` is a partial over the settings of the fleet it planned)."""
    old = r.relaunch
    if not isinstance(old, partial) or len(old.args) < 2:
        return r
    new = partial(old.func, old.args[0], r.settings_dict(), *old.args[2:], **old.keywords)
    return r.with_(engine_flags=new(), relaunch=new)


def peak_fleet(dp: Any, fleet: PeakFleet) -> Any:
    """`dp` (a DayPlan) with its recommendation restated as the schedule's peak fleet (module
    docstring); a plan whose layout is not one aggregated pool keeps the planner's."""
    from capplan.export.layout import AGGREGATED, recommended_layout
    from capplan.models.queueing import summarize
    from capplan.plan.planner import point_warnings
    from capplan.plan.slo import SloSet
    from capplan.plan.verified import queue_model

    res = dp.plan
    if recommended_layout(res.to_dict()) != AGGREGATED:  # the layout every export deploys
        return dp
    best = res.recommendations[0]
    n = max(dp.peak_replicas, 1)
    k = int(dp.peak.get("window", 0)) if dp.peak else 0
    rate = float(dp.windows[k].sizing_rps)
    cap = float(dp.capacity_rps if dp.capacity_rps is not None
                else best.candidate.max_rate_per_s)
    t = fleet.traffic
    check = fleet.check
    binding = best.candidate.binding_constraint
    verified = best.verified
    if check is not None and check.rate_rps > 0:
        verified = check.verification() or verified
        if check.missed is not None and check.rate_rps < best.candidate.max_rate_per_s:
            binding = check.binding(SloSet.strictest(SloSet.of(ln.slo) for ln in res.lanes))
    c = replace(best.candidate, replicas=n, max_rate_per_s=cap, binding_constraint=binding)
    per = rate / n
    pred = summarize(queue_model(c, t).at_rate(np.float64(per)))
    rec = _relaunched(best.with_(candidate=c, per_replica_rate_per_s=per,
                                 predicted=Prediction.of(pred),
                                 slo_margins=t.slos.margins(pred), verified=verified))
    # the warnings the planner gave its own rank 1 at its rate, for this fleet at its own
    ctx = queue_model(fleet.first.candidate, t).ctx_mean
    stale = set(point_warnings(fleet.first, ctx))
    warnings = [w for w in res.warnings if w not in stale]
    warnings += point_warnings(rec, queue_model(c, t).ctx_mean)
    plan = replace(res, recommendations=[rec, *res.recommendations[1:]], warnings=warnings)
    return replace(dp, plan=plan)
