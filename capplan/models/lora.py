"""LoRA adapters: the GPU slots' memory and the step cost of the adapters a batch uses.

Memory (vLLM `LoRAModelManager`, vllm/lora/layers/*.py `create_lora_weights`, v0.10): every
adapted linear layer allocates, for `max_loras` slots, lora_a of (max_lora_rank x input) and
lora_b of (output x max_lora_rank) in the model dtype, at model load (so vLLM's profiler counts
them as weights and the KV cache gets what is left). The adapted modules of a decoder layer are
vLLM's packed ones: qkv_proj and gate_up_proj (column parallel: lora_a whole, lora_b split by
TP, one pair per packed slice: vllm/lora/layers/column_parallel_linear.py
MergedQKVParallelLinearWithLoRA has n_slices = 3, one lora_a of (rank x input) per slice, and
MergedColumnParallelLinearWithLoRA 2 for gate_up), o_proj and down_proj (row parallel: lora_a
split by TP, lora_b whole). Per GPU, per slot and layer:
    qkv     3 r h + r (q + 2 kv) / tp        o     r q / tp + r h
    gate_up 2 r h + 2 r I / tp               down  r I / tp + r h
Adapters beyond the slots wait in the CPU cache (`--max-cpu-loras`, host memory, not modelled).

Step cost (Punica SGMV / BGMV kernels, Chen et al., "Punica: Multi-Tenant LoRA Serving",
MLSys 2024; vLLM vllm/lora/punica_wrapper): each step reads the A and B matrices of every
distinct adapter in its batch once (shrink then expand), does 2 r (in + out) FLOPs per token per
module, and launches a shrink and an expand kernel per module and layer. Distinct adapters among
S sequences drawing adapter i with probability p_i hold E = sum_i 1 - (1 - p_i)^S distinct
adapters, at most max_loras: the analytic queue prices a step with that expected count; the
simulator draws each request's adapter (`draw_adapters`), admits requests by vLLM's max_loras
rule (vllm/v1/core/sched/scheduler.py `Scheduler.schedule`: a waiting request of a further
adapter is skipped once max_loras distinct adapters run) and prices each step with its running
set's distinct adapters (capplan.sim.compiled). The step model takes the adapters in up to
LORA_GROUPS groups of equal probability: uniform popularity is one group (N adapters at 1/N);
Zipf (s = 1) over N adapters is split at log-spaced ranks (1, N^(1/4), N^(1/2), N^(3/4), N),
each group at its mean probability, which keeps E within 4.3% of the exact sum for N <= 1000
and any S (docs/features.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from capplan.errors import InputError

POPULARITIES = ("uniform", "zipf")
LORA_GROUPS = 4
"""Popularity groups the step model takes (module docstring: E within 4.3% of the exact sum)."""
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
    groups: tuple[tuple[float, float], ...]
    """LORA_GROUPS (adapters, probability of each) pairs; unused groups are (0, 0)."""
    num_layers: int

    @property
    def memory_bytes_per_gpu(self) -> float:
        return self.max_loras * self.slot_bytes_per_gpu


def slot_params_per_layer(model: Any, rank: int, tp: int) -> float:
    """Parameters of one adapter slot in one decoder layer on one GPU (module docstring)."""
    h, inter = model.hidden_size, model.intermediate_size
    q, kv = model.num_attention_heads * model.head_dim, model.num_kv_heads * model.head_dim
    kv_gpu = max(kv / tp, model.head_dim)  # KV heads replicate when TP exceeds them
    qkv = 3 * rank * h + rank * (q / tp + 2 * kv_gpu)  # n_slices = 3 lora_a (module docstring)
    o = rank * q / tp + rank * h
    slices = 2 if model.mlp_gated else 1
    gate_up = slices * rank * h + slices * rank * inter / tp
    down = rank * inter / tp + rank * h
    return qkv + o + gate_up + down


def adapter_groups(n: int, popularity: str) -> tuple[tuple[float, float], ...]:
    """The adapters as LORA_GROUPS (count, per-adapter probability) groups (module docstring)."""
    if popularity not in POPULARITIES:
        raise InputError(f"adapter popularity {popularity!r}: expected uniform or zipf")
    if popularity == "uniform" or n <= 1:
        groups = [(float(n), 1.0 / n)]
    else:
        z = sum(1.0 / i for i in range(1, n + 1))
        edges = sorted({0, *(round(n ** (g / LORA_GROUPS)) for g in range(1, LORA_GROUPS + 1))})
        groups = []
        for lo, hi in zip(edges[:-1], edges[1:], strict=True):
            ps = [1.0 / (i * z) for i in range(lo + 1, hi + 1)]
            groups.append((float(len(ps)), sum(ps) / len(ps)))
    groups += [(0.0, 0.0)] * (LORA_GROUPS - len(groups))
    return tuple(groups)


def step_groups(step: Any) -> list[tuple[float, float]]:
    """A step model's popularity groups (its lora_n1, lora_q1 .. lora_n4, lora_q4; the largest
    of each over a grid's configurations)."""
    return [(float(np.max(getattr(step, f"lora_n{g}", 0.0))),
             float(np.max(getattr(step, f"lora_q{g}", 0.0))))
            for g in range(1, LORA_GROUPS + 1)]


def draw_adapters(groups: Any, n: int, rng: np.random.Generator) -> np.ndarray:
    """n requests' adapters (ids 0..N-1, int32) drawn from popularity groups (`adapter_groups`:
    the count, probability pairs): group g's adapters take the next ids, each drawn with its
    group's probability (normalised: the groups' means sum to 1 up to rounding). The
    simulator's per-request adapters, the same popularity the step model's E[D] is taken
    over; -1 for every request when there are no adapters."""
    counts = [int(round(float(c))) for c, _ in groups]
    p = np.repeat([float(q) for _, q in groups], counts)
    if p.size == 0 or p.sum() <= 0:
        return np.full(n, -1, np.int32)
    return rng.choice(p.size, size=n, p=p / p.sum()).astype(np.int32)


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
                    groups=adapter_groups(n, settings.lora_popularity),
                    num_layers=layers)


def expected_distinct(seqs: float, groups: tuple[tuple[float, float], ...],
                      max_loras: float) -> float:
    """Expected distinct adapters among `seqs` sequences, capped at max_loras (the step model
    writes the same sum in capplan.models.perf.step_parts)."""
    return min(float(_distinct(seqs, groups)), max_loras)


def _distinct(seqs: Any, groups: Any) -> Any:
    """E[D(B)] = sum over groups of n (1 - (1 - q)^B), uncapped (arrays broadcast)."""
    return sum(n * (1.0 - (1.0 - q) ** seqs) for n, q in groups)
