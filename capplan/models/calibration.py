"""The few efficiencies and overheads the step-time model needs, and their datasheet defaults.

A calibration is plain frozen data. `default_calibration(gpu)` derives one from the datasheet
with factors justified in docs/perf.md from public measurements; the probe (capplan calibrate)
writes measured ones, loaded by capplan/catalog/calibration.py.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from capplan.catalog.schema import GpuSpec


@dataclass(frozen=True)
class Calibration:
    """Achieved fractions of datasheet peaks, and fixed costs, for one GPU type."""

    mem_bw_frac: float
    """Achieved fraction of peak HBM bandwidth when streaming weights and KV (0-1]."""
    gemm_frac: float
    """Achieved fraction of peak 16-bit dense tensor FLOP/s for large matrix products."""
    gemm_frac_low_precision: float
    """Same for fp8/int8/fp4 products (FP8 GEMMs reach a lower fraction of their peak)."""
    gemm_half_tokens: float
    """Tokens (rows) at which a skinny product reaches half the large-product efficiency."""
    attn_frac: float
    """Achieved fraction of peak 16-bit FLOP/s in prefill attention (FlashAttention)."""
    attn_bw_frac: float
    """Achieved fraction of peak bandwidth reading the KV cache in decode attention."""
    per_layer_overhead_s: float
    """Fixed GPU cost per decoder layer per step: ~10 small kernels (norms, rope, activation,
    cache writes) whose launch gaps and tails do not shrink with batch."""
    allreduce_latency_s: float
    """Latency of one small all-reduce across the TP group."""
    allreduce_bw_frac: float
    """Achieved fraction of the interconnect's per-direction bandwidth in all-reduce."""
    step_overhead_s: float | None = None
    """Fixed cost per engine step: scheduling, input preparation, launches, sampling. None: the
    engine profile's host cost (EngineProfile.step_overhead_s); a measurement replaces it."""
    per_seq_overhead_s: float | None = None
    """Cost per running sequence per step (sampling, output processing). None: the engine
    profile's."""
    request_overhead_s: float | None = None
    """Per-request latency outside engine steps (tokenisation, HTTP, streaming), added to TTFT
    and E2E. None: the engine profile's default (`capplan calibrate --endpoint` measures it)."""
    expert_bw_frac: float = 0.0
    """Achieved fraction of peak bandwidth streaming routed-expert weights (fused MoE kernels,
    few tokens per expert); 0 = same as mem_bw_frac."""
    expert_gemm_frac: float = 1.0
    """Rate of quantized routed experts' grouped GEMMs (fused MoE with fp8/fp4/int4 weights)
    as a fraction of the dense GEMMs' (`gemm_frac` x peak); 16-bit experts always run at the
    dense rate. Published fused-MoE kernel timings at prefill sizes reach 0.14-0.46 of it, but
    with the engines' fitted host costs and request overheads the silicon rows' held-out TTFT
    is worse below 1 (docs/perf.md, "Routed experts at prefill"): a measured calibration may
    set it."""
    per_moe_layer_overhead_s: float = 21e-6
    """Fixed GPU cost per MoE layer per step beyond the dense layer's: the fused-MoE path runs
    ~7 more small kernels (router GEMM, top-k, align/permute, two grouped GEMMs, activation,
    reduce) at the ~3 us launch/tail each that per_layer_overhead_s counts."""
    spec_acceptance_length: float | None = None
    """Mean tokens per speculative step the server measured (1 + accepted / drafts, from its
    spec-decode counters: capplan/probe/spec_metrics.py); None: the published default for the
    method and workload kind. --acceptance-length overrides it."""
    source: str = "default"
    """'default (datasheet)' or the calibration file it came from."""
    engine: str | None = None
    """The engine profile a serving calibration was fitted through (its file's
    measured.engine, e.g. 'vllm 0.14'); None for microbenchmarks and defaults."""
    model: str | None = None
    """The catalog model a serving calibration's levels were measured with (its file's
    measured.model); None for microbenchmarks, defaults and files that do not say."""

    def with_(self, **changes: float | str) -> Calibration:
        return replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def param_names(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name not in ("source", "engine", "model")]


# Defaults from public measurements (docs/perf.md, docs/research/published_perf.md):
#  - bandwidth: decode streams weights and KV (read-only). Read-only "Dot" reaches 3.18 of 3.35
#    TB/s on H100 (95%), copy 2.90 (87%); H200 copy 84-86%, GB200 92%; A100-80GB copy 79-83%.
#    Skinny GEMMs stream a little below pure reads: 0.88 for HBM3/HBM3e parts, 0.83 for
#    HBM2e/GDDR parts and AMD (MI300X ~81% reported, unverified).
#  - GEMM: microbenchmarks reach H100 bf16 794.5 of 989 (80%), A100 bf16 271 of 312 (87%),
#    H100 fp8 1290-1403 of 1979 (65-71%), MI300X bf16 668-782 of 1307 (51-60%): 0.78 / 0.68
#    NVIDIA, 0.55 / 0.48 AMD. (Single-request fp8 prefill in TensorRT-LLM v0.5 reached only
#    33-39% of peak, but vLLM's mixed steps on H200 sustain ~67% in the AIConfigurator data:
#    the large-GEMM rate is the better default for serving; docs/validation.md.)
#  - prefill attention: FlashAttention-2 reaches 50-73% of A100 peak (Dao 2023, fig. 4) but only
#    33% on H100 (328 TFLOP/s, Azure guide); vLLM V1 runs FlashAttention-3 on Hopper, which
#    reaches ~75% (Shah et al. 2024): 0.55 as a common default.
#  - per-step and per-sequence host costs belong to the engine (EngineProfile: scheduler,
#    input preparation, sampler, output processing); per-layer GPU fixed cost: ~10 kernels x
#    ~3 us launch/tail inside a CUDA graph = 30 us.
#  - routed experts stream at mem_bw_frac by default (expert_bw_frac 0). A single factor does
#    not fit the public points: 0.6 of the dense rate closes Qwen3-30B-A3B's batch-1 TPOT gap
#    on A100 (#31, fine-grained experts) but over-predicts Mixtral-8x7B on H200 by 30% (#23,
#    large experts); docs/validation.md keeps the MoE TPOT miss visible instead.
_HBM3_BW_FRAC = 0.88
_OTHER_BW_FRAC = 0.83


def default_calibration(gpu: GpuSpec) -> Calibration:
    """Datasheet-derived calibration for a GPU with no measured calibration file."""
    hbm3 = gpu.vendor == "nvidia" and (gpu.fp8_dense_tflops is not None) and (
        gpu.memory_bandwidth_gb_per_s >= 3000)
    amd = gpu.vendor == "amd"
    kind = gpu.interconnect.kind
    nvlink = kind.startswith("nvlink") or kind == "infinity-fabric"
    return Calibration(
        mem_bw_frac=_HBM3_BW_FRAC if hbm3 else _OTHER_BW_FRAC,
        gemm_frac=0.55 if amd else 0.78,
        gemm_frac_low_precision=0.48 if amd else 0.68,
        gemm_half_tokens=32.0,
        attn_frac=0.55,
        attn_bw_frac=_HBM3_BW_FRAC * 0.9 if hbm3 else _OTHER_BW_FRAC * 0.9,
        per_layer_overhead_s=30e-6,
        allreduce_latency_s=8e-6 if nvlink else 25e-6,
        allreduce_bw_frac=0.7,
        source="default (datasheet x published efficiency factors, docs/perf.md)",
    )
