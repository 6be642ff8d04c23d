"""VRAM per GPU, faithful to how each engine sizes its KV cache. Derivations: docs/memory.md.

    vLLM:    budget = total_memory * gpu_memory_utilization   (Worker.determine_available_memory)
             kv_cache = budget - weights - activation_peak - runtime_overhead
    SGLang and TensorRT-LLM apply their own rule (models/engine.py MemoryAccounting).
    num_blocks = kv_cache // (block_size * kv_bytes_per_token)   (vLLM kv_cache_utils)

Pure functions of specs and numbers: no I/O, no catalog loading.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from capplan.catalog.schema import GpuSpec, ModelSpec
from capplan.errors import InputError
from capplan.models import layers
from capplan.models.engine import EngineProfile, EngineSettings
from capplan.models.features import feature_memory
from capplan.models.memo import per_model
from capplan.units import DTYPE_BYTES, GIB_BYTES, MIB_BYTES, cdiv

# ---------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------

# Group-scale overhead in bytes per weight for each quantized storage format:
#  fp8: per-tensor/per-channel scales are negligible; DeepSeek-style 128x128 blocks add 4 B/16384.
#  int8: W8A8 per-channel scales, negligible.
#  int4: AWQ/GPTQ group 128: an fp16 scale and a 4-bit zero point per group -> 2.5 B / 128.
#  mxfp4: OCP MX spec, one e8m0 (1 B) scale per 32 elements -> 1 B / 32.
#  nvfp4/fp4: NVIDIA NVFP4, one fp8 scale per 16 elements -> 1 B / 16.
_SCALE_BYTES_PER_GROUP = {"fp8": 4.0, "int8": 0.0, "int4": 2.5, "mxfp4": 1.0, "nvfp4": 1.0,
                          "fp4": 1.0}
_DEFAULT_GROUP = {"fp8": 128 * 128, "int8": 1, "int4": 128, "mxfp4": 32, "nvfp4": 16, "fp4": 16}


def quantized_bytes_per_param(fmt: str, group_size: int | None = None) -> float:
    """Storage bytes per weight of a quantized format, scales included."""
    group = group_size or _DEFAULT_GROUP[fmt]
    if fmt == "fp8" and group_size is not None:
        group = group_size * group_size  # fp8 groups are square blocks (weight_block_size)
    return DTYPE_BYTES[fmt] + _SCALE_BYTES_PER_GROUP[fmt] / group


@dataclass(frozen=True)
class ParamCounts:
    """Parameters held by the most loaded GPU, by kind, after the TP/PP split."""

    embedding: float
    lm_head: float
    attention: float
    dense_mlp: float
    experts: float
    shared_experts: float
    router: float
    norms: float
    vision: float
    expert_size: float
    """Parameters of ONE routed expert in ONE layer on this GPU (what a routed token reads)."""
    num_moe_layers: int
    """MoE layers on this GPU's pipeline stage."""

    @property
    def linear(self) -> float:
        """Parameters of the matrices a token multiplies by (everything but tables and norms)."""
        return self.attention + self.dense_mlp + self.experts + self.shared_experts + self.router

    @property
    def total(self) -> float:
        return (self.embedding + self.lm_head + self.attention + self.dense_mlp + self.experts
                + self.shared_experts + self.router + self.norms + self.vision)


def attention_params_per_layer(model: ModelSpec, tp: int) -> float:
    """Attention projection parameters of one layer on one GPU (models/layers.py)."""
    return layers.mixer_params(model, "full_attention", tp)


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> float:
    """KV heads each GPU stores: max(1, kv_heads / tp); heads replicate when tp exceeds them."""
    return layers.kv_heads_per_gpu(model, tp)


