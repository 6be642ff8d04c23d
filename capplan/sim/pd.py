"""Replay a fixed disaggregated deployment: a prefill pool and a decode pool of engines, the KV
link between them, under an open loop, a closed loop or a trace (docs/disaggregation.md).

Per request, in the order the pieces run:
1. the router sends it to prefill worker i mod P (round-robin in arrival order, as vLLM's
   disaggregated proxy and the production stack's `RoundRobinRouter` do); the worker's engine
   runs the prompt with a one-token output (vLLM's proxy sends the prefill with max_tokens=1;
   SGLang and TensorRT-LLM context servers stop after the first token);
2. its KV moves to the decode side: `kv_transfer_s` of the prompt over the layout's link, from
   the prefill step's end;
3. the router sends it, in the order transfers end, to decode worker j mod D, whose engine
   runs it with its prompt already computed: `KvPresentStep` costs the prompt's step as the
   last prompt token attending to the transferred KV (a connector's loaded tokens are a cache
   hit up to prompt - 1 tokens, vLLM KVConnector `get_num_new_matched_tokens`), and the decode
   engine's token budget holds every admitted prompt (no prompt chunk competes with decodes).
   The decode side's first step emits the token the client sees first; TBT and TPOT are the
   decode pool's.

A closed loop of C clients couples the pools (a client sends its next request when its last one
ends on the decode side), which engines run one at a time cannot see: the replay iterates.
Sending times start at 0 (a lower bound); each pass runs both pools on them and sets request
i + C's sending time to the (i + 1)-th completion (plus the client's request overhead), as
`vllm bench serve --max-concurrency C` does. A pass is exact up to the time of the earliest
completion it got wrong, and the passes end when no sending time changes. The means settle in a
few passes; the exact fixed point can take many more, each moving a few sending times by about a
decode step (`replay_pd`'s `means_settled` ends there instead).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from capplan.models.disagg import Link, kv_transfer_s
from capplan.sim.entities import RunRecord
from capplan.sim.workload import Requests

if TYPE_CHECKING:
    from capplan.plan.deployment import Deployment

__all__ = ["KvPresentStep", "PdReplay", "PdReplaySpec", "replay_pd"]

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


def _run_pool(dep: Deployment, workers: int, at_s: np.ndarray, inp: np.ndarray,
              out: np.ndarray, kv_present: bool, sim_engine: str
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[np.ndarray, RunRecord]]]:
    """Route requests round-robin in the order they reach the pool and run each worker:
    (worker, first token at, finished at, runs) per request."""
    n = len(at_s)
    order = np.argsort(at_s, kind="stable")
    worker = np.empty(n, np.int64)
    worker[order] = np.arange(n) % workers
    first, done = np.full(n, np.nan), np.full(n, np.nan)
    runs = []
    for w in range(workers):
        idx = order[worker[order] == w]
        if not len(idx):
            continue
        reqs = Requests(at_s[idx], inp[idx], out[idx], np.zeros(len(idx), np.int64))
        rec = _engine(dep, kv_present, sim_engine).run(reqs)
        first[idx], done[idx] = rec.first_token_at_s, rec.finished_at_s
        runs.append((idx, rec))
    return worker, first, done, runs


def _pipeline(spec: PdReplaySpec, sent: np.ndarray, inp: np.ndarray, out: np.ndarray
              ) -> PdReplay:
    pw, _, pdone, pruns = _run_pool(spec.prefill, spec.prefill_workers, sent, inp,
                                    np.ones_like(out), False, spec.sim_engine)
    kv = spec.decode.memory.kv_bytes_per_token_per_gpu
    ready = pdone + kv_transfer_s(inp, kv, spec.link)
    dw, first, done, druns = _run_pool(spec.decode, spec.decode_workers, ready, inp, out,
                                       True, spec.sim_engine)
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
    passes end there unsettled (`settled` False)."""
    inp = np.asarray(reqs.input_tokens, np.int64)
    out = np.asarray(reqs.output_tokens, np.int64)
    c = reqs.concurrency
    if c is None:
        return _pipeline(spec, np.asarray(reqs.arrival_at_s, float), inp, out)
    n = len(inp)
    sent = np.zeros(n)
    last = None
    for k in range(1, max_passes + 1):
        run = _pipeline(spec, sent, inp, out)
        nxt = np.zeros(n)
        if n > c:
            nxt[c:] = np.sort(run.finished_at_s + spec.request_overhead_s)[:n - c]
        run.passes = k
        if np.max(np.abs(nxt - sent)) <= SETTLED_S:
            return run
        means = _means(run)
        if means_settled is not None and last is not None and np.all(
                np.abs(means - last) <= means_settled * means[1]):
            return run
        sent, last = nxt, means
    run.settled = False
    return run
