"""Replay a fixed disaggregated deployment: a prefill pool and a decode pool of engines, the KV
link between them, under an open loop, a closed loop or a trace (docs/disaggregation.md).

Per request, in the order the pieces run:
1. the router places it on a prefill worker as it arrives (`route`, the spec's
   `prefill_router`: by default a counter, request i of the arrival order on worker i mod P,
   as Dynamo's frontend `--router-mode round-robin`, vLLM's disaggregated proxy and the
   production stack's `RoundRobinRouter` do); the worker's engine runs the prompt with a
   one-token output (vLLM's proxy sends the prefill with max_tokens=1; SGLang and
   TensorRT-LLM context servers stop after the first token);
2. its KV moves to the decode side: `kv_transfer_s` of the prompt over the layout's link, from
   the prefill step's end;
3. the router places it on a decode worker (`decode_router`), as its prefill returns (the
   default, Dynamo's PrefillRouter for vLLM and TensorRT-LLM) or as it arrived
   (`decode_routed_at`), whose engine runs it with its prompt already computed:
   `KvPresentStep` costs the prompt's step as the last prompt token attending to the
   transferred KV (a connector's loaded tokens are a cache hit up to prompt - 1 tokens, vLLM
   KVConnector `get_num_new_matched_tokens`), and the decode engine's token budget holds
   every admitted prompt (no prompt chunk competes with decodes). The decode side's first
   step emits the token the client sees first; TBT and TPOT are the decode pool's.

Each worker's steps may take a factor of their modelled time (`speed_spread`, `worker_speeds`:
same-SKU GPUs differ by a few percent, SPEED_SPREAD); the engine runs on the arrivals divided
by the factor and its record is scaled back (`_scaled`). A counter never misplaces a request
while the workers are identical: in a closed loop the clients come back in the order they were
placed. With workers a few percent apart they come back shuffled, and a counter can send a
request to a worker whose slots are all busy, where it waits for a sequence to end.

A closed loop of C clients couples the pools (a client sends its next request when its last one
ends on the decode side), which engines run one at a time cannot see: the replay iterates.
Sending times start at 0 (a lower bound); each pass runs both pools on them and sets request
i + C's sending time to the (i + 1)-th completion (plus the request overhead's own delay,
`closed_loop_delay`), as
`vllm bench serve --max-concurrency C` does. A pass is exact up to the time of the earliest
completion it got wrong, and the passes end when no sending time changes. The means settle in a
few passes; the exact fixed point can take many more, each moving a few sending times by about a
decode step (`replay_pd`'s `means_settled` ends there instead).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from capplan.models.disagg import Link, kv_transfer_s
from capplan.models.engine import NO_JITTER, closed_loop_delay
from capplan.sim.entities import RunRecord
from capplan.sim.routers import canonical_router
from capplan.sim.workload import Requests

if TYPE_CHECKING:
    from capplan.plan.deployment import Deployment

__all__ = ["ROUTERS", "KvPresentStep", "PdReplay", "PdReplaySpec", "check_router", "replay_pd",
           "route"]

MAX_PASSES = 400
"""Closed loop: the replay stops iterating after this many passes (each pass runs both pools
once) and says it did not settle; a closed loop settles in about requests / C passes."""
SETTLED_S = 1e-9
"""Closed loop: passes end when no request's sending time moved by more than this (s)."""


class KvPresentStep:
    """A decode worker's step model for requests whose prompt KV arrived over the link: a
    prompt's step computes only its last token, reading the other prompt tokens' KV as a cached
    prefix (StepRecord: chunk c = 1 after p = prompt - 1 cached tokens, c * p + c (c + 1) / 2 =
    prompt pairs). Every other input passes through. It has no `constants`, so the scheduler loop
    runs interpreted and asks this `step(...)` rather than compiling the full prompt's formula."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "constants":  # the compiled engine would cost the whole prompt
            raise AttributeError(name)
        return getattr(self.inner, name)

    def step(self, detail: bool = True, **kw: Any) -> dict[str, np.ndarray]:
        """The inner step with each prompt's step computing its last token only (StepRecord
        inputs as keywords, `StepModel.step`'s)."""
        nps = np.asarray(kw.get("num_prefill_seqs", 0), float)
        tokens = (np.asarray(kw.get("prefill_tokens", 0), float)
                  + np.asarray(kw.get("prefill_kv_read", 0), float))
        read = np.maximum(tokens - nps, 0.0)
        win = float(getattr(self.inner, "window", math.inf))
        read_w = np.minimum(read, nps * win) if math.isfinite(win) else read
        kw.update(prefill_tokens=nps, prefill_pairs=tokens, prefill_pairs_window=read_w + nps,
                  prefill_kv_read=read, prefill_kv_read_window=read_w)
        return self.inner.step(detail=detail, **kw)