def param_counts(model: ModelSpec, tp: int = 1, pp: int = 1, attention_dp: int = 1,
                 expert_parallel: int = 1) -> ParamCounts:
    """Per-GPU parameter counts of the heaviest pipeline stage (layers split evenly by vLLM).

    Token mixers of every kind (attention, Mamba, linear attention, conv) count as `attention`;
    per-layer kinds come from models/layers.py. Memoised per (model object, tp, pp): a search
    sizes memory for thousands of engine settings of the same model and TP (models/memo.py).
    """
    counts = _param_counts(model, int(tp), int(pp))
    if attention_dp == 1 and expert_parallel == 1:
        return counts
    # Attention DP x EP (vLLM --data-parallel-size --enable-expert-parallel, SGLang
    # --enable-dp-attention --ep-size, TensorRT-LLM enable_attention_dp moe_expert_parallel_size):
    # non-expert weights stay split by tp (replicated across DP ranks); each GPU holds
    # num_experts / ep experts sliced by moe_tp = tp x dp / ep, i.e. the experts / (tp x dp).
    world = tp * attention_dp
    moe_tp = world // expert_parallel
    return replace(counts, experts=counts.experts * tp / world,
                   expert_size=counts.expert_size * tp / moe_tp)


@per_model
def _param_counts(model: ModelSpec, tp: int, pp: int) -> ParamCounts:
    h, v = model.hidden_size, model.vocab_size
    st = layers.stage_layers(model, pp)
    mlp_mats = layers.mlp_matrices(model)
    moe_layers = st.num_moe
    expert_size = experts = shared = router = 0.0
    if model.moe is not None:
        m = model.moe
        expert_size = mlp_mats * h * m.moe_intermediate_size / tp
        experts = moe_layers * m.num_experts * expert_size
        shared = (moe_layers * m.num_shared_experts * mlp_mats * h
                  * m.shared_expert_intermediate_size / tp)
        router = moe_layers * h * m.num_experts  # replicated gate (vLLM ReplicatedLinear)
    # Vocabulary-parallel embedding and LM head (vLLM VocabParallelEmbedding): split by TP.
    # With PP the first stage holds the embedding, the last the head; the worst GPU holds one.
    embedding = v * h / tp
    lm_head = 0.0 if model.tie_word_embeddings else v * h / tp
    if pp > 1:
        embedding, lm_head = max(embedding, lm_head), 0.0
    sublayers = sum(k != "none" for k in st.mixers) + sum(k != "none" for k in st.mlps)
    return ParamCounts(
        embedding=embedding,
        lm_head=lm_head,
        attention=sum(layers.mixer_params(model, k, tp) for k in st.mixers),
        dense_mlp=layers.dense_mlp_params(model, st, tp),
        experts=experts,
        shared_experts=shared,
        router=router,
        norms=(sublayers + 1) * h,
        vision=model.vision_params / tp,
        expert_size=expert_size,
        num_moe_layers=moe_layers,
    )


@dataclass(frozen=True)
class WeightDtypes:
    """Bytes per parameter of each kind of tensor under one weight-dtype choice."""

    linear: float
    experts: float
    unquantized: float
    compute_dtype: str
    """The tensor-core dtype the matrix products run in (fp8 when weights are fp8)."""
    label: str
    mixer: float | None = None
    """Bytes per token-mixer (attention, Mamba) parameter when they differ from `linear`."""


def weight_dtypes(model: ModelSpec, weight_dtype: str = "auto") -> WeightDtypes:
    """Resolve --weight-dtype to bytes per parameter per tensor kind.

    Quantization covers linear layers only; embeddings, the LM head, norms and the MoE router
    stay in the checkpoint dtype (vLLM Fp8Config / AWQ skip lm_head and embeddings).
    """
    base = model.dtype_bytes
    if weight_dtype == "auto":
        q = model.quantization
        if q is None:
            return WeightDtypes(base, base, base, model.torch_dtype, model.torch_dtype)
        qb = quantized_bytes_per_param(q.format, q.group_size)
        lin = qb if q.modules != "experts" else base
        compute = _compute_dtype(q.format) if q.modules != "experts" else model.torch_dtype
        return WeightDtypes(lin, qb, base, compute, q.format,
                            mixer=base if q.modules == "mlp" else None)
    if weight_dtype in ("bf16", "fp16", "fp32"):
        b = DTYPE_BYTES[weight_dtype]
        return WeightDtypes(b, b, b, weight_dtype, weight_dtype)
    if weight_dtype not in _DEFAULT_GROUP:
        raise InputError(f"--weight-dtype {weight_dtype!r}: use auto, fp32, bf16, fp16, fp8, "
                         "int8, int4 or fp4")
    fmt = "nvfp4" if weight_dtype == "fp4" else weight_dtype
    qb = quantized_bytes_per_param(fmt)
    if weight_dtype == "fp8" and model.quantization and model.quantization.format == "fp8":
        qb = quantized_bytes_per_param("fp8", model.quantization.group_size)
    return WeightDtypes(qb, qb, base, _compute_dtype(fmt), weight_dtype)


