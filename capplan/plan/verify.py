"""Check recommendations with the simulator: the same step model, the lanes' own arrival
processes, lengths and priorities, at the per-replica rate."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from capplan.models.engine import ClientJitter, SchedulerPolicy
from capplan.models.layers import DENSE_LAYOUT, BlockLayout
from capplan.models.perf import StepModel
from capplan.plan.deployment import Deployment
from capplan.plan.result import Verification
from capplan.plan.schema import Lane
from capplan.plan.slo import SloSet

if TYPE_CHECKING:
    from capplan.sim.workload import Lane as SimLane

_SEED = 7


@dataclass(frozen=True, kw_only=True)
class VerifyJob:
    """One replica of a recommendation to simulate: its engine, its share of each lane."""

    lanes: Sequence[Lane]
    replicas: float
    """The replicas the lanes' rates are split over (fewer than a plan's count, a fraction, to
    replay a replica with the plan's headroom on top of its share)."""
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
    layout: BlockLayout = DENSE_LAYOUT
    """How a sequence's tokens fill the pool (sliding windows; plan/deployment.KvPool)."""
    sim_engine: str = "auto"
    """Simulator implementation (capplan.sim.engine_impl); the planner sets it for all jobs of a
    plan at once (`verification_engine`), so a serial and a `--jobs N` run take the same one."""


def sim_lanes(lanes: Any, replicas: int = 1) -> tuple[SimLane, ...]:
    """The simulator's lanes of a plan's lanes, each at `replicas`' share of its rate (one
    replica's; 1: the whole traffic)."""
    from capplan.sim.workload import Lane as SimLane
    from capplan.sim.workload import parse_length

    return tuple(
        SimLane(name=ln.name, rate_per_s=ln.rate_per_s / replicas, arrival=ln.arrival,
                burstiness=ln.burstiness, input_len=parse_length(str(ln.input_len)),
                output_len=parse_length(str(ln.output_len)), priority=ln.priority,
                **({"prefix": ln.prefix.spec()} if getattr(ln, "prefix", None) else {}))
        for ln in lanes)


def simulate_recommendation(job: VerifyJob) -> Verification:
    """Simulate one replica at its per-replica rate; ok if every lane's SLOs hold."""
    # the simulator is imported where it runs: in a verification worker, not in the parent
    # that forks it and runs the analytic search meanwhile (~0.1 s of start-up)
    from capplan.plan.simulation import add_request_overhead
    from capplan.sim import run_scheduler
    from capplan.sim.stability import backlog_grows
    from capplan.sim.workload import Workload

    wl = Workload(sim_lanes(job.lanes, job.replicas), num_requests=job.requests)
    reqs, _ = wl.generate(np.random.default_rng(_SEED)).clip_to_context(job.max_model_len)
    res = run_scheduler(job.step, reqs, wl.lanes, scheduler="continuous",
                        num_gpu_blocks=job.num_gpu_blocks, block_size=job.block_size,
                        max_num_seqs=job.max_num_seqs,
                        max_num_batched_tokens=job.max_num_batched_tokens,
                        policy=job.policy, state_blocks=job.state_blocks, layout=job.layout,
                        sim_engine=job.sim_engine).to_dict()
    res = add_request_overhead(res, job.request_overhead_s)
    # Decode steps are shared, so TBT is one distribution for all lanes; TTFT and E2E are
    # checked per lane against that lane's own SLO (priorities make them differ).
    misses = SloSet.strictest(SloSet.of(ln.slo) for ln in job.lanes).only(
        "tbt_s", "tpot_s").misses(res)
    # An overloaded replica's backlog keeps growing while requests arrive: the one backlog test
    # of every replay (capplan/sim/stability.py)
    offered = sum(ln.rate_per_s for ln in job.lanes) / job.replicas
    win = res.get("arrival_window") or {}
    if backlog_grows(win):
        misses.append(f"overloaded: served {win['served_requests_per_s']:.3g} of "
                      f"{offered:.3g} requests/s while requests arrived; the queue keeps "
                      "growing")
    per_lane = res.get("lanes") or {}
    several = len(job.lanes) > 1
    for ln in job.lanes:
        got = per_lane.get(ln.name, res) if several else res
        own = SloSet.of(ln.slo).only("ttft_s", "e2e_s")
        misses += own.misses(got, f" ({ln.name})" if several else "")
    keep = ("ttft_s", "tbt_s", "e2e_s", "tpot_s", "output_tokens_per_s", "requests_per_s",
            "mean_running_batch", "preemptions", "kv_peak_utilization")
    return Verification(ok=not misses, reason="; ".join(misses), requests=job.requests,
                        simulated={k: res[k] for k in keep if k in res}, rate_per_s=offered)


