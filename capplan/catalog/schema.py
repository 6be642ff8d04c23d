"""Pydantic schemas of the catalog files (GPU, model). YAML keys carry units; properties give SI."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from capplan import limits as L
from capplan.units import (
    DTYPE_BYTES,
    US_S,
    gb_per_s_to_bytes_per_s,
    gib_to_bytes,
    mib_to_bytes,
    tflops_to_flops_per_s,
)

_STRICT = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
# Upper bounds of a GPU's numbers, each ~20x past the largest part shipping (B300: 288 GB HBM,
# 8 TB/s, ~5 PFLOPS dense FP4; NVLink 5: 1.8 TB/s): a value past them is a typo or a unit slip
# (`.inf` bandwidth was accepted and changed answers; `.inf` memory raised an internal error).
_MAX_GIB = 8192.0
_MAX_MIB = 8192.0 * 1024
_MAX_GB_PER_S = 200_000.0
_MAX_TFLOPS = 100_000.0
_MAX_PRICE = 10_000.0  # limits.PRICE_PER_HOUR
# A model's shape, bounded as `models import` bounds config.json (capplan/limits.py says why)
_LAYERS = L.MODEL_LAYERS.field()
_WIDTH = L.MODEL_WIDTH.field()
_FFN = L.MODEL_FFN.field()
_HEADS = L.MODEL_HEADS.field()
_HEAD_DIM = L.MODEL_HEAD_DIM.field()
_VOCAB = L.MODEL_VOCAB.field()
_EXPERTS = L.MODEL_EXPERTS.field()
_CONTEXT = L.MODEL_CONTEXT.field()
RECURRENT_KINDS = ("mamba", "mamba2", "linear_attention", "short_conv")
ATTENTION_KINDS = ("full_attention", "sliding_attention", "chunked_attention")

# When a GPU lacks a measured cudaMemGetInfo total, capplan subtracts what the driver keeps
# back from the NVML total. H100 SXM: NVML 81559 MiB vs torch/vLLM 79.19-79.22 GiB (81090-81121
# MiB) in vLLM logs (an llm-d log; https://github.com/vllm-project/vllm/pull/12126): about
# 450 MiB.
DRIVER_RESERVED_MIB = 450.0


class Interconnect(BaseModel):
    model_config = _STRICT
    kind: Literal[
        "pcie3", "pcie4", "pcie5", "pcie6", "nvlink3", "nvlink4", "nvlink5",
        "nvlink-bridge", "infinity-fabric",
    ]
    bandwidth_gb_per_s: float = Field(gt=0, le=_MAX_GB_PER_S)
    """Per GPU, per direction (decimal GB/s)."""
    max_gpus_per_node: int = Field(ge=1)
    """Largest tensor-parallel group on this interconnect."""

    @property
    def bytes_per_s(self) -> float:
        return gb_per_s_to_bytes_per_s(self.bandwidth_gb_per_s)

    @property
    def label(self) -> str:
        """The link's name in outputs ("NVLink", "PCIe 4.0", "Infinity Fabric")."""
        if self.kind.startswith("pcie"):
            return f"PCIe {self.kind[4:]}.0"
        return {"nvlink-bridge": "NVLink bridge",
                "infinity-fabric": "Infinity Fabric"}.get(self.kind, "NVLink")


class Network(BaseModel):
    """The scale-out network between NVLink domains (nodes, or racks on NVL72), per GPU: what a
    replica spanning several domains uses for TP, attention-DP, EP and PP traffic that leaves
    its domain (docs/multinode.md)."""

    model_config = _STRICT
    kind: Literal["infiniband", "roce", "ethernet"]
    bandwidth_gb_per_s: float = Field(gt=0)
    """Per GPU, per direction (decimal GB/s): one 400 Gb/s NIC per GPU is 50."""
    latency_us: float = Field(gt=0)
    """One-way latency of a message between GPUs of two domains (microseconds)."""

    @property
    def bytes_per_s(self) -> float:
        return gb_per_s_to_bytes_per_s(self.bandwidth_gb_per_s)

    @property
    def latency_s(self) -> float:
        return self.latency_us * US_S