def _compute_dtype(fmt: str) -> str:
    # Weight-only int4 (AWQ/GPTQ) and MXFP4-on-Hopper dequantize to 16-bit for the product.
    return {"fp8": "fp8", "int8": "int8", "nvfp4": "fp4", "fp4": "fp4"}.get(fmt, "bf16")


def checkpoint_bytes(model: ModelSpec) -> float:
    """The checkpoint's weights as it ships them (each tensor in its own dtype, the whole
    model): what a server downloads, whatever dtype it then runs (vLLM and SGLang quantize a
    bf16 checkpoint to fp8 after loading it)."""
    return weight_bytes(param_counts(model), weight_dtypes(model))


def weight_bytes(counts: ParamCounts, dt: WeightDtypes) -> float:
    """Resident weight bytes on one GPU."""
    return (
        counts.attention * (dt.linear if dt.mixer is None else dt.mixer)
        + (counts.dense_mlp + counts.shared_experts) * dt.linear
        + counts.experts * dt.experts
        + (counts.embedding + counts.lm_head + counts.router + counts.norms + counts.vision)
        * dt.unquantized
    )


# ---------------------------------------------------------------------------------------------
# KV cache
# ---------------------------------------------------------------------------------------------


def kv_dtype_bytes(model: ModelSpec, kv_dtype: str = "auto") -> float:
    """--kv-cache-dtype auto stores KV in the model's activation dtype (bf16 for fp8
    checkpoints)."""
    if kv_dtype == "auto":
        return model.dtype_bytes
    if kv_dtype not in ("bf16", "fp16", "fp8"):
        raise InputError(f"--kv-dtype {kv_dtype!r}: use auto, bf16, fp16 or fp8")
    return DTYPE_BYTES[kv_dtype]


def kv_bytes_per_token_per_layer(model: ModelSpec, tp: int, kv_bytes: float) -> float:
    """KV bytes one token occupies in one attention layer on one GPU (models/layers.py)."""
    return layers.attention_kv_bytes_per_token(model, tp, kv_bytes)


def kv_bytes_per_token(model: ModelSpec, tp: int, kv_bytes: float, pp: int = 1) -> float:
    """KV bytes per token over the attention layers of the heaviest stage, sliding ones counted
    as if full (the unit vLLM reports "GPU KV cache size: N tokens" in); see models/layers.py."""
    return layers.kv_bytes_per_token(model, tp, kv_bytes, pp)


def kv_bytes_for_sequence(model: ModelSpec, seq_len: float, tp: int, kv_bytes: float,
                          block_size: int = 16, pp: int = 1,
                          max_num_batched_tokens: int | None = None) -> float:
    """KV and recurrent-state bytes a sequence of seq_len tokens holds on one GPU, in whole
    blocks (models/layers.py sequence_bytes: sliding windows, state pages)."""
    return layers.sequence_bytes(model, seq_len, tp, kv_bytes, block_size, pp,
                                 max_num_batched_tokens)


# ---------------------------------------------------------------------------------------------
# Activation peak and runtime overhead
# ---------------------------------------------------------------------------------------------

# Sampler memory per (sequence, vocabulary entry) at the peak of vLLM V1's dummy sampler run
# (top-k and top-p on; docs/research/vllm_v1_profile_peak.md, read from vLLM 0.9.2-0.11.0):
#  - native PyTorch sampler (a plain `pip install vllm`): the peak is inside torch.sort of the
#    fp32 logits: logits in the model dtype (d), fp32 copy (4), sort values (4) and int64
#    indices (8) out, plus the sort's own int64 index buffer (8) and CUB temporaries (12): d+36;
#  - FlashInfer sampler (used whenever FlashInfer is installed, as in vLLM's Docker image): no
#    sort: logits (d), fp32 copy (4), probabilities (4), uniform samples (4): d+12.
#  - Triton top-k/top-p kernels (vLLM 0.17+, github:vllm-project/vllm pull 33538, the default
#    sampler with FlashInfer's off): no sort either; vLLM 0.19's logged torch peak (1.89 GiB,
#    Llama-3.1-8B, 1,024 sequences, llm-d-planner accuracy/results/v0.19.0) is d+12's.
SAMPLER_EXTRA_BYTES_PER_LOGIT = {"native": 36.0, "flashinfer": 12.0, "triton": 12.0}
# cuBLAS workspace allocated through the torch allocator during profiling: 32 MiB on Hopper and
# Blackwell (sm90+), 8 MiB on older GPUs (PyTorch's default CUBLAS_WORKSPACE_CONFIG sizes).
_SM90_PREFIXES = ("h100", "h200", "h20", "b200", "b300", "gb200", "gb300", "rtx-pro")


