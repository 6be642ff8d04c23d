"""A day plan whose layout is a pool per lane (`pools: separate`): each lane's pool gets its own
schedule, sized from that lane's own rate per window.

The model's day plan (plan/day.py) sizes one shared pool for the whole traffic, and its peak
plan sizes each lane's pool at the lane's rate in the window where the TOTAL traffic peaks: a
lane peaking at another hour would be short of replicas there. Here each lane is planned as a
model of its own is on a shared GPU pool (plan/pool_day.py): its own day plan (its peak plan at
its own peak window, its replicas per window at its own rate, with the same headroom,
min_replicas, start-up lead and daily cycle), and the lanes' pools are added up window by
window as a pool of several models is (`PoolDay`): the plan's schedule gives GPUs per lane,
its GPU-hours and costs are the sum over lanes, its peak GPUs the most any window needs over
all lanes' pools together, and its fixed-fleet baseline each lane's pool fixed at its own peak.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capplan.catalog.loader import Catalog
from capplan.errors import InputError
from capplan.plan.bench_cmds import lane_plan
from capplan.plan.day import DayOptions, DayPlan, plan_day
from capplan.plan.pool_day import PoolDay, placed_together, sum_or_none
from capplan.plan.rate_curve import DAY_S
from capplan.plan.result import PoolComparison, SeparatePool
from capplan.plan.schema import PlanFile

LANE_KEY = "lane_days"
"""The JSON key holding each lane's own day plan (a list of `{"lane": NAME, ...}`)."""


@dataclass(frozen=True)
class LaneDays:
    """A model's day plan (`model`: its shared pool's, with the peak plan's pool comparison)
    and its lanes' own day plans on their pools (`lanes`: one `PoolDay` entry per lane)."""

    model: DayPlan
    lanes: PoolDay

    def totals(self) -> dict[str, Any]:
        """The plan's totals as the sum over the lanes' pools (module docstring)."""
        days = self.lanes.days
        sched = self.lanes.schedule()
        pools = self.lanes.pools()
        one = len(pools) == 1
        auto = sum(d.gpu_hours for d in days)
        fixed = sum(d.fixed_fleet_gpu_hours for d in days)
        cost = sum_or_none([d.cost_per_day_of(d.gpu_hours) for d in days])
        fixed_cost = sum_or_none([d.cost_per_day_of(d.fixed_fleet_gpu_hours) for d in days])
        tokens = sum(d.output_tokens for d in days)
        span_s = max(d.span_s for d in days)

        def per_mtok(per_day: float | None) -> float | None:
            if per_day is None or tokens <= 0:
                return None
            return per_day * span_s / DAY_S / (tokens / 1e6)

        return {
            "schedule": sched,
            "peak_replicas": max(s["replicas"] for s in sched),
            "peak_gpus": pools[0]["peak_gpus"] if one else None,
            "gpu_hours": auto, "fixed_fleet_gpu_hours": fixed,
            "cost_per_day": cost, "fixed_fleet_cost_per_day": fixed_cost,
            "cost_per_million_output_tokens": per_mtok(cost),
            "fixed_fleet_cost_per_million_output_tokens": per_mtok(fixed_cost),
            "saving_gpu_hours": fixed - auto,
            "saving_per_day": None if cost is None or fixed_cost is None else fixed_cost - cost,
            "saving_frac": 1.0 - auto / fixed if fixed > 0 else 0.0,
        }

    def to_dict(self) -> dict[str, Any]:
        out = self.model.to_dict()
        days, names = self.lanes.days, self.lanes.names
        # the lanes' pools as deployed: each lane's recommendation at its own peak fleet
        pools = PoolComparison(self.model.plan.best, [
            SeparatePool(n, best=d.plan.best) for d, n in zip(days, names, strict=True)])
        totals = self.totals()
        shared = out
        note = (f"the plan deploys a pool per lane (pools: separate): each lane's pool is "
                f"scheduled on its own, sized at the lane's own rate in each window (`{LANE_KEY}`"
                "); the schedule and totals add the lanes' pools up, and the day's GPU, TP, "
                "capacity and replica start-up are the shared pool's, for comparison: one "
                f"shared pool would take {shared['gpu_hours']:,.1f} GPU-hours a day "
                f"autoscaled against the lanes' {totals['gpu_hours']:,.1f}")
        day = {**out["day"], "notes": [*out["day"]["notes"], note]}
        # the peak plan's comparison priced each lane at the total's peak window: restated
        shared_h = self.model.plan.best.cost_per_hour
        lanes_h = pools.separate_cost_per_hour
        said = (f"pools: one shared pool costs {_money(shared_h)}/h at the peak window, the "
                f"lanes' pools each at its own peak {_money(lanes_h)}/h together; over the day, "
                f"autoscaled, one shared pool {_money(shared['cost_per_day'])} and a pool per "
                f"lane {_money(totals['cost_per_day'])} per day")
        warnings = [w for w in out.get("warnings") or [] if not w.startswith("pools: ")]
        return {**out, **totals, "day": day, "pools": pools.to_dict(),
                "warnings": [*warnings, said],
                "gpu_pools": self.lanes.pools(),
                # each lane's day: its verify steps name the lane and its dataset (lane_plan)
                LANE_KEY: [{"lane": n, **lane_plan(d.to_dict(), n)}
                           for d, n in zip(days, names, strict=True)]}



def _money(x: float | None) -> str:
    return "unknown (no price)" if x is None else f"${x:,.2f}"



def plan_lane_days(cat: Catalog, plan: PlanFile, opts: DayOptions,
                   run: Callable[[Catalog, PlanFile], Any], model: DayPlan,
                   base: Path | None = None) -> LaneDays:
    """Each lane's own day plan (the plan with that lane alone, one shared pool: its own peak
    plan, schedule and replay), pooled as plan_pool_day pools models; `model`: the plan's own
    day plan (the shared pool and the peak plan's pool comparison)."""
    days = []
    for ln in plan.workloads:
        one = plan.model_copy(update={"workloads": [ln], "pools": "shared"})
        try:
            days.append(plan_day(cat, one, opts, run, base))
        except InputError as e:
            raise InputError(f"lane {ln.name}: {e}") from e
    return LaneDays(model, PoolDay(placed_together(days), [ln.name for ln in plan.workloads],
                                   unit="lane"))