@dataclass(frozen=True, kw_only=True)
class PdReplaySpec:
    """The layout to replay: each pool's deployment and worker count, the KV link."""

    prefill: Deployment
    prefill_workers: int
    decode: Deployment
    decode_workers: int
    link: Link
    request_overhead_s: float = 0.0
    """The client's cost outside engine steps (once per request; closed loop: the delay
    before a client's next request reaches the router)."""
    sim_engine: str = "auto"
    prefill_router: str = "round-robin"
    """How the prefill workers are chosen (ROUTERS), as requests reach the frontend."""
    decode_router: str = "round-robin"
    """How the decode workers are chosen (ROUTERS), at `decode_routed_at`."""
    decode_routed_at: str = "prefill_done"
    """When the decode router places a request (DECODE_ROUTED_AT)."""
    speed_spread: float = 0.0
    """The range of the workers' step-time factors (`worker_speeds`; SPEED_SPREAD is the
    published figure); 0: identical workers."""
    seed: int = 0
    """Seeds the `random` router's draws and the workers' speeds (the same every pass)."""


@dataclass
class PdReplay:
    """Per request (in the requests' order) the stamps of each stage, and each worker's run."""

    sent_at_s: np.ndarray
    prefill_done_at_s: np.ndarray
    decode_ready_at_s: np.ndarray
    first_token_at_s: np.ndarray
    finished_at_s: np.ndarray
    prefill_worker: np.ndarray
    decode_worker: np.ndarray
    prefill_runs: list[tuple[np.ndarray, RunRecord]] = field(default_factory=list)
    """(request indices in the run's order, its record) per prefill worker."""
    decode_runs: list[tuple[np.ndarray, RunRecord]] = field(default_factory=list)
    passes: int = 1
    settled: bool = True
    """Closed loop: the sending times reached their fixed point, or the means settled on a
    pass that kept at most C requests in flight (`max_in_flight`); False: the pass cap ended
    the passes first, and this pass's sending times are still lower bounds."""
    max_in_flight: int | None = None
    """Closed loop: the most requests this pass had sent and not finished at once (at most C
    once settled; an unsettled pass sends some requests before the completion their client
    waits for, and holds more)."""


def in_flight_max(sent_s: np.ndarray, finished_s: np.ndarray) -> int:
    """The most requests sent and not finished at any time (a finish at the instant of a
    send frees its slot first)."""
    s, f = np.sort(np.asarray(sent_s, float)), np.sort(np.asarray(finished_s, float))
    if not len(s):
        return 0
    # before each send: the sends so far (it included) minus the finishes at or before it
    return int(np.max(np.arange(1, len(s) + 1) - np.searchsorted(f, s, side="right")))


def _engine(dep: Deployment, kv_present: bool, sim_engine: str) -> Any:
    from capplan.sim.fleet import engine_for

    lim, step = dep.limits, dep.step
    if not kv_present:
        return engine_for(dep, sim_engine)
    # a decode worker computes no prompt chunk: every admitted prompt fits its step
    eng = engine_for(dep, sim_engine, max_num_batched_tokens=max(
        lim.max_num_batched_tokens, lim.max_num_seqs * dep.memory.max_model_len),
        step=step if hasattr(step, "constants") else KvPresentStep(step))
    # a StepModel's prompt steps with the KV present: the loop's inputs as KvPresentStep's (a
    # stand-in step model is wrapped instead: the plain loop asks it)
    eng.kv_present = hasattr(step, "constants")
    return eng


ROUTERS = ("round-robin", "random", "least-outstanding")
"""How a router places a request on a pool's workers (`route`; names as capplan.sim.routers
spells them, `round_robin` and `least_loaded` accepted): `round-robin`, a counter over the
workers in the order requests reach the router (Dynamo's frontend default, `--router-mode
round-robin`); `random`, a seeded uniform draw per request; `least-outstanding`, the worker
with the fewest of the pool's requests in flight when the request reaches it."""
DECODE_ROUTED_AT = ("arrival", "prefill_done")
"""When the decode router places a request: `arrival`, as the request reaches the frontend
(with its prefill worker; Dynamo's PrefillRouter for SGLang, whose prefill runs as a
background task); `prefill_done`, as its prefill returns (Dynamo's PrefillRouter for vLLM and
TensorRT-LLM, whose prefill runs first: docs/design_docs/disagg_serving.md)."""
SPEED_SPREAD = 0.08
"""Reference spread of the speed of same-SKU GPUs: the average performance variation (max over
min) across the GPUs of one cluster, 8% (Sinha et al., "Not All GPUs Are Created Equal",
SC22, arXiv 2208.11035 abstract). `PdReplaySpec.speed_spread` spreads the workers' step-time
factors uniformly over a range this wide (`worker_speeds`)."""


