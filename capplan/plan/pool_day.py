"""Several models on one GPU pool over a day: each model's day plan, GPUs per window per model,
the pool's peak (the most GPUs any window needs, all models together) against one fleet per
model (the sum of each model's own peak), and the GPU-hours of both.

Models share a pool when their plans pick the same GPU type: a model's off-peak GPUs then serve
another's peak (the pool is sized for the peak of the sum, not the sum of the peaks). Models on
different GPU types form a pool each. Each replica keeps whole GPUs: two small models sharing
one GPU (memory fractions) is not planned here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from capplan.catalog.loader import Catalog
from capplan.errors import InputError
from capplan.plan.bench_cmds import for_model
from capplan.plan.day import HOUR_S, DayOptions, DayPlan, plan_day
from capplan.plan.flags import place_together
from capplan.plan.schema import PlanFile


@dataclass(frozen=True)
class PoolDay:
    """The day plans of several models and their shared pool(s)."""

    days: list[DayPlan]
    names: list[str]
    unit: str = "model"
    """What each day plan is a fleet of: "model", or "lane" for a model's pool per lane
    (plan/lane_day.py); it names the keys (`models` / `lanes`, `gpus_by_model` / `..._lane`)."""

    def _gpus(self) -> np.ndarray:
        """(models, windows) GPUs per window (a shorter day counts 0 after its end)."""
        n = max(len(d.windows) for d in self.days)
        g = np.zeros((len(self.days), n), np.int64)
        for i, d in enumerate(self.days):
            g[i, :len(d.windows)] = [w.gpus for w in d.windows]
        return g

    def _edges(self) -> tuple[np.ndarray, np.ndarray]:
        """(start_s, end_s) of the pool's windows: the longest model day's."""
        longest = max(self.days, key=lambda d: (len(d.windows), d.span_s)).windows
        return (np.array([w.start_s for w in longest]), np.array([w.end_s for w in longest]))

    def pools(self) -> list[dict[str, Any]]:
        """One pool per GPU type: its peak, GPU-hours, and what separate fleets would need."""
        g = self._gpus()
        start, end = self._edges()
        length_h = (end - start) / HOUR_S
        span_h = float(length_h.sum())
        out = []
        types = sorted({d.plan.best.candidate.gpu.key for d in self.days})
        for gpu in types:
            idx = [i for i, d in enumerate(self.days) if d.plan.best.candidate.gpu.key == gpu]
            total = g[idx].sum(axis=0)
            peaks = g[idx].max(axis=1)
            price = self.days[idx[0]].price_per_gpu_hour
            pool_peak, sep = int(total.max()), int(peaks.sum())
            out.append({
                "gpu": gpu, f"{self.unit}s": [self.names[i] for i in idx],
                "peak_gpus": pool_peak, "separate_fleets_peak_gpus": sep,
                "saving_gpus": sep - pool_peak,
                "gpu_hours": float((total * length_h).sum()),
                "fixed_pool_gpu_hours": pool_peak * span_h,
                "separate_fleets_gpu_hours": sep * span_h,
                "price_per_gpu_hour": price,
                "fixed_pool_cost_per_day": None if price is None else
                pool_peak * price * 24.0,
                "separate_fleets_cost_per_day": None if price is None else sep * price * 24.0,
                "peak_window": int(np.argmax(total)),
            })
        return out

    def _types(self) -> list[str]:
        """Each model's GPU type, in model order."""
        return [d.plan.best.candidate.gpu.key for d in self.days]

    def schedule(self) -> list[dict[str, Any]]:
        """The pool's windows: every model's offered rate and replicas summed, GPUs per model
        (`gpus_by_model`, or per lane) and per GPU type (a total only over one type: an L40S
        and an H100 are not two of anything)."""
        g = self._gpus()
        start, end = self._edges()
        types = self._types()
        one_type = len(set(types)) == 1
        sched = []
        for k in range(g.shape[1]):
            ws = [d.windows[k] for d in self.days if k < len(d.windows)]
            by_gpu = {t: int(sum(g[i, k] for i in range(len(types)) if types[i] == t))
                      for t in sorted(set(types))}
            sched.append({
                "start_s": float(start[k]), "end_s": float(end[k]),
                "offered_rps": sum(w.offered_rps for w in ws),
                "replicas": sum(w.replicas for w in ws),
                "gpus": int(g[:, k].sum()) if one_type else None,
                f"gpus_by_{self.unit}": {m: int(g[i, k]) for i, m in enumerate(self.names)},
                "gpus_by_gpu": by_gpu,
                # each model's own p99s are in its schedule (`models`): a pool has none
                "ttft_p99_s": None, "tbt_p99_s": None})
        return sched

    def to_dict(self) -> dict[str, Any]:
        sched = self.schedule()
        # one JSON holds every model: each model's verify lines name it (bench_cmds.for_model)
        per = [for_model(d.to_dict(), m) for d, m in zip(self.days, self.names, strict=True)]
        recs = [{**p["recommendations"][0], "model": m} for p, m in zip(per, self.names,
                                                                        strict=True)]
        pools = self.pools()
        cost = [p["cost_per_day"] for p in per]
        gpus = _gpu_totals(pools[0]) if len(pools) == 1 else dict.fromkeys(_gpu_totals(pools[0]))
        return {
            "model": " + ".join(self.names),
            "target_rate_per_s": max(x["offered_rps"] for x in sched),
            "models": [{"model": m, **p} for m, p in zip(self.names, per, strict=True)],
            "recommendations": recs,
            "gpu_pools": pools,
            "timezone": self.days[0].timezone,  # every model's day is planned in one zone
            "schedule": sched,
            "peak_replicas": max(s["replicas"] for s in sched),
            **gpus,  # GPU counts of the one GPU type; null over several (see gpu_pools)
            **_pool_costs(pools, cost),
            "warnings": [w for p in per for w in p.get("warnings", [])],
        }