def simulate_closed_loop(dep: Deployment, concurrency: int, isl: int, osl: int,
                         requests: int = 400,
                         client_jitter: ClientJitter | None = None,
                         policy: SchedulerPolicy | None = None,
                         seed: int = _SEED) -> dict[str, Any]:
    """A closed loop of `concurrency` clients with fixed lengths, on one deployment, with the
    clients' timing jitter (default: the engine profile's, ClientJitter) and scheduler policy
    (default: the profile's; a benchmark may launch the engine with another, e.g. SGLang's
    --enable-mixed-chunk); `seed` draws the jitter."""
    from capplan.plan.simulation import add_request_overhead
    from capplan.sim import simulate
    from capplan.sim.workload import Lane as SimLane
    from capplan.sim.workload import Workload, parse_length

    lane = SimLane(name="bench", input_len=parse_length(isl), output_len=parse_length(osl))
    wl = Workload((lane,), num_requests=requests, concurrency=concurrency)
    s = dep.settings
    overhead = float(np.asarray(dep.step.request_overhead_s))
    # The overhead is part of each client's cycle (the next request reaches the engine that
    # long after the last one ended) and of what the client measures.
    pool, lim = dep.pool, dep.limits
    # attention DP: the pool holds every rank's blocks (Deployment.pool), so the caps are the
    # replica's (dp x each rank's: Deployment.limits), as capplan.plan.simulation runs them
    res = simulate(dep.step, workload=wl, seed=seed, scheduler="continuous",
                   num_gpu_blocks=pool.num_blocks, block_size=pool.block_size,
                   state_blocks=pool.state_blocks_per_seq, layout=pool.layout,
                   max_num_seqs=lim.max_num_seqs,
                   max_num_batched_tokens=max(lim.max_num_batched_tokens, lim.max_num_seqs),
                   policy=s.profile.scheduler if policy is None else policy,
                   request_overhead_s=overhead,
                   client_jitter=(s.profile.client_jitter if client_jitter is None
                                  else client_jitter)).to_dict()
    return add_request_overhead(res, overhead)


PARALLEL_MIN_REQUESTS = 2000
"""Below this many simulated requests in all, verification runs serially: a worker process
costs ~0.1 s to start and ~0.7 s to load the compiled loop (numba and its cache), more than
small simulations take."""


def numba_installed() -> bool:
    """Whether numba is installed, found without importing it (~0.2 s): the parent only
    decides; `capplan.sim.compiled_available` imports it where the compiled engine runs."""
    import importlib.util

    return importlib.util.find_spec("numba") is not None


def verification_engine(jobs: Sequence[VerifyJob]) -> str:
    """The simulator for a plan's verification jobs, the same with any `--jobs`: the compiled
    loop (capplan.sim.compiled) when numba is installed and the jobs total
    PARALLEL_MIN_REQUESTS or more, else `auto` (the same: compiled when numba imports, else the
    loop interpreted, with equal results to 1e-9 s)."""
    total = sum(j.requests for j in jobs)
    return "compiled" if total >= PARALLEL_MIN_REQUESTS and numba_installed() else "auto"


def _worker_init(load_compiled: bool) -> None:
    """Worker initializer: the default SIGTERM action (the CLI's handler, inherited by the fork,
    would print a traceback when `close` stops the worker); import the compiled engine while the
    parent searches."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if load_compiled:
        import capplan.sim.compiled  # noqa: F401


def _warm(job: VerifyJob) -> None:
    """Load the compiled loop from numba's cache (~0.5 s) with a small job of the plan."""
    simulate_recommendation(job)


WORKERS_PER_CORE = 2
"""Verification workers per available core at most: a simulation is CPU bound, so more workers
only add memory (each loads the compiled engine: `--jobs 256` on 2 cores took 8 GB in 36 s)."""