def cublas_workspace_bytes(gpu_key: str) -> float:
    return (32 if gpu_key.startswith(_SM90_PREFIXES) else 8) * MIB_BYTES


def profile_requests(settings: EngineSettings, rule: str = "max_num_seqs") -> int:
    """The requests of an engine's memory-profiling run (MemoryAccounting.profile_requests):
    vLLM's min(max_num_seqs, T), or TensorRT-LLM's T cut into prompts of max_seq_len - 1."""
    tokens = settings.max_num_batched_tokens
    if rule == "prompt_chunks":
        return cdiv(tokens, max(1, min(tokens, (settings.max_model_len or tokens + 1) - 1)))
    return min(settings.max_num_seqs, tokens)


def activation_peak_bytes(model: ModelSpec, settings: EngineSettings, act_bytes: float,
                          sampler: str = "native", workspace_bytes: float = 0.0,
                          seqs: int | None = None) -> float:
    """Torch peak during vLLM V1's profile run (gpu_model_runner.profile_run).

    One forward of T = max_num_batched_tokens tokens over S = min(max_num_seqs, T) dummy
    requests, whose hidden states stay alive while the sampler runs on the S last positions
    (logits are all-gathered on every TP rank):
        forward  = T d (3 I / tp + 4 H)      (gate_up output 2I and activation output I, plus
                   residual, normed input, attention output and down output; MoE: fused_moe's
                   caches, k (3 I_e / tp + H). vLLM logs with a forward-dominated peak (V0,
                   T = 20000 and 29000, issue #10517) show 4H, not the 2H a reading of V1's
                   code suggests; see docs/memory.md)
        sampler  = T H d + 2 S H d + S V (d + extra)
        peak     = max(forward, sampler) + cuBLAS workspace
    Attention metadata is None in the profile run, so attention kernels allocate nothing.
    `seqs`: the profiling run's requests (`profile_requests`; default vLLM's S).
    """
    tokens = settings.max_num_batched_tokens
    tp, h = settings.tp, model.hidden_size
    mlp = (3 if model.mlp_gated else 2) * model.intermediate_size / tp
    if model.moe is not None:
        m = model.moe
        moe = m.num_experts_per_tok * (3 * m.moe_intermediate_size / tp + h)
        mlp = max(mlp if m.num_dense_layers else 0.0, moe)
    forward = tokens * (mlp + 4 * h) * act_bytes
    seqs = profile_requests(settings) if seqs is None else seqs
    per_logit = act_bytes + SAMPLER_EXTRA_BYTES_PER_LOGIT[sampler]
    sampler_peak = (tokens + 2 * seqs) * h * act_bytes + seqs * model.vocab_size * per_logit
    return max(forward, sampler_peak) + workspace_bytes


# Non-torch memory vLLM's profiler sees grow (cuBLAS/cuBLASLt workspaces, allocator slack):
# 0.07-0.16 GiB at TP=1 in vLLM >= 0.9 logs; TP=2 and TP=8 runs log 0.21-0.30 GiB (NCCL and
# custom all-reduce buffers allocated before the baseline snapshot are not counted)
# (docs/research/vllm_kv_logs*.md).
NON_TORCH_BASE_BYTES = 0.15 * GIB_BYTES
NON_TORCH_TP_BYTES = 0.1 * GIB_BYTES
# CUDA graph capture: vLLM logs "Graph capturing finished ... took 0.52-3.34 GiB" (docs/research);
# it grows with the number of capture sizes and layers. Modelled as a base plus a per-layer cost
# (0.38-1.23 GiB over the catalog: low for large capture sets, see docs/memory.md).
CUDA_GRAPH_BASE_BYTES = 0.25 * GIB_BYTES
CUDA_GRAPH_PER_LAYER_BYTES = 8 * MIB_BYTES


