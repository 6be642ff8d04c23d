"""Engine settings and the engine profile their defaults come from.

The default profile is vLLM's V1 engine as of v0.10-v0.11 (docs/memory.md cites each default).
Settings are plain frozen data: the models read them, they never do I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from capplan.units import GIB_BYTES

WEIGHT_DTYPES = ("auto", "fp32", "bf16", "fp16", "fp8", "int8", "int4", "fp4")
KV_DTYPES = ("auto", "bf16", "fp16", "fp8")


@dataclass(frozen=True)
class SchedulerPolicy:
    """How an engine forms a step and admits requests: what the simulator and the analytic
    queueing model read (each engine profile holds one; sources in docs/research/engines.md)."""

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


@dataclass(frozen=True)
class EngineProfile:
    """Defaults of one serving engine version (vLLM V1 unless said otherwise)."""

    name: str = "vllm"
    version: str = "0.10-0.11 (V1 engine)"
    gpu_memory_utilization: float = 0.9  # vllm/config/cache.py CacheConfig.gpu_memory_utilization
    block_size: int = 16  # CacheConfig.block_size default on CUDA
    max_num_seqs: int = 256  # EngineArgs default for the OpenAI server on <70 GiB GPUs
    max_num_batched_tokens: int = 8192  # V1 chunked-prefill token budget, OpenAI server, H100-class
    sampler: str = "native"
    """Sampler vLLM profiles: "native" (PyTorch, a pip install) or "flashinfer" (installed in
    vLLM's Docker image); it sets the sampler's share of the activation peak."""
    cudagraphs_in_kv_budget: bool = False
    """vLLM <= 0.11 captures CUDA graphs after sizing the KV cache: their memory comes out of the
    (1 - gpu_memory_utilization) margin, not out of the KV cache."""
    scheduler: SchedulerPolicy = SchedulerPolicy()


VLLM = EngineProfile()


def engine_defaults(total_memory_bytes: float, gpu_name: str,
                    profile: EngineProfile = VLLM,  # noqa: ARG001 - one rule for all profiles
                    ) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) vLLM V1 picks for the OpenAI server on a GPU.

    vLLM 0.10-0.11 EngineArgs._set_default_args: GPUs with >= 70 GiB that are not A100s get
    max_num_seqs 1024 and max_num_batched_tokens 8192; others 256 and 2048
    (docs/research/vllm_kv_logs.md, "defaults").
    """
    big = total_memory_bytes >= 70 * GIB_BYTES and "a100" not in gpu_name.lower()
    return (1024, 8192) if big else (256, 2048)


@dataclass(frozen=True)
class EngineSettings:
    """The knobs a user passes to the engine (vLLM flag names)."""

    tp: int = 1
    pp: int = 1
    weight_dtype: str = "auto"
    kv_dtype: str = "auto"
    max_model_len: int | None = None
    """None: the model's max_position_embeddings, as vLLM defaults it."""
    gpu_memory_utilization: float = VLLM.gpu_memory_utilization
    block_size: int = VLLM.block_size
    max_num_seqs: int = VLLM.max_num_seqs
    max_num_batched_tokens: int = VLLM.max_num_batched_tokens
    enforce_eager: bool = False

    def with_(self, **changes: object) -> EngineSettings:
        return replace(self, **changes)  # type: ignore[arg-type]