class GpuSpec(BaseModel):
    """One GPU type, from gpu_catalog/<key>.yaml."""

    model_config = _STRICT
    key: str
    name: str
    vendor: Literal["nvidia", "amd"]
    aliases: list[str] = []
    nvml_names: list[str] = []
    memory_mib: float = Field(gt=0, le=_MAX_MIB)
    """Total memory as NVML / nvidia-smi reports it (MiB)."""
    cuda_total_memory_gib: float | None = Field(default=None, gt=0, le=_MAX_GIB)
    """Total that cudaMemGetInfo (torch, vLLM's total_gpu_memory) reports, when measured."""
    memory_bandwidth_gb_per_s: float = Field(gt=0, le=_MAX_GB_PER_S)
    bf16_dense_tflops: float | None = Field(default=None, gt=0, le=_MAX_TFLOPS)
    fp16_dense_tflops: float | None = Field(default=None, gt=0, le=_MAX_TFLOPS)
    fp8_dense_tflops: float | None = Field(default=None, gt=0, le=_MAX_TFLOPS)
    int8_dense_tops: float | None = Field(default=None, gt=0, le=_MAX_TFLOPS)
    fp4_dense_tflops: float | None = Field(default=None, gt=0, le=_MAX_TFLOPS)
    interconnect: Interconnect
    gpus_per_host: int | None = Field(default=None, ge=1)
    """GPUs one host (one OS, one Kubernetes node) holds, when fewer than the NVLink domain
    (GB200 NVL72: 4 per compute tray); None: the domain is one host."""
    network: Network | None = None
    """Scale-out network between NVLink domains; None: the GPU is planned within one domain."""
    price_per_hour_usd: float | None = Field(default=None, gt=0, le=_MAX_PRICE)
    source: dict[str, str]
    notes: str | None = None

    @model_validator(mode="after")
    def _check(self) -> GpuSpec:
        if self.bf16_dense_tflops is None and self.fp16_dense_tflops is None:
            raise ValueError("needs bf16_dense_tflops or fp16_dense_tflops")
        missing = [
            f for f in _GPU_NUMERIC if getattr(self, f) is not None and f not in self.source
        ]
        for f in ("network", "gpus_per_host"):
            if getattr(self, f) is not None and f not in self.source:
                missing.append(f)
        if missing:
            raise ValueError(f"numbers without a source entry: {', '.join(missing)}")
        return self

    @property
    def total_memory_bytes(self) -> float:
        """What the engine sees as total device memory (cudaMemGetInfo), in bytes."""
        if self.cuda_total_memory_gib is not None:
            return gib_to_bytes(self.cuda_total_memory_gib)
        return mib_to_bytes(self.memory_mib - DRIVER_RESERVED_MIB)

    @property
    def network_domain(self) -> int | None:
        """GPUs per NVLink domain when a scale-out network joins domains (a replica may span
        them), None when the GPU is planned within one domain (no `network:`)."""
        return self.interconnect.max_gpus_per_node if self.network is not None else None

    @property
    def host_gpus(self) -> int:
        """GPUs per host: a replica wider than this runs one engine process group per host."""
        return self.gpus_per_host or self.interconnect.max_gpus_per_node

    @property
    def hbm_bytes_per_s(self) -> float:
        return gb_per_s_to_bytes_per_s(self.memory_bandwidth_gb_per_s)

    def dense_flops_per_s(self, dtype: str) -> float:
        """Peak dense tensor-core rate for a compute dtype; falls back to the 16-bit rate."""
        half = self.bf16_dense_tflops or self.fp16_dense_tflops
        assert half is not None
        table = {
            "bf16": half, "fp16": self.fp16_dense_tflops or half, "fp32": half,
            "fp8": self.fp8_dense_tflops or half, "int8": self.int8_dense_tops or half,
            "fp4": self.fp4_dense_tflops or self.fp8_dense_tflops or half,
        }
        return tflops_to_flops_per_s(table.get(dtype, half))

    def supports(self, dtype: str) -> bool:
        """Whether the chip has native tensor cores for dtype (else it is emulated / upcast)."""
        field = {"fp8": "fp8_dense_tflops", "fp4": "fp4_dense_tflops", "int8": "int8_dense_tops"}
        return dtype not in field or getattr(self, field[dtype]) is not None