# CUDA context and communicators, on the device before an engine loads anything: vLLM 0.19's
# "worker init memory snapshot" on H100 logs non_torch_memory 0.51 GiB at TP 1 and 1.51 GiB at
# TP 2 (NCCL and custom all-reduce buffers over NVLink; llm-d-planner accuracy/results/v0.19.0);
# SGLang 0.4 on 4 x L4 (PCIe) starts from 0.42 GiB less than the device's total.
CONTEXT_BYTES = 0.5 * GIB_BYTES
CONTEXT_NVLINK_WORLD_BYTES = 1.0 * GIB_BYTES


def context_bytes(gpu: GpuSpec, settings: EngineSettings) -> float:
    """The CUDA context and communicators' memory on each GPU (CONTEXT_BYTES, and the NVLink
    world's buffers when a replica spans GPUs over NVLink)."""
    return CONTEXT_BYTES + (CONTEXT_NVLINK_WORLD_BYTES
                            if settings.world_size > 1 and _over_nvlink(gpu) else 0.0)


def _over_nvlink(gpu: GpuSpec) -> bool:
    return gpu.interconnect.kind.startswith("nvlink")


def _fused_allreduce(gpu: GpuSpec, settings: EngineSettings) -> bool:
    """Whether vLLM's FlashInfer all-reduce fusion workspace is allocated: tensor parallelism
    alone (no attention DP, no pipeline stages: vLLM's pass config turns it off with either,
    issues 34458 and 35426) over NVLink on a GPU with FP8 tensor cores (SM90 and SM100: Hopper,
    Blackwell; the fusion's kernels are built for those)."""
    return (settings.tp > 1 and settings.attention_dp == 1 and settings.pp == 1
            and gpu.supports("fp8") and _over_nvlink(gpu))


def runtime_overhead_bytes(model: ModelSpec, settings: EngineSettings,
                           gpu: GpuSpec) -> tuple[float, float]:
    """(non-torch memory counted in the KV budget, CUDA-graph memory outside it or not); a
    world over one GPU adds NON_TORCH_TP_BYTES, or its profile's `non_torch_multi_gpu_bytes`
    where that profile allocates its all-reduce workspace (`_fused_allreduce`)."""
    multi = settings.profile.non_torch_multi_gpu_bytes
    extra = (multi if multi is not None and _fused_allreduce(gpu, settings)
             else NON_TORCH_TP_BYTES)
    non_torch = NON_TORCH_BASE_BYTES + (extra if settings.world_size > 1 else 0.0)
    graphs = 0.0
    if not settings.enforce_eager:
        graphs = CUDA_GRAPH_BASE_BYTES + CUDA_GRAPH_PER_LAYER_BYTES * cdiv(model.num_layers,
                                                                            settings.pp)
    return non_torch, graphs


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryReport:
    """Per-GPU memory plan, in bytes and tokens. Keys follow the CLI JSON contract."""

    total_memory_bytes: float
    budget_bytes: float
    weights_bytes_per_gpu: float
    activation_peak_bytes_per_gpu: float
    runtime_overhead_bytes_per_gpu: float
    cuda_graph_bytes_per_gpu: float
    kv_bytes_per_token_per_gpu: float
    kv_cache_bytes_per_gpu: float
    num_gpu_blocks: int
    kv_cache_tokens: int
    block_size: int
    max_model_len: int
    kv_bytes_per_max_len_seq: float
    max_concurrency: float
    contiguous_max_concurrency: float
    fits: bool
    reason: str
    weight_dtype: str
    kv_dtype_bytes: float
    margin_bytes_per_gpu: float
    """Memory left outside the budget after CUDA graphs: negative means vLLM would OOM."""
    state_bytes_per_seq_per_gpu: float = 0.0
    """Recurrent (Mamba, linear-attention, conv) state one sequence holds, padded to pages;
    part of kv_bytes_per_max_len_seq, so it bounds max_concurrency (vLLM hybrid allocator)."""
    state_blocks_per_seq: int = 0
    """The state in whole blocks of num_gpu_blocks (layers.state_blocks_per_seq): what a
    running sequence holds besides its ceil(tokens / block_size) blocks (simulator, queueing,
    closed loop)."""
    attention_dp: int = 1
    """Attention data-parallel ranks of the replica: each holds its own pool of the size above
    for its own sequences (the replica's KV tokens are attention_dp x kv_cache_tokens)."""
    draft_weights_bytes_per_gpu: float = 0.0
    """Speculative drafter weights, part of weights_bytes_per_gpu (models/speculative.py)."""
    lora_bytes_per_gpu: float = 0.0
    """LoRA adapter slots, part of weights_bytes_per_gpu (models/lora.py)."""
    block_layout: layers.BlockLayout = layers.DENSE_LAYOUT
    """How a sequence's tokens fill the pool in the simulator's block unit (layers.block_layout):
    the blocks a running sequence holds, window layers capped (layers.window_blocks);
    max_concurrency keeps vLLM's start-up reservation (layers.sequence_bytes)."""
    context_bytes_per_gpu: float = 0.0
    """CUDA context and communicators (`context_bytes`): outside vLLM's budget, outside
    SGLang's base, inside TensorRT-LLM's profiled peak (MemoryAccounting)."""

    @property
    def replica_kv_cache_tokens(self) -> int:
        return self.kv_cache_tokens * self.attention_dp


