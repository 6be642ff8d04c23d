"""LoRA adapters: the GPU slots' memory and the step cost of the adapters a batch uses.

Memory (vLLM `LoRAModelManager`, vllm/lora/layers/*.py `create_lora_weights`, v0.10): every
adapted linear layer allocates, for `max_loras` slots, lora_a of (max_lora_rank x input) and
lora_b of (output x max_lora_rank) in the model dtype, at model load (so vLLM's profiler counts
them as weights and the KV cache gets what is left). The adapted modules of a decoder layer are
vLLM's packed ones: qkv_proj and gate_up_proj (column parallel: lora_a whole, lora_b split by
TP, one pair per packed slice), o_proj and down_proj (row parallel: lora_a split by TP, lora_b
whole). Per GPU, per slot and layer:
    qkv     r h + r (q + 2 kv) / tp          o     r q / tp + r h
    gate_up 2 r h + 2 r I / tp               down  r I / tp + r h
Adapters beyond the slots wait in the CPU cache (`--max-cpu-loras`, host memory, not modelled).

Step cost (Punica SGMV / BGMV kernels, Chen et al., "Punica: Multi-Tenant LoRA Serving",
MLSys 2024; vLLM vllm/lora/punica_wrapper): each step reads the A and B matrices of every
distinct adapter in its batch once (shrink then expand), does 2 r (in + out) FLOPs per token per
module, and launches a shrink and an expand kernel per module and layer. Distinct adapters among
S sequences drawing adapter i with probability p_i: E = sum_i 1 - (1 - p_i)^S (at most
max_loras: vLLM schedules no more distinct adapters per step). A Zipf (s = 1) popularity over N
adapters is replaced by the uniform one over exp(H) adapters of the same entropy (its
perplexity), so E = n (1 - (1 - 1/n)^S) with one constant; docs/features.md states the error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from capplan.errors import InputError

POPULARITIES = ("uniform", "zipf")
LORA_KERNELS_PER_LAYER = 8
"""A shrink and an expand kernel for each of qkv, o, gate_up and down (punica_wrapper)."""


@dataclass(frozen=True)
class LoraPlan:
    """Resolved LoRA settings: bytes per slot per GPU and the batch's adapter statistics."""

    max_loras: int
    max_lora_rank: int
    slot_bytes_per_gpu: float
    """One adapter slot's A and B matrices, all layers, on one GPU."""
    flops_per_token: float
    """Extra FLOPs per token on one GPU (shrink + expand, every adapted module)."""
    effective_adapters: float
    """Adapters a batch draws from, uniform-equivalent (exp of the popularity's entropy)."""
    num_layers: int

    @property
    def memory_bytes_per_gpu(self) -> float:
        return self.max_loras * self.slot_bytes_per_gpu


def slot_params_per_layer(model: Any, rank: int, tp: int) -> float:
    """Parameters of one adapter slot in one decoder layer on one GPU (module docstring)."""
    h, inter = model.hidden_size, model.intermediate_size
    q, kv = model.num_attention_heads * model.head_dim, model.num_kv_heads * model.head_dim
    kv_gpu = max(kv / tp, model.head_dim)  # KV heads replicate when TP exceeds them
    qkv = rank * h + rank * (q / tp + 2 * kv_gpu)
    o = rank * q / tp + rank * h
    slices = 2 if model.mlp_gated else 1
    gate_up = slices * rank * h + slices * rank * inter / tp
    down = rank * inter / tp + rank * h
    return qkv + o + gate_up + down


def effective_adapters(n: int, popularity: str) -> float:
    """Uniform-equivalent adapter count: n for uniform; exp(entropy) of Zipf(s=1) over n."""
    if popularity not in POPULARITIES:
        raise InputError(f"adapter popularity {popularity!r}: expected uniform or zipf")
    if popularity == "uniform" or n <= 1:
        return float(n)
    w = [1.0 / i for i in range(1, n + 1)]
    z = sum(w)
    return math.exp(-sum(x / z * math.log(x / z) for x in w))


def plan_lora(model: Any, settings: Any, dtype_bytes: float) -> LoraPlan | None:
    """The LoraPlan of engine settings (None when max_loras is 0)."""
    n_slots = int(settings.max_loras or 0)
    if n_slots == 0:
        return None
    rank = int(settings.max_lora_rank)
    # vLLM LoRAConfig: max_lora_rank one of 1, 8, 16, 32, 64, 128, 256, 320, 512.
    if n_slots < 0 or rank not in (1, 8, 16, 32, 64, 128, 256, 320, 512):
        raise InputError(f"--max-loras {n_slots} --max-lora-rank {rank}: max_loras must be >= 0 "
                         "and the rank one of 1, 8, 16, 32, 64, 128, 256, 320, 512 (vLLM)")
    if model.moe is not None or model.mla is not None or model.is_hybrid:
        raise InputError(f"LoRA on {model.key}: only dense attention models are modelled")
    n = int(settings.lora_adapters or n_slots)
    per_layer = slot_params_per_layer(model, rank, settings.tp)
    layers = math.ceil(model.num_layers / settings.pp)
    return LoraPlan(max_loras=n_slots, max_lora_rank=rank,
                    slot_bytes_per_gpu=per_layer * layers * dtype_bytes,
                    flops_per_token=2 * per_layer * layers,
                    effective_adapters=effective_adapters(n, settings.lora_popularity),
                    num_layers=layers)


def expected_distinct(seqs: Any, adapters: float, max_loras: float) -> Any:
    """Expected distinct adapters among `seqs` sequences (module docstring), capped at
    max_loras. Python floats or numpy arrays (numba-safe operations only)."""
    n = adapters * 1.0
    safe = n + (n <= 0) * 1.0
    distinct = n * (1.0 - (1.0 - 1.0 / safe) ** seqs)
    return distinct * (distinct < max_loras) + max_loras * (distinct >= max_loras)
