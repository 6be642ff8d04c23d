"""Replay requests over a fleet of identical replicas behind a router, on a fixed replica count
or a schedule that changes it per window (docs/fleet.md).

    >>> res = replay_schedule(FleetReplaySpec(requests=reqs, engine_config=dep,
    ...                                       windows=[(0, 900, 2), (900, 1800, 5)],
    ...                                       startup_lag_s=120, slo_ttft_s=1.0))
    >>> [w.attainment for w in res.windows]

The replica timeline (`replica_timeline`): the first window's replicas serve from its start;
a replica added by a later window serves `startup_lag_s` after that window starts (weights
loaded, engine started); a window with fewer replicas drains the newest ones (a replica still
starting is cancelled): a draining replica takes no new request and finishes its own. A request
arriving while no replica accepts waits at the router for the next one to become ready; one
that no replica ever takes is reported unfinished. Nothing is dropped: each arrival is either
completed or unfinished, counted in its arrival window.

Routers (`ROUTERS`), as the production routers use them:
- round-robin: the i-th routed request goes to accepting replica i mod n (vLLM production
  stack `RoundRobinRouter`: `sorted_endpoints[req_id % len(endpoints)]`);
- least-outstanding (alias least_loaded, capplan.sim.routers): the accepting replica with the
  fewest requests in it (running plus waiting), the lowest index on ties (llm-d inference
  scheduler's queue scorer; the vLLM router's power-of-two and least-loaded policies use the
  same signal);
- prefix-affinity: a request sharing content with an earlier one (its prefix group, or a
  trace's first block hash) goes to the replica that served that content while it accepts,
  the others round-robin (vLLM production stack `PrefixAwareRouter`: the endpoint of the
  longest prefix match, inserted after routing; no eviction).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from capplan.errors import InputError
from capplan.sim.entities import RunRecord
from capplan.sim.fleet_results import (
    NEVER,
    FleetReplayResult,
    FleetReplaySpec,
    WindowStats,
    _result,
    _Times,
)
from capplan.sim.routers import canonical_router
from capplan.sim.workload import Requests

if TYPE_CHECKING:
    from capplan.plan.deployment import Deployment

ROUTERS = ("round-robin", "least-outstanding", "prefix-affinity")
__all__ = ["NEVER", "ROUTERS", "FleetReplayResult", "FleetReplaySpec", "WindowStats",
           "check_windows", "fleet_compiled", "replay_schedule", "replica_timeline",
           "run_replica"]


# -- the schedule ----------------------------------------------------------------------------
def check_windows(windows: Sequence[tuple[float, float, int]]) -> np.ndarray:
    """The windows as a (n, 3) float array, checked: contiguous, increasing, counts >= 0."""
    if not len(windows):
        raise InputError("a fleet schedule needs at least one window")
    w = np.asarray([(float(s), float(e), int(n)) for s, e, n in windows], float)
    if not np.all(np.isfinite(w[:, 0])) or np.any(w[:, 1] <= w[:, 0]):
        raise InputError("fleet schedule: each window needs start_s < end_s")
    if np.any(np.abs(w[1:, 0] - w[:-1, 1]) > 1e-9 * np.maximum(1.0, np.abs(w[1:, 0]))):
        raise InputError("fleet schedule: windows must be contiguous (each starts where the "
                         "last ended)")
    if np.any(w[:, 2] < 0) or w[:, 2].max() < 1:
        raise InputError("fleet schedule: replica counts must be >= 0, at least one > 0")
    return w


def replica_timeline(windows: np.ndarray, startup_lag_s: float
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(decided_at_s, ready_at_s, stop_at_s) of every replica the schedule starts: the first
    window's serve from its start, later ones `startup_lag_s` after their window starts; a
    decrease stops the newest first (stop_at_s <= ready_at_s: cancelled while starting)."""
    decided: list[float] = []
    ready: list[float] = []
    stop: list[float] = []
    active: list[int] = []
    for i, (s, _, n) in enumerate(windows):
        while len(active) < int(n):
            active.append(len(ready))
            decided.append(s)
            ready.append(s if i == 0 else s + startup_lag_s)
            stop.append(NEVER)
        while len(active) > int(n):
            stop[active.pop()] = s
    return np.array(decided), np.array(ready), np.array(stop)


