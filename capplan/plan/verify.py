"""Check recommendations with the simulator: the same step model, the lanes' own arrival
processes, lengths and priorities, at the per-replica rate."""

from __future__ import annotations

from typing import Any

import numpy as np

from capplan.sim import run_scheduler, simulate
from capplan.sim.workload import Lane as SimLane
from capplan.sim.workload import Workload, parse_length

_SEED = 7


def _sim_lanes(ctx: Any, replicas: int) -> tuple[SimLane, ...]:
    return tuple(
        SimLane(name=ln.name, rate_per_s=ln.rate_per_s / replicas, arrival=ln.arrival,
                burstiness=ln.burstiness, input_len=parse_length(str(ln.input_len)),
                output_len=parse_length(str(ln.output_len)), priority=ln.priority)
        for ln in ctx.lanes)


def simulate_recommendation(r: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Simulate one replica of recommendation r at its per-replica rate; ok if every SLO holds."""
    wl = Workload(_sim_lanes(ctx, r["replicas"]), num_requests=ctx.requests)
    reqs, _ = wl.generate(np.random.default_rng(_SEED)).clip_to_context(r["max_model_len"])
    res = run_scheduler(ctx.step, reqs, wl.lanes, scheduler="continuous",
                   num_gpu_blocks=ctx.num_gpu_blocks, block_size=ctx.block_size,
                   max_num_seqs=r["max_num_seqs"],
                   max_num_batched_tokens=r["max_num_batched_tokens"]).to_dict()
    t = ctx.traffic
    misses = []
    # Decode steps are shared, so TBT is one distribution for all lanes; TTFT and E2E are
    # checked per lane against that lane's own SLO (priorities make them differ).
    if t.tbt_p99_s is not None and res["tbt_s"]["p99"] > t.tbt_p99_s:
        misses.append(f"p99 TBT {res['tbt_s']['p99'] * 1e3:.1f} ms > {t.tbt_p99_s * 1e3:.1f} ms")
    # An overloaded replica's queue keeps growing while requests arrive. (Completions per
    # second of a finite run are biased low by its drain, so compare the waiting queue in the
    # last third of the arrival window with the middle third instead.)
    offered = sum(ln.rate_per_s for ln in ctx.lanes) / r["replicas"]
    if _queue_grows(res.get("time_series") or {}, len(reqs) / offered):
        misses.append(f"overloaded: the waiting queue keeps growing at {offered:.3g} "
                      "requests/s")
    per_lane = res.get("lanes") or {}
    for ln in ctx.lanes:
        got = per_lane.get(ln.name, res) if len(ctx.lanes) > 1 else res
        for key, slo, name in (("ttft_s", ln.slo.ttft_p99_s, "p99 TTFT"),
                               ("e2e_s", ln.slo.e2e_p99_s, "p99 E2E")):
            if slo is not None and key in got and got[key]["p99"] > slo:
                who = f" ({ln.name})" if len(ctx.lanes) > 1 else ""
                misses.append(f"{name}{who} {got[key]['p99'] * 1e3:.1f} ms > "
                              f"{slo * 1e3:.1f} ms")
    keep = ("ttft_s", "tbt_s", "e2e_s", "tpot_s", "output_tokens_per_s", "requests_per_s",
            "mean_running_batch", "preemptions", "kv_peak_utilization")
    return {"ok": not misses, "reason": "; ".join(misses),
            "requests": ctx.requests, "simulated": {k: res[k] for k in keep if k in res}}


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


def simulate_closed_loop(dep: Any, concurrency: int, isl: int, osl: int, requests: int = 400
                         ) -> dict[str, Any]:
    """A closed loop of `concurrency` clients with fixed lengths, on one deployment."""
    lane = SimLane(name="bench", input_len=parse_length(isl), output_len=parse_length(osl))
    wl = Workload((lane,), num_requests=requests, concurrency=concurrency)
    s = dep.settings
    return simulate(dep.step, workload=wl, seed=_SEED, scheduler="continuous",
                    num_gpu_blocks=dep.memory.num_gpu_blocks, block_size=s.block_size,
                    max_num_seqs=s.max_num_seqs,
                    max_num_batched_tokens=max(s.max_num_batched_tokens, s.max_num_seqs)
                    ).to_dict()
