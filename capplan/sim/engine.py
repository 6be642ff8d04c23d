"""Continuous batching, iteration-level scheduling, under an engine's scheduler policy.

The default policy is vLLM V1's (`vllm/v1/core/sched/scheduler.py`, v0.10-v0.11): each step,
every running sequence whose prompt is computed decodes one token; the rest of the token budget
(`max_num_batched_tokens` minus decode tokens) goes to prefill chunks of running, partially
prefilled sequences, then to waiting ones (ordered by priority, then arrival) while
`max_num_seqs` and free KV blocks allow. Blocks (`ceil(tokens / block_size)`) are allocated as
tokens are computed. A running sequence that needs a block when none is free preempts
(recompute) the lowest-priority, most recently admitted sequence: its blocks are freed, it goes
back to the waiting queue, and its prompt plus the tokens it generated are computed again. A step
with a preemption admits no waiting request.

Hybrid models (Mamba, gated DeltaNet, short conv layers): `state_blocks` pool blocks hold a
running sequence's recurrent state from admission until it finishes or is preempted, besides
its token blocks; admission needs them free and a preemption frees them (vLLM V1's hybrid KV
cache manager allocates them from the same block pool, `MambaManager` in
`vllm/v1/core/single_type_kv_cache_manager.py`, v0.10-v0.11; the count is
`capplan.models.layers.state_blocks_per_seq`).

`SchedulerPolicy` (capplan/models/engine.py) changes four things, each honoured exactly:
- prefill_first (SGLang `Scheduler.get_next_batch_to_run`, "run prefill first if possible"):
  a step that can schedule prefill work (a partial prompt, or a waiting request that fits) is
  prefill only, up to the token budget and `max_num_seqs`; decoders skip it (their next token
  gap spans it). Otherwise the step decodes every decoder. Prefill steps never preempt: a
  chunk whose blocks are not free waits.
- chunked_prefill False (TensorRT-LLM's default; vLLM with chunking disabled): a prompt is
  computed whole in one step, with the step's decode tokens, once decode tokens + prompt fit
  the budget; a prompt over the budget is an InputError.
- reserve_output_frac r > 0 (TensorRT-LLM GUARANTEED_NO_EVICT reserves ISL + OSL, r = 1):
  admission needs ceil((prompt + r * output) / block_size) free blocks, held until the request
  finishes; a sequence allocates beyond its reservation only as its context outgrows it.
- preemption False: the engine never preempts; it needs r = 1, and a sequence finding no free
  block is an internal error (assert), not a silent preemption.
- prefix_caching True (vLLM V1's automatic prefix caching, `vllm/v1/core/kv_cache_manager.py`
  and `block_pool.py`, v0.11-v0.19; docs/prefix_caching.md), for requests that carry shared
  content (`Requests.block_keys`): on admission the longest chain of the prompt's full blocks
  found in the cache is reused, capped at prompt - 1 tokens; those tokens are computed by no
  step (attention still reads them). A full block is registered when the chunk that fills it
  is scheduled (as vLLM's allocate_slots does), so later requests, even later in the same step,
  hit it while it is in use (ref counts: a shared block is held once). Freed blocks
  keep their key in the free queue, tail blocks first, and count as free; an allocation takes
  a free block without a key first, then evicts the least recently freed cached one.
  Difference from vLLM: vLLM hashes every full block (a unique one can only be hit by its own
  request after a preemption) and pops its free queue strictly in order; here blocks without
  shareable content carry no key and are reused before any cached block is evicted.

Speed: per-sequence state is lazy (a decoder stores the decode step it started decoding from),
sums are kept incrementally, finishes sit in a heap and block-boundary crossings in per-step
buckets, so a step costs O(events) in Python. Step times come from `StepModel.step`, evaluated
for a window of steps in one vectorised call; only arrival times need the clock, so a window is
scheduled against estimated step times and checked against the exact ones; from the first step
where an arrival would have been seen differently, the window is rolled back and replayed with
exact times. Results are exact.

References: Kwon et al., "Efficient Memory Management for Large Language Model Serving with
PagedAttention", SOSP 2023; Yu et al., "Orca", OSDI 2022; TensorRT-LLM
`cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp` (GuaranteedNoEvictScheduler) and
docs "Tuning Max Batch Size and Max Num Tokens".
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from heapq import heapify, heappop, heappush
from operator import attrgetter
from typing import Any

import numpy as np

from capplan.errors import InputError
from capplan.models.engine import VLLM, ClientJitter, SchedulerPolicy
from capplan.models.perf import chunk_attention
from capplan.sim.entities import STEP_INPUTS, RunRecord, StepRecord, step_array
from capplan.sim.workload import Requests

VLLM_POLICY = VLLM.scheduler
"""The default: vLLM V1's scheduler policy, from its engine profile."""
WINDOW_MAX = 32
"""Longest speculated window in open loop: longer ones are mostly rolled back."""
NO_WINDOW = 2**62
"""Sliding window of a model without one (no query is capped)."""


