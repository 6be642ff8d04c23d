"""`simulate` on a fixed disaggregated layout, and the replay check of `latency` on one
(capplan/sim/pd.py replays; docs/disaggregation.md, "Replay").

The composed figures are the client's: TTFT = sent -> the decode side's first token (prefill
queue + prefill + KV transfer + decode admission and its first step), E2E = sent -> last token,
TPOT = (E2E - TTFT) / (output - 1), TBT the decode workers' token gaps; the request overhead of
the prefill deployment's profile is added once to TTFT and E2E (as `simulate` does). Per pool:
its stage's latencies, mean running batch, KV peak and whether it is saturated: open loop, a
worker whose backlog grew through the arrivals (plan/simulation.mark_overload, per worker:
capplan/sim/stability.py); closed loop,
the pool whose mean wait exceeds QUEUE_SHARE of a client's cycle (the analytic solve,
plan/pd.py, names a pool at SATURATED_UTILIZATION of its capacity or short of decode slots).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from capplan import limits
from capplan.errors import InputError
from capplan.plan import aiconfigurator
from capplan.plan.aiconfigurator import measured_mean
from capplan.plan.launch_multinode import pd_launch
from capplan.plan.pd import DEFAULT_PROMPTS, PdLayout
from capplan.plan.replay import (  # the aggregated check's: one bar, one count for both
    OPEN_LOOP_REQUESTS,
    TOLERANCE,
)
from capplan.plan.simulation import mark_overload, workload_from_options
from capplan.sim.metrics import step_summary, summarize, summary
from capplan.sim.pd import MAX_PASSES, PdReplay, PdReplaySpec, replay_pd
from capplan.sim.pd import SPEED_SPREAD as GPU_SPEED_SPREAD
from capplan.sim.protocol import PRESETS, BenchmarkRun, preset, request_tpot
from capplan.sim.workload import Requests, parse_length

QUEUE_SHARE = 0.5
"""A closed loop's pool is saturated when its mean wait exceeds this share of a client's cycle
(TTFT + decode): the clients then wait mostly there."""
OPEN_LOOP_MIN_REQUESTS = 500
"""Requests `latency` replays to check an open-loop rate on a layout at least, where
OPEN_LOOP_REQUESTS (the aggregated check's 2,000, for the tails it prints) of the load's
outputs exceed CHECK_TOKENS. Llama-3.1-70B on H200 (SGLang), 2 x TP 2 prefill + 1 x TP 8 decode, 8
req/s of 1,500 / 400 tokens: TTFT p99 701-796 ms of 500 requests, 884-924 ms of 2,000,
928-934 ms of 10,000 and 20,000 (seeds 0 and 1)."""
CHECK_TOKENS = 10_000_000
"""`latency` replays its open-loop or trace check when requests x output tokens stays below
this; a larger load is answered by the analytic solve alone and says so."""
MEANS_SETTLED = 1e-3
"""The benchmark replay's passes end when its mean TTFT and mean E2E move by less than this
share of the mean E2E from one pass to the next (capplan.sim.pd.replay_pd `means_settled`)."""
SPEED_SPREAD = GPU_SPEED_SPREAD
"""The range of the replayed workers' step-time factors (capplan.sim.pd.worker_speeds): the
published spread of same-SKU GPUs (capplan.sim.pd.SPEED_SPREAD), so that clients come back
shuffled and the round-robin counter misplaces requests as on real workers."""
BENCH_MAX_PASSES = 12
"""The benchmark replay runs at least this many passes before it may stop unsettled
(`replay_settled` False), more while they stay within BENCH_PASS_TOKENS: with many decode
workers the round-robin order moves between passes and the mean E2E can swing by a few
percent from pass to pass while the mean TTFT holds (19 SGLang decode workers on GB300, 6,144
clients: TTFT within 0.1%, E2E within 3% over passes 4-25)."""
BENCH_PASS_TOKENS = 50_000_000
"""Decoded tokens the benchmark replay's passes may take in all, the first BENCH_MAX_PASSES
included (a few seconds compiled): a pass short of the fixed point holds more than C
requests, so a replay that fits runs on to its fixed point (DeepSeek-R1 on 2 x TP 16 + 1 x TP
16 H100 workers, 64 clients x 1,000 requests of 500 output tokens: 21 passes of 0.5 M tokens,
of the 100 allowed), one that does not stops at BENCH_MAX_PASSES and gives its means only
(`_unsettled`)."""


def bench_max_passes(pass_tokens: float) -> int:
    """The benchmark replay's pass cap for passes of `pass_tokens` decoded tokens each:
    BENCH_MAX_PASSES, or as many as BENCH_PASS_TOKENS covers (at most the replay's MAX_PASSES)."""
    fit = int(BENCH_PASS_TOKENS // max(float(pass_tokens), 1.0))
    return max(BENCH_MAX_PASSES, min(MAX_PASSES, fit))


def replay_requests(concurrency: int | None, num_prompts: int | None = None,
                    output_tokens_mean: float = 0.0) -> int:
    """How many requests `latency` replays for its check: for a rate OPEN_LOOP_REQUESTS, as
    the aggregated check (fewer where their `output_tokens_mean` outputs would exceed
    CHECK_TOKENS, OPEN_LOOP_MIN_REQUESTS at least); for a closed loop the benchmark's requests
    (`num_prompts`, default vllm bench serve's 1000, at least C), which the analytic solve
    assumes too."""
    if not concurrency:
        fits = int(CHECK_TOKENS // max(output_tokens_mean, 1.0))
        return max(OPEN_LOOP_MIN_REQUESTS, min(OPEN_LOOP_REQUESTS, fits))
    return max(num_prompts or DEFAULT_PROMPTS, concurrency)


def spec_of(layout: PdLayout, sim_engine: str = "auto", seed: int = 0) -> PdReplaySpec:
    """The replay's spec of a layout: its pools, link and routers, the prefill profile's
    request overhead, the workers' speeds spread over SPEED_SPREAD (seeded). The decode worker
    is placed when the decode engine's profile says (PdServing.decode_routed_at): Dynamo's
    PrefillRouter places an SGLang request's decode worker with its prefill worker (SGLang's
    prefill runs as a background task), a vLLM or TensorRT-LLM one's when the prefill returns
    (Dynamo design note "Dynamo Disaggregation", Router Orchestration)."""
    overhead = float(np.asarray(layout.prefill.step.request_overhead_s))
    return PdReplaySpec(prefill=layout.prefill, prefill_workers=layout.prefill_workers,
                        decode=layout.decode, decode_workers=layout.decode_workers,
                        link=layout.link, request_overhead_s=overhead, sim_engine=sim_engine,
                        prefill_router=layout.prefill_router,
                        decode_router=layout.decode_router,
                        decode_routed_at=layout.decode.profile.pd.decode_routed_at,
                        speed_spread=SPEED_SPREAD, seed=seed)


@dataclass(frozen=True, kw_only=True)
class PdLoad:
    """The load of a replay: one of rate, concurrency or trace; lengths; requests; seed."""

    rate: float | None = None
    concurrency: int | None = None
    trace: str | Requests | None = None
    input_len: str = "512"
    output_len: str = "256"
    burstiness: float = 1.0
    requests: int = 1000
    seed: int = 0
    time_unit: str = "auto"

    def describe(self) -> str:
        """The load as the output's `load` line names it: the trace, the clients, or the rate
        and its arrivals (Poisson, or gamma at vllm bench serve's --burstiness)."""
        if self.trace is not None:
            return f"trace {self.trace}" if isinstance(self.trace, str) else "trace"
        if self.concurrency is not None:
            return f"closed loop, {self.concurrency} clients"
        from capplan.plan.load import open_loop_text

        return open_loop_text(self.rate, self.burstiness)


def pd_requests(layout: PdLayout, load: PdLoad) -> tuple[Requests, int]:
    """The requests of a load, clipped to the smaller pool's max_model_len: (requests, cut)."""
    wl = workload_from_options(load.rate, load.concurrency, load.trace, str(load.input_len),
                               str(load.output_len), load.burstiness, load.requests,
                               load.time_unit)
    max_len = min(layout.prefill.memory.max_model_len, layout.decode.memory.max_model_len)
    return wl.generate(np.random.default_rng(load.seed)).clip_to_context(max_len)


def simulate_pd(layout: PdLayout, reqs: Requests, sim_engine: str = "auto",
                load: PdLoad | None = None) -> dict[str, Any]:
    """Replay `reqs` over the layout: composed latency keys, `pools`, `saturated_pools`;
    `load`: the load `reqs` came from, which the `load` line names."""
    spec = spec_of(layout, sim_engine)
    if reqs.concurrency:  # each pass replays every request: passes ~ requests / C + 1
        passes = math.ceil(len(reqs) / reqs.concurrency) + 1
        limits.check_cap("sim_tokens", float(np.sum(reqs.output_tokens)) * passes,
                         f"the closed-loop replay of a P/D layout ({passes} passes of "
                         f"{len(reqs)} requests; fewer --requests or more clients cost less)")
    else:  # a trace's own lengths are bounded here, as one replica's run bounds them
        limits.check_cap("sim_tokens", float(np.sum(reqs.output_tokens)),
                         "the requests' output tokens")
    run = replay_pd(spec, reqs)
    res = _result(layout, reqs, run, spec.request_overhead_s)
    return res if load is None else {**res, "load": load.describe()}


def _result(layout: PdLayout, reqs: Requests, run: PdReplay, overhead: float
            ) -> dict[str, Any]:
    out = np.asarray(reqs.output_tokens, float)
    inp = np.asarray(reqs.input_tokens, float)
    ttft = run.first_token_at_s - run.sent_at_s + overhead
    e2e = run.finished_at_s - run.sent_at_s + overhead
    multi = out > 1
    tpot = (e2e - ttft)[multi] / (out[multi] - 1)
    t0, t1 = float(run.sent_at_s.min()), float(run.finished_at_s.max())
    span = t1 - t0 if t1 > t0 else math.nan
    gaps, counts = _gaps(run.decode_runs)
    pools = {"prefill": _pool(layout, "prefill", run, span),
             "decode": _pool(layout, "decode", run, span)}
    closed = reqs.concurrency is not None
    if closed:
        cycle = float(np.mean(e2e))
        waits = {"prefill": pools["prefill"]["queue_s"]["mean"],
                 "decode": pools["decode"]["admission_s"]["mean"]}
        for k in pools:
            pools[k]["saturated"] = bool(waits[k] > QUEUE_SHARE * cycle)
    saturated = [k for k in ("prefill", "decode") if pools[k]["saturated"]]
    res: dict[str, Any] = {
        "disaggregated": True, "model": layout.decode.model.key, "gpu": layout.decode.gpu.key,
        "layout": layout.describe(), "gpus_total": layout.gpus,
        "ttft_s": summary(ttft), "tbt_s": summary(gaps, counts), "tpot_s": summary(tpot),
        "e2e_s": summary(e2e),
        "kv_transfer_s": summary(run.decode_ready_at_s - run.prefill_done_at_s),
        "requests_per_s": len(out) / span, "output_tokens_per_s": float(out.sum()) / span,
        "input_tokens_per_s": float(inp.sum()) / span, "num_requests": len(out),
        "makespan_s": span, "request_overhead_s": overhead,
        "preemptions": sum(p["preemptions"] for p in pools.values()),
        "kv_peak_utilization": pools["decode"]["kv_peak_utilization"],
        "mean_running_batch": pools["decode"]["mean_running_batch"],
        "pools": pools, "saturated_pools": saturated, "stable": not saturated,
        "load": (f"closed loop, {reqs.concurrency} clients" if closed else "open loop"),
        "replay_passes": run.passes, "replay_settled": run.settled,
        "max_in_flight": run.max_in_flight,
        "answered_by": "replay",
        "routing": {"prefill_router": layout.prefill_router,
                    "decode_router": layout.decode_router, "worker_speed_spread": SPEED_SPREAD},
        "kv_link": {"name": layout.link.name, "bytes_per_s": layout.link.bytes_per_s,
                    "latency_s": layout.link.latency_s, "source": layout.link.source},
        "calibration": layout.decode.calibration.source,
        "launch": pd_launch(layout),
    }
    return res if run.settled or not closed else _unsettled(res, reqs.concurrency)


UNSETTLED_KEYS = ("ttft_s", "tbt_s", "tpot_s", "e2e_s")
"""The latencies whose quantiles an unsettled closed-loop replay withholds (`_unsettled`)."""


def _unsettled(res: dict[str, Any], clients: int) -> dict[str, Any]:
    """A closed-loop replay the pass cap stopped short of its fixed point: its last pass sent
    some requests before the completion their client waits for (more than C in flight), so
    its tails and KV peaks are a heavier load's. Means are kept (they settle first), the
    quantiles and KV peaks withheld (None), and `replay_note` says why."""
    def means_only(summary: dict[str, Any]) -> dict[str, Any]:
        return {q: (v if q == "mean" else None) for q, v in summary.items()}

    out = {**res, **{k: means_only(res[k]) for k in UNSETTLED_KEYS}, "kv_peak_utilization": None}
    out["pools"] = {role: {**p, "kv_peak_utilization": None,
                           **{k: means_only(p[k])
                              for k in ("queue_s", "ttft_s", "admission_s", "tbt_s")
                              if k in p}}
                    for role, p in res["pools"].items()}
    out["replay_note"] = (
        f"the closed loop did not settle in {res['replay_passes']} passes: its last pass had "
        f"{res['max_in_flight']} requests in flight for {clients} clients (sending times "
        "still lower bounds), so only the means are given; quantiles and KV peaks withheld")
    return out


def _gaps(runs: list[tuple[np.ndarray, Any]]) -> tuple[np.ndarray, np.ndarray]:
    vals, wts = [], []
    for _, rec in runs:
        st = step_summary(rec)
        vals += [st.tbt_gap_s, rec.extra_gaps_s]
        wts += [st.tbt_count, np.ones(len(rec.extra_gaps_s))]
    if not vals:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(vals), np.concatenate(wts).astype(float)


def _pool(layout: PdLayout, role: str, run: PdReplay, span: float) -> dict[str, Any]:
    """A pool's figures; its rate per worker over the whole replay's `span` (first request sent
    to last finished), as the system's rate is: a prefill worker's own span ends with its last
    prompt, long before the decodes do, and read over it the pool seemed to serve more than
    the system did."""
    dep, n = ((layout.prefill, layout.prefill_workers) if role == "prefill"
              else (layout.decode, layout.decode_workers))
    runs = run.prefill_runs if role == "prefill" else run.decode_runs
    per = [summarize(rec, ()).to_dict() for _, rec in runs]
    overloaded = [mark_overload(p, np.asarray(rec.arrival_at_s, float)) is not None
                  for p, (_, rec) in zip(per, runs, strict=True)]
    queue = np.concatenate([np.maximum(rec.admitted_at_s - rec.arrival_at_s, 0.0)
                            for _, rec in runs])
    out: dict[str, Any] = {
        "workers": n, "gpus_per_worker": dep.gpus_per_replica, "layout": dep.layout_text,
        "engine_settings": dep.settings_summary(),
        "requests_per_s_per_worker": float(np.mean([len(rec.arrival_at_s) for _, rec in runs])
                                           / span),
        "mean_running_batch": float(np.mean([p["mean_running_batch"] for p in per])),
        "kv_peak_utilization": float(max(p["kv_peak_utilization"] for p in per)),
        "preemptions": int(sum(p["preemptions"] for p in per)),
        "queue_s": summary(queue), "saturated": any(overloaded)}
    if role == "prefill":
        out["ttft_s"] = summary(run.prefill_done_at_s - run.sent_at_s)
    else:
        out["admission_s"] = summary(run.first_token_at_s - run.decode_ready_at_s)
        out["tbt_s"] = summary(*_gaps(runs))
    return out


def replayed_requests(concurrency: int, measured: int, output_tokens: float = 0.0) -> int:
    """Requests the benchmark replay runs: all `measured` up to `replay_rounds` per client
    (REPLAY_ROUNDS, fewer for requests of `output_tokens` each beyond the sim_tokens limit),
    else the start-up wave and k - 1 more rounds (`benchmark_replay`)."""
    c = int(concurrency)
    measured = max(int(measured), c)
    k = aiconfigurator.replay_rounds(c, output_tokens)  # the one rule, where it is defined
    return measured if measured <= k * c else k * c


def benchmark_replay(layout: PdLayout, concurrency: int, input_len: str, output_len: str,
                     measured: int, seed: int = 0, sim_engine: str = "auto",
                     tpot: str | None = None) -> dict[str, Any]:
    """A closed-loop benchmark's measured phase replayed on the layout (docs/disaggregation.md,
    "Benchmark replay"): `concurrency` clients start together (the tools drain their warm-ups
    first), `measured` requests in all (at least one per client). A run of at most k requests
    per client (aiconfigurator.replay_rounds: REPLAY_ROUNDS, fewer above the sim_tokens limit)
    is replayed whole; a longer one replays its start-up wave and the first k rounds and
    repeats the mean of rounds 2..k for the rest (capplan.plan.aiconfigurator.measured_mean,
    as the aggregated rows are replayed): the
    means of TTFT, TPOT and E2E are the whole run's, quantiles, pools and throughput the
    replayed rounds'. `tpot`: the tool's TPOT definition (capplan.sim.protocol; default the
    first token excluded). The result is simulate_pd's with a `benchmark_replay` record."""
    c = int(concurrency)
    measured = max(int(measured), c)
    rounds = measured / c
    n = replayed_requests(c, measured, parse_length(output_len).mean)
    reqs, _ = pd_requests(layout, PdLoad(concurrency=c, input_len=input_len,
                                         output_len=output_len, requests=n, seed=seed))
    # the passes end on the means (MEANS_SETTLED): a few passes, each of the replayed requests
    limits.check_cap("sim_tokens", float(np.sum(reqs.output_tokens)),
                     f"one pass of the benchmark replay ({n} requests)")
    spec = spec_of(layout, sim_engine, seed)
    run = replay_pd(spec, reqs, means_settled=MEANS_SETTLED,
                    max_passes=bench_max_passes(float(np.sum(reqs.output_tokens))))
    res = _result(layout, reqs, run, spec.request_overhead_s)
    ttft = run.first_token_at_s - run.sent_at_s + spec.request_overhead_s
    e2e = run.finished_at_s - run.sent_at_s + spec.request_overhead_s
    per = {"ttft_s": ttft, "e2e_s": e2e,
           "tpot_s": request_tpot(ttft, e2e, reqs.output_tokens, tpot)}
    record: dict[str, Any] = {"measured_requests": measured, "replayed_requests": n,
                              "rounds": rounds, "extrapolated": n < measured}
    for key, v in per.items():
        wave, first = float(np.nanmean(v[:c])), float(np.nanmean(v))
        mean = measured_mean(wave, first, rounds, n // c) if n < measured else first
        res[key] = {**res[key], "mean": mean}
        record[f"{key[:-2]}_wave_mean_s"] = wave
    res["benchmark_replay"] = record
    return res


def closed_loop_latency(layout: PdLayout, analytic: dict[str, Any], load: Any,
                        input_len: str, output_len: str, benchmark: str | None = None,
                        seed: int = 0, sim_engine: str = "auto") -> dict[str, Any]:
    """`latency` on a layout under a closed loop: the benchmark replay (`benchmark_replay`) of
    the named tool's protocol (`benchmark`, capplan.sim.protocol; default `vllm bench serve`'s:
    --num-prompts requests, 1000 unless given), with the analytic solve's figures beside it
    (`analytic_check`)."""
    c = int(load.concurrency)
    run = BenchmarkRun.of(preset(benchmark) if benchmark else PRESETS["vllm"], c,
                          load.num_prompts)
    _, inp, out = run.workload(input_len, output_len)
    work = replayed_requests(c, run.measured, float(load.output_stats.mean)) * float(
        load.output_stats.mean)
    if work > limits.cap("sim_tokens"):
        return {**analytic, "answered_by": "analytic",
                "replay_note": f"no replay: one pass of the benchmark replay decodes {work:.3g} "
                               f"tokens, above the sim_tokens limit of "
                               f"{limits.cap('sim_tokens'):.3g} (`capplan --limit "
                               "sim_tokens=N` raises it)"}
    sim = benchmark_replay(layout, c, inp, out, run.measured, seed, sim_engine,
                           run.preset.tpot)
    check = _analytic_check(analytic, sim)
    b = sim["benchmark_replay"]
    k = b["replayed_requests"] // c
    how = (f"; replayed: {b['replayed_requests']} requests (the start-up wave and rounds 2-{k}),"
           f" the other {b['measured_requests'] - b['replayed_requests']} at rounds 2-{k}'s mean"
           if b["extrapolated"] else "")
    return {**sim, **_kept(analytic), "analytic_check": check,
            "load": f"closed loop, {c} clients, {b['measured_requests']} measured requests "
                    f"({run.preset.tool}){how}",
            **({"benchmark": run.preset.describe()} if benchmark else {}),
            "answered_by": "replay of the benchmark"}


def _analytic_check(analytic: dict[str, Any], sim: dict[str, Any]) -> dict[str, Any]:
    """The analytic solve's means beside the replay's: `analytic_check` of a replayed answer."""
    diffs = {key: _rel_diff(analytic.get(key), sim[key]["mean"])
             for key in ("ttft_s", "tpot_s")}
    return {"analytic_ttft_mean_s": (analytic.get("ttft_s") or {}).get("mean"),
            "analytic_tpot_mean_s": analytic.get("tpot_s"),
            "rel_diff": diffs, "tolerance": TOLERANCE}


def _kept(analytic: dict[str, Any]) -> dict[str, Any]:
    """What a replayed answer keeps of the analytic one: the launch lines, the pools'
    capacities."""
    return {k: analytic[k] for k in ("launch", "capacity_by_pool_requests_per_s")
            if k in analytic}


def _rel_diff(a: Any, b: float) -> float:
    """|a - b| / b of the analytic mean `a` (a figure or a quantile dict) against the
    replay's `b`; inf where either is missing."""
    a = a.get("mean") if isinstance(a, dict) else a
    return abs(a - b) / b if a is not None and b and math.isfinite(b) else math.inf


def check_latency(layout: PdLayout, analytic: dict[str, Any], reqs: Requests,
                  sim_engine: str = "auto") -> dict[str, Any]:
    """`latency` on a layout: the analytic answer checked against the replay of the same load
    (open loop) or replaced by it (closed loop, trace; or a disagreement over TOLERANCE).
    Returns the answer with `answered_by` and, when both ran, `analytic_check`; a replayed
    answer keeps the analytic answer's `load` line. A trace whose mean rate saturates a pool
    in the analytic solve is replayed (its own requests), and the answer keeps that verdict:
    the pool is named in `saturated_pools` (`stable` False) with the analytic `reason`,
    whatever the finite replay's backlog showed (`_saturated_check`)."""
    passes = math.ceil(len(reqs) / reqs.concurrency) + 1 if reqs.concurrency else 1
    work = float(np.sum(reqs.output_tokens)) * passes
    if work > CHECK_TOKENS:
        return {**analytic, "answered_by": "analytic",
                "replay_note": f"no replay: {work:.3g} simulated tokens exceed the check's "
                               f"{CHECK_TOKENS:.3g} (capplan simulate replays it)"}
    load = str(analytic.get("load", ""))
    if not analytic["stable"] and not reqs.concurrency and not load.startswith("trace"):
        # a saturated pool under an open loop has no steady latencies: a finite replay's would
        # grow with its length (as plan/replay.py answers one replica)
        return {**analytic, "answered_by": "analytic (a pool is saturated: not replayed)"}
    sim = {**simulate_pd(layout, reqs, sim_engine), "load": analytic.get("load")}
    if not analytic["stable"]:
        return _saturated_check(analytic, sim)
    check = _analytic_check(analytic, sim)
    agree = all(d <= TOLERANCE for d in check["rel_diff"].values())
    if load.startswith(("closed", "trace")) or not agree:
        return {**sim, **_kept(analytic), "analytic_check": check,
                "answered_by": "replay" if agree else "replay (the analytic solve differs by "
                f"more than {TOLERANCE:.0%})"}
    return {**analytic, "answered_by": "analytic (within "
            f"{TOLERANCE:.0%} of the replay)", "analytic_check": check}


def _saturated_check(analytic: dict[str, Any], sim: dict[str, Any]) -> dict[str, Any]:
    """The replay of a trace whose mean rate saturates a pool in the analytic solve: the
    replay's latencies (the trace's own, finite), the analytic solve's saturated pools added to
    the replay's, its reason kept, and `analytic_check` recording that verdict (there are no
    analytic means to compare)."""
    pools = [p for p in ("prefill", "decode")
             if p in analytic["saturated_pools"] or p in sim["saturated_pools"]]
    return {**sim, **_kept(analytic), "stable": False, "saturated_pools": pools,
            "reason": analytic.get("reason"),
            "analytic_check": {"analytic_stable": False,
                               "analytic_saturated_pools": list(analytic["saturated_pools"]),
                               "analytic_reason": analytic.get("reason"),
                               "analytic_ttft_mean_s": None, "analytic_tpot_mean_s": None,
                               "rel_diff": None, "tolerance": TOLERANCE},
            "answered_by": "replay of the trace's requests (the analytic solve finds the "
                           f"{' and '.join(analytic['saturated_pools'])} pool"
                           f"{'s' if len(analytic['saturated_pools']) > 1 else ''} saturated "
                           "at the trace's mean rate: no steady state to compare; the replay's "
                           "latencies are this finite trace's)"}


def pd_latency_checked(layout: PdLayout, load: Any, replay: PdLoad,
                       benchmark: str | None = None) -> dict[str, Any]:
    """`latency` on a layout: the analytic solve (plan/pd.pd_latency), replaced by the replay
    of the benchmark a closed loop runs (`closed_loop_latency`; `benchmark` names the tool), or
    checked against the replay of a rate's Poisson (or gamma) arrivals or the trace's own
    requests (`check_latency`; a trace is time-dependent: the replay answers). `replay`: the
    replay's lengths, burstiness, seed, and trace with its time unit (its rate, clients and
    requests are the load's)."""
    from capplan.plan.pd import pd_latency

    res = pd_latency(layout, load)
    trace = replay.trace
    if benchmark is not None and (load.concurrency is None or trace is not None):
        raise InputError(f"--benchmark {benchmark} with a disaggregated layout replays a closed "
                         "loop: give --concurrency C")
    if load.concurrency is not None and trace is None:
        return closed_loop_latency(layout, res, load, replay.input_len, replay.output_len,
                                   benchmark, replay.seed)
    spec = replay if trace is not None else replace(
        replay, rate=load.rate_per_s if load.concurrency is None else None,
        concurrency=load.concurrency, requests=replay_requests(
            load.concurrency, load.num_prompts, parse_length(replay.output_len).mean))
    reqs, _ = pd_requests(layout, spec)
    return check_latency(layout, res, reqs)
