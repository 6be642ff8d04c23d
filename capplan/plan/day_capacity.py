"""The capacity per replica the simulator sustains within the SLOs at the day's peak window:
the one verdict a replayed day plan sizes its windows and states its recommendation with.

The planner's capacity `c` (the analytic one, or the rate its replay confirmed: a check of
`verify.requests_per_check` requests, one seed) can sit above what the simulator sustains: its
short replay starts empty, and near capacity a p99 over a few thousand requests turns on the
seed (Llama-3.1-8B on H100 TP 2, 800 / 250-token lognormal requests, TTFT 1 s, TBT 60 ms,
confirmed at 48 req/s by the planner's 4,000 requests: 20,000 requests at 48 req/s put TTFT
p99 at 1.5 s, and two of three seeds miss). So, when the day is replayed, one replica of the
chosen configuration is replayed at the peak window's lanes (its mix, arrival process and
lengths) for SIM_WINDOWS windows' length of arrivals (at least MIN_REQUESTS), and its capacity
is the highest rate, at most `c`, at which that replay is stable and meets every SLO strictly
(the day replay's 10% tolerance is left as margin): `c` itself when it passes there, else by
bisection below it (MAX_SIMS replays, the same requests with their arrival times scaled, so a
higher rate is the same requests closer together). That rate is the day plan's capacity per
replica: the windows are sized at it (`day_sizing`'s capacities times it over theirs at the
peak), and the recommendation states it and this replay as its confirmation (plan/day_fleet.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from capplan.plan.result import Verification
from capplan.plan.search import replay_binding, replay_found
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


@dataclass(frozen=True)
class CapacityCheck:
    """What the capacity replay found: the rate (0: none it tried met the SLOs), the requests
    replayed, the replay's stats at that rate and what the lowest rate that missed missed."""

    rate_rps: float
    requests: int = 0
    stats: dict[str, Any] | None = None
    missed: dict[str, Any] | None = field(default=None, compare=False)

    def verification(self) -> Verification | None:
        """The replay at the capacity as the recommendation's confirmation (None: nothing met
        the SLOs, or no stats)."""
        if self.stats is None or self.rate_rps <= 0:
            return None
        st = self.stats
        sim = {"ttft_s": {"p99": st.get("ttft_p99_s")}, "tbt_s": {"p99": st.get("tbt_p99_s")},
               "tpot_s": {"p99": st.get("tpot_p99_s"), "mean": st.get("tpot_mean_s")},
               "e2e_s": {"p99": st.get("e2e_p99_s")}, "requests_per_s": st.get("served_rps")}
        return Verification(ok=True, reason="", requests=self.requests, simulated=sim,
                            rate_per_s=self.rate_rps)

    def binding(self, slos: SloSet) -> str:
        """What the replay found binding where it lowered the capacity: the SLO the lowest
        rate that missed was furthest over, or capacity when it was overloaded."""
        from capplan.plan.day_replay import stat_key

        m = self.missed or {}
        if m.get("overloaded") or m.get("unfinished"):
            return replay_binding("capacity")
        over = [(float(m[stat_key(t)]) / t.limit_s, t.label) for t in slos
                if m.get(stat_key(t)) is not None and np.isfinite(m[stat_key(t)])]
        return replay_binding(f"{max(over)[1]} SLO" if over else "capacity")


def _replay_at(base: Requests, rate_rps: float, dep: Any, slos: SloSet
               ) -> tuple[bool, dict[str, Any]]:
    """Whether one replica replaying `base` at `rate_rps` is stable and meets every SLO
    strictly, and the replay's stats."""
    from capplan.plan.day_replay import meets, replay_windows

    reqs = replace(base, arrival_at_s=np.asarray(base.arrival_at_s, float) / rate_rps)
    end = float(reqs.arrival_at_s[-1]) + 1e-6
    stats = replay_windows(reqs, dep, [(0.0, end, 1)], 0.0, slos)[0]
    return meets(stats, slos, tolerance=0.0), stats


def simulated_capacity(dep: Any, lanes: Any, slos: SloSet, analytic_rps: float,
                       window_s: float) -> CapacityCheck:
    """The highest per-replica rate, at most `analytic_rps` (the planner's capacity), at which
    one replica (`dep`, a capplan.plan.deployment.Deployment) replaying the lanes' traffic for
    SIM_WINDOWS x `window_s` of arrivals is stable and meets `slos` (module docstring)."""
    n = int(np.clip(math.ceil(analytic_rps * window_s * SIM_WINDOWS), MIN_REQUESTS,
                    MAX_REQUESTS))
    base = _requests(lanes, n, dep.settings.max_model_len)
    ok, stats = _replay_at(base, analytic_rps, dep, slos)
    if ok:
        return CapacityCheck(analytic_rps, n, stats)
    lo, hi, at_lo, missed = 0.0, analytic_rps, None, stats
    for _ in range(STEPS):
        mid = (lo + hi) / 2
        ok, st = _replay_at(base, mid, dep, slos)
        if ok:
            lo, at_lo = mid, st
        else:
            hi, missed = mid, st
    return CapacityCheck(lo, n, at_lo, missed)


def capacity_source(cand: Any) -> str:
    """What gave a candidate's capacity per replica: "the analytic model" (the queueing
    model), or "the planner's replay" (it sized the replicas, or confirmed a rate below the
    analytic one)."""
    binding = str(getattr(cand, "binding_constraint", ""))
    replayed = getattr(cand, "sized_by_replay", False) or replay_found(binding)
    return "the planner's replay" if replayed else "the analytic model"


def sized_at_simulated(cat: Any, plan: Any, cand: Any, size: Any, k: int, window_s: float
                       ) -> tuple[Any, CapacityCheck, list[str]]:
    """`size` (plan/day_mix.Sizing) with every capacity scaled by the simulated capacity at
    peak window k over the planner's there (the analytic one, or what its replay confirmed),
    when the simulator sustains less; the capacity check; a note saying what the check
    found. `plan` is the peak window's plan file (its lanes at the peak's rates, trace lanes
    with their lengths)."""
    from capplan.plan.day_replay import replica_deployment

    slos = SloSet.strictest(SloSet.of(ln.slo) for ln in plan.workloads)
    given = float(size.capacity_rps[k])
    if given <= 0:
        return size, CapacityCheck(given), []
    dep = replica_deployment(cat, plan.model, cand)
    check = simulated_capacity(dep, plan.workloads, slos, given, window_s)
    sim, src = check.rate_rps, capacity_source(cand)
    how = (f"one replica replayed at the peak window's traffic ({check.requests:,} requests, "
           "every SLO strictly)" if check.requests else "one replica replayed at the peak "
           "window's traffic")
    if sim >= given:
        return size, check, [f"{how} meets the SLOs at the {given:.3g} req/s per replica "
                             f"{src} gave: the capacity the windows are sized at"]
    if sim <= 0:  # no rate the bisection tried met the SLOs: nothing to scale by
        return size, check, [
            f"the simulator met the SLOs at no rate it tried per replica at the peak window's "
            f"traffic (up to {given:.3g} req/s): windows keep the capacity {src} gave "
            f"({'analytic capacity' if src == 'the analytic model' else 'not confirmed'}), "
            "and the day replay judges them"]
    f = sim / given
    note = (f"the simulator sustains {sim:.3g} req/s per replica within the SLOs ({how}), "
            f"below the {given:.3g} req/s {src} gave: every window's capacity is scaled by "
            f"{f:.3f}")
    return replace(size, capacity_rps=np.asarray(size.capacity_rps) * f), check, [note]
