"""Run a plan file's day plan: one model (plan/day.py) or several on one pool
(plan/pool_day.py), each peak sized by the steady-rate planner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from capplan.catalog.loader import Catalog
from capplan.plan.day import DayOptions, DayPlan, plan_day
from capplan.plan.lane_day import plan_lane_days
from capplan.plan.pool_day import deploys_lane_pools, plan_pool_day
from capplan.plan.result import PlanResult
from capplan.plan.schema import PlanFile


def day_options(plan: PlanFile) -> DayOptions:
    d = plan.day
    return DayOptions(window_s=d.window_s, min_replicas=d.min_replicas, load_from=d.load_from,
                      load_gb_per_s=d.load_gb_per_s, engine_startup_s=d.engine_startup_s,
                      replay=d.replay, timezone=d.timezone)


def run_day_plan(cat: Catalog, plan: PlanFile, verify: Any = None, base: Path | None = None,
                 opts: DayOptions | None = None) -> Any:
    """A day plan (one model: DayPlan; its lanes' own day plans when it deploys a pool per
    lane: LaneDays) or a shared pool of several models (PoolDay; a model of them that deploys a
    pool per lane as its LaneDays), with the steady-rate planner
    `planner.run_plan(cat, plan, verify)` sizing each peak."""
    from capplan.plan.planner import run_plan

    opts = opts or day_options(plan)

    def run(c: Catalog, p: PlanFile) -> PlanResult:
        return run_plan(c, p, verify)

    def lanes(one: PlanFile, dp: DayPlan) -> Any:
        """A model's lanes' own day plans when it deploys a pool per lane: each lane's pool on
        its own schedule, which the totals count (they count what runs)."""
        if deploys_lane_pools(dp):
            return plan_lane_days(cat, one, opts, run, dp, base)
        return dp

    if plan.models is not None:  # each model as one model's plan is (`lanes`)
        return plan_pool_day(cat, plan, opts, run, base, lanes)
    return lanes(plan, plan_day(cat, plan, opts, run, base))
