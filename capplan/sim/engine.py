"""Continuous batching, iteration-level scheduling, under an engine's scheduler policy.

The default policy is vLLM V1's (`vllm/v1/core/sched/scheduler.py`, v0.10-v0.11): each step,
every running sequence whose prompt is computed decodes one token; the rest of the token budget
(`max_num_batched_tokens` minus decode tokens) goes to prefill chunks of running, partially
prefilled sequences, then to waiting ones (ordered by priority, then arrival) while
`max_num_seqs` and free KV blocks allow. Blocks (`ceil(tokens / block_size)`) are allocated as
tokens are computed. A running sequence that needs a block when none is free preempts
(recompute) the lowest-priority, most recently admitted sequence: its blocks are freed, it goes
back to the waiting queue, and its prompt plus the tokens it generated are computed again, less
what the prefix cache still holds of them (below). A step with a preemption admits no waiting
request.

Hybrid models (Mamba, gated DeltaNet, short conv layers): `state_blocks` pool blocks hold a
running sequence's recurrent state from admission until it finishes or is preempted, besides
its token blocks; admission needs them free and a preemption frees them (vLLM V1's hybrid KV
cache manager allocates them from the same block pool, `MambaManager` in
`vllm/v1/core/single_type_kv_cache_manager.py`, v0.10-v0.11; the count is
`capplan.models.layers.state_blocks_per_seq`).

Sliding-window models (`layout`, a `capplan.models.layers.BlockLayout`): the pool counts blocks
of `block_size` tokens in gcd(full, window) attention layers, `layout.units` per block of
`num_gpu_blocks`, and a sequence of k token blocks holds `layout.blocks(k)` = full * k +
window * min(k, window_cap): its window layers stop growing at the window behind a prefill
chunk (vLLM V1 `SlidingWindowManager` allocates ceil(L / block_size) blocks and frees those
that fall out of the window; `SlidingWindowSpec.max_memory_usage_bytes`, the cap `memory`
sizes with, bounds what is left). A prefix-cache entry is a token block's full-layer part
(`layout.entry` pool blocks); window-layer blocks are taken afresh on a hit. A layout of
window layers only caches a token block's window-layer blocks instead, a sequence's first
`layout.cached_cap` token blocks at most (vLLM reuses a longer cached prefix holding only its
last window; here the rest is recomputed).
A policy with `frees_out_of_window` off counts window layers as full ones
(`layout.kept_whole`).

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
- whole_prompts_after_first (SGLang `PrefillAdder.add_one_req`): after a step's first prompt
  (a continuing chunk counts), a waiting prompt is admitted only if its tokens past its
  prefix-cache hit are fewer than what the step leaves of the prompt budget
  (`max_prefill_tokens`, less the step's decodes and prompt tokens; capplan.sim.compiled
  `prompt_budget`), and the first refused ends the step's admissions; admitted prompts are
  chunked at the token budget as usual.
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
  A preempted sequence's full blocks stay cached too (`SchedulerPolicy.preempt_cached`):
  "computed" (vLLM V1: `KVCacheManager.free` keeps every full block's hash; the rescheduled
  request's `get_computed_blocks` finds them) keeps every block it computed, prompt and
  output; "prompt" (SGLang `ScheduleBatch.retract_decode` frees only what lies past the radix
  tree's prefix) its prompt's. They enter the free queue last block first, so eviction takes a
  sequence's tail first and what is left is always a leading run; when the sequence is admitted
  again its chain of hits goes on through that run (capped at target - 1 tokens), and only the
  rest is recomputed. This runs whenever the profile has prefix caching on, shared content or
  not (hits on a sequence's own blocks are not counted as prefix hits).
  Difference from vLLM: vLLM hashes every full block and pops its free queue strictly in order;
  here only shareable blocks and a preempted sequence's own carry a key, and blocks without one
  (a finished request's unique blocks) are reused before any cached block is evicted.

LoRA (a step model with `lora_max_loras` slots; vLLM V1 `Scheduler.schedule`, the waiting
loop): each request has an adapter (`Requests.adapter`, else drawn from the step model's
popularity groups with `adapter_seed`); the running requests' adapters are loaded, and a waiting
request whose adapter is not loaded while every slot is taken is skipped, staying waiting while
later requests are considered. A request without an adapter (-1) is never skipped. Each step is
priced with its running set's distinct adapters.

One implementation: `capplan.sim.compiled` holds these rules as one loop over
struct-of-arrays state (numba-compiled when numba is installed); `ContinuousEngine` checks the
configuration and runs that loop, compiled (`jit`, the default) or as plain Python from the same
source (`jit=False`; also any step model other than `StepModel`, e.g. the tests' stand-ins,
whose step time the plain loop asks for step by step).

References: Kwon et al., "Efficient Memory Management for Large Language Model Serving with
PagedAttention", SOSP 2023; Yu et al., "Orca", OSDI 2022; TensorRT-LLM
`cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp` (GuaranteedNoEvictScheduler) and
docs "Tuning Max Batch Size and Max Num Tokens".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from capplan.errors import InputError
from capplan.models.engine import VLLM, ClientJitter, SchedulerPolicy, check_step_budget
from capplan.models.layers import DENSE_LAYOUT, BlockLayout
from capplan.sim.engine_options import (  # noqa: F401 (re-exported: the engine's options)
    ENGINE_IMPLS,
    INSTALL_HINT,
    LEGACY_IMPLS,
    NO_WINDOW,
    check_overhead,
)
from capplan.sim.entities import STEP_INPUTS, RunRecord
from capplan.sim.workload import Requests
from capplan.units import cdiv

VLLM_POLICY = replace(VLLM.scheduler, schedules_ahead=False)
"""The default: vLLM V1's scheduler policy, from its engine profile, with each step formed when
the last one ends (a bare engine; a deployment runs its profile's policy, which forms steps a
step ahead with the host overlap on: SchedulerPolicy.schedules_ahead)."""


def step_times(step_model: Any, steps: Mapping[str, Any] | np.ndarray) -> np.ndarray:
    """Exact step times (s) of many steps; `steps[name]` is a column of `STEP_INPUTS` (a
    structured array of StepRecords, or a dict of arrays)."""
    kw = {k: steps[k] for k in STEP_INPUTS}
    n = len(kw[STEP_INPUTS[0]])
    out = np.asarray(step_model.step(**kw, detail=False)["step_s"], float)
    return np.array(np.broadcast_to(out, (n,)), float)


class ContinuousEngine:
    """A continuous-batching engine over a step-time model; `run()` simulates a request set
    with the scheduler loop of `capplan.sim.compiled`."""

    jit = True
    """Run the loop compiled when numba is installed and the step model is a `StepModel`;
    False: the same loop as plain Python (debugging; `--sim-engine python`)."""
    keep_steps = True
    """Keep the per-step arrays (`RunRecord.step_*`; memory grows with the steps) besides their
    aggregate `RunRecord.steps`; the simulator's runs (`run_scheduler`) keep the aggregate only."""
    series_cap = 1 << 16
    """Step samples kept for the time series (even; tests lower it)."""
    adapter_seed = 0
    """Seed of the requests' LoRA adapters when they carry none (compiled.adapters_of; the
    simulator's runs take the workload's seed, `run_scheduler`)."""
    kv_present = False
    """A P/D decode worker (capplan.sim.pd): a prompt's KV arrived over the link, so its step
    computes its last token only, reading the rest as a cached prefix (sim/pd.KvPresentStep)."""

    def __init__(self, step_model: Any, num_gpu_blocks: int, block_size: int, max_num_seqs: int,
                 max_num_batched_tokens: int, policy: SchedulerPolicy = VLLM_POLICY,
                 state_blocks: int = 0, layout: BlockLayout = DENSE_LAYOUT) -> None:
        # A step's budget holds every running decoder's token (vLLM's SchedulerConfig refuses
        # less; TensorRT-LLM and SGLang's mixed chunks would leave decodes out of a step, which
        # the replay does not model). A prefill-first engine's budget bounds prefill steps only
        # (SGLang: chunked_prefill_size).
        check_step_budget(max_num_batched_tokens, max_num_seqs, policy)
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
        # the policy decides whether window layers shed their out-of-window blocks
        self.layout = layout if policy.frees_out_of_window else layout.kept_whole()
        """How a sequence's tokens fill the pool (models/layers.BlockLayout); the engine counts
        blocks in its unit (layout.sim_blocks of `num_gpu_blocks`)."""
        self.total_blocks = self.layout.sim_blocks(num_gpu_blocks)
        self.block_size = int(block_size)
        self.state_blocks = self.layout.sim_blocks(state_blocks)
        """Blocks a running sequence's recurrent state holds from admission until it finishes
        or is preempted (hybrid models: models/layers.state_blocks_per_seq)."""
        self.max_num_seqs = int(max_num_seqs)
        self.max_num_batched_tokens = int(max_num_batched_tokens)
        w = float(getattr(step_model, "window", NO_WINDOW))
        self.has_window = w < 1e15
        self.window = int(w) if self.has_window else NO_WINDOW

    def reserved_blocks(self, prompt_tokens: np.ndarray, output_tokens: np.ndarray
                        ) -> np.ndarray:
        """Blocks held from admission, per request: ceil((prompt + r * output) / block_size),
        0 when r = 0."""
        r = self.policy.reserve_output_frac
        p = np.asarray(prompt_tokens, np.int64)
        if r <= 0:
            return np.zeros_like(p)
        return np.ceil((p + r * np.asarray(output_tokens)) / self.block_size).astype(np.int64)

    def _check_requests(self, reqs: Requests) -> None:
        need = reqs.input_tokens + reqs.output_tokens
        i = int(np.argmax(need)) if len(reqs) else 0
        pool = self.total_blocks - self.state_blocks
        need_blocks = cdiv(int(need[i]), self.block_size) if len(reqs) else 0
        if len(reqs) and self.layout.blocks(need_blocks) > pool:
            # the limit the decision uses: the longest sequence whose blocks fit the pool
            cap = self.layout.token_blocks_within(pool, need_blocks) * self.block_size
            raise InputError(f"request {i} needs {int(need[i])} KV tokens but the cache holds "
                             f"{cap}: raise --gpu-memory-utilization or shorten requests")
        if len(reqs) and not self.policy.chunked_prefill:
            # Without chunking a prompt runs whole; a recompute after a preemption computes the
            # prompt and all but the last generated token again.
            longest = reqs.input_tokens + (reqs.output_tokens - 1) * self.policy.preemption
            i = int(np.argmax(longest))
            if int(longest[i]) > self.max_num_batched_tokens:
                over = int(np.count_nonzero(longest > self.max_num_batched_tokens))
                prompt = int(reqs.input_tokens[i])
                what = (f"a prefill of {prompt} tokens" if int(longest[i]) == prompt else
                        f"a prefill of up to {int(longest[i])} tokens (its {prompt}-token prompt "
                        f"and, recomputed after a preemption, all but the last of its "
                        f"{int(reqs.output_tokens[i])} output tokens)")
                raise InputError(f"request {i} needs {what} but "
                                 f"chunked prefill is off and --max-num-batched-tokens is "
                                 f"{self.max_num_batched_tokens} ({over} of {len(reqs)} "
                                 "requests exceed it): raise it, shorten prompts, or run the "
                                 "engine with chunked prefill (its +chunked-prefill option)")

    def run(self, reqs: Requests, priorities: np.ndarray | None = None,
            progress: Callable[[int], None] | None = None,
            request_overhead_s: float = 0.0,
            client_jitter: ClientJitter | None = None) -> RunRecord:
        """Simulate `reqs` to completion. `priorities[lane]`: lower runs first.

        `request_overhead_s` (closed loop): the time between a request's last token and the
        client's next request reaching the engine (HTTP, tokenisation, streaming, the client),
        so a client's cycle is its request's time in the engine plus the overhead, as the
        analytic closed loop has it. Arrivals are recorded at the engine: add the overhead to
        TTFT and E2E for what the client measures. The delay varies per request
        (`models.engine.closed_loop_delay`): overhead x e with e ~ Exp(1), or with an active
        `client_jitter` overhead + spread x e, e pre-drawn per request from the jitter's seed;
        requests then reach the engine in the order of their delays.
        """
        from capplan.sim import compiled  # the scheduler loop (imports numba when installed)

        return compiled.loop_module(self).run_engine(self, reqs, priorities, progress,
                                                     request_overhead_s, client_jitter)


class CompiledEngine(ContinuousEngine):
    """`ContinuousEngine` that insists on the compiled loop (numba) and keeps only the steps'
    aggregate by default."""

    impl = "compiled"
    keep_steps = False

    def _arrays(self, reqs: Requests, prio: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The loop's per-request state and configuration (capplan.sim.compiled.build_arrays)."""
        from capplan.sim import compiled

        return compiled.build_arrays(self, reqs, prio)

    def run(self, reqs: Requests, priorities: np.ndarray | None = None,
            progress: Callable[[int], None] | None = None,
            request_overhead_s: float = 0.0,
            client_jitter: ClientJitter | None = None) -> RunRecord:
        from capplan.sim import compiled

        if compiled.numba is None:
            raise InputError(INSTALL_HINT)
        return super().run(reqs, priorities, progress, request_overhead_s, client_jitter)