_GPU_NUMERIC = (
    "memory_mib", "cuda_total_memory_gib", "memory_bandwidth_gb_per_s", "bf16_dense_tflops",
    "fp16_dense_tflops", "fp8_dense_tflops", "int8_dense_tops", "fp4_dense_tflops",
    "price_per_hour_usd",
)


class Quantization(BaseModel):
    """How a checkpoint ships quantized (DeepSeek-V3 fp8 blocks, gpt-oss MXFP4 experts...)."""

    model_config = _STRICT
    format: Literal["fp8", "int8", "int4", "mxfp4", "nvfp4", "fp4"]
    modules: Literal["all_linear", "experts", "mlp"] = "all_linear"
    """Linear layers stored quantized: all, the routed experts only, or every MLP (dense,
    shared and routed) with the token mixers (attention, Mamba) left unquantized."""
    group_size: int | None = Field(default=None, ge=1)
    exclude: list[str] = []
    """Module names the checkpoint leaves unquantized, as its config lists them."""


class MoeSpec(BaseModel):
    model_config = _STRICT
    num_experts: _EXPERTS
    num_experts_per_tok: _EXPERTS
    moe_intermediate_size: _FFN
    num_shared_experts: int = Field(default=0, ge=0, le=L.MODEL_EXPERTS.hi)
    shared_expert_intermediate_size: int = Field(default=0, ge=0, le=L.MODEL_FFN.hi)
    """Intermediate width of each shared expert."""
    num_dense_layers: int = Field(default=0, ge=0)
    """Layers with a dense MLP instead of experts (DeepSeek first_k_dense_replace)."""
    n_group: int = Field(default=1, ge=1)
    """Expert groups of group-limited routing (config.json n_group; 1: none)."""
    topk_group: int = Field(default=1, ge=1)
    """Groups a token's experts may lie in (config.json topk_group; DeepSeek-V3: 4 of 8)."""


class MlaSpec(BaseModel):
    model_config = _STRICT
    kv_lora_rank: int = Field(ge=1)
    q_lora_rank: int | None = Field(default=None, ge=1)
    qk_rope_head_dim: int = Field(ge=1)
    qk_nope_head_dim: int = Field(ge=1)
    v_head_dim: int = Field(ge=1)
    index_n_heads: int | None = Field(default=None, ge=1)
    """DeepSeek sparse attention (V3.2) lightning indexer: heads, head dim, keys kept."""
    index_head_dim: int | None = Field(default=None, ge=1)
    index_topk: int | None = Field(default=None, ge=1)
    fp8_latent_bytes: int | None = Field(default=None, ge=1)
    """Bytes one token's latent takes per layer when the KV cache is fp8, where the architecture
    stores its own fp8 layout (DeepSeek-V3.2: 656, vLLM's fp8_ds_mla); None: (kv_lora_rank +
    qk_rope_head_dim) x 1 B."""


LayerKind = Literal["full_attention", "sliding_attention", "chunked_attention", "mamba",
                    "mamba2", "linear_attention", "short_conv", "none"]
"""Token mixer of one layer (vLLM KV cache spec it maps to: docs/architectures.md)."""
MlpKind = Literal["dense", "moe", "none"]