def validate_settings(model: ModelSpec, s: EngineSettings, gpu: GpuSpec | None = None) -> None:
    """Raise InputError for settings vLLM itself would reject (or a node cannot host)."""
    u = s.gpu_memory_utilization
    if not (isinstance(u, int | float) and math.isfinite(u) and 0 < u <= 1):
        raise InputError(f"--gpu-memory-utilization {u}: must be in (0, 1]")
    for name in ("tp", "pp", "block_size", "max_num_seqs", "max_num_batched_tokens"):
        val = getattr(s, name)
        if not isinstance(val, int) or val < 1:
            raise InputError(f"--{name.replace('_', '-')} {val}: must be a positive integer")
    if s.max_model_len is not None and s.max_model_len < 1:
        raise InputError(f"--max-model-len {s.max_model_len}: must be a positive integer")
    if model.num_attention_heads % s.tp:
        raise InputError(f"--tp {s.tp}: must divide the {model.num_attention_heads} attention "
                         f"heads of {model.key}")
    kvh = model.num_kv_heads
    if model.mla is None and kvh % s.tp and s.tp % kvh:
        raise InputError(f"--tp {s.tp}: must divide, or be a multiple of, the {kvh} KV heads")
    if s.pp > model.num_layers:
        raise InputError(f"--pp {s.pp}: exceeds the {model.num_layers} layers of {model.key}")
    if s.max_model_len is not None and s.max_model_len > model.max_position_embeddings:
        raise InputError(f"--max-model-len {s.max_model_len}: exceeds {model.hf_id}'s "
                         f"{model.max_position_embeddings} (max_position_embeddings): past the "
                         "positions it was trained for, which vLLM and SGLang refuse")
    validate_layout(model, s)
    if gpu is not None:
        validate_span(s, gpu)
        why = fp8_refusal(model, s, gpu)
        if why:
            raise InputError(why)


def fp8_refusal(model: ModelSpec, s: EngineSettings, gpu: GpuSpec) -> str | None:
    """Why the settings' engine cannot run on `gpu` (EngineProfile.gpu_refusal: not its GPU
    vendor) or cannot run their fp8 weights or KV cache there, or None
    (EngineProfile.fp8_refusal; an FP8 checkpoint under weight dtype auto counts as fp8)."""
    why = s.profile.gpu_refusal(gpu)
    if why:
        return why
    dt = weight_dtypes(model, s.weight_dtype)
    return s.profile.fp8_refusal(gpu, "fp8" in (dt.compute_dtype, dt.label), s.kv_dtype)


def validate_span(s: EngineSettings, gpu: GpuSpec) -> None:
    """A replica wider than one NVLink domain needs the GPU's scale-out network (catalog
    `network:`); TP, attention DP, EP and PP then cross it (models/layout.py)."""
    domain = gpu.interconnect.max_gpus_per_node
    if gpu.network is not None or s.world_size <= domain:
        return
    what = (f"--tp {s.tp}" if s.attention_dp == 1 else
            f"--tp {s.tp} x --attention-dp {s.attention_dp}")
    raise InputError(f"{what}: a {gpu.key} node connects at most {domain} GPUs "
                     f"({gpu.interconnect.kind}) and the GPU catalog gives it no scale-out "
                     "network (network: in its YAML) to span nodes; split across nodes with "
                     "--pp instead")


