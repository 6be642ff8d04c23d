"""Simulate one deployment under a workload: the library side of `capplan simulate` and of
`capplan.simulate()` (workload from options, context clipping, schedulers, the bound)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from capplan import limits
from capplan.errors import InputError
from capplan.models.lora import draw_adapters, step_groups
from capplan.models.perf import BOUNDS
from capplan.models.prefix import PrefixSpec
from capplan.plan.deployment import Deployment
from capplan.plan.fleet_sim import FleetOptions, run_fleet
from capplan.plan.load import require_one_load
from capplan.sim import SCHEDULERS, engine_impl, run_features, run_scheduler
from capplan.sim.engine import LEGACY_IMPLS
from capplan.sim.fleet import fleet_compiled
from capplan.sim.protocol import BenchmarkRun
from capplan.sim.stability import backlog_grows
from capplan.sim.workload import (
    Lane,
    Requests,
    Workload,
    arrival_rate,
    load_trace,
    parse_length,
)


def parse_schedulers(text: str) -> list[str]:
    """'continuous', or a comma list of continuous/static/dynamic (duplicates dropped)."""
    names = [s.strip() for s in str(text).split(",") if s.strip()]
    for s in names:
        if s not in SCHEDULERS:
            raise InputError(f"--scheduler {s!r}: expected {', '.join(SCHEDULERS)} or a comma list")
    if not names:
        raise InputError("--scheduler: expected continuous, static or dynamic")
    return list(dict.fromkeys(names))


def workload_from_options(rate: float | None, concurrency: int | None, trace: str | Requests | None,
                          input_len: str, output_len: str, burstiness: float,
                          requests: int, time_unit: str = "auto") -> Workload:
    require_one_load(rate, concurrency, trace)
    if trace is not None:  # a path, or a trace already read (Requests: read once by latency)
        # a replay needs no rate: a burst (every request at one instant, an offline
        # `--request-rate inf` run) or one request replays as it is; latency and recommend,
        # which read the trace as a rate, refuse those (replayable_rate)
        reqs = trace if isinstance(trace, Requests) else load_trace(trace, time_unit)
        return Workload((Lane(name="trace"),), trace=reqs)
    limits.check_cap("sim_requests", requests, "--requests")  # estimated before the work
    if rate is not None:
        limits.check_sim_horizon(requests, rate)
    lane = Lane(rate_per_s=rate, arrival="gamma" if burstiness != 1.0 else "poisson",
                burstiness=burstiness, input_len=parse_length(input_len),
                output_len=parse_length(output_len))
    limits.check_cap("sim_tokens", requests * lane.output_len.mean,
                     "--requests x mean --output-len")
    return Workload((lane,), num_requests=requests, concurrency=concurrency)


def run_simulation(dep: Deployment, *, rate: float | None, concurrency: int | None,
                   trace: str | Requests | None, input_len: str, output_len: str, burstiness: float,
                   requests: int, seed: int, schedulers: tuple[str, ...] | list[str],
                   batch_size: int | None = None, batch_timeout_s: float = 0.05,
                   chunked_prefill: bool | None = None,
                   progress: Callable[[str, int, int], Any] | None = None,
                   time_unit: str = "auto", sim_engine: str = "auto",
                   prefix: PrefixSpec | None = None,
                   fleet: FleetOptions | None = None,
                   benchmark: BenchmarkRun | None = None) -> dict[str, Any]:
    """{"head": run description and bound, "results": {scheduler: SimResult dict},
    "notes": [...]}. `progress(scheduler, done, total)` is called as requests finish.
    `chunked_prefill` None keeps the engine profile's choice; False forces whole prompts.
    `sim_engine` (auto, compiled, python) runs the scheduler loop compiled or interpreted;
    each result names the one that ran as `engine_impl`. `fleet` (replicas > 1 or a
    schedule): the continuous scheduler over a fleet behind a router
    (`capplan.plan.fleet_sim.run_fleet`). `benchmark`: a tool's protocol
    (capplan.sim.protocol): its measured and warm-up requests, random lengths and metric
    definitions (`benchmark` key)."""
    limits.SEED.check(seed, "seed")
    if benchmark is not None:
        if fleet is not None and fleet.is_fleet:
            raise InputError("--benchmark measures one engine as the tool does; it does not "
                             "combine with --replicas or --schedule")
        requests, input_len, output_len = benchmark.workload(input_len, output_len)
    wl = workload_from_options(rate, concurrency, trace, input_len, output_len, burstiness,
                               requests, time_unit)
    wl, reqs, notes = _requests_of(dep, wl, prefix, seed)
    s = dep.settings
    overhead = float(np.asarray(dep.step.request_overhead_s))
    pool = dep.pool  # hybrids: each running sequence's state holds pool.state_blocks_per_seq
    results: dict[str, dict[str, Any]] = {}
    for name in schedulers:
        if fleet is not None and fleet.is_fleet:
            if name != "continuous":
                raise InputError("--replicas and --schedule simulate continuous batching only")
            res = run_fleet(dep, reqs, wl.lanes, fleet, sim_engine)
            results[name] = {**add_request_overhead(res, overhead),
                             "engine_impl": "compiled fleet" if fleet_compiled(
                                 dep, reqs, sim_engine) else engine_impl(
                                 name, sim_engine, **run_features(s.profile.scheduler, reqs))}
            continue
        tick = None
        if progress is not None:
            def tick(done: int, name: str = name) -> None:
                progress(name, done, len(reqs))
        res = run_scheduler(dep.step, reqs, wl.lanes, scheduler=name,
                            num_gpu_blocks=pool.num_blocks, block_size=pool.block_size,
                            state_blocks=pool.state_blocks_per_seq, layout=pool.layout,
                            max_num_seqs=dep.limits.max_num_seqs,
                            max_num_batched_tokens=dep.limits.max_num_batched_tokens,
                            enable_chunked_prefill=chunked_prefill, batch_size=batch_size,
                            batch_timeout_s=batch_timeout_s, policy=s.profile.scheduler,
                            request_overhead_s=overhead if concurrency is not None else 0.0,
                            client_jitter=(s.profile.client_jitter if concurrency is not None
                                           else None),
                            progress=tick, sim_engine=sim_engine, adapter_seed=seed,
                            **({} if benchmark is None else
                               {"measure": benchmark.measure(overhead)})).to_dict()
        results[name] = _with_engine(add_request_overhead(res, overhead), name, sim_engine,
                                     run_features(s.profile.scheduler, reqs), notes)
    if run_features(s.profile.scheduler, reqs)["prefix_caching"] and "continuous" in results:
        # the replay ran the prefix cache: its hits are a figure even when none (a cache that
        # thrashes), not a key that only appears when there were some
        results["continuous"].setdefault("prefix_hit_tokens", 0)
        results["continuous"].setdefault("prefix_hit_frac", 0.0)
    if concurrency is None:  # open loop: say when the arrivals outran the engine
        notes += _overload_notes(results, np.asarray(reqs.arrival_at_s, float))
    return {"head": _head(dep, wl, reqs, results[schedulers[0]], seed, overhead),
            "results": results, "notes": notes}


def _requests_of(dep: Deployment, wl: Workload, prefix: PrefixSpec | None, seed: int
                 ) -> tuple[Workload, Requests, list[str]]:
    """The workload with its prefix spec, its requests drawn and cut to max_model_len, checked
    against the caps; and the notes on what was read or cut."""
    if prefix is not None and wl.trace is None:
        from capplan.plan.prefix import check_prefix_fits

        for ln in wl.lanes:
            check_prefix_fits(prefix, ln.input_len.mean)
        wl = replace(wl, lanes=tuple(replace(ln, prefix=prefix) for ln in wl.lanes))
    max_len = dep.memory.max_model_len
    reqs, clipped = wl.generate(np.random.default_rng(seed)).clip_to_context(max_len)
    if dep.settings.max_loras and reqs.adapter is None:  # every scheduler and replica of the
        # run replays the same adapters, drawn with its seed (models/lora.py draw_adapters)
        reqs = replace(reqs, adapter=draw_adapters(step_groups(dep.step), len(reqs),
                                                   np.random.default_rng(seed)))
    _check_work(wl.trace is not None, reqs, dep)
    notes = [f"trace {wl.trace.note}"] if wl.trace is not None and wl.trace.note else []
    notes += [f"{clipped} prompts cut to fit max_model_len {max_len}"] if clipped else []
    return wl, reqs, notes


def _head(dep: Deployment, wl: Workload, reqs: Requests, first: dict[str, Any], seed: int,
          overhead: float) -> dict[str, Any]:
    """The run's description: deployment, settings, the bound at the first scheduler's mean
    running batch, the load read."""
    s, pool = dep.settings, dep.pool
    ctx = float(np.mean(reqs.input_tokens) + np.mean(reqs.output_tokens) / 2)
    per_replica_batch = first["mean_running_batch"] / max(first.get("replicas", 1), 1)
    bound = BOUNDS[int(dep.step.decode_step(max(per_replica_batch, 1.0), ctx)["bound_index"])]
    head = {"model": dep.model.key, "gpu": dep.gpu.key, "tp": s.tp, "pp": s.pp, "bound": bound,
            "max_num_seqs": s.max_num_seqs, "max_num_batched_tokens": s.max_num_batched_tokens,
            "num_gpu_blocks": dep.memory.num_gpu_blocks, "seed": seed,
            "calibration": dep.step.calibration_source, "num_requests": len(reqs),
            "request_overhead_s": overhead, "engine_settings": dep.settings_summary()}
    if pool.state_blocks_per_seq:
        head["state_blocks_per_seq"] = pool.state_blocks_per_seq
    if wl.trace is not None and wl.trace.note:  # the columns and time unit read, as latency's
        head["load"] = f"trace {wl.trace.note}"
    return head


def _check_work(is_trace: bool, reqs: Any, dep: Deployment) -> None:
    """The caps on what the run will do, from the generated requests, before any step."""
    if is_trace:  # a trace's own lengths
        limits.check_cap("sim_tokens", float(np.sum(reqs.output_tokens)),
                         "the trace's output tokens")
    if dep.settings.profile.scheduler.prefix_caching and reqs.has_prefix:
        limits.check_cap("prefix_blocks", shared_prompt_blocks(reqs, dep.pool.block_size),
                         "shared prompt blocks to hash for prefix caching")


def _with_engine(res: dict[str, Any], name: str, asked: str, features: dict[str, Any],
                 notes: list[str]) -> dict[str, Any]:
    """The result with the engine that ran; when it is not the one asked for, why (said in
    every format, not only on stderr)."""
    impl = engine_impl(name, asked, **features)
    asked = LEGACY_IMPLS.get(asked, asked)  # fast, reference: the loop as plain Python
    out = {**res, "engine_impl": impl}
    if asked not in ("auto", impl):
        # the one loop runs every feature: only static and dynamic batching run elsewhere
        out["engine_note"] = f"--sim-engine {asked} asked, {impl} ran: the {name} scheduler"
        notes.append(out["engine_note"])
    return out


def _overload_notes(results: dict[str, dict[str, Any]], arrivals: np.ndarray) -> list[str]:
    out = []
    for name, res in results.items():
        note = mark_overload(res, arrivals)
        notes = ([note] if note else []) + _replica_notes(res)
        out += [n if len(results) == 1 else f"{name}: {n}" for n in notes]
    return out


UNEVEN_SHARE = 1.5
"""A fleet's router is said to load a replica unevenly when it sent it more than this multiple
of an even share of the requests (2 replicas: over 75%; 4: over 37.5%). Round-robin and
least-outstanding stay within a few percent of even; prefix-affinity sends every request of a
prefix to the replica that first served it, so one shared prefix loads one replica."""


def _replica_notes(res: dict[str, Any]) -> list[str]:
    """A fleet's replicas: each marked `overloaded` by its own backlog test (a note for each
    that is), and a note when the router sent one replica over UNEVEN_SHARE of an even
    share (fixed replica counts; a schedule's replicas serve different spans)."""
    per = res.get("per_replica") or []
    if not per or not any("arrival_window" in p for p in per):  # closed loops: no arrivals
        return []
    notes = []
    for i, p in enumerate(per):
        win = p.get("arrival_window") or {}
        p["overloaded"] = backlog_grows(win)
        if p["overloaded"]:
            notes.append(f"replica {i} overloaded: served {win['served_requests_per_s']:.3g} "
                         f"of the {win['offered_requests_per_s']:.3g} req/s routed to it while "
                         f"requests arrived (its backlog grew by {win['backlog_growth']:.0f}, "
                         f"a stable queue's by at most {win['tolerance']:.0f})")
    total = sum(int(p.get("requests", 0)) for p in per)
    busiest = max(range(len(per)), key=lambda i: int(per[i].get("requests", 0)))
    share = int(per[busiest].get("requests", 0)) / total if total else 0.0
    if len(per) > 1 and not res.get("windows") and share > UNEVEN_SHARE / len(per):
        notes.append(f"uneven routing: the {res.get('router')} router sent {share:.0%} of the "
                     f"requests to replica {busiest} (an even share is {1 / len(per):.0%})")
    return notes


def mark_overload(res: dict[str, Any], arrivals: np.ndarray) -> str | None:
    """Add offered_requests_per_s and overloaded to an open-loop result (overloaded: its
    backlog grew through the arrivals, capplan.sim.stability); the note when overloaded
    ("served X of Y req/s offered")."""
    n = len(arrivals)
    span = float(arrivals.max() - arrivals.min()) if n > 1 else 0.0
    if span <= 0:
        return None
    res["offered_requests_per_s"] = arrival_rate(n, span)
    win = res.get("arrival_window") or {}
    res["overloaded"] = backlog_grows(win)
    return overload_note(win) if res["overloaded"] else None


def overload_note(win: dict[str, float]) -> str:
    """What an overloaded run's backlog test found (its `arrival_window`)."""
    return (f"overloaded: served {win['served_requests_per_s']:.3g} of "
            f"{win['offered_requests_per_s']:.3g} req/s offered while requests arrived (the "
            f"second half of the arrivals); {win['backlog_growth']:.0f} more requests waited "
            f"for a first token at the last arrival than at mid-way (a stable queue's: at "
            f"most {win['tolerance']:.0f}), so the latencies grow with the run's length "
            "(capplan latency gives the rate one replica sustains)")


def shared_prompt_blocks(reqs: Any, block_size: int) -> float:
    """Full prompt blocks prefix caching keys (Requests.block_keys, counted without building
    them): the shared part of each prompt (hash_ids x their block, or the prefix) over the
    block size."""
    inp = np.asarray(reqs.input_tokens, np.int64)
    if reqs.hash_ids is not None:
        shared = np.array([len(h) for h in reqs.hash_ids], np.int64) * reqs.hash_block_tokens
    elif reqs.prefix_tokens is not None and reqs.prefix_group is not None:
        shared = np.where(np.asarray(reqs.prefix_group) >= 0, reqs.prefix_tokens, 0)
    else:
        return 0.0
    return float(np.sum(np.minimum(shared, inp) // block_size))


def add_request_overhead(res: dict[str, Any], overhead_s: float) -> dict[str, Any]:
    """What a client measures: the per-request cost outside engine steps (HTTP, tokenisation,
    streaming; the engine profile's or a calibration's request_overhead_s) adds to TTFT and
    E2E of every request, as it does in the analytic model."""
    if overhead_s <= 0:
        return res
    out = dict(res)
    for key in ("ttft_s", "e2e_s"):
        if isinstance(res.get(key), dict):
            out[key] = {k: (v + overhead_s if isinstance(v, int | float) and k != "count"
                            else v) for k, v in res[key].items()}
    lanes = res.get("lanes")
    if isinstance(lanes, dict):
        out["lanes"] = {n: add_request_overhead(v, overhead_s) for n, v in lanes.items()}
    if isinstance(res.get("mean_in_system"), int | float) and res.get("requests_per_s"):
        # Little's law with the client's time: each request is in the system overhead longer
        out["mean_in_system"] = res["mean_in_system"] + overhead_s * res["requests_per_s"]
    per = res.get("per_replica")
    if isinstance(per, list):  # a fleet's replicas, as its whole (each p99 a client's)
        out["per_replica"] = [{**p, **{k: p[k] + overhead_s for k in ("ttft_p99_s", "e2e_p99_s")
                                       if isinstance(p.get(k), int | float)}} for p in per]
    return out
