"""Several models on one GPU pool over a day: each model's day plan, GPUs per window per model,
the pool's peak (the most GPUs any window needs, all models together) against one fleet per
model (the sum of each model's own peak), and the GPU-hours of both.

Models share a pool when their plans pick the same GPU type: a model's off-peak GPUs then serve
another's peak (the pool is sized for the peak of the sum, not the sum of the peaks). Models on
different GPU types form a pool each. Each replica keeps whole GPUs: two small models sharing
one GPU (memory fractions) is not planned here.

A model that deploys a pool per lane is planned as a plan of one model deploying them is
(plan/lane_day.py: each lane's own day plan): its fleets are its lanes' pools, which the
schedule, the pool's peak and the GPU-hours count (each lane's pool a fleet with its own peak),
not its shared pool, which it prints only for comparison.
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
from capplan.plan.flags import fleet_pool, place_together
from capplan.plan.placement import Around, Output, place, place_around
from capplan.plan.schema import PlanFile


@dataclass(frozen=True)
class PoolDay:
    """The day plans of several models and their shared pool(s)."""

    days: list[Any]
    """Each model's day plan (DayPlan), or, for a model that deploys a pool per lane, its
    lanes' own day plans (plan/lane_day.py's LaneDays): its fleets are then its lanes' pools."""
    names: list[str]
    unit: str = "model"
    """What each day plan is a fleet of: "model", or "lane" for a model's pool per lane
    (plan/lane_day.py); it names the keys (`models` / `lanes`, `gpus_by_model` / `..._lane`)."""

    def _fleet_days(self) -> list[tuple[int, DayPlan]]:
        """(index of its model, its day plan) of every fleet that runs, in order: a model's
        own, or each of its lanes' pools (`running_days`)."""
        return [(i, f) for i, d in enumerate(self.days) for f in running_days(d)]

    def _gpus(self) -> np.ndarray:
        """(fleets, windows) GPUs per window (a shorter day counts 0 after its end)."""
        fleets = [f for _, f in self._fleet_days()]
        n = max(len(d.windows) for d in fleets)
        g = np.zeros((len(fleets), n), np.int64)
        for i, d in enumerate(fleets):
            g[i, :len(d.windows)] = [w.gpus for w in d.windows]
        return g

    def _edges(self) -> tuple[np.ndarray, np.ndarray]:
        """(start_s, end_s) of the pool's windows: the longest fleet day's."""
        longest = max((f for _, f in self._fleet_days()),
                      key=lambda d: (len(d.windows), d.span_s)).windows
        return (np.array([w.start_s for w in longest]), np.array([w.end_s for w in longest]))

    def pools(self) -> list[dict[str, Any]]:
        """One pool per GPU type: its peak, GPU-hours, and what separate fleets would need
        (each fleet fixed at its own peak: a model's, or each lane's pool of a model that
        deploys a pool per lane)."""
        g = self._gpus()
        start, end = self._edges()
        length_h = (end - start) / HOUR_S
        span_h = float(length_h.sum())
        fleets = self._fleet_days()
        out = []
        types = sorted({f.plan.best.candidate.gpu.key for _, f in fleets})
        for gpu in types:
            idx = [k for k, (_, f) in enumerate(fleets) if f.plan.best.candidate.gpu.key == gpu]
            total = g[idx].sum(axis=0)
            peaks = g[idx].max(axis=1)
            price = fleets[idx[0]][1].price_per_gpu_hour
            pool_peak, sep = int(total.max()), int(peaks.sum())
            names = [self.names[i] for i in dict.fromkeys(fleets[k][0] for k in idx)]
            out.append({
                "gpu": gpu, f"{self.unit}s": names,
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

    def schedule(self) -> list[dict[str, Any]]:
        """The pool's windows: every fleet's offered rate and replicas summed, GPUs per model
        (`gpus_by_model`, or per lane; a model's pools per lane together) and per GPU type (a
        total only over one type: an L40S and an H100 are not two of anything)."""
        g = self._gpus()
        start, end = self._edges()
        fleets = self._fleet_days()
        types = [f.plan.best.candidate.gpu.key for _, f in fleets]
        one_type = len(set(types)) == 1
        sched = []
        for k in range(g.shape[1]):
            ws = [f.windows[k] for _, f in fleets if k < len(f.windows)]
            by_gpu = {t: int(sum(g[i, k] for i in range(len(types)) if types[i] == t))
                      for t in sorted(set(types))}
            by_unit = {m: int(sum(g[i, k] for i, (j, _) in enumerate(fleets) if j == n))
                       for n, m in enumerate(self.names)}
            sched.append({
                "start_s": float(start[k]), "end_s": float(end[k]),
                "offered_rps": sum(w.offered_rps for w in ws),
                "replicas": sum(w.replicas for w in ws),
                "gpus": int(g[:, k].sum()) if one_type else None,
                f"gpus_by_{self.unit}": by_unit,
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
            # every model's day is planned in one zone
            "timezone": self._fleet_days()[0][1].timezone,
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
                  run: Callable[[Catalog, PlanFile], Any], base: Path | None = None,
                  lanes: Callable[[PlanFile, DayPlan], Any] | None = None) -> PoolDay:
    """Each model's day plan (its lanes; its own candidates/engine or the plan's), pooled;
    `lanes(one, day)`: the model's lanes' own day plans when its day plan deploys a pool per
    lane (day_run: plan/lane_day.py's plan_lane_days), else its day plan as it is."""
    assert plan.models is not None, "plan_pool_day needs models:"
    days, names = [], []
    for m in plan.models:
        one = plan.model_copy(update={
            "models": None, "model": m.model, "workloads": m.workloads,
            "candidates": m.candidates or plan.candidates, "engine": m.engine or plan.engine})
        try:
            day = plan_day(cat, one, opts, run, base)
            days.append(day if lanes is None else lanes(one, day))
        except InputError as e:
            raise InputError(f"model {m.model}: {e}") from e
        names.append(m.model)
    if len(set(names)) != len(names):
        raise InputError("models: a model is listed twice; give each its lanes once")
    return PoolDay(placed_together(days), names)


def running_days(d: Any) -> list[DayPlan]:
    """The day plans of the fleets a model's entry runs: its own (a DayPlan), or its lanes'
    (a LaneDays: `lanes.days`)."""
    return [d] if isinstance(d, DayPlan) else list(d.lanes.days)


def placed_together(days: list[Any]) -> list[Any]:
    """The models' day plans (DayPlan, or a model's LaneDays) with their launch lines placed:
    the fleets that run (each model's lanes' pools when it deploys a pool per lane, else its
    best) as one output (flags.place_together: hosts, GPUs and ports continue from one fleet
    to the next), hosts named from them alone; the fleets printed for comparison (each model's
    other layout) each beside them (`_beside`): an alternative to its own model's running
    fleets, not run beside them (only one layout of a model runs), while the other models'
    fleets keep running."""
    groups = [_running(d) for d in days]
    runs = _placed(groups)
    alts = _beside([_compared(d) for d in days], groups)
    return [_with(d, run, alt) for d, run, alt in zip(days, runs, alts, strict=True)]


def _placed(groups: list[list[Any]]) -> list[list[Any]]:
    """Each group's recommendations, every group's placed as one output, in order."""
    placed = iter(place_together([r for g in groups for r in g]))
    return [[next(placed) for _ in g] for g in groups]


def _beside(alts: list[list[Any]], groups: list[list[Any]]) -> list[list[Any]]:
    """Each model's comparison (`alts`) placed beside the fleets that run (`groups`, each
    model's, placed as one output): from its model's own first running host, on its own
    running GPUs and ports, then on hosts past every running fleet and every comparison
    placed before it, never on another model's running GPUs or ports (placement.Around); its
    router on its model's first running fleet's front port. Fleets that `place_together`
    leaves as they are (one fleet, or no `relaunch`) keep their comparison as one output."""
    recs = [r for g in groups for r in g]
    flat = [r for g in alts for r in g]
    if len(recs) < 2 or any(r.relaunch is None for r in recs + flat):
        return _placed(alts)
    pools = tuple(fleet_pool(r) for r in recs)
    where = place("vllm", pools, fronts=len(pools))  # an aggregated replica's ports: any engine
    owner = [k for k, g in enumerate(groups) for r in g for _ in range(r.replicas)]
    hosts = max(_host(p) + p.span for p in where)
    placed = list(zip(owner, where, strict=True))
    out = []
    for k, g in enumerate(alts):
        others = [p for j, p in placed if j != k]
        mine = [p for j, p in placed if j == k]
        a = Around(own=tuple(sorted({_host(p) for p in mine})),
                   kinds=tuple((_host(p), fleet_pool(r).gpu) for r, p in _owned(groups[k], mine)),
                   after=max(_host(p) + p.span for _, p in placed),
                   taken=frozenset(x for p in others for x in _gpus(p)),
                   ports=frozenset((_host(p), p.port) for p in others),
                   front=sum(len(x) for x in groups[:k]), fronts=len(pools), hosts=hosts)
        shapes = tuple(fleet_pool(r) for r in g)
        out.append([r.with_(engine_flags=r.relaunch(out=Output(shapes, i, around=a)))
                    for i, r in enumerate(g)])
        placed += [(k, p) for p in place_around("vllm", shapes, a)]
    return out


def _owned(fleets: list[Any], where: list[Any]) -> list[tuple[Any, Any]]:
    """Each replica's placement (`where`, in order) with its fleet's recommendation."""
    it = iter(where)
    return [(r, next(it)) for r in fleets for _ in range(r.replicas)]


def _host(p: Any) -> int:
    """A placement's first host's index (HOSTn; `localhost`: 0)."""
    return int(p.host[4:]) if p.host.startswith("HOST") else 0


def _gpus(p: Any) -> list[tuple[int, int]]:
    """The (host, GPU) a placement takes: its GPUs on its host, or every GPU of its hosts."""
    if p.span == 1:
        return [(_host(p), x) for x in p.gpu_ids]
    return [(_host(p) + k, x) for k in range(p.span) for x in range(p.host_gpus)]


def _running(d: Any) -> list[Any]:
    """The fleets a model's entry runs (`running_days`' recommended fleets)."""
    if isinstance(d, DayPlan):
        return _fleets(d, deploys_lane_pools(d))
    return [f.plan.best for f in running_days(d)]


def _compared(d: Any) -> list[Any]:
    """The fleets a model's entry prints for comparison: the layout it does not deploy (a
    LaneDays: its model's one shared pool)."""
    if isinstance(d, DayPlan):
        return _fleets(d, not deploys_lane_pools(d))
    return [d.model.plan.best]


def _with(d: Any, run: list[Any], alt: list[Any]) -> Any:
    """A model's entry with its fleets placed (`run`: those it runs, `alt`: its comparison)."""
    if isinstance(d, DayPlan):
        lanes = deploys_lane_pools(d)
        return _replaced(d, run if lanes else alt, alt if lanes else run)
    model = _replaced(d.model, run, alt)  # its lanes' pools as placed to run
    ran = [_replaced(f, [], [r]) for f, r in zip(d.lanes.days, run, strict=True)]
    return replace(d, model=model, lanes=replace(d.lanes, days=ran))


def deploys_lane_pools(d: DayPlan) -> bool:
    """Whether a model's day plan deploys a pool per lane: its plan asks for one (`pools:
    separate`; the pool comparison exists only over several lanes, planner._per_lane_pools)
    and its peak plan found a fleet for every lane, as export/layout.recommended_layout reads
    it from the plan's JSON (the layout every export deploys)."""
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