def check_router(name: str, what: str = "router") -> str:
    """The canonical name of router `name` if it is one of ROUTERS (capplan.sim.routers
    aliases accepted), else an InputError naming the choices."""
    return canonical_router(name, ROUTERS, what)


def route(policy: str, at_s: np.ndarray, workers: int, seed: int = 0,
          done_s: np.ndarray | None = None) -> np.ndarray:
    """The worker of each request under `policy` (ROUTERS), requests reaching the router at
    `at_s` (ties in the requests' order). `least-outstanding` counts a worker's earlier requests
    whose `done_s` (the pool's finish times of the previous pass; None: none finished yet)
    is after the request's time, and takes the lowest-numbered worker of the fewest."""
    policy = check_router(policy)
    n = len(at_s)
    order = np.argsort(at_s, kind="stable")
    worker = np.empty(n, np.int64)
    if policy == "round-robin":
        worker[order] = np.arange(n) % workers
    elif policy == "random":
        worker[:] = np.random.default_rng(seed).integers(0, workers, n)
    else:
        busy: list[list[float]] = [[] for _ in range(workers)]
        done = np.full(n, math.inf) if done_s is None else np.asarray(done_s, float)
        for i in order:
            t = at_s[i]
            for h in busy:
                while h and h[0] <= t:
                    heapq.heappop(h)
            w = min(range(workers), key=lambda k: len(busy[k]))
            worker[i] = w
            heapq.heappush(busy[w], done[i] if math.isfinite(done[i]) else math.inf)
    return worker


def worker_speeds(workers: int, spread: float, seed: int) -> np.ndarray:
    """Each worker's step-time factor: the W quantiles (k + 1/2) / W of a uniform spread over
    [1 - spread / 2, 1 + spread / 2], in a seeded order over the workers (every layout gets the
    stated spread, not one draw's; all 1 when `spread` is 0 or W is 1)."""
    if spread <= 0 or workers < 2:
        return np.ones(workers)
    q = (np.arange(workers) + 0.5) / workers - 0.5
    return 1.0 + spread * np.random.default_rng(seed).permutation(q)


def _scaled(rec: RunRecord, f: float) -> RunRecord:
    """A run's record with every time and duration multiplied by `f`: the run of an engine
    whose steps all take `f` times as long, on arrivals `f` times as late (the engine's
    clock only advances by steps, so the schedule is the same)."""
    if f == 1.0:
        return rec
    times = ("arrival_at_s", "admitted_at_s", "first_token_at_s", "finished_at_s",
             "step_start_s", "step_dur_s", "step_tbt_gap_s", "extra_gaps_s")
    kw: dict[str, Any] = {k: np.asarray(getattr(rec, k)) * f for k in times}
    if rec.steps is not None:
        st = rec.steps
        kw["steps"] = replace(st, tbt_gap_s=st.tbt_gap_s * f, running_s=st.running_s * f,
                              in_system_s=st.in_system_s * f,
                              series_start_s=st.series_start_s * f)
    return replace(rec, **kw)


def _run_pool(dep: Deployment, worker: np.ndarray, at_s: np.ndarray, inp: np.ndarray,
              out: np.ndarray, kv_present: bool, sim_engine: str, speeds: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, RunRecord]]]:
    """Run each worker of a pool on the requests routed to it (`worker`), requests reaching
    it at `at_s`, worker w's steps `speeds[w]` times as long: (first token at, finished at,
    runs) per request."""
    n = len(at_s)
    order = np.argsort(at_s, kind="stable")
    first, done = np.full(n, np.nan), np.full(n, np.nan)
    runs = []
    for w, f in enumerate(speeds):
        idx = order[worker[order] == w]
        if not len(idx):
            continue
        reqs = Requests(at_s[idx] / f, inp[idx], out[idx], np.zeros(len(idx), np.int64))
        rec = _scaled(_engine(dep, kv_present, sim_engine).run(reqs), float(f))
        first[idx], done[idx] = rec.first_token_at_s, rec.finished_at_s
        runs.append((idx, rec))
    return first, done, runs


