"""Check recommendations with the simulator: the same step model, the lanes' own arrival
processes, lengths and priorities, at the per-replica rate."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from capplan.models.engine import ClientJitter, SchedulerPolicy
from capplan.models.perf import StepModel
from capplan.plan.deployment import Deployment
from capplan.plan.result import Verification
from capplan.plan.schema import Lane
from capplan.plan.simulation import add_request_overhead
from capplan.plan.slo import SloSet
from capplan.sim import run_scheduler, simulate
from capplan.sim.workload import Lane as SimLane
from capplan.sim.workload import Workload, parse_length

_SEED = 7


@dataclass(frozen=True, kw_only=True)
class VerifyJob:
    """One replica of a recommendation to simulate: its engine, its share of each lane."""

    lanes: Sequence[Lane]
    replicas: int
    step: StepModel
    num_gpu_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    requests: int
    policy: SchedulerPolicy = SchedulerPolicy()
    """The engine profile's scheduler policy (prefill-first, reservation...)."""
    request_overhead_s: float = 0.0
    state_blocks: int = 0
    """Blocks a running sequence's recurrent state holds (hybrids; plan/deployment.KvPool)."""


def _sim_lanes(job: VerifyJob) -> tuple[SimLane, ...]:
    return tuple(
        SimLane(name=ln.name, rate_per_s=ln.rate_per_s / job.replicas, arrival=ln.arrival,
                burstiness=ln.burstiness, input_len=parse_length(str(ln.input_len)),
                output_len=parse_length(str(ln.output_len)), priority=ln.priority,
                **({"prefix": ln.prefix.spec()} if getattr(ln, "prefix", None) else {}))
        for ln in job.lanes)


def simulate_recommendation(job: VerifyJob) -> Verification:
    """Simulate one replica at its per-replica rate; ok if every lane's SLOs hold."""
    wl = Workload(_sim_lanes(job), num_requests=job.requests)
    reqs, _ = wl.generate(np.random.default_rng(_SEED)).clip_to_context(job.max_model_len)
    res = run_scheduler(job.step, reqs, wl.lanes, scheduler="continuous",
                        num_gpu_blocks=job.num_gpu_blocks, block_size=job.block_size,
                        max_num_seqs=job.max_num_seqs,
                        max_num_batched_tokens=job.max_num_batched_tokens,
                        policy=job.policy, state_blocks=job.state_blocks).to_dict()
    res = add_request_overhead(res, job.request_overhead_s)
    # Decode steps are shared, so TBT is one distribution for all lanes; TTFT and E2E are
    # checked per lane against that lane's own SLO (priorities make them differ).
    misses = SloSet.strictest(SloSet.of(ln.slo) for ln in job.lanes).only("tbt_s").misses(res)
    # An overloaded replica's queue keeps growing while requests arrive. (Completions per
    # second of a finite run are biased low by its drain, so compare the waiting queue in the
    # last third of the arrival window with the middle third instead.)
    offered = sum(ln.rate_per_s for ln in job.lanes) / job.replicas
    if _queue_grows(res.get("time_series") or {}, len(reqs) / offered):
        misses.append(f"overloaded: the waiting queue keeps growing at {offered:.3g} "
                      "requests/s")
    per_lane = res.get("lanes") or {}
    several = len(job.lanes) > 1
    for ln in job.lanes:
        got = per_lane.get(ln.name, res) if several else res
        own = SloSet.of(ln.slo).only("ttft_s", "e2e_s")
        misses += own.misses(got, f" ({ln.name})" if several else "")
    keep = ("ttft_s", "tbt_s", "e2e_s", "tpot_s", "output_tokens_per_s", "requests_per_s",
            "mean_running_batch", "preemptions", "kv_peak_utilization")
    return Verification(ok=not misses, reason="; ".join(misses), requests=job.requests,
                        simulated={k: res[k] for k in keep if k in res})


def _queue_grows(ts: dict[str, list[float]], window_s: float) -> bool:
    t = np.asarray(ts.get("time_s", []), float)
    w = np.asarray(ts.get("waiting", []), float)
    if t.size < 6 or window_s <= 0:
        return False
    mid = w[(t > window_s / 3) & (t <= 2 * window_s / 3)]
    last = w[(t > 2 * window_s / 3) & (t <= window_s)]
    if not mid.size or not last.size:
        return False
    return bool(last.mean() > 5 and last.mean() > 2 * mid.mean() + 2)


def simulate_closed_loop(dep: Deployment, concurrency: int, isl: int, osl: int,
                         requests: int = 400,
                         client_jitter: ClientJitter | None = None) -> dict[str, Any]:
    """A closed loop of `concurrency` clients with fixed lengths, on one deployment, with the
    clients' timing jitter (default: the engine profile's, ClientJitter)."""
    lane = SimLane(name="bench", input_len=parse_length(isl), output_len=parse_length(osl))
    wl = Workload((lane,), num_requests=requests, concurrency=concurrency)
    s = dep.settings
    overhead = float(np.asarray(dep.step.request_overhead_s))
    # The overhead is part of each client's cycle (the next request reaches the engine that
    # long after the last one ended) and of what the client measures.
    pool = dep.pool
    res = simulate(dep.step, workload=wl, seed=_SEED, scheduler="continuous",
                   num_gpu_blocks=pool.num_blocks, block_size=pool.block_size,
                   state_blocks=pool.state_blocks_per_seq,
                   max_num_seqs=s.max_num_seqs,
                   max_num_batched_tokens=max(s.max_num_batched_tokens, s.max_num_seqs),
                   policy=s.profile.scheduler, request_overhead_s=overhead,
                   client_jitter=(s.profile.client_jitter if client_jitter is None
                                  else client_jitter)).to_dict()
    return add_request_overhead(res, overhead)


PARALLEL_MIN_REQUESTS = 2000
"""Below this many simulated requests in all, verification runs serially: a worker process
costs ~0.1 s to start, more than small simulations take."""


class ParallelVerifier:
    """`simulate_recommendation` over several processes (`--jobs N`): `map(jobs)` returns the
    results in job order, each the same as a serial call (every job seeds its own run)."""

    def __init__(self, jobs: int) -> None:
        self.jobs = max(1, int(jobs))

    def __call__(self, job: VerifyJob) -> Verification:
        return simulate_recommendation(job)

    def map(self, jobs: list[VerifyJob]) -> list[Verification]:
        workers = min(self.jobs, len(jobs))
        if workers < 2 or sum(j.requests for j in jobs) < PARALLEL_MIN_REQUESTS:
            return [simulate_recommendation(j) for j in jobs]
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # fork: the children inherit the loaded modules and catalog (no re-import)
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            return list(pool.map(simulate_recommendation, jobs))
