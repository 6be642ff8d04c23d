"""Simulate a fleet of replicas behind a router: the library side of `capplan simulate
--replicas / --schedule` and of `capplan.simulate(replicas=..., router=...)` (docs/fleet.md).

Open loops and traces replay on `capplan.sim.fleet.replay_schedule` (every router). A closed
loop of C clients splits its clients over the N replicas (C // N each, one more for the first
C mod N), each client keeping its replica (a sticky session): what a router converges to with
identical replicas and one request in flight per client; the router plays no part then.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from capplan import limits as L
from capplan.errors import InputError
from capplan.plan.deployment import Deployment
from capplan.sim.entities import RunRecord, StepSummary
from capplan.sim.fleet import ROUTERS, FleetReplaySpec, replay_schedule, run_replica
from capplan.sim.metrics import step_summary, summarize
from capplan.sim.routers import canonical_router
from capplan.sim.workload import Lane, Requests

REPLICAS = L.REPLICAS


@dataclass(frozen=True, kw_only=True)
class FleetOptions:
    """How many replicas and how requests reach them."""

    replicas: int = 1
    router: str = "least-outstanding"
    schedule: tuple[tuple[float, int], ...] = ()
    """(start_s, replicas) per window, in order from 0; overrides `replicas`."""
    startup_lag_s: float = 0.0
    slo_ttft_s: float | None = None
    slo_tbt_s: float | None = None
    """Per-request targets of the attainment (TTFT, TPOT), open loops."""

    @property
    def is_fleet(self) -> bool:
        return self.replicas > 1 or bool(self.schedule)

    def __post_init__(self) -> None:
        # one name per policy (capplan.sim.routers): aliases become the canonical name
        object.__setattr__(self, "router", canonical_router(self.router, ROUTERS, "--router"))

    def check(self) -> None:
        REPLICAS.check(self.replicas, "--replicas")
        if not (math.isfinite(self.startup_lag_s) and self.startup_lag_s >= 0):
            raise InputError(f"--startup-lag {self.startup_lag_s!r}: expected seconds >= 0")


def parse_schedule(text: str) -> tuple[tuple[float, int], ...]:
    """'START_S:REPLICAS,...' (e.g. '0:2,900:5,1800:3') -> ((0.0, 2), (900.0, 5), ...)."""
    out = []
    for part in str(text).split(","):
        start, sep, count = part.strip().partition(":")
        try:
            if not sep:
                raise ValueError
            out.append((float(start), int(count)))
        except ValueError:
            raise InputError(f"--schedule {text!r}: expected START_S:REPLICAS,... "
                             "(e.g. 0:2,900:5)") from None
    if out[0][0] != 0 or any(b[0] <= a[0] for a, b in zip(out, out[1:], strict=False)):
        raise InputError(f"--schedule {text!r}: windows start at 0 and increase")
    for _, n in out:
        if n:
            REPLICAS.check(n, "--schedule replicas")
    return tuple(out)


def windows_of(opts: FleetOptions, reqs: Requests) -> list[tuple[float, float, int]]:
    """The replay windows: the schedule's, the last one to the last arrival (and a second);
    one window for a fixed replica count."""
    last = float(np.max(reqs.arrival_at_s)) if len(reqs) else 0.0
    sched = opts.schedule or ((0.0, opts.replicas),)
    ends = [s for s, _ in sched[1:]] + [max(last, sched[-1][0]) + 1.0]
    return [(s, e, n) for (s, n), e in zip(sched, ends, strict=True)]


def merge_records(recs: list[RunRecord]) -> RunRecord:
    """Runs of separate replicas as one (requests concatenated, step aggregates summed)."""
    sts = [step_summary(r) for r in recs]
    cat = np.concatenate
    z, zi = np.zeros(0), np.zeros(0, np.int64)
    steps = StepSummary(
        num_steps=sum(s.num_steps for s in sts),
        tbt_gap_s=cat([s.tbt_gap_s for s in sts]),
        tbt_count=cat([np.asarray(s.tbt_count, float) for s in sts]),
        running_s=sum(s.running_s for s in sts), in_system_s=sum(s.in_system_s for s in sts),
        kv_blocks_max=max(s.kv_blocks_max for s in sts), series_start_s=z, series_running=zi,
        series_waiting=zi, series_kv_blocks=zi)
    return RunRecord(
        **{k: cat([getattr(r, k) for r in recs]) for k in (
            "arrival_at_s", "admitted_at_s", "first_token_at_s", "finished_at_s",
            "input_tokens", "output_tokens", "lane", "extra_gaps_s")},
        step_start_s=z, step_dur_s=z, step_tbt_count=zi, step_tbt_gap_s=z, step_running=zi,
        step_waiting=zi, step_kv_blocks=zi, num_gpu_blocks=recs[0].num_gpu_blocks,
        preemptions=sum(r.preemptions for r in recs), scheduler="continuous", steps=steps,
        prefix_hit_tokens=sum(r.prefix_hit_tokens for r in recs))


def _closed_loop(dep: Deployment, reqs: Requests, opts: FleetOptions, sim_engine: str
                 ) -> tuple[RunRecord, list[dict[str, Any]]]:
    """Each replica runs its share of the clients and of the requests (module docstring)."""
    n = opts.replicas
    c = int(reqs.concurrency or 1)
    if c < n:
        raise InputError(f"--concurrency {c} with --replicas {n}: fewer clients than replicas")
    idx = np.arange(len(reqs))
    s = dep.settings
    overhead = float(np.asarray(dep.step.request_overhead_s))
    recs, per = [], []
    for r in range(n):
        mine = idx[idx % n == r]
        sub = Requests(reqs.arrival_at_s[mine], reqs.input_tokens[mine],
                       reqs.output_tokens[mine], reqs.lane[mine], c // n + (r < c % n),
                       adapter=None if reqs.adapter is None else reqs.adapter[mine])
        recs.append(run_replica(dep, sub, sim_engine, overhead, s.profile.client_jitter))
        per.append({"requests": len(mine), "clients": int(sub.concurrency or 0)})
    return merge_records(recs), per


def run_fleet(dep: Deployment, reqs: Requests, lanes: tuple[Lane, ...], opts: FleetOptions,
              sim_engine: str = "auto") -> dict[str, Any]:
    """The simulate result keys over the whole fleet (the replicas' requests together, their
    step integrals summed: `mean_running_batch` is the fleet's), plus `replicas`, `router`,
    `per_replica`, `unfinished` and, for a schedule, `windows` (`WindowStats` keys)."""
    opts.check()
    if reqs.concurrency is not None:
        if opts.schedule:
            raise InputError("--schedule replays open loops and traces, not --concurrency")
        rec, per = _closed_loop(dep, reqs, opts, sim_engine)
        out = summarize(rec, lanes).to_dict()
        return {**out, "replicas": opts.replicas, "router": "sticky clients",
                "per_replica": per, "unfinished": 0}
    wins = windows_of(opts, reqs)
    res = replay_schedule(FleetReplaySpec(requests=reqs, engine_config=dep, windows=wins,
                                          router=opts.router, startup_lag_s=opts.startup_lag_s,
                                          sim_engine=sim_engine, slo_ttft_s=opts.slo_ttft_s,
                                          slo_tbt_s=opts.slo_tbt_s))
    assert res.record is not None
    out = summarize(res.record, lanes).to_dict()
    out.pop("time_series", None)
    out["arrival_window"] = res.arrival_window  # every arrival, the unfinished ones included
    fleet: dict[str, Any] = {"replicas": max(n for _, _, n in wins), "router": opts.router,
                             "per_replica": res.per_replica, "unfinished": res.unfinished,
                             "replica_seconds": res.replica_seconds}
    if res.attainment is not None:
        fleet["attainment"] = res.attainment
    if opts.schedule:
        fleet["startup_lag_s"] = opts.startup_lag_s
        fleet["windows"] = [w.to_dict() for w in res.windows]
    return {**out, **fleet}
