"""Engine settings, and the versioned profiles of the engines capplan plans for.

Every difference between vLLM, SGLang and TensorRT-LLM lives here, in one `EngineProfile` each:
what the memory fraction covers (`MemoryAccounting`), how a step is formed and requests are
admitted (`SchedulerPolicy`), the per-GPU defaults, the per-request cost outside engine steps,
and the launch flags. The memory model, step model, queueing model, simulator and planner read
the profile; none of them branches on an engine's name. Sources of every default:
docs/engines.md (and docs/research/engines.md for the quotes).

Settings are plain frozen data: the models read them, they never do I/O.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, Protocol

import numpy as np
from numpy.typing import ArrayLike

from capplan.errors import InputError, nearest
from capplan.models.speculative import METHODS
from capplan.units import GIB_BYTES, ci, gib_to_bytes


class GpuLike(Protocol):
    """What engine defaults read of a GPU (capplan.catalog.schema.GpuSpec has it)."""

    name: str

    @property
    def total_memory_bytes(self) -> float: ...

    def supports(self, dtype: str) -> bool: ...


VENDOR_NAMES = {"nvidia": "NVIDIA", "amd": "AMD"}
SPEC_METHODS = METHODS
"""Every speculative decoding method capplan models."""
WEIGHT_DTYPES = ("auto", "fp32", "bf16", "fp16", "fp8", "int8", "int4", "fp4")
KV_DTYPES = ("auto", "bf16", "fp16", "fp8")


@dataclass(frozen=True)
class ClientJitter:
    """Timing noise of a closed-loop benchmark's clients (docs/queueing.md, "Jitter").

    The delay between a request's last token at the engine and its client's next request
    reaching the engine is the per-request overhead o plus noise of standard deviation
    `spread_s(osl) = sqrt(request_s^2 + osl * per_token_s^2)`: a per-request part (HTTP,
    tokenisation, the client's event loop) and a per-streamed-token part whose independent
    per-token costs add up over the finished request's `osl` streamed tokens (variance grows
    with osl, the spread with sqrt(osl)). The delay is o + spread * e with e ~ Exp(1) (a
    non-negative waiting time whose standard deviation is `spread`), pre-drawn per request from
    `seed`; what the client measures stays engine time + o. An active jitter replaces the
    overhead's own variation (o then fixed, the noise the jitter's), however small its spread;
    all zero: the overhead's own variation, an exponential law of mean o (`closed_loop_delay`),
    or none at all with `fixed_overhead` (every delay exactly o: the synchronised loop)."""

    request_s: float = 0.0
    per_token_s: float = 0.0
    seed: int = 7
    fixed_overhead: bool = False

    def __post_init__(self) -> None:
        for name in ("request_s", "per_token_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise InputError(f"client jitter {name} {v}: must be a finite number >= 0")

    @property
    def active(self) -> bool:
        return self.request_s > 0 or self.per_token_s > 0

    def spread_s(self, osl: float) -> float:
        return math.sqrt(self.request_s ** 2 + max(float(osl), 0.0) * self.per_token_s ** 2)


NO_JITTER = ClientJitter()


def closed_loop_delay(overhead_s: float, jitter: ClientJitter | None, osl: float
                      ) -> tuple[float, float]:
    """(fixed, spread) of the delay between a request's last token at the engine and its
    client's next request reaching the engine in a closed loop: fixed + spread * e, e ~ Exp(1)
    pre-drawn per request (docs/queueing.md, "Jitter"). With an active ClientJitter: the
    per-request overhead o plus its noise (o, `spread_s(osl)`); with `fixed_overhead`: o
    exactly (o, 0). Otherwise the overhead's own variation from request to request, an
    exponential law of mean o (0, o): the law of a positive delay of which only the mean is
    known (the maximum-entropy law; the rows the overhead is fitted on give means). A fixed o
    keeps equal clients in step: those that finish within o of each other arrive together and
    queue behind each other's prefill steps every round, as in the start-up wave
    (docs/queueing.md, "Jitter"). What the client measures stays engine time + o."""
    o = max(float(overhead_s), 0.0)
    if jitter is not None and jitter.active:
        return o, jitter.spread_s(osl)
    if jitter is not None and jitter.fixed_overhead:
        return o, 0.0
    return 0.0, o


@dataclass(frozen=True)
class SchedulerPolicy:
    """How an engine forms a step and admits requests: what the simulator and the analytic
    queueing model read (each engine profile holds one; sources in docs/engines.md)."""

    prefill_first: bool = False
    """False (vLLM V1): every step decodes each running sequence, then fills the rest of the
    token budget with prefill chunks. True (SGLang without --enable-mixed-chunk): a step that has
    waiting prefill work runs prefill only, and running sequences skip that step."""
    chunked_prefill: bool = True
    """False: a prompt is prefilled whole in one step and must fit the token budget
    (TensorRT-LLM's default, enable_chunked_prefill=False)."""
    reserve_output_frac: float = 0.0
    """KV reserved at admission for the output, as a fraction of the request's output length:
    0 allocates as tokens are computed (vLLM); 1 reserves prompt + output up front
    (TensorRT-LLM's GUARANTEED_NO_EVICT); SGLang reserves a decaying new_token_ratio."""
    preemption: bool = True
    """Whether a running sequence can be preempted when KV runs out (recompute)."""
    prefix_caching: bool = True
    """Automatic prefix caching on by default: vLLM V1 (`enable_prefix_caching` defaults to
    True since 0.8, vllm/config/cache.py), SGLang (RadixAttention unless
    --disable-radix-cache), TensorRT-LLM (KvCacheConfig.enable_block_reuse True). The
    simulator and the queueing model apply a workload's prefix sharing only when it is on."""
    preempt_cached: str = "computed"
    """With prefix caching on, which of a preempted sequence's full KV blocks stay cached (free,
    evictable least recently freed first, its last block first) for its recompute to find:
    "computed", every block it computed, prompt and output (vLLM V1: `KVCacheManager.free`
    keeps each full block's hash, and the rescheduled request's `get_computed_blocks` finds
    them, vllm/v1/core/kv_cache_manager.py, single_type_kv_cache_manager.py); "prompt", its
    prompt's (SGLang `ScheduleBatch.retract_decode` frees only the KV past the radix tree's
    `prefix_indices`, the prompt inserted after prefill); "none"."""
    frees_out_of_window: bool = True
    """A sequence's sliding-window layers give back the blocks that fall out of the window as it
    grows, so the replay holds at most layers.window_blocks_cap blocks of them (vLLM V1
    `SlidingWindowManager.remove_skipped_blocks`; SGLang `ScheduleBatch` evicts SWA-pool slots
    behind the window, advancing a request's `swa_evicted_seqlen`; TensorRT-LLM
    `WindowBlockManager::adjustBlocksIfNeeded` calls `detachFrontBlock` once a sequence spans
    window + tokens_per_block, batch_manager/kvCacheManager.cpp). False: window layers hold the
    whole sequence, as full ones (layers.BlockLayout.kept_whole)."""
    schedules_ahead: bool = False
    """The batch of step k is formed while step k - 1 runs, so it admits only the requests
    that reached the engine before step k - 1 began: an arrival during a step waits for the
    step after the next (one step more than a synchronous loop). vLLM's engine core with async
    scheduling (vllm/v1/engine/core.py `step_with_batch_queue`, a batch queue of 2: it
    schedules the next batch, then blocks on the one in flight), SGLang's overlap loop
    (managers/scheduler.py `event_loop_overlap`: receive, schedule and launch batch k, then
    wait for batch k - 1's result) and TensorRT-LLM's overlap scheduler
    (`_executor_loop_overlap`) all work this way; an idle engine schedules an arrival at once.
    Set from the profile's `host_overlap` (EngineProfile)."""
    whole_prompts_after_first: bool = False
    """After a step's first prompt (a continuing chunk counts as first), a further waiting
    prompt is admitted only if its tokens past its prefix-cache hit are fewer than what the step
    leaves of the prompt budget (`max_prefill_tokens` less the decodes riding in the step and
    the prompt tokens already scheduled); the first one it refuses ends the step's admissions.
    The first prompt, and a further one that is admitted, is chunked at the step's token budget
    as usual. SGLang: `PrefillAdder.add_one_req` refuses with `input_tokens >=
    rem_input_tokens and len(can_run_list) != 0` (`AddReqResult.OTHER`, which ends the
    scheduler's loop), rem_input_tokens = max_prefill_tokens - running_bs with
    --enable-mixed-chunk (`PrefillAdder.__init__`, `mixed_with_decode_tokens`) and the chunk
    cap chunked_prefill_size - running_bs (python/sglang/srt/managers/schedule_policy.py,
    scheduler.py `get_new_batch_prefill`, 0.5.8). False (vLLM V1, TensorRT-LLM): the budget's
    leftover takes a chunk of the next prompt."""
    max_prefill_tokens: int = 0
    """The prompt budget of `whole_prompts_after_first`, per attention-DP rank (the replica's
    is this times the ranks, capplan.sim.compiled.prompt_budget): SGLang's
    --max-prefill-tokens default 16384 (python/sglang/srt/server_args.py 0.5.8); 0: the step's
    token budget."""

    def held_tokens(self, isl: ArrayLike, osl: ArrayLike) -> Any:
        """Mean KV tokens a running sequence holds: running sequences are spread evenly over
        their lives (prompt plus half the output); an engine reserving a fraction r of the
        output at admission holds at least prompt + r output from the start, so
        isl + osl (1 + r) / 2 (TensorRT-LLM's GUARANTEED_NO_EVICT, r = 1: isl + osl)."""
        r = min(max(self.reserve_output_frac, 0.0), 1.0)
        return isl + osl * (1 + r) / 2

    def launched_budget(self, budget: int, max_model_len: int) -> int:
        """The token budget the engine runs with: a whole-prompt engine's holds the longest
        prompt it accepts (TensorRT-LLM rejects one over max_num_tokens when chunked prefill is
        off, tensorrt_llm/llmapi/llm.py `_check_arguments`; vLLM without chunked prefill
        requires max_num_batched_tokens >= max_model_len)."""
        return budget if self.chunked_prefill else max(budget, max_model_len)

    def decodes_beside_prompt(self, budget: ArrayLike, prompt: ArrayLike) -> Any:
        """How many running sequences a waiting whole prompt can join, or None when none
        limit it. An engine that prefills whole prompts in steps that also decode counts the
        running decodes against the token budget first and admits a prompt only into what is
        left (TensorRT-LLM MicroBatchScheduler: generation requests take one token each; a
        context request that would exceed max_num_tokens stops the step's scheduling), so a
        P-token prompt waits until at most budget - P sequences run. Chunking engines split
        the prompt instead; a prefill-first engine's prompt step holds no decodes."""
        if self.chunked_prefill or self.prefill_first:
            return None
        return np.maximum(np.asarray(budget, float) - np.asarray(prompt, float), 0.0)


@dataclass(frozen=True)
class KvBudget:
    """The KV cache an engine sizes, and the memory left outside what it accounts for."""

    budget_bytes: float
    """What the memory fraction covers (reported as the budget)."""
    kv_cache_bytes: float
    margin_bytes: float
    """Memory left on the GPU once everything the engine allocates is placed; < 0 means OOM."""


@dataclass(frozen=True)
class MemoryAccounting:
    """What an engine's memory fraction covers, as a formula of the per-GPU terms.

    `kind` names the rule; `kv_budget` applies it. The three rules (docs/engines.md):
    - "total" (vLLM `--gpu-memory-utilization`): the fraction of TOTAL memory that weights,
      the profiled activation peak, non-torch memory and the KV cache share; CUDA graphs are
      captured after sizing (<= 0.11) and live in the remaining margin.
    - "static" (SGLang `--mem-fraction-static`): the fraction of total memory for the static
      pools, weights plus the KV pool; activations and CUDA graphs must fit in the rest.
    - "free" (TensorRT-LLM `free_gpu_memory_fraction`): the fraction of memory still FREE after
      weights, activations and runtime buffers are in place that goes to the KV cache.
    The CUDA context and the communicators' buffers (`context`) are on the device before any
    of this: vLLM (>= 0.9) measures from a snapshot taken after them, SGLang's "total" is the
    free memory before the weights load (its fraction's base is total - context), and
    TensorRT-LLM's profiled peak includes them.
    """

    kind: str = "total"
    cudagraphs_in_budget: bool = False
    profile_requests: str = "max_num_seqs"
    """The requests of the profiling run whose logits the sampler holds at the activation peak:
    "max_num_seqs" (vLLM: min(max_num_seqs, token budget) dummy requests) or "prompt_chunks"
    (TensorRT-LLM: the token budget cut into prompts of at most max_seq_len - 1 tokens,
    `KvCacheCreator._create_dummy_context_requests`, 1.x: one request when a prompt holds it)."""

    def budget_label(self, frac: float) -> str:
        """What the budget row of a memory table holds, by the rule."""
        return {"total": f"budget at {frac:g} of total",
                "static": f"static pools at {frac:g} of the memory free at start (weights, KV)",
                "free": f"KV cache at {frac:g} of free memory"}[self.kind]

    def outside(self, part: str) -> bool:
        """Whether `part` ("activation", "cuda_graphs") is a part the fraction leaves out,
        beside those it covers (never under the free rule, whose figure is the KV cache
        alone and its label says so)."""
        if self.kind == "free":
            return False
        if part == "context":  # before vLLM's baseline snapshot; not in SGLang's base
            return True
        return not self.cudagraphs_in_budget if part == "cuda_graphs" else self.kind != "total"

    def kv_budget(self, total: float, frac: float, weights: float, activation: float,
                  overheads: tuple[float, float, float]) -> KvBudget:
        """Apply the rule. All arguments in bytes per GPU; `frac` is the engine's fraction;
        `overheads`: (non-torch memory, CUDA graphs, CUDA context and communicators)."""
        return _KV_RULES[self.kind](self, total, frac, weights, activation, *overheads)

    def fraction_for(self, total: float, kv: float, weights: float, activation: float,
                     overheads: tuple[float, float, float]) -> float:
        """The fraction under which the engine sizes a KV cache of `kv` bytes: `kv_budget`
        solved for `frac` (the same arguments, bytes per GPU; a denominator of at least one
        byte where it subtracts). A launch line's memory flag holds the KV cache the plan
        counted on, whichever rule its engine's flag follows (capplan.plan.flags
        .memory_fractions)."""
        non_torch, graphs, context = overheads
        if self.kind == "static":
            return (weights + non_torch + kv) / max(total - context, 1.0)
        if self.kind == "free":
            return kv / max(total - context - weights - activation - non_torch - graphs, 1.0)
        in_budget = graphs if self.cudagraphs_in_budget else 0.0
        return (weights + activation + non_torch + in_budget + kv) / total


def _kv_total(acc: MemoryAccounting, total: float, frac: float, weights: float, act: float,
              non_torch: float, graphs: float, context: float) -> KvBudget:
    # vLLM Worker.determine_available_memory: budget = total * util; KV = budget - profiled use
    # (the context predates the baseline snapshot: it lives in the margin).
    budget = total * frac
    in_budget = graphs if acc.cudagraphs_in_budget else 0.0
    kv = budget - weights - act - non_torch - in_budget
    return KvBudget(budget, kv, total - budget - (graphs - in_budget) - context)


def _kv_static(acc: MemoryAccounting, total: float, frac: float, weights: float, act: float,
               non_torch: float, graphs: float, context: float) -> KvBudget:
    # SGLang ModelRunner.profile_max_num_token (model_runner_kv_cache_mixin.py, 0.5.8): rest =
    # available after the weights - total * (1 - frac), total the free memory before they load.
    base = total - context
    budget = base * frac
    kv = budget - weights - non_torch
    return KvBudget(budget, kv, base - budget - act - graphs)


def _kv_free(acc: MemoryAccounting, total: float, frac: float, weights: float, act: float,
             non_torch: float, graphs: float, context: float) -> KvBudget:
    # TensorRT-LLM KvCacheCreator._cal_max_memory (1.x): (total - profiled peak) * fraction, the
    # peak holding everything on the device (context, weights, activations, runtime, graphs).
    free = total - context - weights - act - non_torch - graphs
    kv = frac * free
    return KvBudget(kv, kv, free - kv)


_KV_RULES: dict[str, Callable[..., KvBudget]] = {
    "total": _kv_total, "static": _kv_static, "free": _kv_free}


@dataclass(frozen=True)
class KvHandshake:
    """The KV handshake a disaggregated worker listens on: its default port, the roles that
    listen, and whether a worker takes one port per rank (tp x pp x dp). vLLM's NixlConnector
    listens on VLLM_NIXL_SIDE_CHANNEL_PORT (default 5600) offset by its ranks (by DP rank x TP
    or by TP rank, as releases differ: vllm/distributed/kv_transfer/kv_connector/v1/
    nixl_connector.py), advertised at VLLM_NIXL_SIDE_CHANNEL_HOST (default localhost), so
    workers on one host need ports apart and workers on several hosts their host's address;
    SGLang's prefill server runs a bootstrap server on --disaggregation-bootstrap-port (default
    8998; server_args.py), which the router names after each prefill URL."""

    port: int
    roles: tuple[str, ...]
    per_rank: bool


@dataclass(frozen=True)
class PdServing:
    """How the engine serves a disaggregated (prefill / decode) layout: the front end in front
    of its pools, when that front end places a request on a decode worker, and what the
    workers' KV handshake needs (each profile's sources["pd"])."""

    front_end: str
    """The router or proxy in front of the pools, by the builder that launches it
    (capplan.plan.launch_multinode.FRONT_END_LINES): "vllm-router"
    (vllm-project/router `--vllm-pd-disaggregation`), "sglang-router"
    (`python -m sglang_router.launch_router --pd-disaggregation`), "trtllm-disaggregated"
    (`trtllm-serve disaggregated -c disagg_config.yaml`)."""
    decode_routed_at: str = "prefill_done"
    """When the request's decode worker is picked (capplan.sim.pd.DECODE_ROUTED_AT):
    "arrival" (with its prefill worker: Dynamo's PrefillRouter for SGLang, whose prefill runs
    as a background task) or "prefill_done" (as the prefill returns: vLLM, TensorRT-LLM); the
    P/D replay places it so (capplan.plan.pd_sim.spec_of)."""
    router_takes_bootstrap_port: bool = False
    """The front end names each prefill worker's KV bootstrap port after its URL (SGLang's
    router: `--prefill URL PORT`; the Kubernetes export reads the port off the worker's line)."""
    kv_host_env: str | None = None
    """The environment variable a P/D worker advertises its KV handshake's address in, which
    the Kubernetes export sets to the pod's own address (vLLM's NixlConnector:
    VLLM_NIXL_SIDE_CHANNEL_HOST, default localhost); None: the engine has none."""
    kv_handshake: KvHandshake | None = None
    """The KV handshake its workers listen on (None: none the launch lines set)."""
    role_names: tuple[str, str] = ("prefill", "decode")
    """The engine's own names of the prefill and decode roles, as a fixed layout's launch lines
    title its workers (TensorRT-LLM: context and generation servers)."""
    router_policies: dict[str, str] = field(
        default_factory=lambda: {"round-robin": "round_robin", "random": "random"})
    """The front end's name for each of the replay's routers it has (capplan.sim.pd.ROUTERS):
    sglang_router `--prefill-policy/--decode-policy` random|round_robin|cache_aware|
    power_of_two (its default cache_aware); vLLM's router (vllm-project/router, a fork of
    SGLang's: `--policy`, `--prefill-policy/--decode-policy` random|round_robin|cache_aware|
    power_of_two|consistent_hash, its default cache_aware); TensorRT-LLM's disaggregated server
    `router.type` round_robin (default)|load_balancing (fewest requests in flight)|
    kv_cache_aware (tensorrt_llm/serve/router.py create_router)."""
    front_key: str = "router"
    """The key of a P/D plan's front-end line (`{engine}_{front_key}`): vLLM's "proxy", the
    others' "router" (SGLang's sglang_router, TensorRT-LLM's disaggregated server, which its
    docs call the router)."""
    front_end_exported: bool = True
    """Whether the Kubernetes export runs the front end in front of addressed P/D pools
    (capplan.export.k8s), on launch.pd_front_port as the plan's router line: SGLang's router,
    which the engine's image carries (sgl-project/sglang docker/Dockerfile builds and installs
    sgl-router), TensorRT-LLM's disaggregated server (`trtllm-serve disaggregated`, a command
    of the trtllm-serve the image runs), its configuration file a ConfigMap, and vLLM's
    `vllm-router` from its own image (`router_image`)."""
    router_image: str | None = None
    """The container image of a front end that is not in its engine's image (None: the
    engine's): vllm-project/router publishes `vllm/vllm-router:v{VERSION}` on each release
    (.buildkite/scripts/publish-release-images.sh; its Dockerfile installs
    /usr/local/bin/vllm-router and sets only CMD, so the pod's command runs the plan's line);
    0.1.17 is the PyPI release the launch line installs. Change the tag to yours."""


@dataclass(frozen=True)
class EngineDefaults:
    """What an engine picks when the user leaves a setting out, for one GPU and TP."""

    max_num_seqs: int
    max_num_batched_tokens: int
    memory_fraction: float
    block_size: int


@dataclass(frozen=True)
class EngineProfile:
    """One serving engine at one version: memory accounting, scheduling, defaults, flags."""

    name: str
    """The engine's id in specs, JSON and launch-line keys: vllm, sglang, trtllm."""
    display_name: str
    """The engine as people write it, in every human-facing output (tables, launch-line titles,
    reports): vLLM, SGLang, TensorRT-LLM (`engine_display_name`)."""
    version: str
    memory: MemoryAccounting
    scheduler: SchedulerPolicy
    defaults_rule: Callable[[GpuLike, int], EngineDefaults]
    """(GPU, TP) -> the engine's defaults."""
    block_sizes: tuple[int, ...]
    """Block (page) sizes the engine accepts."""
    request_overhead_s: float
    """Per-request latency outside engine steps (HTTP, tokenisation, detokenisation, streaming,
    the benchmark client): the default's base when no calibration measured it
    (`capplan.models.perf.request_overhead` adds the MLA term; docs/validation.md)."""
    pd: PdServing
    """How the engine serves a disaggregated layout: its front end, when that places a
    request's decode worker, the KV handshake's needs (PdServing)."""
    default_port: int
    """The engine's default HTTP port (`vllm serve` 8000, vllm/entrypoints/openai/cli_args.py;
    SGLang 30000, server_args.py; `trtllm-serve` 8000, tensorrt_llm/commands/serve.py)."""
    multinode_launch: str
    """How one replica over several hosts is launched, by the builder that writes its commands
    (capplan.plan.launch.NODE_COMMANDS; sources["multinode"]): "node-rank" (the same command
    on every host with its rank and the first host's address: SGLang `--nnodes N --node-rank
    k --dist-init-addr`), "mpirun" (one MPI launch from any host, its environment passed to
    every rank: TensorRT-LLM's `mpirun ... trtllm-llmapi-launch trtllm-serve`), "dp-or-ray"
    (each host runs its data-parallel ranks, or TP / PP wider than a host on a Ray cluster:
    vLLM)."""
    replica_router: str
    """The router in front of an aggregated fleet of several replicas, by the builder that
    launches it (capplan.plan.placement.REPLICA_FRONT_LINES; sources["replica_router"]):
    "sglang-router" (`python -m sglang_router.launch_router --worker-urls ...`), "vllm-router"
    (`vllm-router --worker-urls ...`). TensorRT-LLM has no router of its own over aggregated
    servers (its `trtllm-serve disaggregated` front end needs context and generation servers),
    so its fleets take vLLM's, which forwards OpenAI requests to any such server."""
    mla_layer_request_overhead_s: float = 0.0
    """Added to `request_overhead_s` per layer of a model with multi-head latent attention
    (DeepSeek-V2/V3/R1, Kimi-K2): such models show a fixed TTFT 100-200 ms above their prefill
    at low load in every engine (docs/engines.md, "The per-request overhead")."""
    step_overhead_s: float = 0.0
    """Fixed cost of one engine step that no overlap hides (launch, sampling, the step's
    synchronisation), beside `layer_step_overhead_s`; every shipped profile sets its own
    (docs/engines.md, "Host costs per step and per running sequence"); a calibration that
    measured it replaces both."""
    layer_step_overhead_s: float = 0.0
    """Fixed cost of a step per layer of a pipeline stage (kernel launches and the gaps between
    a layer's small kernels, which CUDA graphs do not remove): adds layers x this to
    `step_overhead_s`, so the fixed cost grows with the model's depth (docs/engines.md)."""
    moe_layer_step_s_without_fp4: float = 0.0
    """GPU time per MoE layer per step, beyond the step model's, on GPUs without fp4 tensor
    cores (Hopper and older), where the engine's MoE layers run other kernels than on
    Blackwell (TensorRT-LLM: its TRTLLM MoE backend is Blackwell-only; docs/engines.md,
    "MoE layers on Hopper")."""
    prefill_rate_frac: float = 1.0
    """The engine's prefill GEMMs and attention at this fraction of the calibration's rates
    (capplan.models.perf.fixed_parts: a prompt token's FLOPs count 1 / this); decode steps
    are unchanged. 1: the catalog's rates (docs/engines.md, "Host costs")."""
    per_seq_overhead_s: float = 0.0
    """Host (CPU) cost per running sequence per step, set by each profile (scheduling, input
    preparation, output processing, detokenisation); hidden behind the GPU's step when
    `host_overlap` is on."""
    host_overlap: bool = False
    """The host work of step n+1 runs while the GPU runs step n (vLLM async scheduling,
    SGLang's overlap scheduler, TensorRT-LLM's overlap scheduler): only the part of the
    per-sequence host cost that exceeds the GPU's step shows (capplan.models.perf.step_parts),
    and the scheduler forms each batch a step ahead (`SchedulerPolicy.schedules_ahead`, kept
    equal to this)."""
    prefill_worker_overlap: bool | None = None
    """The host overlap of a disaggregated prefill worker, when the engine runs those without
    its default (TensorRT-LLM's context servers: False); None: `host_overlap`. A P/D layout's
    prefill pool runs with it (capplan.plan.pd.make_layout) and launches with it."""
    client_jitter: ClientJitter = NO_JITTER
    """Timing noise of a closed-loop benchmark's clients and server front end (breaks cohorts
    up): the default of `latency --concurrency` and `simulate --concurrency`."""
    sampler: str = "native"
    """vLLM's sampler: "native", "flashinfer" or "triton"; sets the sampler's share of the
    activation peak (docs/memory.md)."""
    non_torch_multi_gpu_bytes: float | None = None
    """Non-torch memory a tensor-parallel world adds during the engine's memory profile where
    it allocates its all-reduce fusion workspace (capplan.models.memory._fused_allreduce);
    None, or elsewhere: capplan.models.memory.NON_TORCH_TP_BYTES."""
    flag_names: dict[str, str] = field(default_factory=dict)
    """The engine's own names of the settings, for launch lines (capplan/plan/launch.py): a
    flag followed by its value (`tp`, `pp`), or words with the size at `{n}`
    (`attention_dp`, `expert_parallel`); an entry that is not a `--` flag is a line of the
    engine's LLM-API options file (TensorRT-LLM's attention DP), as in `option_flags`."""
    deepep_llm_api_options: tuple[str, ...] = ()
    """LLM-API options-file lines a replica that runs DeepEP adds (TensorRT-LLM: DeepEP runs in
    the WIDEEP MoE backend, fused_moe_wide_ep.py: `moe_config: backend: WIDEEP`)."""
    spec_host_costs: tuple[float, float] = (0.0, 0.0)
    """Host costs of speculation (seconds per speculative step, per draft pass) beyond the GPU
    work the step model prices (proposer input preparation, draft attention metadata,
    rejection-sampler bookkeeping). vLLM: the least-squares line a + b K through the residual
    per-step time of EAGLE-1 on Llama-3.1-8B-Instruct, H100, batch 1, K = 2..7 (vLLM issue
    20780: measured AL x TPOT minus the vanilla 7.07 ms TPOT, minus the step model's own
    increment); `python benchmarks/speculative_vllm.py` recomputes it and scores the held-out
    EAGLE-3 rows. Other engines: no published per-K timings found, so 0 (their drafting is
    priced on the GPU alone)."""
    sources: dict[str, str] = field(default_factory=dict)
    """Where each default comes from (file and version of the engine's source)."""
    supports_attention_dp: bool = True
    """Whether the engine runs attention data parallelism inside one replica."""
    supports_expert_parallel: bool = True
    """Whether the engine shards MoE experts across GPUs (expert parallelism)."""
    attention_dp_tp1: bool = False
    """Attention DP runs one rank per GPU (attention TP 1): TensorRT-LLM enable_attention_dp."""
    tp_flag_is_world: bool = False
    """The engine's `--tp` (`flag_names["tp"]`) counts every GPU of a pipeline stage, its
    attention-DP ranks inside it (SGLang `--tp 8 --enable-dp-attention --dp 8` and TensorRT-LLM
    tensor_parallel_size 8 with attention DP are 8 GPUs); False: it is one attention-DP rank's
    TP, which the DP size multiplies (vLLM `--tensor-parallel-size 8 --data-parallel-size 2`
    is 16 GPUs). capplan.models.layout maps the notation (sources["layouts"])."""
    expert_parallel_is_world: bool = False
    """The engine's EP size is always the whole world (tp x attention_dp) when EP is on
    (vLLM --enable-expert-parallel), so no other EP size can be launched."""

    covers: str = ""
    """The engine releases this profile stands for, e.g. "0.10-0.13"."""
    since: str = ""
    """The first release the profile stands for (default: `version`)."""
    image: str = ""
    """The engine's container image of a release this profile stands for (the Kubernetes and
    llm-d exports run it): a tag at or after `version` that has every flag the profile's launch
    lines use, and before the next profile's release (its source in a comment beside it)."""
    options: tuple[str, ...] = ()
    """Profile options applied to this profile (PROFILE_OPTIONS keys), in the order given."""
    option_flags: dict[str, str] = field(default_factory=dict)
    """The engine's own launch words for each profile option it supports: a command-line flag
    (`--...`), or a line of TensorRT-LLM's LLM-API options file (`option_launch`)."""
    limits_per_dp_group: bool = False
    """The running-request cap and the token budget the engine is launched with are the whole
    attention-DP group's, which the engine divides by its DP ranks: a rank runs cap // dp and
    budget // dp (SGLang). capplan's settings are per rank, so a launch line multiplies them by
    the ranks (`launch_limit`) and the engine's default budget is divided (`rank_default`)."""
    deepep_mode: str = "auto"
    """The DeepEP mode the engine runs for a replica whose expert all-to-all crosses NVLink
    domains (models/layout.py deepep_mode): "auto" (per step: normal kernels with prompt
    tokens, low-latency ones in decode-only steps), "normal" or "low_latency" for every step;
    a P/D pool pins its role's (capplan/plan/pd.py make_layout)."""
    deepep_flags: dict[str, str] = field(default_factory=dict)
    """The launch words that run each DeepEP mode (NAME=VALUE words are environment
    variables); a mode missing here is one the release cannot launch (no DeepEP: the MoE
    traffic is costed as the engine's default all-gather + reduce-scatter)."""
    budget_covers_model_len: bool = False
    """The default token budget is at least max_model_len (vLLM V0 without chunked prefill:
    `max_num_batched_tokens = max(max_model_len, 2048)`, so a whole prompt always fits)."""
    llm_d_chart: bool = False
    """Whether llm-d-modelservice's Helm chart runs the engine (its vllmServe command and its
    routing sidecar's NIXL connector: vLLM only); the llm-d export refuses a plan sized for
    another (capplan.export.llmd.vllm_only; sources["llm_d"])."""
    fp8_needs_fp8_cores: tuple[str, ...] = ()
    """What of fp8 the engine runs only on GPUs with FP8 tensor cores (Ada, Hopper or later,
    sm89+: the GPU catalog's `fp8_dense_tflops`, GpuSpec.supports("fp8")): "weights" (an FP8
    checkpoint or on-the-fly FP8), "kv" (an fp8 KV cache). Empty: the engine runs both on
    Ampere too (vLLM and SGLang: FP8 weights as W8A16 Marlin kernels; sources["fp8"])."""
    gpu_vendors: tuple[str, ...] = ("nvidia", "amd")
    """GPU vendors (the GPU catalog's `vendor`) the engine runs on; `gpu_refusal` refuses the
    others (TensorRT-LLM: NVIDIA only; sources["gpu_vendors"])."""
    speculative_methods: tuple[str, ...] = SPEC_METHODS
    """The speculative decoding methods (capplan.models.speculative.METHODS) this release runs
    with the flags capplan's launch lines give it; the others are refused
    (`speculative_refusal`; sources["speculative"] where a release lacks some)."""
    spec_tree_flag: str | None = None
    """The launch flag that makes the drafts a tree of `--spec-topk` branches (SGLang
    `--speculative-eagle-topk`); None: the engine's line drafts a chain, and a topk above 1 is
    refused (sources["spec_tree"])."""

    def __post_init__(self) -> None:
        # the scheduler forms batches a step ahead exactly when the host work overlaps
        if self.scheduler.schedules_ahead != self.host_overlap:
            object.__setattr__(self, "scheduler",
                               replace(self.scheduler, schedules_ahead=self.host_overlap))

    def defaults(self, gpu: GpuLike, tp: int = 1) -> EngineDefaults:
        return self.defaults_rule(gpu, tp)

    def gpu_refusal(self, gpu: GpuLike) -> str | None:
        """Why this engine cannot run on `gpu` at all (one line), or None (`gpu_vendors`; a
        device of no GPU vendor, the measured host CPU of a probe, is not refused here)."""
        vendor = getattr(gpu, "vendor", None)
        if vendor not in VENDOR_NAMES or vendor in self.gpu_vendors:
            return None
        runs = " or ".join(VENDOR_NAMES.get(v, v) for v in self.gpu_vendors)
        others = [p.name for p in PROFILES.values() if vendor in p.gpu_vendors]
        return (f"--engine {self.name}: {self.display_name} runs on {runs} GPUs only, and "
                f"{gpu.name} is an {VENDOR_NAMES.get(vendor, vendor)} GPU"
                + (f"; use --engine {' or '.join(others)}" if others else ""))

    def speculative_refusal(self, method: str, spec_topk: int = 1) -> str | None:
        """Why this release cannot run speculative `method` (with `spec_topk` branches) as
        capplan launches it (one line), or None."""
        if method not in self.speculative_methods:
            why = self.sources.get("speculative", "")
            later = [p.version for p in VERSIONS[self.name] if method in p.speculative_methods]
            return (f"--speculative {method}: {self.display_name} {self.version} cannot run "
                    f"it as capplan launches it" + (f": {why}" if why else "")
                    + (f"; use --engine {self.name}@{later[0]} or later" if later else ""))
        if spec_topk > 1 and self.spec_tree_flag is None:
            tree = [p.display_name for p in PROFILES.values() if p.spec_tree_flag]
            return (f"--spec-topk {spec_topk}: capplan launches {self.display_name} with a "
                    "chain of drafts (topk 1), so a draft tree is not planned for it"
                    + (f"; a tree runs on {', '.join(tree)}" if tree else ""))
        return None

    def fp8_refusal(self, gpu: GpuLike, fp8_weights: bool, kv_dtype: str) -> str | None:
        """Why this engine cannot run the dtypes on `gpu` (one line), or None when it can:
        fp8 the engine runs only on FP8 tensor cores (`fp8_needs_fp8_cores`)."""
        if gpu.supports("fp8"):
            return None
        what = [w for w, on in (("weights", fp8_weights), ("kv", kv_dtype == "fp8"))
                if on and w in self.fp8_needs_fp8_cores]
        if not what:
            return None
        if what[0] == "weights":
            return (f"--weight-dtype fp8: {self.name} {self.version} runs FP8 only on GPUs "
                    f"with FP8 tensor cores (Ada, Hopper or later; sm89+), which {gpu.name} "
                    "lacks; use a 16-bit dtype or vllm/sglang (FP8 weights as W8A16 Marlin "
                    "kernels on Ampere)")
        return (f"--kv-dtype fp8: {self.name} {self.version} keeps an fp8 KV cache only on "
                f"GPUs with FP8 tensor cores (Ada, Hopper or later; sm89+), which {gpu.name} "
                "lacks; use --kv-dtype auto (a 16-bit KV cache) or vllm/sglang, whose "
                "attention kernels read an fp8 KV cache on Ampere")

    @property
    def release_options(self) -> tuple[str, ...]:
        """The PROFILE_OPTIONS this release has: those it has launch words for
        (`option_flags`, from its sources), and `overlap` where the host overlap is already
        its default (the option restates it). vLLM 0.6 has none (--async-scheduling arrived
        in 0.10), SGLang 0.3 only mixed-chunk (no overlap scheduler before 0.4)."""
        return tuple(o for o in PROFILE_OPTIONS
                     if o in self.option_flags or (o == "overlap" and self.host_overlap))

    def option_launch(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """What the options applied (`options`) add to the engine's launch line: its
        command-line words, and the lines its LLM-API options file carries."""
        given = [self.option_flags[o] for o in self.options if o in self.option_flags]
        return (tuple(w for f in given if f.startswith("--") for w in f.split()),
                tuple(f for f in given if not f.startswith("--")))

    @property
    def image_release(self) -> tuple[int, ...]:
        """The release number of `image`'s tag ((0, 14, 1) of vllm/vllm-openai:v0.14.1)."""
        return _version_key(self.image.rsplit(":", 1)[-1]) or ()

    @property
    def label(self) -> str:
        opts = "".join(f" +{o}" for o in self.options)
        return f"{self.name} {self.version}{opts}"

    @property
    def spec(self) -> str:
        """The string `engine_profile` resolves back to this profile: name@version+options,
        the bare name for the engine's newest profile (the default)."""
        newest = VERSIONS[self.name][-1].version == self.version
        return (self.name if newest else f"{self.name}@{self.version}") + "".join(
            f"+{o}" for o in self.options)

    @property
    def pinned(self) -> str:
        """name@version+options, whichever release: how JSON names the profile
        (`engine_profile`, every command alike); `engine_profile` resolves it back."""
        return f"{self.name}@{self.version}" + "".join(f"+{o}" for o in self.options)

def _vllm_defaults(gpu: GpuLike, tp: int) -> EngineDefaults:
    # vLLM 0.10-0.19 EngineArgs (_set_default_args / get_batch_defaults), OpenAI server: GPUs
    # with >= 70 GiB that are not A100s get max_num_seqs 1024 and max_num_batched_tokens 8192;
    # others 256 and 2048 (docs/research/engines.md, "vLLM V1").
    big = gpu.total_memory_bytes >= 70 * GIB_BYTES and "a100" not in gpu.name.lower()
    seqs, tokens = (1024, 8192) if big else (256, 2048)
    return EngineDefaults(seqs, tokens, 0.9, 16)


# SGLang 0.5.9 ServerArgs._handle_gpu_memory_settings: (upper bound GiB, chunked_prefill_size,
# cuda_graph_max_bs at tp < 4, at tp >= 4).
_SGLANG_TIERS = ((20, 2048, 8, 8), (35, 2048, 24, 80), (60, 4096, 32, 160), (90, 8192, 256, 512),
                 (160, 8192, 256, 512), (math.inf, 16384, 512, 512))


def _sglang_defaults(gpu: GpuLike, tp: int) -> EngineDefaults:
    # SGLang 0.5.9 server_args.py: reserved = 512 MB + 1.5 x chunk + 2 x cuda_graph_max_bs
    # + tp * pp / 8 GiB (at least 10 GiB above 60 GiB); mem_fraction_static =
    # (gpu_mem - reserved) / gpu_mem. Page size 1, but 64 on Blackwell, whose default MHA
    # backend (trtllm_mha) requires it (_handle_page_size).
    gib = gpu.total_memory_bytes / GIB_BYTES
    _, chunk, bs_small, bs_large = next(t for t in _SGLANG_TIERS if gib < t[0])
    graph_bs = bs_small if tp < 4 else bs_large
    mib = gib * 1024
    reserved = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + tp / 8 * 1024
    if gib > 60:
        reserved = max(reserved, 10 * 1024)
    frac = round((mib - reserved) / mib, 3)
    page = 64 if gpu.supports("fp4") else 1  # fp4 tensor cores: Blackwell
    # max_running_requests unset: min(KV tokens / 2, req_to_token_pool.size <= 4096); the KV
    # bound applies through the admission rule, so the slot cap is the pool's 4096.
    return EngineDefaults(4096, chunk, frac, page)


def _trtllm_defaults(gpu: GpuLike, tp: int) -> EngineDefaults:
    # TensorRT-LLM 1.x LLM API BaseLlmArgs: max_batch_size 2048, max_num_tokens 8192;
    # KvCacheConfig.free_gpu_memory_fraction 0.9, tokens_per_block 32.
    return EngineDefaults(2048, 8192, 0.9, 32)


HOST_COSTS_SOURCE = ("layer_step_overhead_s, per_seq_overhead_s, request_overhead_s and "
                     "mla_layer_request_overhead_s fitted per engine (shared by its releases) on "
                     "every silicon row replayed with its release's profile "
                     "(benchmarks/validate_silicon.py --loso; held-out scores and error bands in "
                     "docs/validation.md section 4b); an MLA model's fixed TTFT independently: "
                     "DeepSeek-R1-0528 on SGLang at C = 1, 180 ms at 128-token prompts "
                     "(github:tenstorrent/tt-inference-server issue 356, 2025-07-09)")


VLLM_0_11 = EngineProfile(
    name="vllm",
    display_name="vLLM",
    version="0.11",
    since="0.10",
    covers="0.10-0.13 (V1 engine, synchronous scheduling by default)",
    # docs.vllm.ai deployment/docker (v0.11): "FROM vllm/vllm-openai:v0.11.0"
    image="vllm/vllm-openai:v0.11.0",
    memory=MemoryAccounting("total", cudagraphs_in_budget=False),
    scheduler=SchedulerPolicy(prefill_first=False, chunked_prefill=True,
                              reserve_output_frac=0.0, preemption=True),
    defaults_rule=_vllm_defaults,
    block_sizes=(8, 16, 32, 64, 128),
    request_overhead_s=0.045,
    mla_layer_request_overhead_s=0.25e-3,
    step_overhead_s=0.0,
    layer_step_overhead_s=40e-6,
    per_seq_overhead_s=62.5e-6,
    flag_names={"tp": "--tensor-parallel-size", "pp": "--pipeline-parallel-size",
                "max_num_seqs": "--max-num-seqs",
                "max_num_batched_tokens": "--max-num-batched-tokens",
                "memory_fraction": "--gpu-memory-utilization", "max_model_len": "--max-model-len",
                "block_size": "--block-size", "kv_fp8": "--kv-cache-dtype fp8",
                "quant_fp8": "--quantization fp8", "attention_dp": "--data-parallel-size {n}",
                "expert_parallel": "--enable-expert-parallel"},
    expert_parallel_is_world=True,
    tp_flag_is_world=False,
    multinode_launch="dp-or-ray",
    replica_router="vllm-router",
    default_port=8000,
    pd=PdServing("vllm-router", decode_routed_at="prefill_done",
                 kv_host_env="VLLM_NIXL_SIDE_CHANNEL_HOST",
                 kv_handshake=KvHandshake(5600, ("prefill", "decode"), per_rank=True),
                 front_key="proxy", router_image="vllm/vllm-router:v0.1.17"),
    spec_host_costs=(0.55e-3, 0.15e-3),
    llm_d_chart=True,
    # One all-to-all backend per engine, no per-step choice (vllm/config/parallel.py
    # ParallelConfig.all2all_backend, default allgather_reducescatter; 0.10-0.13 read it from
    # VLLM_ALL2ALL_BACKEND, vllm/envs.py): low-latency kernels, which run every step (the
    # docs' "Expert Parallel Deployment": deepep_low_latency for decode-dominated serving).
    deepep_mode="low_latency",
    deepep_flags={"normal": "VLLM_ALL2ALL_BACKEND=deepep_high_throughput",
                  "low_latency": "VLLM_ALL2ALL_BACKEND=deepep_low_latency"},
    option_flags={"overlap": "--async-scheduling", "no-overlap": "--no-async-scheduling"},
    sources={
        "gpu_vendors": "NVIDIA (CUDA) and AMD (ROCm) GPUs: docs getting_started/"
                       "installation/gpu (CUDA and ROCm tabs)",
        "spec_tree": "chain drafts: capplan's --speculative-config gives "
                     "num_speculative_tokens only (vLLM's tree attention, "
                     "speculative_token_tree, is not planned)",
        "host_costs": HOST_COSTS_SOURCE,
        "fp8": "Ampere runs FP8 weights as W8A16: docs features/quantization 'Supported "
               "Hardware' (Marlin (GPTQ/AWQ/FP8) on Ampere; FP8 W8A8 from Ada), "
               "model_executor/layers/quantization/fp8.py use_marlin when not "
               "has_device_capability(89) (github:vllm-project/vllm pull 5975); fp8 KV "
               "cache on non-Hopper GPUs through FlashInfer/Triton (pull 24577, 0.11)",
        "host_overlap": "off: vllm/config/scheduler.py SchedulerConfig.async_scheduling "
                        "defaults to False through 0.13 (opt-in --async-scheduling since "
                        "0.10)",
        "layouts": "vllm/config/parallel.py ParallelConfig (v0.10.2): --data-parallel-size "
                   "ranks each run attention on their own requests, world_size_across_dp = "
                   "TP x PP x DP (--tensor-parallel-size is one rank's); "
                   "--enable-expert-parallel shards experts over EP = TP x DP ranks (docs: "
                   "Data Parallel Deployment, Expert Parallel Deployment)",
        "multinode": "docs 'Data Parallel Deployment' (v0.10): each host runs its DP ranks, "
                     "--data-parallel-size-local L --data-parallel-address HEAD "
                     "--data-parallel-rpc-port P, the other hosts --data-parallel-start-rank "
                     "k L --headless; TP or PP wider than a host on a Ray cluster "
                     "(--distributed-executor-backend ray, docs 'Distributed Inference and "
                     "Serving')",
        "replica_router": "vllm-project/router src/main.rs: regular mode, --worker-urls "
                          "URL... (num_args 0..), --policy round_robin, --host, --port "
                          "(default 30000)",
        "pd": "front end: vllm-project/router (pip install vllm-router) "
              "--vllm-pd-disaggregation, the prefill with max_tokens=1, then the decode; "
              "Dynamo's PrefillRouter picks the decode worker when the prefill returns "
              "(design note 'Dynamo Disaggregation', Router Orchestration); NixlConnector "
              "advertises its side channel at VLLM_NIXL_SIDE_CHANNEL_HOST, default localhost "
              "(vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py)",
        "llm_d": "llm-d-modelservice's chart runs vLLM: its vllmServe command and its routing "
                 "sidecar's NIXL connector",
        "client_jitter": "fitted on the silicon training rows with the request overhead and "
                         "rounds (benchmarks/validate_silicon.py --fit --fit-jitter; "
                         "docs/validation.md); SGLang's and TensorRT-LLM's rows fit best "
                         "without it",
        "memory": "vllm/v1/worker/gpu_worker.py Worker.determine_available_memory (v0.10.2)",
        "scheduler": "vllm/v1/core/sched/scheduler.py Scheduler.schedule (v0.10.2): running "
                     "requests first, then waiting ones, one token budget, recompute preemption",
        "defaults": "vllm/engine/arg_utils.py EngineArgs._set_default_args (v0.10.2)",
        "block_size": "vllm/config/cache.py CacheConfig.block_size (16 on CUDA)",
    },
)

SGLANG = EngineProfile(
    name="sglang",
    display_name="SGLang",
    version="0.5",
    covers="0.5.x",
    # v0.5.9: the release its defaults are read from; priority scheduling, which a lane's
    # priority launches, arrived after v0.5.2 (github:sgl-project/sglang pull 8746)
    image="lmsysorg/sglang:v0.5.9",
    host_overlap=True,
    option_flags={"mixed-chunk": "--enable-mixed-chunk",
                  "no-overlap": "--disable-overlap-schedule"},
    memory=MemoryAccounting("static"),
    scheduler=SchedulerPolicy(prefill_first=True, chunked_prefill=True,
                              reserve_output_frac=0.7, preemption=True,
                              preempt_cached="prompt", whole_prompts_after_first=True,
                              max_prefill_tokens=16384),
    defaults_rule=_sglang_defaults,
    limits_per_dp_group=True,
    tp_flag_is_world=True,
    multinode_launch="node-rank",
    replica_router="sglang-router",
    default_port=30000,
    pd=PdServing("sglang-router", decode_routed_at="arrival", router_takes_bootstrap_port=True,
                 kv_handshake=KvHandshake(8998, ("prefill",), per_rank=False)),
    block_sizes=(1, 16, 32, 64, 128),
    # the all-rows fit of docs/validation.md 4b (HOST_COSTS_SOURCE) ...
    request_overhead_s=0.25,
    mla_layer_request_overhead_s=0.125e-3,
    step_overhead_s=0.0,
    layer_step_overhead_s=60e-6,
    # ... but 55 us, not the fit's 45 us: the published SGLang 0.3 plateaus (4c) +2% / +12%
    per_seq_overhead_s=55e-6,
    sampler="flashinfer",
    # python/sglang/srt/server_args.py (v0.5): --moe-a2a-backend deepep (default none),
    # --deepep-mode auto (default) picks per step (layers/moe/utils.py DeepEPMode.resolve)
    deepep_mode="auto",
    deepep_flags={m: f"--moe-a2a-backend deepep --deepep-mode {m}"
                  for m in ("auto", "normal", "low_latency")},
    flag_names={"tp": "--tp", "pp": "--pp-size", "max_num_seqs": "--max-running-requests",
                "max_num_batched_tokens": "--chunked-prefill-size",
                "memory_fraction": "--mem-fraction-static", "max_model_len": "--context-length",
                "block_size": "--page-size", "kv_fp8": "--kv-cache-dtype fp8_e4m3",
                "quant_fp8": "--quantization fp8", "attention_dp": "--enable-dp-attention --dp {n}",
                "expert_parallel": "--ep-size {n}"},
    spec_tree_flag="--speculative-eagle-topk",
    sources={
        "gpu_vendors": "NVIDIA and AMD GPUs: docs/platforms/amd_gpu.md (MI300X, ROCm)",
        "spec_tree": "python/sglang/srt/server_args.py (0.5): --speculative-eagle-topk, the "
                     "branching of the EAGLE draft tree (docs/advanced_features/"
                     "speculative_decoding.md)",
        "host_costs": HOST_COSTS_SOURCE,
        "fp8": "Ampere runs FP8 weights as W8A16 Marlin: python/sglang/srt/layers/"
               "quantization/fp8_utils.py can_auto_enable_marlin_fp8 (80 <= sm < 89), read "
               "by Fp8LinearMethod; fp8_e4m3 KV through FlashInfer, which dequantizes it on "
               "sm80 (github:EricLBuehler/mistral.rs issue 1570: 'works fine on vllm and "
               "sglang' on an sm86 GPU)",
        "host_overlap": "on: python/sglang/srt/server_args.py disable_overlap_schedule "
                        "defaults to False (the overlap scheduler, default since v0.4.0); "
                        "--enable-mixed-chunk is the mixed-chunk option",
        "layouts": "python/sglang/srt/server_args.py (v0.5): --tp is the world size; "
                   "--enable-dp-attention --dp N splits it into N attention groups of tp/N "
                   "('assert tp_size % dp_size == 0'; layers/dp_attention.py attn_tp_size = "
                   "tp_size // dp_size); --ep-size shards experts (moe_tp = tp / ep)",
        "multinode": "python/sglang/srt/server_args.py (v0.5): the same command on every host "
                     "with --nnodes N --node-rank k --dist-init-addr HEAD:PORT",
        "replica_router": "sgl-router py_src/sglang_router/router_args.py: --worker-urls "
                          "URL... (nargs *), --policy random|round_robin|cache_aware|"
                          "power_of_two, --host, --port (default 30000)",
        "pd": "front end: sgl-router, python -m sglang_router.launch_router "
              "--pd-disaggregation --prefill URL [BOOTSTRAP_PORT] --decode URL (docs: PD "
              "Disaggregation), a prefill server's bootstrap on "
              "--disaggregation-bootstrap-port (default 8998, server_args.py); Dynamo's "
              "PrefillRouter picks the decode worker with the prefill worker, SGLang's "
              "prefill running as a background task (design note 'Dynamo "
              "Disaggregation', Router Orchestration)",
        "memory": "python/sglang/srt/model_executor/model_runner.py profile_max_num_token "
                  "(v0.5): rest_memory = available - total * (1 - mem_fraction_static)",
        "scheduler": "python/sglang/srt/managers/scheduler.py get_next_batch_to_run (v0.5): "
                     "a new prefill batch runs before decode; mixed chunks off by default",
        "admission": "python/sglang/srt/managers/schedule_policy.py (0.5.8) PrefillAdder: "
                     "after a step's first prompt a further one is admitted only whole within "
                     "rem_input_tokens = max_prefill_tokens (16384, server_args.py) less the "
                     "step's decodes and prompt tokens (add_one_req 'input_tokens >= "
                     "rem_input_tokens and len(can_run_list) != 0' returns OTHER); chunks are "
                     "cut at chunked_prefill_size less the same (rem_chunk_tokens)",
        "reserve": "python/sglang/srt/managers/schedule_policy.py PrefillAdder: reserves "
                   "new_token_ratio x max_new_tokens per running request "
                   "(SGLANG_INIT_NEW_TOKEN_RATIO 0.7)",
        "defaults": "python/sglang/srt/server_args.py (v0.5) GPU-memory tiers",
        "dp_limits": "python/sglang/srt/server_args.py _handle_data_parallelism (v0.4-0.5): "
                     "chunked_prefill_size //= dp_size with --enable-dp-attention; "
                     "model_executor/model_runner.py: max_running_requests // dp_size per "
                     "rank",
    },
)

TRTLLM = EngineProfile(
    name="trtllm",
    display_name="TensorRT-LLM",
    version="1.2",
    covers="1.2-1.3 (PyTorch backend)",
    # NGC nvcr.io/nvidia/tensorrt-llm/release, the stable 1.2.1 (github:triton-inference-server/
    # tensorrtllm_backend pull 853 moved to it from 1.2.0rc8)
    image="nvcr.io/nvidia/tensorrt-llm/release:1.2.1",
    host_overlap=True,
    option_flags={"no-overlap": "disable_overlap_scheduler: true",
                  "chunked-prefill": "enable_chunked_prefill: true"},
    memory=MemoryAccounting("free", profile_requests="prompt_chunks"),
    scheduler=SchedulerPolicy(prefill_first=False, chunked_prefill=False,
                              reserve_output_frac=1.0, preemption=False),
    defaults_rule=_trtllm_defaults,
    block_sizes=(8, 16, 32, 64, 128),
    request_overhead_s=0.035,
    mla_layer_request_overhead_s=2e-3,
    step_overhead_s=0.0,
    layer_step_overhead_s=17.5e-6,
    # 8 x H200 (DeepSeek-R1 FP8) minus 8 x B200 (FP4) ITL over the step model, per MoE layer:
    # median of 57-111 us (github:NVIDIA/TensorRT-LLM issue 5929; docs/engines.md)
    moe_layer_step_s_without_fp4=63.5e-6,
    per_seq_overhead_s=0.0,
    prefill_worker_overlap=False,
    sampler="flashinfer",
    # The WIDEEP MoE backend's all-to-all (tensorrt_llm/_torch/modules/fused_moe/
    # fused_moe_wide_ep.py select_alltoall_method_type, 1.x): DeepEP's normal kernels for every
    # step where it runs them, TRTLLM_FORCE_ALLTOALL_METHOD pins the method; the default MoE
    # backend all-gathers and reduce-scatters (launch lines add moe_config backend WIDEEP).
    deepep_mode="normal",
    deepep_flags={"normal": "TRTLLM_FORCE_ALLTOALL_METHOD=DeepEP",
                  "low_latency": "TRTLLM_FORCE_ALLTOALL_METHOD=DeepEPLowLatency"},
    flag_names={"tp": "--tp_size", "pp": "--pp_size", "max_num_seqs": "--max_batch_size",
                "max_num_batched_tokens": "--max_num_tokens",
                "memory_fraction": "--kv_cache_free_gpu_memory_fraction",
                "max_model_len": "--max_seq_len",
                "kv_fp8": "--extra_llm_api_options kv_fp8.yaml  # kv_cache_config: {dtype: fp8}",
                "attention_dp": "enable_attention_dp: true",  # an LLM-API options-file line
                "expert_parallel": "--ep_size {n}"},
    attention_dp_tp1=True,
    tp_flag_is_world=True,
    multinode_launch="mpirun",
    replica_router="vllm-router",
    default_port=8000,
    pd=PdServing("trtllm-disaggregated", decode_routed_at="prefill_done",
                 role_names=("context", "generation"),
                 router_policies={"round-robin": "round_robin",
                                  "least-outstanding": "load_balancing"}),
    deepep_llm_api_options=("moe_config:", "  backend: WIDEEP"),
    fp8_needs_fp8_cores=("weights", "kv"),
    gpu_vendors=("nvidia",),
    sources={
        "host_costs": HOST_COSTS_SOURCE,
        "gpu_vendors": "NVIDIA GPUs only: nvidia.github.io/TensorRT-LLM/supported-hardware.html"
                       " lists Blackwell, Hopper, Ada Lovelace and Ampere GPUs",
        "spec_tree": "chain drafts: capplan's speculative_config gives max_draft_len only (no "
                     "eagle_choices tree), tensorrt_llm/llmapi/llm_args.py",
        "fp8": "no FP8 on Ampere: support matrix (nvidia.github.io/TensorRT-LLM/0.18.2/"
               "reference/support-matrix.html, Precision: 'Ampere (SM80, SM86) - FP32, FP16, "
               "BF16, INT8, INT4', FP8 from Ada SM89 and Hopper SM90); features/quantization "
               "(1.x): 'The default PyTorch backend supports FP4 and FP8 quantization on the "
               "latest Blackwell and Hopper GPUs'; Model Optimizer support matrix "
               "(nvidia.github.io/Model-Optimizer/guides/0_support_matrix.html): FP8 'GPUs: "
               "Ada and Later'",
        "host_overlap": "on: tensorrt_llm/llmapi/llm_args.py TorchLlmArgs."
                        "disable_overlap_scheduler defaults to False (PyTorch backend, 1.x)",
        "prefill_worker_overlap": "off: examples/disaggregated/README.md (1.x), context "
                                  "servers' extra-llm-api-config sets disable_overlap_scheduler"
                                  ": True (not yet supported in disaggregated context servers); "
                                  "AIConfigurator generator/rule_plugin/trtllm.rule: prefill "
                                  "disable_overlap_scheduler = true",
        "layouts": "tensorrt_llm/llmapi/llm_args.py (1.x): tensor_parallel_size is the world "
                   "size; enable_attention_dp (attention_dp.yaml: enable_attention_dp: true) "
                   "makes every rank its own attention DP rank (attention TP 1; "
                   "tensorrt_llm/mapping.py Mapping); "
                   "moe_expert_parallel_size x moe_tensor_parallel_size = tensor_parallel_size",
        "multinode": "docs 'trtllm-serve' (1.x): one launch from any host, mpirun -H "
                     "NODE0_IP:G,NODE1_IP:G -np W trtllm-llmapi-launch trtllm-serve ..., its "
                     "environment passed to every rank with -x",
        "replica_router": "none of its own: trtllm-serve disaggregated "
                          "(tensorrt_llm/llmapi/disagg_utils.py) fronts context and generation "
                          "servers only; vllm-project/router src/main.rs lists trtllm among its "
                          "--backend runtimes and routes it in its regular mode (--worker-urls)",
        "pd": "front end: trtllm-serve disaggregated -c disagg_config.yaml "
              "(tensorrt_llm/llmapi/disagg_utils.py extract_disagg_cfg: hostname, port, "
              "context_servers and generation_servers with their urls and router.type); "
              "Dynamo's PrefillRouter picks the decode worker when the prefill returns "
              "(design note 'Dynamo Disaggregation', Router Orchestration)",
        "memory": "tensorrt_llm/llmapi/llm_args.py KvCacheConfig.free_gpu_memory_fraction "
                  "(default 0.9 of free memory after the model is loaded)",
        "scheduler": "tensorrt_llm/llmapi/llm_args.py CapacitySchedulerPolicy "
                     "GUARANTEED_NO_EVICT (default): admits a request only if its KV for "
                     "input + max output tokens can be reserved; enable_chunked_prefill False",
        "defaults": "tensorrt_llm/llmapi/llm_args.py BaseLlmArgs max_batch_size 2048, "
                    "max_num_tokens 8192; KvCacheConfig tokens_per_block 32",
        "moe_without_fp4": "MoE backends: TRTLLM on B200/GB200/B300/GB300, TRITON on H200 "
                           "(deployment guide for gpt-oss on TensorRT-LLM, 'MoE Backend Support "
                           "Matrix'); 63.5 us per MoE layer: DeepSeek-R1 ITL at batch 1, TP 8, "
                           "EP 1/4/8, 1,600 and 8,192-token prompts, 8 x H200 FP8 against 8 x "
                           "B200 FP4, each over capplan's step (github:NVIDIA/TensorRT-LLM "
                           "issue 5929, v0.21.0rc2): the median of six differences, 57-111 us",
    },
)

VLLM = replace(
    VLLM_0_11, version="0.14", since="0.14",
    covers="0.14-0.16 (V1 engine, asynchronous scheduling)",
    # --all2all-backend needs >= 0.11.1, --no-async-scheduling's default >= 0.14 (below)
    image="vllm/vllm-openai:v0.14.1",
    host_overlap=True,
    # --all2all-backend replaced VLLM_ALL2ALL_BACKEND (github:vllm-project/vllm pull 26732,
    # 0.11.1; the variable was removed in 0.15, pull 33535)
    deepep_flags={"normal": "--all2all-backend deepep_high_throughput",
                  "low_latency": "--all2all-backend deepep_low_latency"},
    sources={**VLLM_0_11.sources,
             "host_overlap": "on: async scheduling became vLLM's default in 0.14 "
                             "(github:vllm-project/vllm pull 27614, the last item of the "
                             "async-scheduling plan, issue 27679); --no-async-scheduling "
                             "turns it off"})


VLLM_0_17 = replace(
    VLLM, version="0.17", since="0.17",
    covers="0.17-0.18 (V1 engine, asynchronous scheduling, Triton top-k/top-p sampler)",
    # the release AIConfigurator's vLLM 0.17 runs name (its silicon sample's images)
    image="vllm/vllm-openai:v0.17.0",
    sampler="triton",
    sources={**VLLM.sources,
             "sampler": "Triton top-k/top-p kernels (github:vllm-project/vllm pull 33538) "
                        "replace the sort-based sampler: Qwen3-14B on H100 at 0.95 logs "
                        "274,848 KV tokens on 0.15 and 0.16, 297,152 on 0.17 and 296,400 on "
                        "0.18 (llm-d-planner accuracy/results/version-sweep)"})

VLLM_0_19 = replace(
    VLLM_0_17, version="0.19", since="0.19", covers="0.19 and later",
    # the release of llm-d-planner's 0.19 logs (the CUDA 12.9 build; -cu130 the CUDA 13 one)
    image="vllm/vllm-openai:v0.19.0",
    non_torch_multi_gpu_bytes=gib_to_bytes(2.07),
    sources={**VLLM_0_17.sources,
             "non_torch": "2.07 GiB of non-torch forward increase on every TP 2 and TP 4 "
                          "startup of vLLM 0.19.0 on H100 (FlashInfer all-reduce fusion "
                          "workspace; 0.25 at TP 1, none with PP 2): llm-d-planner "
                          "accuracy/results/v0.19.0 logs, gpu_worker.py 'Memory profiling "
                          "takes'; tensor parallelism alone over NVLink on SM90/SM100 GPUs "
                          "(memory._fused_allreduce)"})


def _sglang04_defaults(gpu: GpuLike, tp: int) -> EngineDefaults:
    # SGLang 0.4.x ServerArgs.__post_init__: mem_fraction_static by TP size (0.88 at TP 1,
    # 0.87 at 2-3, 0.85 at 4-7, 0.81 at 8-15, 0.79 at 16+); chunked_prefill_size 2048 below
    # 25 GB of GPU memory, else 8192; page size 1.
    frac = 0.88 if tp < 2 else 0.87 if tp < 4 else 0.85 if tp < 8 else 0.81 if tp < 16 else 0.79
    chunk = 2048 if gpu.total_memory_bytes < 25e9 else 8192
    return EngineDefaults(4096, chunk, frac, 1)


SGLANG_0_4 = replace(
    SGLANG, version="0.4", covers="0.4.x", defaults_rule=_sglang04_defaults,
    # the last 0.4 release: --enable-deepep-moe (v0.4.6-0.4.9)
    image="lmsysorg/sglang:v0.4.9.post6-cu126",
    # server_args.py (v0.4.6-0.4.9): --enable-deepep-moe, --deepep-mode (default auto)
    deepep_flags={m: f"--enable-deepep-moe --deepep-mode {m}"
                  for m in ("auto", "normal", "low_latency")},
    sources={**SGLANG.sources,
             "defaults": "python/sglang/srt/server_args.py (v0.4) __post_init__: "
                         "mem_fraction_static by tp_size, chunked_prefill_size by GPU memory",
             "admission": "python/sglang/srt/managers/schedule_policy.py (v0.4.0-0.4.9) "
                          "PrefillAdder.add_one_req, scheduler.py get_new_batch_prefill: "
                          "0.5.8's rule and max_prefill_tokens 16384 (server_args.py); "
                          "through 0.4.6 a later prompt is refused above rem_input_tokens "
                          "('input_tokens > self.rem_input_tokens'), from 0.4.9 at it ('>='), "
                          "a one-token difference not replayed"})

TRTLLM_1_0 = replace(
    TRTLLM, version="1.0", covers="1.0-1.1 (PyTorch backend)",
    image="nvcr.io/nvidia/tensorrt-llm/release:1.0.0")  # NGC, TensorRT-LLM 1.0 release notes
"""TensorRT-LLM 1.0-1.1: the same scheduler, defaults and overlap as 1.2; its own profile so
that a plan names the release it was made for (docs/engines.md, "Profiles by version")."""

def _vllm06_defaults(gpu: GpuLike, tp: int) -> EngineDefaults:
    # vLLM 0.6 EngineArgs: max_num_seqs 256 on every GPU; without chunked prefill
    # SchedulerConfig's budget is max(max_model_len, 2048) (budget_covers_model_len).
    return EngineDefaults(256, 2048, 0.9, 16)


VLLM_0_6 = replace(
    VLLM_0_11, version="0.6", since="0.6",
    covers="0.6.x (V0 engine: prefill-only steps of whole prompts, synchronous host)",
    # the last 0.6 release: --scheduling-policy arrived in 0.6.3 (github:vllm-project/vllm
    # pull 8850)
    image="vllm/vllm-openai:v0.6.6.post1",
    defaults_rule=_vllm06_defaults, budget_covers_model_len=True,
    scheduler=SchedulerPolicy(prefill_first=True, chunked_prefill=False,
                              reserve_output_frac=0.0, preemption=True, prefix_caching=False),
    host_overlap=False, option_flags={}, deepep_flags={}, speculative_methods=(),
    sources={**VLLM_0_11.sources,
             "speculative": "its vllm/engine/arg_utils.py (v0.6.6) takes --speculative-model "
                            "and --num-speculative-tokens, not the --speculative-config "
                            "capplan's vLLM lines pass, and has no EAGLE-3; both came in "
                            "later releases",
             "scheduler": "vllm/core/scheduler.py Scheduler._schedule_default (v0.6.0): "
                          "waiting prompts are scheduled first, whole, and a step with "
                          "prefills schedules no decodes; chunked prefill off by default "
                          "(vllm/engine/arg_utils.py turns it on only above a 32K "
                          "max_model_len, which this profile does not follow); recompute "
                          "preemption",
             "defaults": "vllm/engine/arg_utils.py EngineArgs (v0.6.0): max_num_seqs 256, "
                         "gpu_memory_utilization 0.9, block_size 16, enable_prefix_caching "
                         "False; vllm/config.py SchedulerConfig: max_num_batched_tokens = "
                         "max(max_model_len, 2048) without chunked prefill",
             "host_overlap": "off: the V0 engine loop schedules, prepares inputs and "
                             "processes outputs between steps (vLLM blog 2024-09-05 'vLLM "
                             "v0.6.0: 2.7x Throughput Improvement', 'Performance "
                             "Diagnosis'); --num-scheduler-steps (multi-step, off by "
                             "default) is not modelled"})

def _sglang03_defaults(gpu: GpuLike, tp: int) -> EngineDefaults:
    # SGLang 0.3.0 server_args.py ServerArgs: mem_fraction_static by TP size (0.88 at TP 1,
    # 0.87 at 2-3, 0.85 at 4-7, 0.83 at 8-15, 0.79 at 16+), chunked_prefill_size 8192 on every
    # GPU; page size 1. The request cap, min(KV tokens / 2, req_to_token_pool - 1) with a pool
    # of 2,048-5,120 slots (model_runner.py init_memory_pool), depends on the KV cache: 0.4's
    # 4096 stands in for it.
    frac = 0.88 if tp < 2 else 0.87 if tp < 4 else 0.85 if tp < 8 else 0.83 if tp < 16 else 0.79
    return EngineDefaults(4096, 8192, frac, 1)


SGLANG_0_3 = replace(
    SGLANG_0_4, version="0.3", since="0.3", covers="0.3.x (no overlap scheduler)",
    image="lmsysorg/sglang:v0.3.6.post3-cu124",  # the last 0.3 release
    host_overlap=False, defaults_rule=_sglang03_defaults, deepep_flags={},
    option_flags={"mixed-chunk": "--enable-mixed-chunk"},
    sources={**SGLANG_0_4.sources,
             "host_overlap": "off: the overlap ('zero-overhead') batch scheduler arrived in "
                            "v0.4 (lmsys.org/blog/2024-12-04-sglang-v0-4, 'Zero-Overhead "
                            "Batch Scheduler'); before it the CPU's scheduling ran between "
                            "GPU steps",
             "defaults": "python/sglang/srt/server_args.py (v0.3.0) ServerArgs: "
                         "mem_fraction_static by tp_size (__post_init__; 0.88 at TP 1 and "
                         "0.85 at TP 4, as benchmark/benchmark_vllm_060/README.md notes), "
                         "chunked_prefill_size 8192; the request cap is 0.4's (0.3.0's "
                         "depends on the KV cache: model_executor/model_runner.py "
                         "init_memory_pool, managers/tp_worker.py)",
             "scheduler": "python/sglang/srt/managers/tp_worker.py ModelTpServer.forward_step "
                          "(v0.3.0): a new prefill batch runs instead of the decode batch; "
                          "--enable-mixed-chunk off by default (server_args.py)",
             "admission": "python/sglang/srt/managers/policy_scheduler.py (v0.3.0) "
                          "PrefillAdder.add_one_req: after a step's first prompt a further one "
                          "is refused when 'input_tokens > self.rem_input_tokens', "
                          "rem_input_tokens = max_prefill_tokens (16384, server_args.py) less "
                          "the prompt tokens scheduled and, with --enable-mixed-chunk only, "
                          "the running decodes; one admitted is chunked at rem_chunk_tokens "
                          "(chunked_prefill_size less the same); tp_worker.py "
                          "get_new_prefill_batch ends the step at the first refusal: 0.5.8's "
                          "rule but for '>' (0.5.8 '>='), a one-token difference not replayed"})

VERSIONS: dict[str, tuple[EngineProfile, ...]] = {
    "vllm": (VLLM_0_6, VLLM_0_11, VLLM, VLLM_0_17, VLLM_0_19),
    "sglang": (SGLANG_0_3, SGLANG_0_4, SGLANG), "trtllm": (TRTLLM_1_0, TRTLLM)}
"""Every engine's profiles by version, oldest first; the last is the default."""
PROFILES: dict[str, EngineProfile] = {name: v[-1] for name, v in VERSIONS.items()}
ENGINES = tuple(PROFILES)


def _with_overlap(p: EngineProfile, on: bool) -> EngineProfile:
    return replace(p, host_overlap=on)


def _mixed_chunk(p: EngineProfile) -> EngineProfile:
    if not p.scheduler.prefill_first:
        raise InputError(f"engine option mixed-chunk: {p.name}'s steps already mix prefill "
                         "chunks with decodes (it applies to sglang)")
    return replace(p, scheduler=replace(p.scheduler, prefill_first=False))


def _chunked_prefill(p: EngineProfile) -> EngineProfile:
    if p.scheduler.chunked_prefill or p.scheduler.prefill_first:
        raise InputError(f"engine option chunked-prefill: {p.name} does not prefill whole "
                         "prompts beside its decodes (it applies to trtllm)")
    return replace(p, scheduler=replace(p.scheduler, chunked_prefill=True))


PROFILE_OPTIONS: dict[str, Callable[[EngineProfile], EngineProfile]] = {
    "mixed-chunk": _mixed_chunk,
    "chunked-prefill": _chunked_prefill,
    "overlap": lambda p: _with_overlap(p, True),
    "no-overlap": lambda p: _with_overlap(p, False),
}
"""Options on top of a version's profile, written `engine@version+option`: SGLang's
--enable-mixed-chunk (prefill chunks ride with the decode batch), TensorRT-LLM's
enable_chunked_prefill (tensorrt_llm/llmapi/llm_args.py, default False: its micro-batch
scheduler then chunks prompts into the budget the decodes leave), and the host overlap on or
off (vLLM --async-scheduling / --no-async-scheduling, SGLang --disable-overlap-schedule,
TensorRT-LLM disable_overlap_scheduler)."""

_ALIASES = {"tensorrtllm": "trtllm", "trt": "trtllm", "trtllm": "trtllm", "vllm": "vllm",
            "sglang": "sglang"}
ENGINE_PATTERN = (r"^\s*[-_]*(" + "|".join("[-_]*".join(ci(c) for c in name)
                                            for name in sorted(_ALIASES, key=len, reverse=True))
                  + r")[-_]*\s*(@[^@+]*[^@+\s][^@+]*)?(\+[^+]+)*\s*$")
"""An engine spec's shape as `engine_profile` reads it (a name of _ALIASES in any case,
'-' and '_' anywhere in it, blanks around it; one non-blank @VERSION; +OPTIONs): the plan
file's JSON Schema, and `engine_profile` refuses what it refuses. Which releases and options
exist the planner says."""


def _version_key(version: str) -> tuple[int, ...] | None:
    """(0, 11) of "0.11", "v0.11.2rc1" or "0.11.0.post1"; None when it does not start with a
    number."""
    parts = []
    for piece in version.strip().lstrip("vV").split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) < len(piece):
            break
    return tuple(parts) or None


_MEMORY_ONLY = ("version", "since", "covers", "sources", "image", "sampler",
                "non_torch_multi_gpu_bytes")
"""Profile fields that are its release's name, image or memory accounting, not its latency
model: profiles differing only in these time steps alike (`same_latency_model`)."""


def same_latency_model(a: EngineProfile, b: EngineProfile) -> bool:
    """Whether two profiles time steps and requests alike (a calibration fitted through one
    holds for the other): equal but for their names and memory accounting."""
    blank = dict.fromkeys(_MEMORY_ONLY)
    return replace(a, **blank) == replace(b, **blank)


def check_step_budget(max_num_batched_tokens: int, max_num_seqs: int,
                      policy: SchedulerPolicy) -> None:
    """InputError for a token budget below the running-sequence cap where every step holds each
    running sequence's decode token (vLLM SchedulerConfig._verify_args refuses it); a
    prefill-first engine's budget bounds prefill steps only (SGLang chunked_prefill_size)."""
    if max_num_batched_tokens < max_num_seqs and not policy.prefill_first:
        raise InputError(f"--max-num-batched-tokens {max_num_batched_tokens} must be >= "
                         f"--max-num-seqs {max_num_seqs}: each step's token budget holds "
                         "every running sequence's decode token (vLLM refuses less; "
                         "capplan does not replay steps that leave decodes out)")


def profile_for_version(name: str, version: str | None) -> EngineProfile:
    """The profile of engine `name` (a VERSIONS key) for release `version`: the newest profile
    whose version is not later than it ("0.12" -> vLLM's 0.11 profile); None or "latest": the
    newest. InputError for releases older than every profile or unreadable versions."""
    versions = VERSIONS[name]
    if version is None or version.strip().lower() in ("", "latest", "newest"):
        return versions[-1]
    key = _version_key(version)
    if key is None:
        raise InputError(f"engine version {version!r}: expected a release number such as "
                         f"{versions[0].version} or {versions[-1].version}")
    older = [p for p in versions if (_version_key(p.since or p.version) or ()) <= key]
    if not older:
        raise InputError(f"engine {name}@{version}: capplan models {name} from "
                         f"{versions[0].since or versions[0].version} ({versions[0].covers})")
    return older[-1]


def launch_limit(profile: EngineProfile, per_rank: int, attention_dp: int) -> int:
    """The value of a running-request cap or token budget flag that gives each of
    `attention_dp` ranks `per_rank` (EngineProfile.limits_per_dp_group)."""
    return per_rank * attention_dp if profile.limits_per_dp_group else per_rank


def rank_default(profile: EngineProfile, default: int, attention_dp: int) -> int:
    """A rank's share of an engine default that is the whole DP group's."""
    return max(1, default // attention_dp) if profile.limits_per_dp_group else default


def engine_display_name(engine: str) -> str:
    """An engine id's (`vllm`, or any spec `engine_profile` reads) human label
    (EngineProfile.display_name: vLLM, SGLang, TensorRT-LLM); a name capplan does not know
    comes back as given."""
    try:
        return engine_profile(engine).display_name
    except InputError:
        return engine


def engine_profile(name: str) -> EngineProfile:
    """The profile an engine spec names: `vllm`, `vllm@0.11`, `sglang@0.5+mixed-chunk`,
    `trtllm@1.0+no-overlap` (name, optional release, optional PROFILE_OPTIONS); InputError
    names the valid ones."""
    return _engine_profile(str(name))


@functools.lru_cache(maxsize=256)
def _engine_profile(spec: str) -> EngineProfile:
    head, *opts = spec.strip().split("+")
    base, _, version = head.partition("@")
    if "@" in version or ("@" in head and not version.strip()):
        raise InputError(f"engine {spec!r}: expected NAME, optionally one @VERSION "
                         "(e.g. vllm@0.11)")
    key = base.strip().lower().replace("-", "").replace("_", "")
    if key not in _ALIASES:
        hint = nearest(base, list(PROFILES), n=1, cutoff=0.5)
        raise InputError(f"unknown engine {spec!r}: expected one of {', '.join(PROFILES)}, "
                         "optionally @VERSION and +OPTION (e.g. vllm@0.11, "
                         "sglang+mixed-chunk)" + (f" (did you mean {hint[0]}?)" if hint else ""))
    prof = profile_for_version(_ALIASES[key], version if "@" in head else None)
    release = prof
    if not re.match(ENGINE_PATTERN, spec):
        raise InputError(f"engine {spec!r}: expected NAME[@VERSION][+OPTION...] "
                         "(e.g. sglang@0.5+mixed-chunk)")
    applied: list[str] = []
    for opt in (o.strip().lower() for o in opts):
        if opt not in PROFILE_OPTIONS:
            raise InputError(f"unknown engine option {opt!r} in {spec!r}: expected one of "
                             f"{', '.join(PROFILE_OPTIONS)}")
        _check_option(spec, opt, applied)
        prof = PROFILE_OPTIONS[opt](prof)  # its own refusals first (mixed-chunk on vllm...)
        if opt not in release.release_options:
            have = ", ".join(f"+{o}" for o in release.release_options) or "none"
            raise InputError(f"engine option {opt} in {spec!r}: {release.name}@"
                             f"{release.version} (covers {release.covers}) has no such option; "
                             f"its options: {have} (docs/engines.md, 'Profiles by version')")
        applied.append(opt)
    return replace(prof, options=tuple(applied)) if applied else prof


_CONTRADICTING = {"overlap": "no-overlap", "no-overlap": "overlap"}


def _check_option(spec: str, opt: str, applied: list[str]) -> None:
    """InputError for an option given twice, or against one already given."""
    if opt in applied:
        raise InputError(f"engine option {opt} given twice in {spec!r}")
    other = _CONTRADICTING.get(opt)
    if other in applied:
        raise InputError(f"engine options {other} and {opt} contradict each other in "
                         f"{spec!r}: give one")


def engine_defaults(gpu: GpuLike, profile: EngineProfile = VLLM) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) the engine picks on a GPU."""
    d = profile.defaults(gpu, 1)
    return d.max_num_seqs, d.max_num_batched_tokens


@dataclass(frozen=True)
class EngineSettings:
    """The knobs a user passes to the engine (vLLM flag names; other engines map them through
    their profile's `flag_names`)."""

    tp: int = 1
    pp: int = 1
    weight_dtype: str = "auto"
    kv_dtype: str = "auto"
    max_model_len: int | None = None
    """None: the model's max_position_embeddings, as vLLM defaults it."""
    gpu_memory_utilization: float = 0.9
    """The engine's memory fraction, in that engine's own meaning (MemoryAccounting)."""
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enforce_eager: bool = False
    engine: str = "vllm"
    """The engine profile these settings are for (a key of PROFILES)."""
    attention_dp: int = 1
    """Attention data-parallel ranks of one replica, each a TP group of `tp` GPUs with its own
    batch and KV pool; the replica spans tp x pp x attention_dp GPUs."""
    expert_parallel: int = 1
    """Expert-parallel size of the MoE layers over the replica's tp x attention_dp GPUs (the
    rest of that world is MoE tensor parallelism: moe_tp = tp x attention_dp / expert_parallel)."""
    deepep_mode: str | None = None
    """The DeepEP mode of an expert all-to-all that crosses NVLink domains (auto, normal,
    low_latency; models/layout.py deepep_mode); None: the engine profile's."""
    # Features that change memory and step cost (capplan/models/speculative.py, lora.py,
    # vision.py; docs/features.md).
    speculative: str | None = None
    """Speculative decoding method: eagle3, eagle, mtp, ngram or draft:MODEL; None: off."""
    spec_tokens: int | None = None
    """Draft steps per engine step (vLLM num_speculative_tokens); None: the method's default;
    0: no speculation."""
    spec_topk: int = 1
    """Draft tree branching (SGLang --speculative-eagle-topk); 1: a chain."""
    spec_draft_tokens: int | None = None
    """Tokens verified per sequence per step (SGLang --speculative-num-draft-tokens); None:
    spec_tokens + 1 for a chain."""
    acceptance_length: float | None = None
    """Mean tokens emitted per sequence per step (measured); None: the published default."""
    spec_workload: str = "chat"
    """Workload kind the default acceptance is taken for: chat, code, math, summarisation."""
    draft_model: Any = field(default=None, compare=False, repr=False)
    """The draft model's ModelSpec for draft:MODEL (resolved from the catalog)."""
    max_loras: int = 0
    """LoRA adapter slots on the GPU (vLLM --max-loras); 0: LoRA off."""
    max_lora_rank: int = 16
    """Largest adapter rank the slots are sized for (vLLM --max-lora-rank, default 16)."""
    lora_adapters: int = 0
    """Distinct adapters in the traffic (0: as many as max_loras)."""
    lora_popularity: str = "uniform"
    """How requests pick adapters: uniform or zipf (s = 1)."""
    images_per_request: int = 0
    """Images in each request's prompt (vLLM --limit-mm-per-prompt image=N); 0: text only."""
    image_width: int = 1024
    """Image width in pixels."""
    image_height: int = 1024
    """Image height in pixels."""

    @property
    def world_size(self) -> int:
        """GPUs of one pipeline stage of a replica (attention TP x DP = MoE TP x EP)."""
        return self.tp * self.attention_dp

    @property
    def moe_tp(self) -> int:
        return self.world_size // max(self.expert_parallel, 1)

    def with_(self, **changes: object) -> EngineSettings:
        """`dataclasses.replace(self, **changes)` without its __init__ call (no __post_init__
        here, nothing cached in the instance): the planner makes one per configuration it
        sizes, thousands per search."""
        unknown = changes.keys() - _SETTINGS_FIELDS
        if unknown:
            raise TypeError(f"EngineSettings has no field {sorted(unknown)[0]!r}")
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__, **changes)
        return new

    @property
    def profile(self) -> EngineProfile:
        return engine_profile(self.engine)


_SETTINGS_FIELDS = frozenset(f.name for f in fields(EngineSettings))