def validate_layout(model: ModelSpec, s: EngineSettings) -> None:
    """Raise InputError for an attention-DP / expert-parallel layout the engine cannot run."""
    dp, ep = s.attention_dp, s.expert_parallel
    for flag, val in (("--attention-dp", dp), ("--expert-parallel", ep)):
        if not isinstance(val, int) or val < 1:
            raise InputError(f"{flag} {val}: must be a positive integer")
    p = s.profile
    if dp > 1 and not p.supports_attention_dp:
        raise InputError(f"--attention-dp {dp}: {p.name} has no attention data parallelism")
    if dp > 1 and p.attention_dp_tp1 and s.tp != 1:
        raise InputError(f"--attention-dp {dp}: {p.name} runs attention DP with one GPU per "
                         f"rank (use --tp 1, not {s.tp})")
    if ep == 1:
        return
    if model.moe is None:
        raise InputError(f"--expert-parallel {ep}: {model.key} is dense (no experts to shard)")
    if not p.supports_expert_parallel:
        raise InputError(f"--expert-parallel {ep}: {p.name} has no expert parallelism")
    world = s.tp * dp
    if world % ep:
        raise InputError(f"--expert-parallel {ep}: must divide the tp x attention-dp = {world} "
                         "GPUs of a replica stage")
    if model.moe.num_experts % ep:
        raise InputError(f"--expert-parallel {ep}: must divide the {model.moe.num_experts} "
                         f"experts of {model.key}")
    if p.expert_parallel_is_world and ep != world:
        raise InputError(f"--expert-parallel {ep}: {p.name} shards experts over all tp x "
                         f"attention-dp = {world} GPUs (use {world} or 1)")