def step_times(step_model: Any, steps: Mapping[str, Any] | np.ndarray) -> np.ndarray:
    """Exact step times (s) of many steps; `steps[name]` is a column of `STEP_INPUTS` (a
    structured array of StepRecords, or a dict of arrays)."""
    kw = {k: steps[k] for k in STEP_INPUTS}
    n = len(kw[STEP_INPUTS[0]])
    out = np.asarray(step_model.step(**kw, detail=False)["step_s"], float)
    return np.array(np.broadcast_to(out, (n,)), float)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class ContinuousEngine:
    """A continuous-batching engine over a step-time model; `run()` simulates a request set."""

    def __init__(self, step_model: Any, num_gpu_blocks: int, block_size: int, max_num_seqs: int,
                 max_num_batched_tokens: int, policy: SchedulerPolicy = VLLM_POLICY,
                 state_blocks: int = 0) -> None:
        if max_num_batched_tokens < max_num_seqs:
            raise InputError(f"--max-num-batched-tokens {max_num_batched_tokens} must be >= "
                             f"--max-num-seqs {max_num_seqs} (vLLM rejects it too)")
        if num_gpu_blocks < 1:
            raise InputError("no KV-cache blocks: the model does not fit; see `capplan memory`")
        if not (isinstance(state_blocks, int | np.integer) and 0 <= state_blocks < num_gpu_blocks):
            raise InputError(f"state_blocks {state_blocks}: must be an integer from 0 to the "
                             f"{num_gpu_blocks} KV blocks less one")
        r = policy.reserve_output_frac
        if not 0.0 <= r <= 1.0:
            raise InputError(f"reserve_output_frac {r}: must be between 0 and 1")
        if not policy.preemption and r < 1.0:
            raise InputError(f"an engine without preemption must reserve the whole output at "
                             f"admission (reserve_output_frac 1, not {r}): otherwise a running "
                             "sequence can find no free KV block")
        self.step_model = step_model
        self.policy = policy
        self.total_blocks = int(num_gpu_blocks)
        self.block_size = int(block_size)
        self.state_blocks = int(state_blocks)
        """Blocks a running sequence's recurrent state holds from admission until it finishes
        or is preempted (hybrid models: models/layers.state_blocks_per_seq)."""
        self.max_num_seqs = int(max_num_seqs)
        self.max_num_batched_tokens = int(max_num_batched_tokens)
        w = float(getattr(step_model, "window", NO_WINDOW))
        self.has_window = w < 1e15
        self.window = int(w) if self.has_window else NO_WINDOW

    def reserved_blocks(self, prompt_tokens: int, output_tokens: int) -> int:
        """Blocks held from admission: ceil((prompt + r * output) / block_size), 0 when r = 0."""
        r = self.policy.reserve_output_frac
        if r <= 0:
            return 0
        return math.ceil((prompt_tokens + r * output_tokens) / self.block_size)

    def _check_requests(self, reqs: Requests) -> None:
        need = reqs.input_tokens + reqs.output_tokens
        cap = (self.total_blocks - self.state_blocks) * self.block_size
        if len(reqs) and int(need.max()) > cap:
            i = int(np.argmax(need))
            raise InputError(f"request {i} needs {int(need[i])} KV tokens but the cache holds "
                             f"{cap}: raise --gpu-memory-utilization or shorten requests")
        if len(reqs) and not self.policy.chunked_prefill:
            # Without chunking a prompt runs whole; a recompute after a preemption computes the
            # prompt and all but the last generated token again.
            longest = reqs.input_tokens + (reqs.output_tokens - 1) * self.policy.preemption
            i = int(np.argmax(longest))
            if int(longest[i]) > self.max_num_batched_tokens:
                raise InputError(f"request {i} needs a {int(longest[i])}-token prefill but "
                                 f"chunked prefill is off and --max-num-batched-tokens is "
                                 f"{self.max_num_batched_tokens}: raise it or shorten prompts")

    def run(self, reqs: Requests, priorities: np.ndarray | None = None,
            progress: Callable[[int], None] | None = None,
            request_overhead_s: float = 0.0,
            client_jitter: ClientJitter | None = None) -> RunRecord:
        """Simulate `reqs` to completion. `priorities[lane]`: lower runs first.

        `request_overhead_s` (closed loop): the time between a request's last token and the
        client's next request reaching the engine (HTTP, tokenisation, streaming, the client),
        so a client's cycle is its request's time in the engine plus the overhead, as the
        analytic closed loop has it. Arrivals are recorded at the engine: add the overhead to
        TTFT and E2E for what the client measures. `client_jitter` (closed loop): that delay
        is overhead + spread * e with e ~ Exp(1) pre-drawn per request from the jitter's seed
        (ClientJitter); requests then reach the engine in the order of their delays.
        """
        check_overhead(request_overhead_s)
        self._check_requests(reqs)
        prio = np.zeros(1, np.int64) if priorities is None else np.asarray(priorities)
        st = self._state_cls(self, reqs, prio[reqs.lane].tolist(), float(request_overhead_s),
                             client_jitter)
        st.simulate(progress)
        return st.record()

    @property
    def _state_cls(self) -> type[_State]:
        """The scheduler state that runs the simulation (a faster engine substitutes its own)."""
        return _State


def check_overhead(request_overhead_s: float) -> None:
    """A per-request overhead must be a finite number >= 0 (one-line error otherwise)."""
    if not (np.isfinite(request_overhead_s) and request_overhead_s >= 0):
        raise InputError(f"request_overhead_s {request_overhead_s}: must be >= 0")


@dataclass(slots=True)
class _Seq:
    """One request's scheduling state. Step indices: `step` counts every engine step (the
    clock's), `decode step` only the steps that decode (the same unless prefill_first)."""

    prompt_tokens: int
    output_tokens: int
    priority: int
    reserved_blocks: int
    target_tokens: int
    """Tokens to compute before the next token: the prompt, plus the generated tokens after a
    recompute."""
    computed_tokens: int = 0
    """KV tokens computed (for a decoder: as of decode step `decode_from`)."""
    generated_tokens: int = 0
    """Output tokens produced (for a decoder: as of decode step `decode_from`)."""
    decode_from: int = -1
    """Decoding: the decode step from which it gets one token per decode step; -1 otherwise."""
    epoch: int = 0
    """Bumped when it starts decoding or is preempted: stale heap entries carry an old one."""
    last_token_step: int = -1
    first_token_step: int = -1
    finished_step: int = -1
    admitted_step: int = -1
    arrival_step: int = -1
    """Closed loop: the step whose end sends it (-1: sent at t = 0)."""
    jitter_s: float = 0.0
    """Closed loop with client jitter: its delay from that step's end beyond the overhead."""
    queue_key: tuple[int, float, int] = (0, 0.0, 0)
    refs: tuple[int, ...] = ()
    """Prefix caching: indices of its blocks that are shared cache entries (its hits, and the
    full blocks it registered), released by ref count."""

    def restore(self, values: tuple) -> None:
        """Set every field from a `_seq_values(q)` tuple."""
        for f, v in zip(_SEQ_FIELDS, values, strict=True):
            setattr(self, f, v)


_SEQ_FIELDS = tuple(f.name for f in fields(_Seq))
_seq_values = attrgetter(*_SEQ_FIELDS)
"""All fields of a _Seq as a tuple (a snapshot for rollback)."""


