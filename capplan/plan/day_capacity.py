"""The capacity per replica the simulator sustains within the SLOs at the day's peak window.

The analytic capacity (the highest per-replica rate at which the queueing model meets every
SLO, `Candidate.max_rate_per_s`) can sit above what the simulator sustains: Llama-3.1-8B on an
H100 (800 / 250-token lognormal requests, TTFT 1 s, TBT 60 ms) is given 24.26 req/s, while its
replay at 24.3 req/s is overloaded (the backlog test, capplan.sim.stability: 23.4 req/s served
while requests arrived). A day plan with no headroom then sizes windows above capacity, and
only the windows the replay checks are caught. So, when the day is replayed, one replica of
the chosen configuration is replayed at the peak window's lanes (its mix, arrival process and
lengths) for SIM_WINDOWS windows' length of arrivals, and its capacity is the highest rate at which
that replay is stable and meets every SLO (strictly: the day replay's 10% tolerance is left
as margin), found by bisection below the analytic capacity (MAX_SIMS replays, the same
requests with their arrival times scaled, so a higher rate is the same requests closer
together). The day's windows are then sized at the analytic capacities scaled by that over
the analytic one at the peak (`day_sizing`'s capacities times the factor)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from capplan.plan.slo import SloSet
from capplan.sim.workload import Requests

SIM_SEED = 31
"""Seed of the requests replayed (fixed: the answer is repeatable)."""
SIM_WINDOWS = 3
"""Windows' length of arrivals replayed: near capacity a queue's excursions last long, so a
p99 over one window from an empty start reads low (Llama-3.1-8B above at 23.75 req/s: TTFT
p99 0.95 s over its first 15 minutes, 1.26-1.95 s over the next ones; over 45 minutes, three
seeds put the 1-s SLO between 23.0 and 23.5 req/s)."""
MIN_REQUESTS = 2000
"""At least this many requests per replay (a p99 of its own; a slow replica's window may hold
few)."""
MAX_REQUESTS = 100_000
STEPS = 6
"""Bisection steps below the analytic capacity: resolution 1/64 of it (1.6%)."""


def _requests(lanes: Any, n: int, max_model_len: int) -> Requests:
    """n requests of the lanes' mix at a total rate of 1 request/s (their arrival processes,
    lengths cut to max_model_len as the server's), in one lane as the day replay's."""
    from capplan.plan.verify import sim_lanes
    from capplan.sim.workload import Workload

    total = sum(ln.rate_per_s for ln in lanes)
    wl = Workload(sim_lanes(lanes, total), num_requests=n)
    reqs, _ = wl.generate(np.random.default_rng(SIM_SEED)).clip_to_context(max_model_len)
    # one queue, as the day replay runs its merged lanes (it routes and serves them alike)
    return replace(reqs, lane=np.zeros(len(reqs), np.int64))


def _meets_at(base: Requests, rate_rps: float, dep: Any, slos: SloSet) -> bool:
    """Whether one replica replaying `base` at `rate_rps` is stable and meets every SLO."""
    from capplan.plan.day_replay import meets, replay_windows

    reqs = replace(base, arrival_at_s=np.asarray(base.arrival_at_s, float) / rate_rps)
    end = float(reqs.arrival_at_s[-1]) + 1e-6
    stats = replay_windows(reqs, dep, [(0.0, end, 1)], 0.0, slos)[0]
    return meets(stats, slos, tolerance=0.0)


def simulated_capacity(dep: Any, lanes: Any, slos: SloSet, analytic_rps: float,
                       window_s: float) -> float:
    """The highest per-replica rate, at most `analytic_rps`, at which one replica (`dep`, a
    capplan.plan.deployment.Deployment) replaying the lanes' traffic for SIM_WINDOWS x
    `window_s` of arrivals is stable and meets `slos` (module docstring)."""
    n = int(np.clip(math.ceil(analytic_rps * window_s * SIM_WINDOWS), MIN_REQUESTS,
                    MAX_REQUESTS))
    base = _requests(lanes, n, dep.settings.max_model_len)
    if _meets_at(base, analytic_rps, dep, slos):
        return analytic_rps
    lo, hi = 0.0, analytic_rps
    for _ in range(STEPS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _meets_at(base, mid, dep, slos) else (lo, mid)
    return lo


def sized_at_simulated(cat: Any, plan: Any, cand: Any, size: Any, k: int, window_s: float
                       ) -> tuple[Any, float, list[str]]:
    """`size` (plan/day_mix.Sizing) with every capacity scaled by the simulated capacity at
    peak window k over its analytic one, when the simulator sustains less; the simulated
    capacity; a note when it scaled. `plan` is the peak window's plan file (its lanes at the
    peak's rates, trace lanes with their lengths)."""
    from capplan.plan.day_replay import replica_deployment

    slos = SloSet.strictest(SloSet.of(ln.slo) for ln in plan.workloads)
    analytic = float(size.capacity_rps[k])
    if analytic <= 0:
        return size, analytic, []
    dep = replica_deployment(cat, plan.model, cand)
    sim = simulated_capacity(dep, plan.workloads, slos, analytic, window_s)
    if sim >= analytic:
        return size, sim, []
    if sim <= 0:  # no rate the bisection tried met the SLOs: nothing to scale by
        return size, sim, [f"the simulator met the SLOs at no rate it tried per replica at "
                           f"the peak window's traffic (up to {analytic:.3g} req/s): windows "
                           "keep the analytic capacity, and the day replay judges them"]
    f = sim / analytic
    note = (f"the simulator sustains {sim:.3g} req/s per replica within the SLOs at the peak "
            f"window's traffic, below the analytic {analytic:.3g}: every window's capacity "
            f"is scaled by {f:.3f}")
    return replace(size, capacity_rps=np.asarray(size.capacity_rps) * f), sim, [note]