def memory_report(model: ModelSpec, gpu: GpuSpec, settings: EngineSettings,
                  profile: EngineProfile | None = None) -> MemoryReport:
    """Size weights, activations, overheads and the paged KV cache on one GPU, by the memory
    accounting of the settings' engine (or `profile`)."""
    profile = profile or settings.profile
    validate_settings(model, settings, gpu)
    s = settings
    max_len = model.context_len(s.max_model_len)
    dt = weight_dtypes(model, s.weight_dtype)
    counts = param_counts(model, s.tp, s.pp, s.attention_dp, s.expert_parallel)
    weights = weight_bytes(counts, dt)
    act_bytes = 2.0 if model.torch_dtype != "fp32" else 4.0
    act = activation_peak_bytes(model, s, act_bytes, profile.sampler,
                                cublas_workspace_bytes(gpu.key),
                                profile_requests(s, profile.memory.profile_requests))
    kvb = kv_dtype_bytes(model, s.kv_dtype)
    feat = feature_memory(model, s, kv_bytes_per_token_per_layer(model, s.tp, kvb),
                          model.dtype_bytes, act_bytes, dt.linear)
    weights += feat.weights_bytes
    if feat.encoder_forward_bytes or feat.encoder_cache_bytes:
        act = max(act + feat.encoder_cache_bytes, feat.encoder_forward_bytes)
    non_torch, graphs = runtime_overhead_bytes(model, s, gpu)
    total = gpu.total_memory_bytes
    context = context_bytes(gpu, s)
    kvb_plan = profile.memory.kv_budget(total, s.gpu_memory_utilization, weights, act,
                                        (non_torch, graphs, context))
    budget, kv_cache = kvb_plan.budget_bytes, kvb_plan.kv_cache_bytes
    overhead = non_torch + (graphs if profile.memory.cudagraphs_in_budget else 0.0)
    per_token, bs, state, state_blocks = _kv_layout(model, s.tp, kvb, s.block_size, s.pp)
    seq_bytes = _sequence_bytes(model, max_len, s.tp, kvb, bs, s.pp, s.max_num_batched_tokens)
    if per_token and feat.draft_kv_bytes_per_token:
        # The drafter's KV pages share the pool, token for token (vLLM allocates them in the
        # same KV cache config; SGLang's draft worker shares the token pool).
        seq_bytes *= (per_token + feat.draft_kv_bytes_per_token) / per_token
        per_token += feat.draft_kv_bytes_per_token
    if per_token:
        blocks = max(0, int(kv_cache // (bs * per_token)))
        usable = blocks * bs * per_token
    else:  # no attention layer: one state page per sequence (MambaSpec, block = max_model_len)
        bs, per_token = max_len, state / max_len
        blocks = max(0, int(kv_cache // state)) if state else 0
        usable = blocks * state
    tokens = blocks * bs
    concurrency = usable / seq_bytes if seq_bytes else 0.0
    # whole sequences reserved up front, token by token (no blocks): full-attention layers
    # hold max_len tokens, sliding-window layers their window as seq_bytes counts it (the
    # window behind a prefill chunk), recurrent state its page
    whole = (layers.sequence_bytes(model, max_len, s.tp, kvb, 1, s.pp, s.max_num_batched_tokens)
             - layers.state_bytes_per_seq(model, s.tp, kvb, 1, s.pp))
    if whole and feat.draft_kv_bytes_per_token and per_token:
        whole *= per_token / (per_token - feat.draft_kv_bytes_per_token)
    contiguous = (math.floor(max(kv_cache, 0) / (whole + state)) if whole + state else 0.0)
    margin = kvb_plan.margin_bytes
    fits, reason = True, "fits"
    if kv_cache <= 0:
        fits = False
        need = (weights + act + overhead) / GIB_BYTES
        reason = (f"weights+activations+overhead need {need:.1f} GiB per GPU but the "
                  f"{profile.name} budget is {budget / GIB_BYTES:.1f} GiB")
    elif concurrency < 1:
        fits = False
        reason = (f"KV cache holds {tokens} tokens, less than one sequence of max_model_len "
                  f"{max_len} (lower --max-model-len or add GPUs)")
    return MemoryReport(
        total_memory_bytes=total, budget_bytes=budget, weights_bytes_per_gpu=weights,
        activation_peak_bytes_per_gpu=act, runtime_overhead_bytes_per_gpu=overhead,
        cuda_graph_bytes_per_gpu=graphs, kv_bytes_per_token_per_gpu=per_token,
        kv_cache_bytes_per_gpu=max(kv_cache, 0.0), num_gpu_blocks=blocks,
        kv_cache_tokens=tokens, block_size=bs, max_model_len=max_len,
        kv_bytes_per_max_len_seq=seq_bytes, max_concurrency=concurrency,
        contiguous_max_concurrency=contiguous, fits=fits, reason=reason,
        weight_dtype=dt.label, kv_dtype_bytes=kvb, margin_bytes_per_gpu=margin,
        state_bytes_per_seq_per_gpu=state,
        state_blocks_per_seq=state_blocks if per_token else 0,
        attention_dp=s.attention_dp,
        draft_weights_bytes_per_gpu=feat.draft_weights_bytes, lora_bytes_per_gpu=feat.lora_bytes,
        context_bytes_per_gpu=context,
        block_layout=(layers.block_layout(model, bs, s.max_num_batched_tokens, s.pp,
                                          profile.scheduler.frees_out_of_window)
                      if per_token else layers.DENSE_LAYOUT),
    )


@per_model
def _kv_layout(model: ModelSpec, tp: int, kvb: float, block_size: int, pp: int
               ) -> tuple[float, int, float, int]:
    """KV bytes per token, block size, state bytes and state blocks per sequence: the same for
    every max_num_seqs and chunk size of a search (memoised, as the parameter counts)."""
    per_token = kv_bytes_per_token(model, tp, kvb, pp)
    # Hybrids: vLLM raises the block size until an attention page holds a state page.
    bs = layers.effective_block_size(model, tp, kvb, block_size)
    return (per_token, bs, layers.state_bytes_per_seq(model, tp, kvb, bs, pp),
            layers.state_blocks_per_seq(model, pp))


@per_model
def _sequence_bytes(model: ModelSpec, max_len: int, tp: int, kvb: float, bs: int, pp: int,
                    max_num_batched_tokens: int) -> float:
    return kv_bytes_for_sequence(model, max_len, tp, kvb, bs, pp, max_num_batched_tokens)