def _group_keys(reqs: Requests) -> np.ndarray:
    """Per request its shared-content key for prefix affinity (-1: none): the prefix group, or
    a trace's first block hash."""
    n = len(reqs)
    if reqs.hash_ids is not None:
        return np.array([int(h[0]) if len(h) else -1 for h in reqs.hash_ids], np.int64)
    if reqs.prefix_group is not None:
        return np.asarray(reqs.prefix_group, np.int64)
    return np.full(n, -1, np.int64)


def _finite(x: float) -> float | None:
    """x, or None for infinity (JSON has no infinity: a replica that never drains)."""
    return float(x) if math.isfinite(x) else None


# -- one replica -----------------------------------------------------------------------------
def engine_for(dep: Any, sim_engine: str = "auto", *, step: Any = None,
               max_num_batched_tokens: int | None = None) -> Any:
    """One replica's engine from its `Deployment`: the replica's KV pool and limits (all
    data-parallel ranks: Deployment.pool, Deployment.limits), its profile's scheduler, the
    loop compiled or interpreted as `sim_engine` picks (`capplan.sim.engine_impl`); `step` and
    the token budget may be overridden (a P/D decode worker's)."""
    from capplan.sim import engine_impl
    from capplan.sim.engine import ContinuousEngine

    pool, lim = dep.pool, dep.limits
    eng = ContinuousEngine(
        dep.step if step is None else step, pool.num_blocks, pool.block_size, lim.max_num_seqs,
        lim.max_num_batched_tokens if max_num_batched_tokens is None else max_num_batched_tokens,
        dep.settings.profile.scheduler, state_blocks=pool.state_blocks_per_seq,
        layout=pool.layout)
    eng.jit = engine_impl("continuous", sim_engine) == "compiled"
    return eng


def run_replica(dep: Deployment, reqs: Requests, sim_engine: str = "auto",
                request_overhead_s: float = 0.0, client_jitter: Any = None) -> RunRecord:
    """One replica's run of its requests with per-step arrays kept (the fleet attributes token
    gaps to windows by time); a closed loop's `request_overhead_s` and `client_jitter` as
    `ContinuousEngine.run` takes them."""
    eng = engine_for(dep, sim_engine)
    if reqs.concurrency is None:
        return eng.run(reqs)
    return eng.run(reqs, None, None, request_overhead_s, client_jitter)


# -- the replay ------------------------------------------------------------------------------
def replay_schedule(spec: FleetReplaySpec) -> FleetReplayResult:
    """Replay `spec.requests` over the schedule `spec.windows` (module docstring)."""
    spec = replace(spec, router=canonical_router(spec.router, ROUTERS))
    if not (math.isfinite(spec.startup_lag_s) and spec.startup_lag_s >= 0):
        raise InputError(f"startup lag {spec.startup_lag_s!r}: expected seconds >= 0")
    reqs = spec.requests
    if reqs.concurrency is not None:
        raise InputError("a fleet schedule replays open-loop requests (a trace or a rate)")
    w = check_windows(spec.windows)
    decided, ready, stop = replica_timeline(w, spec.startup_lag_s)
    keys = _group_keys(reqs)
    tm, per = _replay_loop(spec.engine_config, reqs, (ready, stop, spec.router, keys, w[:, 0]),
                           spec.sim_engine)
    return _result(spec, w, tm, decided, stop, per)


