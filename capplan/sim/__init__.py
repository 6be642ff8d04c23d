"""Discrete-event simulator: workloads, continuous / static / dynamic batching, metrics.

    >>> result = simulate(dep.step, num_gpu_blocks=dep.memory.num_gpu_blocks, block_size=16,
    ...                   max_num_seqs=256, max_num_batched_tokens=8192, workload=wl, seed=0)
    >>> result.to_dict()["ttft_s"]["p99"]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import cache
from typing import Any

import numpy as np

from capplan.errors import InputError
from capplan.models.engine import ClientJitter, SchedulerPolicy
from capplan.models.layers import DENSE_LAYOUT, BlockLayout
from capplan.sim.batching import BatchEngine
from capplan.sim.engine import (
    ENGINE_IMPLS,
    INSTALL_HINT,
    LEGACY_IMPLS,
    VLLM_POLICY,
    ContinuousEngine,
)
from capplan.sim.entities import RunRecord
from capplan.sim.metrics import SimResult, summarize
from capplan.sim.workload import Lane, LengthDist, Requests, Workload, load_trace, parse_length

SCHEDULERS = ("continuous", "static", "dynamic")

__all__ = ["ENGINE_IMPLS", "SCHEDULERS", "BatchEngine", "ContinuousEngine", "Lane",
           "LengthDist", "Requests", "RunRecord", "SimResult", "Workload", "engine_impl",
           "run_features",
           "load_trace", "parse_length", "run_scheduler", "simulate"]


def engine_impl(scheduler: str, sim_engine: str = "auto", num_requests: int | None = None,
                **features: Any) -> str:
    """How a simulation runs: continuous batching's one scheduler loop (capplan.sim.compiled)
    "compiled" (numba) when asked for, or `auto` with numba installed, else "python" (the same
    loop interpreted); "reference" for static and dynamic batching, which have one engine each.
    `--sim-engine compiled` without numba is an InputError naming the package to install; the
    earlier engines' names (fast, reference) run the loop as plain Python. `num_requests` and
    `features` (`run_features`) no longer change the choice: every feature runs in the loop."""
    del num_requests, features
    if sim_engine not in ENGINE_IMPLS and sim_engine not in LEGACY_IMPLS:
        raise InputError(f"--sim-engine {sim_engine!r}: expected one of {', '.join(ENGINE_IMPLS)}")
    if scheduler != "continuous":
        return "reference"
    sim_engine = LEGACY_IMPLS.get(sim_engine, sim_engine)
    if sim_engine == "compiled" and not compiled_available():
        raise InputError(INSTALL_HINT)
    return "compiled" if sim_engine != "python" and compiled_available() else "python"


@cache
def compiled_available() -> bool:
    """Whether numba imports (the loop can run compiled); checked once, on first use."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def run_features(policy: SchedulerPolicy, reqs: Requests) -> dict[str, Any]:
    """The features a run uses and its size (`prefix_caching`: lookups of shared content, only
    when the policy has it on and the requests share content; a preempted request's own cached
    blocks are re-found whenever the policy has prefix caching on, `preempt_cached`)."""
    return {"prefix_caching": bool(policy.prefix_caching and getattr(reqs, "has_prefix", False)),
            "closed_loop": getattr(reqs, "concurrency", None) is not None,
            "num_requests": len(reqs)}


def run_scheduler(step_model: Any, reqs: Requests, lanes: tuple[Lane, ...], *, scheduler: str,
                  num_gpu_blocks: int, block_size: int, max_num_seqs: int,
                  max_num_batched_tokens: int, policy: SchedulerPolicy = VLLM_POLICY,
                  enable_chunked_prefill: bool | None = None, batch_size: int | None = None,
                  batch_timeout_s: float = 0.0, request_overhead_s: float = 0.0,
                  client_jitter: ClientJitter | None = None,
                  progress: Callable[[int], None] | None = None,
                  sim_engine: str = "auto", state_blocks: int = 0, adapter_seed: int = 0,
                  layout: BlockLayout = DENSE_LAYOUT,
                  measure: Callable[[RunRecord, tuple[Lane, ...]], Any] = summarize) -> SimResult:
    """Simulate concrete requests under one scheduler and summarise the run.

    `policy` is the engine profile's scheduler policy (continuous batching only; default
    vLLM V1's: mixed chunked prefill, KV allocated as computed, recompute preemption);
    `enable_chunked_prefill`, when given, overrides the policy's `chunked_prefill` (a user's
    `--no-enable-chunked-prefill`). `request_overhead_s` (closed loop, continuous): each
    client's next request reaches the engine a delay of that mean after its last one ended
    (its own exponential delay: models.engine.closed_loop_delay; `ContinuousEngine.run`);
    latencies stay engine-side, so add it to TTFT and E2E. `client_jitter` (closed loop,
    continuous): noise that replaces the overhead's own variation (ClientJitter).
    `sim_engine` (auto, compiled, python) runs the loop compiled or interpreted
    (`engine_impl`); both give the same results. `state_blocks`: blocks each running
    sequence's recurrent state holds (hybrid models, `MemoryReport.state_blocks_per_seq`;
    continuous batching). `layout`: how a sequence's tokens fill the pool, sliding-window layers
    capped at their window's blocks (`MemoryReport.block_layout`; every scheduler).
    `adapter_seed`: a LoRA step model's engine draws the requests'
    adapters with it when they carry none (continuous batching; capplan.sim.compiled.adapters_of).
    `measure(record, lanes)` summarises the run (default `summarize`; a benchmark protocol's
    drops its warm-ups, capplan.sim.protocol.measure).
    """
    if enable_chunked_prefill is not None:
        policy = replace(policy, chunked_prefill=enable_chunked_prefill)
    prio = np.array([ln.priority for ln in lanes] or [0], np.int64)
    if scheduler == "continuous":
        eng = ContinuousEngine(step_model, num_gpu_blocks, block_size, max_num_seqs,
                               max_num_batched_tokens, policy, state_blocks=state_blocks,
                               layout=layout)
        # a stand-in step model (tests) runs the plain loop: only StepModel's formula compiles
        eng.jit = engine_impl(scheduler, sim_engine) == "compiled"
        eng.keep_steps = False  # the steps' aggregate only: memory that does not grow
        eng.adapter_seed = adapter_seed
        return measure(eng.run(reqs, prio, progress, request_overhead_s, client_jitter), lanes)
    if scheduler in ("static", "dynamic"):
        batch = BatchEngine(step_model, num_gpu_blocks, block_size,
                            batch_size or max_num_seqs, scheduler, batch_timeout_s, layout)
        return measure(batch.run(reqs, prio, progress), lanes)
    raise InputError(f"--scheduler {scheduler!r}: expected one of {', '.join(SCHEDULERS)}")


def simulate(step_model: Any, *, workload: Workload, seed: int = 0, **kw: Any) -> SimResult:
    """Draw the workload with `np.random.default_rng(seed)` and run `run_scheduler` (which
    takes the keyword arguments, `policy=` among them); a LoRA engine draws the adapters with
    the same seed."""
    reqs = workload.generate(np.random.default_rng(seed))
    kw.setdefault("adapter_seed", seed)
    return run_scheduler(step_model, reqs, workload.lanes, **kw)