class _State:
    """The mutable state of one run (the engine's instance is only configuration)."""

    def __init__(self, eng: ContinuousEngine, reqs: Requests, prio: list[int],
                 overhead_s: float = 0.0, jitter: ClientJitter | None = None) -> None:
        self.e = eng
        self.reqs = reqs
        self.n = len(reqs)
        self.prefill_first = eng.policy.prefill_first
        self.chunked = eng.policy.chunked_prefill
        self.can_preempt = eng.policy.preemption
        self.closed = reqs.concurrency is not None
        self.overhead_s = overhead_s if self.closed else 0.0
        self.jitter = jitter if self.closed and jitter is not None and jitter.active else None
        """Client jitter: each next request's delay is drawn (ClientJitter); sent requests
        wait in `pool` and reach the engine in the order of their arrival times, each taking
        the next request's index (its lengths) when it arrives."""
        self.timed = self.closed and (overhead_s > 0 or self.jitter is not None)
        """Closed loop whose next requests arrive `overhead_s` after a completion: the engine
        needs the clock to see them (without overhead they arrive at the next step)."""
        self.noise = (np.random.default_rng(self.jitter.seed).standard_exponential(self.n)
                      .tolist() if self.jitter is not None else [])
        self.pool: dict[int, list[float]] = {}
        """Client jitter: sending step -> sorted delays (beyond the overhead) of the requests
        sent at its end that have not reached the engine yet."""
        self.exact_ends: list[float] = []
        """timed: end time of every step of the finished windows"""
        self.window_ends: list[float] = []
        """timed: end times of the current window's steps (estimated while speculating)"""
        self.arr = reqs.arrival_at_s.tolist()
        self.arr_np = np.asarray(reqs.arrival_at_s, float)
        self.seqs = [_Seq(p, o, pr, eng.reserved_blocks(p, o), p) for p, o, pr in
                     zip(reqs.input_tokens.tolist(), reqs.output_tokens.tolist(), prio,
                         strict=True)]
        self.running: dict[int, int] = {}
        """sequence -> admission order"""
        self.prefilling: list[int] = []
        self.waiting: list[tuple] = []
        """heap of queue keys (priority, arrival, sequence)"""
        self.fin_heap: list[tuple[int, int, int]] = []
        """(decode step of the last token, sequence, epoch)"""
        self.blk_due: dict[int, list[tuple[int, int]]] = {}
        """decode step -> decoders whose token then needs a new KV block"""
        self.win_heap: list[tuple[int, int, int]] = []
        """(decode step from which the context fills the window, sequence, epoch)"""
        self.first_decodes: list[tuple[int, int, int]] = []
        """prefill_first: (sequence, epoch, step of its last token) before its first decode"""
        self.step = 0
        self.decode_step = 0
        self.last_decode_step = -1
        self.next_request = 0
        """Requests sent so far (in order)."""
        self.next_arrival = 0
        """Requests that reached the waiting queue so far (in order)."""
        self.free_blocks = eng.total_blocks
        self.pc = eng.policy.prefix_caching and reqs.has_prefix
        """Prefix caching applies: the engine has it and the requests share content."""
        self.keys: dict[int, list] = {}
        """sequence -> its blocks' keys (Requests.block_keys), computed on first use"""
        self.cached: dict = {}
        """Free blocks that keep a key: key -> when it was freed (a stamp; vLLM's free queue
        is in that order, least recently freed first)."""
        self.lru: list[tuple[int, Any]] = []
        """heap of (stamp, key) over `cached`, lazily cleaned (an entry is live while
        cached[key] is its stamp)"""
        self.stamp = 0
        self.ref: dict = {}
        """key -> requests holding the registered block with that key"""
        self.undo: list[tuple] = []
        """Changes to cached / ref / lru since the window's snapshot, to roll them back (copying
        a cache of tens of thousands of blocks every window cost 6x the run)."""
        self.hit_tokens = 0
        # Decoders, kept as sums at the current decode step: how many, their computed tokens,
        # their contexts capped at the window, and how many contexts are still below it.
        self.num_decoding = self.sum_computed = self.sum_ctx_window = self.num_below_window = 0
        self.admissions = self.preemptions = self.done = 0
        self.log: list[StepRecord] = []
        self.gaps: list[tuple[int, int]] = []
        """(step of a token, step of the next token) of gaps outside the per-step counts"""
        self.saved: dict[int, tuple] = {}
        self.starts: list[np.ndarray] = []
        self.durs: list[np.ndarray] = []
        self.ends: list[np.ndarray] = []
        self.chunks: dict[int, int] = {}
        self.budget = 0
        self.preempted_now = self.dec_done = self.prefill_blocked = False
        if self.closed:
            c = min(int(reqs.concurrency or 0), self.n)
            for s in range(c):
                self._enqueue(s, -1)
            self.next_request = self.next_arrival = c

    # -- bookkeeping ------------------------------------------------------------------------
    def _touch(self, s: int) -> None:
        if s not in self.saved:
            self.saved[s] = _seq_values(self.seqs[s])

    def _held(self, q: _Seq, computed: int) -> int:
        return max(q.reserved_blocks, _cdiv(computed, self.e.block_size))

    def _enqueue(self, s: int, arrival_step: int) -> None:
        q = self.seqs[s]
        q.arrival_step = arrival_step
        # closed loop: in sending order (with jitter, indices are in arrival order)
        order = s if self.jitter is not None else arrival_step if self.closed else self.arr[s]
        q.queue_key = (q.priority, order, s)
        heappush(self.waiting, q.queue_key)

    def _pool_next(self) -> tuple[float, int]:
        """Client jitter: the earliest arrival among the requests on their way, and its
        sending step (inf, -1: none)."""
        best, best_g = math.inf, -1
        for g, delays in self.pool.items():
            t = self._step_end(g) + delays[0]
            if t < best or (t == best and g < best_g):
                best, best_g = t, g
        return best + self.overhead_s, best_g

    def _arrive_jittered(self, t: float) -> None:
        while self.next_arrival < self.next_request:
            t_arr, g = self._pool_next()
            if t_arr > t:
                break
            delays = self.pool[g]
            j = delays.pop(0)
            if not delays:
                del self.pool[g]
            s = self.next_arrival
            self._touch(s)
            self.seqs[s].jitter_s = j
            self._enqueue(s, g)
            self.next_arrival += 1

    def _step_end(self, g: int) -> float:
        ends = self.exact_ends
        return ends[g] if g < len(ends) else self.window_ends[g - len(ends)]

    def _arrival_time(self, s: int) -> float:
        if self.jitter is not None and s >= self.next_arrival:  # the next one on its way
            return self._pool_next()[0]
        if self.closed:  # timed: sent when the step `arrival_step` ended (-1: at 0)
            q = self.seqs[s]
            g = q.arrival_step
            return (self._step_end(g) if g >= 0 else 0.0) + self.overhead_s + q.jitter_s
        return self.arr[s]

    def _arrive(self, t: float) -> None:
        if self.closed and not self.timed:
            return
        if self.jitter is not None:
            self._arrive_jittered(t)
            return
        nxt, sent = self.next_arrival, self.next_request if self.closed else self.n
        while nxt < sent and self._arrival_time(nxt) <= t:
            self._enqueue(nxt, self.seqs[nxt].arrival_step)
            nxt += 1
        self.next_arrival = nxt
        if not self.closed:
            self.next_request = nxt

    _SCALARS = ("step", "decode_step", "last_decode_step", "next_request", "next_arrival",
                "free_blocks",
                "num_decoding", "sum_computed", "sum_ctx_window", "num_below_window",
                "admissions", "preemptions", "done", "hit_tokens", "stamp")

    def _snapshot(self) -> tuple:
        self.saved = {}
        self.undo = []
        if len(self.lru) > 2 * len(self.cached) + 1024:  # drop stale heap entries
            self.lru = [(st, k) for k, st in self.cached.items()]
            heapify(self.lru)
        return (dict(self.running), self.prefilling[:], self.waiting[:], self.fin_heap[:],
                {k: v[:] for k, v in self.blk_due.items()}, self.win_heap[:],
                self.first_decodes[:], len(self.log), len(self.gaps),
                tuple(getattr(self, k) for k in self._SCALARS),
                {k: v[:] for k, v in self.pool.items()})

    def _restore(self, snap: tuple) -> None:
        for s, values in self.saved.items():
            self.seqs[s].restore(values)
        self.saved = {}
        (running, prefilling, waiting, fin_heap, blk_due, win_heap, first_decodes, nlog, ngaps,
         scalars, pool) = snap
        self.pool = {k: v[:] for k, v in pool.items()}
        for kind, key, old in reversed(self.undo):
            if kind == "h":  # an entry popped from the heap goes back
                heappush(self.lru, (old, key))
                continue
            d = self.cached if kind == "c" else self.ref
            if old is None:
                d.pop(key, None)
            else:
                d[key] = old
        self.undo = []
        self.running, self.prefilling, self.waiting = dict(running), prefilling[:], waiting[:]
        self.fin_heap, self.win_heap = fin_heap[:], win_heap[:]
        self.blk_due = {k: v[:] for k, v in blk_due.items()}
        self.first_decodes = first_decodes[:]
        del self.log[nlog:]
        del self.gaps[ngaps:]
        for k, v in zip(self._SCALARS, scalars, strict=True):
            setattr(self, k, v)

    # -- prefix caching (vLLM V1 KVCacheManager / BlockPool) ----------------------------------
    def _keys(self, s: int) -> list:
        k = self.keys.get(s)
        if k is None:
            k = self.keys[s] = self.reqs.block_keys(s, self.e.block_size)
        return k

    def _lookup(self, s: int, num_tokens: int) -> list:
        """Keys of the longest cached chain of full blocks, capped at num_tokens - 1 tokens
        (kv_cache_manager.get_computed_blocks: max_cache_hit_length = num_tokens - 1)."""
        keys, out = self._keys(s), []
        for k in keys[:(num_tokens - 1) // self.e.block_size]:
            if k not in self.ref and k not in self.cached:
                break
            out.append(k)
        return out

    def _hit(self, q: _Seq, hits: list) -> None:
        """Reuse the hit blocks (block_pool.touch: ref count up, out of the free queue)."""
        cached, ref, undo = self.cached, self.ref, self.undo
        for k in hits:
            if k in cached:
                undo.append(("c", k, cached.pop(k)))
                self.free_blocks -= 1
            undo.append(("r", k, ref.get(k)))
            ref[k] = ref.get(k, 0) + 1
        q.refs = tuple(range(len(hits)))
        q.computed_tokens = len(hits) * self.e.block_size
        self.hit_tokens += q.computed_tokens

    def _take(self, n: int) -> None:
        """Allocate n free blocks: keyless ones first, then evict cached ones LRU-first
        (block_pool.get_new_blocks -> _maybe_evict_cached_block)."""
        if self.pc:
            evict = n - (self.free_blocks - len(self.cached))
            cached, lru, undo = self.cached, self.lru, self.undo
            while evict > 0:
                st, k = heappop(lru)
                undo.append(("h", k, st))
                if cached.get(k) == st:
                    undo.append(("c", k, cached.pop(k)))
                    evict -= 1
        self.free_blocks -= n

    def _register(self, s: int, before: int, after: int) -> None:
        """Full blocks a scheduled chunk fills become cache entries when the chunk is scheduled,
        before the step runs (kv_cache_manager.allocate_slots -> cache_blocks), so a request
        admitted later in the same step already hits them; an existing entry with the same key
        keeps the block private."""
        bs, keys, q = self.e.block_size, self._keys(s), self.seqs[s]
        new = [j for j in range(before // bs, min(after // bs, len(keys)))
               if keys[j] not in self.ref and keys[j] not in self.cached]
        for j in new:
            self.undo.append(("r", keys[j], None))
            self.ref[keys[j]] = 1
        if new:
            q.refs = q.refs + tuple(new)

    def _release(self, s: int, computed: int) -> None:
        """Free s's blocks and its state's, tail first (single_type_kv_cache_manager.free): a
        shared entry frees its block when its last holder lets go; freed full blocks with a
        key stay cached in the free queue (decode-filled ones included: a next turn resends
        them)."""
        q = self.seqs[s]
        held = self._held(q, computed)
        self.free_blocks += self.e.state_blocks
        if not self.pc:
            self.free_blocks += held
            return
        keys, refs, ref, undo = self._keys(s), set(q.refs), self.ref, self.undo
        full = computed // self.e.block_size
        for j in range(held - 1, -1, -1):
            k = keys[j] if j < len(keys) else None
            if j in refs:
                undo.append(("r", k, ref[k]))
                ref[k] -= 1
                if ref[k]:
                    continue  # another request still holds the block
                del ref[k]
                self._cache(k)
            elif k is not None and j < full and k not in ref and k not in self.cached:
                self._cache(k)
            self.free_blocks += 1
        q.refs = ()

    def _cache(self, k: Any) -> None:
        """A freed block keeps its key at the back of the free queue."""
        self.undo.append(("c", k, None))
        self.cached[k] = self.stamp
        heappush(self.lru, (self.stamp, k))
        self.stamp += 1

    # -- preemption -------------------------------------------------------------------------
    def _victim(self) -> int:
        seqs, running = self.seqs, self.running
        assert self.can_preempt, ("out of KV blocks under a policy without preemption: the "
                                  "admission reservation must prevent this")
        return max(running, key=lambda s: (seqs[s].priority, running[s]))

    def _stop_decoding(self, q: _Seq) -> int:
        """Take decoder q out of the decode sums; returns its computed tokens now."""
        k = self.decode_step - q.decode_from
        nc = q.computed_tokens + k
        self.num_decoding -= 1
        self.sum_computed -= nc
        if self.e.has_window:
            self.sum_ctx_window -= min(nc + 1, self.e.window)
            self.num_below_window -= nc + 1 < self.e.window
        if k > 0:
            q.last_token_step = self.last_decode_step
        q.generated_tokens += k
        return nc

    def _preempt(self, v: int) -> None:
        """Recompute preemption: free v's blocks, back to the waiting queue (vLLM V1)."""
        q = self.seqs[v]
        self._touch(v)
        if q.decode_from >= 0:
            nc = self._stop_decoding(q)
            if self.dec_done:  # its block for this step is allocated and its token budgeted
                nc += 1
                self.budget += 1
        else:
            nc = q.computed_tokens + self.chunks.pop(v, 0)
            self.prefilling.remove(v)
        self._release(v, nc)
        q.computed_tokens, q.decode_from = 0, -1
        q.target_tokens = q.prompt_tokens + q.generated_tokens
        q.epoch += 1
        del self.running[v]
        heappush(self.waiting, q.queue_key)
        self.preemptions += 1
        self.preempted_now = True

    # -- one step ---------------------------------------------------------------------------
    def _decode_blocks(self) -> None:
        """Blocks for decoders whose token this decode step starts a new block."""
        d, seqs, bs = self.decode_step, self.seqs, self.e.block_size
        due = self.blk_due.pop(d, None)
        if not due:
            return
        need = [s for s, ep in due if seqs[s].epoch == ep and seqs[s].decode_from >= 0]
        if self.free_blocks < len(need):
            pending = set(need)
            while self.free_blocks < len(pending):
                v = self._victim()
                self._preempt(v)
                pending.discard(v)
            need = [s for s in need if s in pending]
        self._take(len(need))
        nxt = self.blk_due.setdefault(d + bs, [])
        for s in need:
            nxt.append((s, seqs[s].epoch))

    def _prefill_running(self) -> None:
        """Next chunks of running, partially prefilled sequences."""
        seqs = self.seqs
        for s in list(self.prefilling):
            if self.budget <= 0:
                break
            if s not in self.running:
                continue
            q = seqs[s]
            c = min(q.target_tokens - q.computed_tokens, self.budget)
            nb = self._held(q, q.computed_tokens + c) - self._held(q, q.computed_tokens)
            if nb > self.free_blocks and self.prefill_first:
                # A prefill-only step does not preempt: the chunk waits for blocks, and no new
                # prompt starts meanwhile (so at most one prompt is ever partly computed).
                self.prefill_blocked = True
                continue
            while self.free_blocks < nb:
                v = self._victim()
                self._preempt(v)
                if v == s:
                    break
            if s not in self.running:
                continue
            self._take(nb)
            if self.pc:
                self._touch(s)
                self._register(s, q.computed_tokens, q.computed_tokens + c)
            self.chunks[s] = c
            self.budget -= c

    def _admit_waiting(self) -> None:
        """Waiting requests in queue order while the budget, max_num_seqs and blocks allow."""
        e, seqs, wq = self.e, self.seqs, self.waiting
        while wq and self.budget > 0 and len(self.running) < e.max_num_seqs:
            s = wq[0][2]
            q = seqs[s]
            hits = self._lookup(s, q.target_tokens) if self.pc else []
            h = len(hits) * e.block_size
            c = min(q.target_tokens - h, self.budget)
            if c < q.target_tokens - h and not self.chunked:
                break  # the whole prompt must fit what is left of the budget
            # New blocks beyond the hits (and the state's), plus the hit blocks taken out of
            # the free queue.
            nb = self._held(q, h + c) - len(hits) + e.state_blocks
            reuse = sum(k in self.cached for k in hits)
            if nb + reuse > self.free_blocks:
                break
            heappop(wq)
            self._touch(s)
            if hits:
                self._hit(q, hits)
            self._take(nb)
            if self.pc:
                self._register(s, h, h + c)
            self.running[s] = self.admissions
            self.admissions += 1
            if q.admitted_step < 0:
                q.admitted_step = self.step
            self.prefilling.append(s)
            self.chunks[s] = c
            self.budget -= c

    def _schedule_prefill(self, budget: int) -> bool:
        self.budget = budget
        self.prefill_blocked = False
        self._prefill_running()
        if not self.preempted_now and not self.prefill_blocked:
            self._admit_waiting()
        return bool(self.chunks)

    def _first_decode_gaps(self) -> int:
        """prefill_first: gaps of decoders decoding for the first time since their last token
        (came in a prefill step); returns how many of them there are."""
        g, seqs, n = self.step, self.seqs, 0
        for s, ep, last in self.first_decodes:
            if seqs[s].epoch == ep and seqs[s].decode_from >= 0:
                self.gaps.append((last, g))
                n += 1
        self.first_decodes = []
        return n

    def _record(self, decode: bool) -> StepRecord:
        e, seqs = self.e, self.seqs
        ptok = pairs = pairs_w = pread = pread_w = ncomp = 0
        for s, c in self.chunks.items():
            q = seqs[s]
            p = q.computed_tokens
            pr, prw, rw = chunk_attention(c, p, e.window)
            ptok += c
            pairs += pr
            pairs_w += prw
            pread += p
            pread_w += rw
            ncomp += p + c == q.target_tokens
        nd = kv = kvw = tbt = 0
        tbt_from = -1
        if decode:
            nd = self.num_decoding
            kv = self.sum_computed + nd
            kvw = self.sum_ctx_window if e.has_window else kv
            tbt, tbt_from = nd, self.step - 1
            if self.prefill_first:
                tbt, tbt_from = nd - self._first_decode_gaps(), self.last_decode_step
        return StepRecord(nd, kv, kvw, ptok, pairs, pairs_w, pread, pread_w, len(self.chunks),
                          nd + ncomp, len(self.running), len(self.waiting),
                          e.total_blocks - self.free_blocks, tbt, tbt_from)

    def _finish(self, s: int, computed: int) -> None:
        q = self.seqs[s]
        q.finished_step = self.step
        del self.running[s]
        self._release(s, computed)
        self.done += 1
        if self.closed and self.next_request < self.n:
            nxt = self.next_request
            self.next_request += 1
            if self.jitter is not None:  # on its way with its own delay (the pool)
                spread = self.jitter.spread_s(q.output_tokens)
                j = spread * self.noise[nxt]
                insort(self.pool.setdefault(self.step, []), j)
            elif self.timed:  # on its way: _arrive enqueues it overhead_s after this step ends
                self._touch(nxt)
                self.seqs[nxt].arrival_step = self.step
            else:
                self._enqueue(nxt, self.step)
                self.next_arrival = self.next_request

    def _advance_prefills(self) -> list[int]:
        """After the step: prefill progress; completed prompts give a token. Returns the
        sequences that start decoding."""
        g, seqs, new_dec = self.step, self.seqs, []
        for s, c in self.chunks.items():
            q = seqs[s]
            self._touch(s)
            q.computed_tokens += c
            if q.computed_tokens < q.target_tokens:
                continue
            self.prefilling.remove(s)
            if q.generated_tokens == 0:
                q.first_token_step = g
            else:
                self.gaps.append((q.last_token_step, g))
            q.generated_tokens += 1
            q.last_token_step = g
            if q.generated_tokens >= q.output_tokens:
                self._finish(s, q.computed_tokens)
            else:
                new_dec.append(s)
        return new_dec

    def _advance_decoders(self) -> None:
        """After a decode step: finishes, then every decoder moves on one token."""
        e, d, seqs, fh = self.e, self.decode_step, self.seqs, self.fin_heap
        while fh and fh[0][0] <= d:
            _, s, ep = heappop(fh)
            q = seqs[s]
            if q.epoch != ep or q.decode_from < 0:
                continue
            self._touch(s)
            nc = self._stop_decoding(q) + 1  # this step computed its last token's input
            q.computed_tokens, q.generated_tokens = nc, q.output_tokens
            q.decode_from, q.last_token_step = -1, self.step
            self._finish(s, nc)
        self.sum_computed += self.num_decoding
        d1 = d + 1
        if e.has_window:
            self.sum_ctx_window += self.num_below_window
            wh = self.win_heap
            while wh and wh[0][0] <= d1:
                _, s, ep = heappop(wh)
                if seqs[s].epoch == ep and seqs[s].decode_from >= 0:
                    self.num_below_window -= 1
        self.decode_step = d1
        self.last_decode_step = self.step

    def _start_decoding(self, s: int) -> None:
        """s decodes from the next decode step on."""
        e, q, d1 = self.e, self.seqs[s], self.decode_step
        q.decode_from = d1
        q.epoch += 1
        ep, nc = q.epoch, q.computed_tokens
        self.num_decoding += 1
        self.sum_computed += nc
        if e.has_window:
            ctx = nc + 1
            self.sum_ctx_window += min(ctx, e.window)
            if ctx < e.window:
                self.num_below_window += 1
                heappush(self.win_heap, (d1 + e.window - ctx, s, ep))
        last = d1 + q.output_tokens - q.generated_tokens - 1
        heappush(self.fin_heap, (last, s, ep))
        # The first token whose KV starts a block beyond what it holds (its reservation, or
        # the blocks of its computed tokens): context nc -> nc + 1 with nc at a block edge.
        bs = e.block_size
        edge = max(nc + (-nc) % bs, q.reserved_blocks * bs)
        if d1 + edge - nc <= last:
            self.blk_due.setdefault(d1 + edge - nc, []).append((s, ep))
        if self.prefill_first:
            self.first_decodes.append((s, ep, self.step))

    def _exec(self) -> StepRecord:
        self.chunks = {}
        self.preempted_now = self.dec_done = False
        if self.prefill_first:
            decode = not self._schedule_prefill(self.e.max_num_batched_tokens)
            if decode:
                assert self.num_decoding, "a step with neither prefill nor decode work"
                self._decode_blocks()
        else:
            decode = True
            self._decode_blocks()
            self.dec_done = True
            self._schedule_prefill(self.e.max_num_batched_tokens - self.num_decoding)
        rec = self._record(decode)
        self.log.append(rec)
        new_dec = self._advance_prefills()
        if decode:
            self._advance_decoders()
        for s in new_dec:
            self._start_decoding(s)
        self.step += 1
        return rec

    # -- the clock --------------------------------------------------------------------------
    def _idle(self) -> bool:
        return not self.running and not self.waiting

    def _replay(self, snap: tuple, starts: np.ndarray, ends: np.ndarray, m: int, w0: int) -> int:
        """Roll back to the window start and run its first m + 1 steps on the exact clock."""
        self._restore(snap)
        if self.timed:
            self.window_ends = ends.tolist()
        for k in range(m + 1):
            if k:
                self._arrive(float(starts[k]))
                if self._idle():
                    break
            self._exec()
        return len(self.log) - w0

    def _seen_exact(self, first: int, starts: np.ndarray, ends: np.ndarray,
                    seen: list[int]) -> np.ndarray:
        """Requests that had arrived by each step start on the exact clock (`first` had by
        the window start)."""
        if not self.closed:
            return np.searchsorted(self.arr_np, starts, "right")
        all_ends = _EndsView(self.exact_ends, ends)
        if self.jitter is not None:
            return self._seen_jittered(first, starts, all_ends, seen)
        g = np.array([self.seqs[s].arrival_step for s in range(first, self.next_request)],
                     np.int64)
        arrivals = np.where(g >= 0, all_ends[np.maximum(g, 0)], 0.0) + self.overhead_s
        return first + np.searchsorted(arrivals, starts, "right")

    def _seen_jittered(self, first: int, starts: np.ndarray, all_ends: _EndsView,
                       seen: list[int]) -> np.ndarray:
        """`_seen_exact` with client jitter: the arrivals counted on the exact clock, and -1
        from the step where a request arrived whose exact time falls after one that arrived
        later on the estimated clock (the requests took the wrong indices: replay from it)."""
        seqs = self.seqs
        got = [(seqs[s].arrival_step, seqs[s].jitter_s) for s in range(first, self.next_arrival)]
        way = [(g, j) for g, js in self.pool.items() for j in js]
        gj = np.array(got + way, float).reshape(-1, 2)
        t = all_ends[gj[:, 0].astype(np.int64)] + gj[:, 1] + self.overhead_s
        counts = first + np.searchsorted(np.sort(t), starts, "right")
        k = len(got)
        if k:
            later_min = np.minimum.accumulate(np.append(t[1:], np.inf)[::-1])[::-1]
            bad = np.flatnonzero(t[:k] > later_min[:k])
            if bad.size:
                step = int(np.searchsorted(np.asarray(seen), first + bad[0], "right"))
                counts[min(step, len(counts) - 1):] = -1
        return counts

    def _clock(self) -> tuple[int, int, _Estimator]:
        """The windowed clock's first window, its cap and the step-time estimator. A closed
        loop without overhead needs no clock to schedule: long windows never roll back."""
        cap = 1024 if self.closed and not self.timed else WINDOW_MAX
        return min(64, cap), cap, _Estimator(self.e.step_model, self.e.max_num_batched_tokens)

    def _wait(self, t_s: float) -> float | None:
        """Admit what has arrived by t_s; when the engine is then idle, the time of the next
        arrival (the loop jumps there), else None."""
        self._arrive(t_s)
        if not self._idle():
            return None
        sent = self.next_request if self.closed else self.n
        assert self.next_arrival < sent, "the engine is idle with requests left"
        return max(t_s, self._arrival_time(self.next_arrival))

    def simulate(self, progress: Callable[[int], None] | None) -> None:
        t_s = 0.0
        window, cap, est = self._clock()
        while self.done < self.n:
            jump = self._wait(t_s)
            if jump is not None:
                t_s = jump
                continue
            w0, first = len(self.log), self.next_arrival
            snap = self._snapshot()
            est.refit(self.log[-1] if self.log else None)
            t, seen = t_s, []
            for k in range(window):  # speculate on the estimated clock
                if k:
                    self._arrive(t)
                    if self._idle():
                        break
                seen.append(self.next_arrival)
                t += est(self._exec())
                if self.timed:
                    self.window_ends.append(t)
                if self.done >= self.n:
                    break
            dur = step_times(self.e.step_model, step_array(self.log[w0:]))
            starts, dur, ends, window, _ = self._settle_window(snap, t_s, dur, first, seen, w0,
                                                                window, cap)
            t_s = self._commit_steps(starts, dur, ends, progress)

    def _settle_window(self, snap: tuple, t_s: float, dur: np.ndarray, first: int,
                       seen: list[int], w0: int, window: int, cap: int
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, bool]:
        """Exact times of a window scheduled on estimated ones: from the first step whose
        arrivals the estimate saw differently, roll back and replay with the exact clock.
        Returns (starts, durations, ends, the next window's length, whether it replayed)."""
        # one clock: a step starts exactly when the one before it ends
        ends = t_s + np.cumsum(dur)
        starts = np.concatenate(([t_s], ends[:-1]))
        bad = ([] if self.closed and not self.timed else
               np.flatnonzero(self._seen_exact(first, starts, ends, seen) != np.asarray(seen)))
        if not len(bad):
            return starts, dur, ends, min(cap, 2 * window), False
        m = int(bad[0])
        done_steps = self._replay(snap, starts, ends, m, w0)
        dur, starts, ends = (a[:done_steps].copy() for a in (dur, starts, ends))
        if done_steps == m + 1:
            dur[m] = step_times(self.e.step_model, step_array(self.log[-1:]))[0]
            ends[m] = starts[m] + dur[m]
        return starts, dur, ends, min(max(16, m + 8), cap), True

    def _commit_steps(self, starts: np.ndarray, dur: np.ndarray, ends: np.ndarray,
                      progress: Callable[[int], None] | None) -> float:
        """Keep exactly timed steps; returns the clock after the last."""
        self.saved = {}
        self.starts.append(starts)
        self.durs.append(dur)
        self.ends.append(ends)
        if self.timed:
            self.exact_ends.extend(ends.tolist())
            self.window_ends = []
        if progress is not None:
            progress(self.done)
        return float(ends[-1])

    # -- results ----------------------------------------------------------------------------
    def record(self) -> RunRecord:
        starts = np.concatenate(self.starts) if self.starts else np.zeros(0)
        dur = np.concatenate(self.durs) if self.durs else np.zeros(0)
        ends = np.concatenate(self.ends) if self.ends else np.zeros(0)
        log = step_array(self.log)
        steps = np.array([(q.admitted_step, q.first_token_step, q.finished_step, q.arrival_step)
                          for q in self.seqs], np.int64).reshape(-1, 4)
        jit = np.array([q.jitter_s for q in self.seqs], float)
        admitted, first, finished, arrs = steps.T
        if self.closed:  # sent when step `arrs` ended (-1: at 0), at the engine overhead later
            sent = np.where(arrs >= 0, ends[np.maximum(arrs, 0)] if len(ends) else 0.0, 0.0)
            arrival = np.where(arrs >= 0, sent + self.overhead_s + jit, 0.0)
        else:
            arrival = self.arr_np
        # A step's counted gap runs from the previous decode step: the step's own duration
        # when that is the step before (always, unless prefill_first).
        prev = log["tbt_from_step"]
        consecutive = prev == np.arange(len(log)) - 1
        step_gap = np.where(consecutive, dur, ends - ends[np.maximum(prev, 0)])
        gaps = np.array(self.gaps, np.int64).reshape(-1, 2)
        return RunRecord(
            arrival_at_s=arrival,
            admitted_at_s=starts[admitted],
            first_token_at_s=ends[first],
            finished_at_s=ends[finished],
            input_tokens=np.asarray(self.reqs.input_tokens),
            output_tokens=np.asarray(self.reqs.output_tokens),
            lane=np.asarray(self.reqs.lane),
            step_start_s=starts, step_dur_s=dur,
            step_tbt_count=log["tbt_count"], step_tbt_gap_s=step_gap,
            extra_gaps_s=ends[gaps[:, 1]] - ends[gaps[:, 0]],
            step_running=log["num_running"], step_waiting=log["num_waiting"],
            step_kv_blocks=log["kv_blocks_used"],
            num_gpu_blocks=self.e.total_blocks, preemptions=self.preemptions,
            scheduler="continuous", prefix_hit_tokens=self.hit_tokens,
        )


class _EndsView:
    """The step ends so far (a list) followed by a window's (an array), indexed by step number
    without joining them: a closed loop looks up the few steps its clients' last requests ended
    in, and a join copied every step of the run at each window (quadratic in the steps)."""

    __slots__ = ("done", "window")

    def __init__(self, done: list[float], window: np.ndarray) -> None:
        self.done, self.window = done, window

    def __getitem__(self, idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx, np.int64)
        n = len(self.done)
        old = idx < n
        out = np.empty(idx.shape, float)
        if old.any():
            out[old] = [self.done[i] for i in idx[old].tolist()]
        out[~old] = self.window[idx[~old] - n]
        return out


class _Estimator:
    """An estimate of step time that guides speculation (accuracy only affects speed).

    Around a pure-decode base step: linear in the decode aggregates, plus a table over the
    prefill tokens of the step (the prefill term is far from linear near the roofline ridge).
    """

    def __init__(self, step_model: Any, max_tokens: int) -> None:
        self.m = step_model
        self.base: tuple[float, float] | None = None
        self.grid = np.unique(np.concatenate([np.arange(0, 256, 8),
                                              np.geomspace(256, max(max_tokens, 257), 96)]))

    def refit(self, last: StepRecord | None) -> None:
        nd, kv, kvw = ((float(last.num_decode), float(last.decode_kv_tokens),
                        float(last.decode_kv_tokens_window)) if last else (1.0, 1.0, 1.0))
        if self.base is not None:
            bn, bk = self.base
            if abs(nd - bn) <= 0.03 * bn + 1 and abs(kv - bk) <= 0.2 * bk + 256:
                return
        nd, kv, kvw = max(nd, 1.0), max(kv, 1.0), max(kvw, 1.0)
        x = self.grid
        n = 6 + len(x)
        cols = {k: np.zeros(n) for k in STEP_INPUTS}
        cols["num_decode"][:] = cols["num_logits"][:] = nd
        cols["decode_kv_tokens"][:] = kv
        cols["decode_kv_tokens_window"][:] = kvw
        # rows: 0 base, 1 one more decoder, 2 +1000 KV tokens, 3 +3e4 pairs, 4 one more
        # prefill sequence, 5 one more logit, 6.. prefill tokens over the grid
        cols["num_decode"][1] += 1
        cols["num_logits"][1] += 1
        cols["decode_kv_tokens"][2] += 1000
        cols["decode_kv_tokens_window"][2] += 1000
        cols["prefill_pairs"][3] = cols["prefill_pairs_window"][3] = 3e4
        cols["num_prefill_seqs"][4] += 1
        cols["num_logits"][5] += 1
        cols["prefill_tokens"][6:] = x
        cols["prefill_pairs"][6:] = cols["prefill_pairs_window"][6:] = x * (x + 1) / 2
        cols["num_prefill_seqs"][6:] = x > 0
        cols["num_logits"][6:] += x > 0
        d = step_times(self.m, cols)
        self.base = (nd, kv)
        self.d0 = float(d[0])
        self.g_nd = float(d[1] - d[0])
        self.g_kv = float(d[2] - d[0]) / 1000
        self.g_pairs = float(d[3] - d[0]) / 3e4
        self.g_nps = float(d[4] - d[0])
        self.g_logits = float(d[5] - d[0])
        self.table = (d[6:] - d[0]).tolist()
        self.x = x.tolist()

    def __call__(self, rec: StepRecord) -> float:
        self.refit(rec)
        assert self.base is not None
        d = (self.d0 + (rec.num_decode - self.base[0]) * self.g_nd
             + (rec.decode_kv_tokens - self.base[1]) * self.g_kv)
        pt = rec.prefill_tokens
        if pt:
            x = self.x
            i = min(bisect_left(x, pt), len(x) - 1)
            lo = max(i - 1, 0)
            f = 0.0 if x[i] == x[lo] else (pt - x[lo]) / (x[i] - x[lo])
            d += self.table[lo] + f * (self.table[i] - self.table[lo])
            d += (rec.prefill_pairs - pt * (pt + 1) / 2) * self.g_pairs
            d += (rec.num_prefill_seqs - 1) * self.g_nps
            d += (rec.num_logits - rec.num_decode - 1) * self.g_logits
        return d