def _gpu_totals(pool: dict[str, Any]) -> dict[str, Any]:
    """The plan's GPU counts and GPU-hours: its one pool's."""
    return {"peak_gpus": pool["peak_gpus"],
            "separate_fleets_peak_gpus": pool["separate_fleets_peak_gpus"],
            "gpu_hours": pool["gpu_hours"], "fixed_fleet_gpu_hours": pool["fixed_pool_gpu_hours"],
            "separate_fleets_gpu_hours": pool["separate_fleets_gpu_hours"]}


def _pool_costs(pools: list[dict[str, Any]], cost: list[Any]) -> dict[str, Any]:
    """Cost per day autoscaled, of the fixed pools and of separate fleets, over all pools
    (dollars add up across GPU types; `cost`: each model's own cost per day, None where its
    GPU has no price)."""
    return {
        "cost_per_day": None if None in cost else float(sum(cost)),
        "fixed_fleet_cost_per_day": sum_or_none(p["fixed_pool_cost_per_day"] for p in pools),
        "separate_fleets_cost_per_day": sum_or_none(p["separate_fleets_cost_per_day"]
                                                     for p in pools),
    }


def sum_or_none(xs: Any) -> float | None:
    """The sum, or None when any term is unknown (an unpriced GPU's cost)."""
    vals = list(xs)
    return None if any(v is None for v in vals) else float(sum(vals))


def plan_pool_day(cat: Catalog, plan: PlanFile, opts: DayOptions,
                  run: Callable[[Catalog, PlanFile], Any], base: Path | None = None) -> PoolDay:
    """Each model's day plan (its lanes; its own candidates/engine or the plan's), pooled."""
    assert plan.models is not None, "plan_pool_day needs models:"
    days, names = [], []
    for m in plan.models:
        one = plan.model_copy(update={
            "models": None, "model": m.model, "workloads": m.workloads,
            "candidates": m.candidates or plan.candidates, "engine": m.engine or plan.engine})
        try:
            days.append(plan_day(cat, one, opts, run, base))
        except InputError as e:
            raise InputError(f"model {m.model}: {e}") from e
        names.append(m.model)
    if len(set(names)) != len(names):
        raise InputError("models: a model is listed twice; give each its lanes once")
    return PoolDay(placed_together(days), names)


def placed_together(days: list[DayPlan]) -> list[DayPlan]:
    """The models' day plans, whose fleets run at once, with their launch lines placed as one
    (flags.place_together: hosts, GPUs and ports continue from one fleet to the next): each
    model's recommended fleets first (its lanes' pools when it recommends a pool per lane, else
    its best), then the fleets each prints for comparison (the other layout's), after every
    fleet that runs, so no printed line takes a GPU or a port of one that runs."""
    runs = [_fleets(d, _deploys_lanes(d)) for d in days]
    alts = [_fleets(d, not _deploys_lanes(d)) for d in days]
    placed = iter(place_together([r for fleets in (*runs, *alts) for r in fleets]))
    runs = [[next(placed) for _ in fleets] for fleets in runs]
    alts = [[next(placed) for _ in fleets] for fleets in alts]
    return [_replaced(d, run if _deploys_lanes(d) else alt, alt if _deploys_lanes(d) else run)
            for d, run, alt in zip(days, runs, alts, strict=True)]


def _deploys_lanes(d: DayPlan) -> bool:
    """The model's plan recommends a pool per lane (`pools: separate`, every lane planned), as
    layout.recommended_layout reads it from the plan's JSON."""
    pools = d.plan.pools
    return d.plan.inputs.pools == "separate" and pools is not None and bool(pools.separate) \
        and all(p.best is not None for p in pools.separate)


def _fleets(d: DayPlan, lanes: bool) -> list[Any]:
    """The model's lanes' pools (`lanes`: those it planned; none without a comparison), else
    its best fleet."""
    if not lanes:
        return [d.plan.best]
    return [p.best for p in (d.plan.pools.separate if d.plan.pools else []) if p.best]


def _replaced(d: DayPlan, lanes: list[Any], best: list[Any]) -> DayPlan:
    """d with its best fleet (`best`: one) and its lanes' pools (`lanes`, in order) placed."""
    plan = d.plan
    (top,) = best
    pools = plan.pools
    if pools is not None:
        it = iter(lanes)
        pools = replace(pools, shared=top, separate=[
            replace(p, best=next(it)) if p.best is not None else p for p in pools.separate])
    return replace(d, plan=replace(plan, recommendations=[top, *plan.recommendations[1:]],
                                   pools=pools))