def fleet_compiled(dep: Deployment, reqs: Requests, sim_engine: str) -> bool:
    """Whether the fleet loop (`capplan.sim.fleet_loop`) runs compiled: `--sim-engine auto`
    or compiled, numba installed, an open loop (with or without prefix caching); else it runs
    as plain Python (`fleet_loop.plain_module`)."""
    from capplan.sim import compiled_available, engine_impl, run_features

    if sim_engine not in ("auto", "compiled"):
        engine_impl("continuous", sim_engine)  # checks the name
        return False
    feats = run_features(dep.settings.profile.scheduler, reqs)
    if sim_engine == "compiled":
        engine_impl("continuous", "compiled", **feats)  # InputError without numba
    return compiled_available() and not feats["closed_loop"]


def _replay_loop(dep: Deployment, reqs: Requests, fleet: tuple, sim_engine: str
                 ) -> tuple[_Times, list[dict[str, Any]]]:
    """Route and simulate on the fleet loop, compiled or (`fleet_compiled` false) the same
    source as plain Python; per-request times and TBT samples."""
    from capplan.sim import compiled as C
    from capplan.sim import fleet_loop
    from capplan.sim.engine import CompiledEngine

    jit = fleet_compiled(dep, reqs, sim_engine)
    L = fleet_loop if jit else fleet_loop.plain_module()

    ready, stop, router, keys, bounds = fleet
    pool, lim = dep.pool, dep.limits
    eng = CompiledEngine(dep.step, pool.num_blocks, pool.block_size, lim.max_num_seqs,
                         lim.max_num_batched_tokens, dep.settings.profile.scheduler,
                         state_blocks=pool.state_blocks_per_seq, layout=pool.layout)
    eng._check_requests(reqs)
    arr, q, cfg, _, pcx = C._inputs_of(eng, reqs, None, 0.0, None)  # cfg[PC]: prefix caching
    consts = tuple(float(v) for v in dep.step.constants())
    moe = bool(float(dep.step.num_experts) > 0)
    if jit:
        C._check_kernel(dep.step, consts, moe)
        L.check_kernel(q, cfg, consts, moe)
    (rep, _, qt, tv, tw, twin, gv, gwin, sc, tf) = L.simulate_fleet(
        arr, q, cfg, consts, moe,
        (np.asarray(ready, float), np.asarray(stop, float), L.ROUTER_CODES[router],
         np.asarray(keys, np.int64), np.ascontiguousarray(bounds, float),
         L.new_affinity_map()), L.fleet_prefix_cache(pcx, len(ready)))
    err = int(sc[:, C.ERR].max()) if len(sc) else 0
    if err:
        raise AssertionError(C.ERRORS[err])
    routed = rep >= 0
    first = np.where(routed, qt[C.FIRST_T], np.nan)
    fin = np.where(routed, qt[C.FIN_T], np.nan)
    nw = len(bounds)
    # a sample's time stands for its window: the window start (the metrics bin by time)
    at = np.concatenate([np.asarray(bounds)[twin], np.asarray(bounds)[gwin]]) if nw else []
    tm = _Times(first, fin, [np.asarray(at, float)], [np.concatenate([tv, gv])],
                [np.concatenate([tw, np.ones(len(gv))])],
                np.where(routed, qt[C.ADM_T], np.nan),
                {"running_s": float(tf[:, C.RUN_INT].sum()),
                 "in_system_s": float(tf[:, C.SYS_INT].sum()),
                 "kv_blocks_max": int(sc[:, C.KV_MAX].max()) if len(sc) else 0,
                 "preemptions": int(sc[:, C.PREEMPTIONS].sum()),
                 "prefix_hit_tokens": int(sc[:, C.HIT_TOKENS].sum())}, rep)
    per = []
    counts = np.bincount(rep[routed], minlength=len(ready))
    for r in range(len(ready)):
        mine = rep == r
        p: dict[str, Any] = {"requests": int(counts[r]), "ready_at_s": float(ready[r]),
                             "stop_at_s": _finite(stop[r]),
                             "preemptions": int(sc[r, C.PREEMPTIONS]),
                             "prefix_hit_tokens": int(sc[r, C.HIT_TOKENS])}
        if mine.any():
            p["last_finish_s"] = float(fin[mine].max())
        per.append(p)
    return tm, per


