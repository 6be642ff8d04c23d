"""Verify a day plan by replaying its trace over the fleet (capplan.sim.fleet.replay_schedule).

Two replays over the same windows: the planned schedule (scale-ups started `replica_start_s`
ahead, so a window's replicas serve from its start) and a reactive policy (each window runs the
replicas the previous window needed, and the added ones serve only after the start-up lag).
Each window gets its SLO attainment (the fraction of its arrivals whose TTFT and TPOT meet the
SLOs) and its replayed TTFT / TBT p99 under both.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from capplan.plan.slo import SloSet
from capplan.sim.workload import Requests

SLO_TOLERANCE = 0.10
"""A replayed p99 within 10% of its SLO counts as meeting it (the acceptance's tolerance: the
analytic plan and the replay agree to about this much, docs/queueing.md)."""


def _deployment(cat: Any, dp: Any) -> Any:
    """The Deployment of one replica of the plan's best configuration."""
    from capplan.plan.deployment import resolve_deployment

    c = dp.plan.best.candidate
    return resolve_deployment(cat, dp.plan.model, c.gpu.key, c.settings,
                              c.group.calibration)


def _selected(n: int, peak: int, which: str) -> tuple[int, int]:
    """[first, last) window indices to replay: all, or the peak and its two neighbours."""
    if which == "all":
        return 0, n
    return max(0, peak - 1), min(n, peak + 2)


def _subset(reqs: Requests, start_s: float, end_s: float, last: bool) -> Requests:
    """The requests arriving in [start_s, end_s) (to end_s inclusive for the last window:
    a trace's last window ends at its last arrival)."""
    t = np.asarray(reqs.arrival_at_s)
    lo = int(np.searchsorted(t, start_s))
    hi = int(np.searchsorted(t, end_s, side="right" if last else "left"))
    return Requests(t[lo:hi], np.asarray(reqs.input_tokens)[lo:hi],
                    np.asarray(reqs.output_tokens)[lo:hi], np.zeros(hi - lo, np.int64))


def replay_windows(reqs: Requests, dep: Any, windows: list[tuple[float, float, int]],
                   startup_lag_s: float, slos: SloSet) -> list[dict[str, Any]]:
    """The one call into the fleet replay: per-window stats as dicts."""
    from capplan.sim import compiled_available
    from capplan.sim.fleet import FleetReplaySpec, replay_schedule

    # the compiled engine whatever each replica's share (sim.COMPILED_MIN_REQUESTS weighs
    # numba's ~1 s load against one run; a replay runs a replica per window and per policy)
    engine = "compiled" if compiled_available() else "auto"
    res = replay_schedule(FleetReplaySpec(
        requests=reqs, engine_config=dep, windows=windows, router="least-outstanding",
        startup_lag_s=startup_lag_s, slo_ttft_s=slos.ttft_p99_s, slo_tbt_s=slos.tbt_p99_s,
        sim_engine=engine))
    return [w.to_dict() for w in res.windows]


def _meets(stats: dict[str, Any], slos: SloSet) -> bool:
    lim = 1 + SLO_TOLERANCE
    ok = True
    for key, slo in (("ttft_p99_s", slos.ttft_p99_s), ("tbt_p99_s", slos.tbt_p99_s)):
        v = stats.get(key)
        if slo is not None and v is not None and np.isfinite(v):
            ok = ok and v <= lim * slo
    return ok and stats.get("unfinished", 0) == 0


def verify_day(cat: Any, dp: Any, reqs: Requests, which: str = "peak") -> Any:
    """The day plan with each replayed window's `replay` filled in (planned and reactive)."""
    w = dp.windows
    peak = max(range(len(w)), key=lambda i: w[i].offered_rps)
    lo, hi = _selected(len(w), peak, which)
    part = _subset(reqs, w[lo].start_s, w[hi - 1].end_s, hi == len(w))
    slos = SloSet.strictest(SloSet.of(ln.slo) for ln in dp.plan.lanes)
    if len(part) == 0:
        return dp
    dep = _deployment(cat, dp)
    planned = replay_windows(part, dep, [(x.start_s, x.end_s, max(x.replicas, 0))
                                         for x in w[lo:hi]], 0.0, slos)
    reactive = replay_windows(part, dep, [(x.start_s, x.end_s, x.reactive_replicas)
                                          for x in w[lo:hi]], dp.lag.total_s, slos)
    out = list(w)
    for i, (p, r) in enumerate(zip(planned, reactive, strict=True)):
        keep = ("replicas", "served_rps", "ttft_p99_s", "tbt_p99_s", "attainment",
                "completed", "unfinished")
        out[lo + i] = replace(w[lo + i], replay={
            "planned": {**{k: p[k] for k in keep}, "meets_slo": _meets(p, slos)},
            "reactive": {**{k: r[k] for k in keep}, "meets_slo": _meets(r, slos)}})
    notes = [*dp.notes, f"replayed windows {lo} to {hi - 1} ({len(part)} requests) over the "
             "planned schedule and a reactive one (least-outstanding routing; a replica the "
             f"reactive policy adds serves after {dp.lag.total_s:.0f} s)"]
    return replace(dp, windows=out, notes=notes)