class SsmSpec(BaseModel):
    """Mamba / Mamba2 mixer dimensions (HF mamba_* / ssm_* fields)."""

    model_config = _STRICT
    version: Literal[1, 2] = 2
    num_heads: int = Field(default=1, ge=1)
    """Mamba2 heads (Mamba1: 1)."""
    head_dim: int = Field(ge=1)
    """Mamba2 head dim; Mamba1: the whole inner width."""
    state_size: int = Field(ge=1)
    n_groups: int = Field(default=1, ge=1)
    conv_kernel: int = Field(default=4, ge=2)
    dt_rank: int | None = Field(default=None, ge=1)
    """Mamba1 x_proj rank (None for Mamba2)."""

    @property
    def inner_size(self) -> int:
        return self.num_heads * self.head_dim


class LinearAttentionSpec(BaseModel):
    """Gated DeltaNet (Qwen3-Next, Qwen3.5) linear-attention dimensions."""

    model_config = _STRICT
    num_k_heads: int = Field(ge=1)
    num_v_heads: int = Field(ge=1)
    head_k_dim: int = Field(ge=1)
    head_v_dim: int = Field(ge=1)
    conv_kernel: int = Field(default=4, ge=2)


class VisionSpec(BaseModel):
    """A vision encoder (ViT + patch merger), from config.json `vision_config` and the image
    processor's preprocessor_config.json (Qwen2-VL / Qwen2.5-VL field names)."""

    model_config = _STRICT
    depth: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    patch_size: int = Field(ge=1)
    spatial_merge_size: int = Field(default=2, ge=1)
    temporal_patch_size: int = Field(default=2, ge=1)
    out_hidden_size: int = Field(ge=1)
    mlp_gated: bool = True
    window_size: int | None = Field(default=None, ge=1)
    """Window attention span in pixels (Qwen2.5-VL 112); None: every layer attends fully."""
    fullatt_block_indexes: list[int] = []
    """Layers with full attention when window_size is set."""
    min_pixels: int = Field(default=3136, ge=1)
    max_pixels: int = Field(default=12845056, ge=1)