def _pipeline(spec: PdReplaySpec, sent: np.ndarray, inp: np.ndarray, out: np.ndarray,
              last: PdReplay | None = None) -> PdReplay:
    """One pass: both pools on the sending times `sent` (`last`: the previous pass, whose
    finish times a `least-outstanding` router counts)."""
    pw = route(spec.prefill_router, sent, spec.prefill_workers, spec.seed,
               None if last is None else last.prefill_done_at_s)
    pspeed = worker_speeds(spec.prefill_workers, spec.speed_spread, spec.seed)
    _, pdone, pruns = _run_pool(spec.prefill, pw, sent, inp, np.ones_like(out), False,
                                spec.sim_engine, pspeed)
    kv = spec.decode.memory.kv_bytes_per_token_per_gpu
    ready = pdone + kv_transfer_s(inp, kv, spec.link)
    routed_at = sent if spec.decode_routed_at == "arrival" else pdone
    dw = route(spec.decode_router, routed_at, spec.decode_workers, spec.seed + 1,
               None if last is None else last.finished_at_s)
    dspeed = worker_speeds(spec.decode_workers, spec.speed_spread, spec.seed + 1)
    first, done, druns = _run_pool(spec.decode, dw, ready, inp, out, True, spec.sim_engine,
                                   dspeed)
    return PdReplay(sent, pdone, ready, first, done, pw, dw, pruns, druns)


def _means(run: PdReplay) -> np.ndarray:
    """Mean time to first token and mean end-to-end time of a pass (from sending)."""
    return np.array([np.mean(run.first_token_at_s - run.sent_at_s),
                     np.mean(run.finished_at_s - run.sent_at_s)])


def replay_pd(spec: PdReplaySpec, reqs: Requests, means_settled: float | None = None,
              max_passes: int = MAX_PASSES) -> PdReplay:
    """Run `reqs` through the layout (module docstring); a closed loop (`reqs.concurrency`)
    iterates its sending times to the fixed point. `means_settled`: the passes also end when
    the pass's mean TTFT and mean E2E each moved by less than this share of the mean E2E (a
    client's cycle) since the last pass (the benchmark's means settle in a few passes; the
    last passes move single sending times by about a decode step each). `max_passes`: the
    passes end there unsettled (`settled` False). A closed loop's pass records its
    `max_in_flight`; the means-settled stop takes only a pass holding at most C."""
    inp = np.asarray(reqs.input_tokens, np.int64)
    out = np.asarray(reqs.output_tokens, np.int64)
    c = reqs.concurrency
    if c is None:
        at = np.asarray(reqs.arrival_at_s, float)
        run = _pipeline(spec, at, inp, out)
        if "least-outstanding" in (check_router(spec.prefill_router),
                                   check_router(spec.decode_router)):
            for k in range(2, max_passes + 1):  # the loads counted from the last pass's ends
                nxt = _pipeline(spec, at, inp, out, run)
                nxt.passes = k
                if np.array_equal(nxt.prefill_worker, run.prefill_worker) and \
                        np.array_equal(nxt.decode_worker, run.decode_worker):
                    return nxt
                run = nxt
            run.settled = False
        return run
    n = len(inp)
    sent = np.zeros(n)
    last = None
    run = None
    # each next request reaches the prefill pool the overhead's own delay after a response
    # ends (models.engine.closed_loop_delay: overhead x Exp(1), drawn per request in sending
    # order), taking the next index in arrival order, as the compiled closed loop does
    fixed, spread = closed_loop_delay(spec.request_overhead_s, None, 0.0)
    delay = fixed + spread * np.random.default_rng(NO_JITTER.seed).standard_exponential(n)
    for k in range(1, max_passes + 1):
        run = _pipeline(spec, sent, inp, out, run)
        nxt = np.zeros(n)
        if n > c:
            nxt[c:] = np.sort(np.sort(run.finished_at_s)[:n - c] + delay[c:])
        run.passes = k
        run.max_in_flight = in_flight_max(run.sent_at_s, run.finished_at_s)
        if np.max(np.abs(nxt - sent)) <= SETTLED_S:
            return run
        means = _means(run)
        if means_settled is not None and last is not None and np.all(
                np.abs(means - last) <= means_settled * means[1]) \
                and run.max_in_flight <= c:
            return run
        sent, last = nxt, means
    run.settled = False
    return run