def worker_count(jobs: int, tasks: int | None = None) -> int:
    """min(jobs, tasks, WORKERS_PER_CORE x the cores this process may use), at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    n = min(max(1, int(jobs)), WORKERS_PER_CORE * (cores or 1))
    return max(1, min(n, tasks) if tasks is not None else n)


CLOSE_WAIT_S = 10.0
"""How long close() waits for a worker to end after SIGTERM before it sends SIGKILL."""


class ParallelVerifier:
    """`simulate_recommendation` over several processes (`--jobs N`): `map(jobs)` returns the
    results in job order, each the same as a serial call (every job seeds its own run).

    With numba installed the workers are forked when the verifier is made and `prepare` loads
    the compiled engine in each of them while the parent's analytic search runs, so the
    verification itself then takes milliseconds (docs/performance.md). Use it as a context
    manager (or call `close`) to stop the workers."""

    def __init__(self, jobs: int, *, spare_core: bool = False) -> None:
        """jobs: worker processes at most. spare_core (the CLI's default `--jobs`, the cores
        available): one core fewer, at least one worker, forked at once even when that is one:
        the parent's analytic search keeps a core to itself while the workers load the
        compiled engine (on 2 cores, two workers loading it beside the search cost the search
        ~0.3 s, and on a cold numba cache each of them compiled the loop, ~25 s CPU apiece)."""
        self.jobs = max(1, worker_count(jobs) - 1) if spare_core else worker_count(jobs)
        self._pool: Any = None
        self._warming: list[Any] = []
        if (self.jobs > 1 or spare_core) and numba_installed():
            self._pool = self._executor(self.jobs, load_compiled=True)
            # the pool forks its workers at its first task: fork them now, so they import the
            # compiled engine while the parent loads the catalog and sizes the candidates
            self._warming.append(self._pool.submit(int))

    @staticmethod
    def _executor(workers: int, load_compiled: bool = False) -> Any:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # fork: the children inherit the loaded modules and catalog (no re-import)
        return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                                   initializer=_worker_init, initargs=(load_compiled,))

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A Future of fn(*args) run in a worker (fn a module function, the arguments
        picklable), or None when no worker is idle: none, or still loading the compiled engine
        (then the caller does the work itself rather than wait for the loading). The planner's
        search hands a worker part of the configurations it finishes (search_bound._exact)."""
        if self._pool is None or not all(f.done() for f in self._warming):
            return None
        return self._pool.submit(fn, *args)

    def __call__(self, job: VerifyJob) -> Verification:
        return simulate_recommendation(job)

    def prepare(self, job: VerifyJob) -> None:
        """Warm every worker's compiled engine on `job` (small) in the background."""
        if self._pool is not None:
            for _ in range(self.jobs):
                self._warming.append(self._pool.submit(_warm, replace(job, sim_engine="compiled")))

    def map(self, jobs: list[VerifyJob]) -> list[Verification]:
        workers = min(self.jobs, len(jobs))
        # a warm pool runs even one worker's share: its engine is loaded, the parent's is not
        if (workers < 2 and self._pool is None) or \
                sum(j.requests for j in jobs) < PARALLEL_MIN_REQUESTS:
            return [simulate_recommendation(j) for j in jobs]
        if self._pool is None:
            self._pool = self._executor(workers)
        return list(self._pool.map(simulate_recommendation, jobs))

    def map_while(self, jobs: list[VerifyJob], meanwhile: Callable[[], object]
                  ) -> list[Verification]:
        """`map(jobs)`, with `meanwhile()` run in this process once the jobs are handed to the
        workers (before it when they run here); the results are map's."""
        if self._pool is None or sum(j.requests for j in jobs) < PARALLEL_MIN_REQUESTS:
            meanwhile()
            return self.map(jobs)
        pending = self._pool.map(simulate_recommendation, jobs)  # submitted at once
        meanwhile()
        return list(pending)

    def close(self) -> None:
        """Stop the workers at once: a warm-up the plan did not need is not waited for."""
        if self._pool is None:
            return
        pool, self._pool = self._pool, None
        # the processes and the manager thread have no public accessor; shutdown(wait=False)
        # forgets the thread, so a later shutdown(wait=True) waits for nothing and the killed
        # workers stayed zombies until the thread got round to reaping them (a loaded machine)
        procs = list((getattr(pool, "_processes", None) or {}).values())
        manager = getattr(pool, "_executor_manager_thread", None)
        pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            try:
                os.kill(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:  # reap every worker here: none outlives close()
            p.join(CLOSE_WAIT_S)
            if p.exitcode is None:
                p.kill()
                p.join()
        if manager is not None:
            manager.join(CLOSE_WAIT_S)

    def __enter__(self) -> ParallelVerifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