class ModelSpec(BaseModel):
    """One model architecture, from model_catalog/<key>.yaml (fields as in HF config.json)."""

    model_config = _STRICT
    key: str
    name: str
    hf_id: str
    aliases: list[str] = []
    architecture: str
    torch_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    quantization: Quantization | None = None
    num_layers: _LAYERS
    hidden_size: _WIDTH
    intermediate_size: _FFN
    num_attention_heads: _HEADS
    num_kv_heads: _HEADS
    head_dim: _HEAD_DIM
    vocab_size: _VOCAB
    max_position_embeddings: _CONTEXT
    max_position_embeddings_by_id: dict[str, _CONTEXT] = {}
    """Checkpoints of this architecture whose config.json allows a different context (an
    Instruct release of 32768 next to a 131072 base), by Hugging Face id."""
    tie_word_embeddings: bool = False
    mlp_gated: bool = True
    hidden_act: str = "silu"
    layer_types: list[LayerKind] | None = None
    """Token mixer of each layer; None: full attention plus num_sliding_layers (layer_kinds)."""
    mlp_types: list[MlpKind] | None = None
    """MLP of each layer; None: dense, or MoE after moe.num_dense_layers."""
    mlp_intermediate_sizes: list[_FFN] | None = None
    """Dense MLP width of each layer when they differ (Nemotron-Super block_configs)."""
    ssm: SsmSpec | None = None
    linear_attention: LinearAttentionSpec | None = None
    conv_kernel: int | None = Field(default=None, ge=2)
    """Short-conv (LFM2) kernel length (conv_L_cache)."""
    ssm_state_dtype: Literal["bf16", "fp16", "fp32"] | None = None
    """Recurrent (SSM) state dtype; None: the model dtype (vLLM mamba_ssm_cache_dtype auto)."""
    attn_output_gate: bool = False
    """q_proj also emits a per-head output gate (Qwen3-Next, Qwen3.5)."""
    sliding_window: _CONTEXT | None = None
    num_sliding_layers: int = Field(default=0, ge=0)
    moe: MoeSpec | None = None
    mla: MlaSpec | None = None
    vision_params: float = Field(default=0, ge=0)
    vision: VisionSpec | None = None
    """The vision encoder's shape (image tokens and encoder cost); vision_params its size."""
    mtp_layers: int = Field(default=0, ge=0, le=L.MODEL_LAYERS.hi)
    """Multi-token-prediction layers the checkpoint holds (config num_nextn_predict_layers):
    what `--speculative mtp` drafts with (capplan/models/speculative.py)."""
    params_total: float = Field(gt=0)
    params_active: float = Field(gt=0)
    source: dict[str, str]
    notes: str | None = None

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.num_sliding_layers > self.num_layers:
            raise ValueError("num_sliding_layers exceeds num_layers")
        if self.num_sliding_layers and self.sliding_window is None:
            raise ValueError("num_sliding_layers set but sliding_window is null")
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError("num_attention_heads must be a multiple of num_kv_heads")
        if self.moe and self.moe.num_dense_layers > self.num_layers:
            raise ValueError("moe.num_dense_layers exceeds num_layers")
        for name, kinds in (("layer_types", self.layer_types), ("mlp_types", self.mlp_types),
                            ("mlp_intermediate_sizes", self.mlp_intermediate_sizes)):
            if kinds is not None and len(kinds) != self.num_layers:
                raise ValueError(f"{name} has {len(kinds)} entries for {self.num_layers} layers")
        kinds = set(self.layer_types or ())
        if kinds & {"mamba", "mamba2"} and self.ssm is None:
            raise ValueError("mamba layers need an ssm: section")
        if "linear_attention" in kinds and self.linear_attention is None:
            raise ValueError("linear_attention layers need a linear_attention: section")
        if "short_conv" in kinds and self.conv_kernel is None:
            raise ValueError("short_conv layers need conv_kernel")
        if self.layer_types is not None:
            windowed = sum(k in ("sliding_attention", "chunked_attention") for k in kinds)
            if windowed and self.sliding_window is None:
                raise ValueError("sliding/chunked layers need sliding_window")
            n_win = sum(k in ("sliding_attention", "chunked_attention") for k in self.layer_types)
            if n_win != self.num_sliding_layers:
                raise ValueError(f"num_sliding_layers is {self.num_sliding_layers} but layer_types "
                                 f"has {n_win} sliding/chunked layers")
        if "config" not in self.source:
            raise ValueError("source.config (where the architecture came from) is required")
        return self

    @property
    def dtype_bytes(self) -> float:
        return DTYPE_BYTES[self.torch_dtype]

    def context_len(self, max_model_len: int | None = None) -> int:
        """The context an engine serves: max_model_len when set, else the checkpoint's own
        max_position_embeddings (vLLM's default for --max-model-len)."""
        return max_model_len or self.max_position_embeddings

    @property
    def num_moe_layers(self) -> int:
        if self.mlp_types is not None:
            return sum(k == "moe" for k in self.mlp_types)
        return 0 if self.moe is None else self.num_layers - self.moe.num_dense_layers

    @property
    def layer_kinds(self) -> list[str]:
        """Mixer of each layer; without layer_types the sliding layers are counted, not placed."""
        if self.layer_types is not None:
            return list(self.layer_types)
        n = self.num_sliding_layers
        return ["full_attention"] * (self.num_layers - n) + ["sliding_attention"] * n

    @property
    def mlp_kinds(self) -> list[str]:
        if self.mlp_types is not None:
            return list(self.mlp_types)
        dense = self.num_layers if self.moe is None else self.moe.num_dense_layers
        return ["dense"] * dense + ["moe"] * (self.num_layers - dense)

    @property
    def is_hybrid(self) -> bool:
        """Holds a recurrent state per sequence (Mamba, linear attention, short conv layers)."""
        return any(k in RECURRENT_KINDS for k in self.layer_kinds)

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def is_multimodal(self) -> bool:
        return self.vision_params > 0
