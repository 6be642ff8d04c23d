"""The prefill step of DeepSeek-V3/R1 against the prefill throughput its operators published.

Run: .venv/bin/python benchmarks/published_prefill.py [--write-docs]

Each row is a published prefill deployment: its GPU, layout (attention DP x expert parallel, as
SGLang `--tp W --dp W --enable-dp-attention --ep W` and DeepSeek's "EP32, MLA and shared
expert DP32" run it), prompt length and tokens per GPU per step, and the input tokens per
second per GPU its authors measured. capplan's prefill step for exactly that layout
(`StepModel.step` with the step's prompts, whole, on every rank) gives tokens per step over step
time, per GPU; the parts say which term sets it. A second table takes the step's compute apart
against the kernels' own published rates. Nothing here is fitted to these figures.
`--write-docs` rewrites the blocks `published_prefill:deployments` and `:terms` of
docs/perf.md ("Prefill of DeepSeek-V3/R1 against published deployments").
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from docblocks import ROOT, write_block  # benchmarks/ is on sys.path when run as a script

from capplan.catalog.loader import load_catalog
from capplan.catalog.schema import GpuSpec
from capplan.models.calibration import default_calibration
from capplan.models.engine import EngineSettings
from capplan.models.layout import Links, ep_all_to_all, ep_all_to_all_normal
from capplan.models.perf import StepModel, build_step_model, chunk_attention, step_parts

DOC = ROOT / "docs" / "perf.md"
SGLANG_H100 = "SGLang, H100 (lmsys.org 2025-05-05)"
DEEPSEEK_PROFILE = "DeepSeek profile, H800"
SGLANG_GB200 = "SGLang, GB200 (lmsys.org 2025-09-25)"


@dataclass(frozen=True)
class Deployment:
    source: str
    gpu: str
    ranks: int
    """Attention-DP ranks of one GPU each, the experts sharded over all of them (EP = ranks)."""
    isl: int
    tokens_per_gpu: int
    """Prompt tokens per GPU per step (whole prompts of `isl` tokens)."""
    published: float
    """Input tokens per second per GPU, as published (per node / 8 where given per node)."""
    note: str


DEPLOYMENTS = [
    # lmsys.org/blog/2025-05-05-large-scale-ep ("Prefill Phase: On 4 nodes (4x8xH100, EP32),
    # ... 57,674, 54,543, and 50,302 tokens per second for prompt lengths of 1K, 2K, and 4K";
    # 16,384 tokens per device: "Overall Throughput"; EPLB with a distribution matching the
    # data, two-batch overlap, DeepEP normal mode, DeepGEMM).
    Deployment(SGLANG_H100, "h100-sxm", 32, 1024, 16384, 57674 / 8, "EPLB, TBO"),
    Deployment(SGLANG_H100, "h100-sxm", 32, 2048, 16384, 54543 / 8, "EPLB, TBO"),
    Deployment(SGLANG_H100, "h100-sxm", 32, 4096, 16384, 50302 / 8, "EPLB, TBO"),
    # same post, "SGLang + Simulated Perfect EPLB": 59,337 per node
    Deployment(SGLANG_H100, "h100-sxm", 32, 4096, 16384, 59337 / 8,
               "simulated perfect balance, TBO"),
    # github.com/deepseek-ai/profile-data README ("EP32 and TP1 ... prompt length set to 4K and
    # a batch size of 16K tokens per GPU ... two micro-batches", balanced routing); 62,713 per
    # node is the SGLang post's reading of that trace ("DeepSeek Profile").
    Deployment(DEEPSEEK_PROFILE, "h800", 32, 4096, 16384, 62713 / 8,
               "balanced routing, TBO"),
    # lmsys.org/blog/2025-09-25-gb200-part-2: "BF16 for attention and FP8 for GEMM ... 18,471
    # input ... tokens per second" per GPU, 2,000-token inputs, "for prefill, we use 4 ranks
    # per instance for high-precision"; tokens per rank not stated: the 16,384 of the H100
    # scripts (--chunked-prefill-size 524288 over 32 ranks, sglang issue 6017).
    Deployment(SGLANG_GB200, "gb200", 4, 2000, 16384, 18471,
               "4 ranks, fine-grained overlap; tokens per rank assumed"),
]

DEEPSEEK_DAY = (73_700, 0.563)
"""DeepSeek's "Inference System Overview" (open-infra-index, day 6): 73.7k input tokens per
second per H800 node over a day's prefill, 56.3% of them prefix-cache hits that run no prefill:
73.7k x 0.437 = 32.2k computed tokens per node, a day's mean at its loads (not a full step)."""


def h800(cat) -> GpuSpec:  # noqa: ANN001
    """The H800: the H100 SXM's chips and HBM with its NVLink cut to 400 GB/s both ways
    (DeepEP docs/legacy.md: "H800 (~160 GB/s NVLink maximum bandwidth)", one CX7 400 Gb/s
    NIC per GPU); not in the catalog, which plans the GPUs one can buy."""
    h = cat.gpu("h100-sxm")
    return h.model_copy(update={
        "key": "h800", "name": "NVIDIA H800 SXM5 (H100 SXM with 400 GB/s NVLink)",
        "interconnect": h.interconnect.model_copy(update={"bandwidth_gb_per_s": 200.0})})


def step_model(cat, d: Deployment) -> StepModel:  # noqa: ANN001
    gpu = h800(cat) if d.gpu == "h800" else cat.gpu(d.gpu)
    s = EngineSettings(tp=1, attention_dp=d.ranks, expert_parallel=d.ranks, engine="sglang",
                       weight_dtype="fp8", max_model_len=d.isl + 1, max_num_seqs=1024,
                       max_num_batched_tokens=d.tokens_per_gpu)
    return build_step_model(cat.model("deepseek-v3"), gpu, s)


PARTS = ("step", "dense_mem", "expert_mem", "kv_mem", "dense_cmp", "expert_cmp", "attn_cmp",
         "comm", "p2p", "overhead", "pp")


def parts(sm: StepModel, d: Deployment) -> dict[str, float]:
    """capplan's prefill step of the deployment (the whole replica's batch): its parts, s."""
    seqs = d.tokens_per_gpu / d.isl * d.ranks
    pairs = chunk_attention(float(d.isl), 0.0, 2.0**62)[0] * seqs
    x = (0.0, 0.0, 0.0, float(d.tokens_per_gpu * d.ranks), pairs, pairs, 0.0, 0.0, seqs, seqs)
    out = step_parts(x, sm.constants(), True)
    return {k: float(v) for k, v in zip(PARTS, out, strict=True)}


def per_gpu(d: Deployment, step_s: float) -> float:
    return d.tokens_per_gpu / step_s


def deployments_table() -> str:
    cat = load_catalog()
    lines = ["| source | GPU | ranks (DP = EP) | prompt | tokens per GPU per step | "
             "published tok/s per GPU | capplan tok/s per GPU | capplan / published | "
             "without EP comm | capplan step: dense GEMMs / expert GEMMs / attention / "
             "EP comm / fixed (ms) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for d in DEPLOYMENTS:
        p = parts(step_model(cat, d), d)
        pred = per_gpu(d, p["step"])
        no_comm = per_gpu(d, p["step"] - p["comm"])
        lines.append(
            f"| {d.source}: {d.note} | {d.gpu} | {d.ranks} | {d.isl:,} | {d.tokens_per_gpu:,} "
            f"| {d.published:,.0f} | {pred:,.0f} | {pred / d.published:.2f} | "
            f"{no_comm:,.0f} ({no_comm / d.published:.2f}) | {p['dense_cmp'] * 1e3:,.0f} / "
            f"{max(p['expert_cmp'], p['expert_mem']) * 1e3:,.0f} / {p['attn_cmp'] * 1e3:,.0f} / "
            f"{p['comm'] * 1e3:,.0f} / {p['overhead'] * 1e3:,.0f} |")
    node, hit = DEEPSEEK_DAY
    lines.append(f"\nDeepSeek's production day (H800, EP32 prefill units): {node:,} input tokens "
                 f"per second per node with {hit:.1%} prefix-cache hits, "
                 f"{node * (1 - hit) / 8:,.0f} computed tokens per second per GPU: a day's mean "
                 "at its loads, below its profile's full step (the table's H800 row), so not "
                 "scored as a step.")
    return "\n".join(lines) + "\n"


# DeepGEMM README (deepseek-ai/DeepGEMM, H800, the DeepSeek-V3 shapes at M = 4096 rows): FP8
# TFLOP/s of each dense projection (N, K) and of the grouped contiguous-layout expert GEMMs.
DEEPGEMM_DENSE = ((2112, 7168, 1058), (24576, 1536, 990), (32768, 512, 590), (7168, 16384, 1358),
                  (4096, 7168, 1304), (7168, 2048, 1025))
"""q_a + kv_a, q_b, kv_b, o_proj, shared-expert gate-up, shared-expert down."""
DEEPGEMM_GROUPED = ((4096, 7168, 1297), (7168, 2048, 1099))
"""routed experts' gate-up and down (4 groups of 8,192 rows)."""
TBO_COMPUTE_SMS = 108 / 132
"""Two-batch overlap: the computation stream runs on 108 of the H800's 132 SMs while DeepEP's
normal kernels hold 24 (deepseek-ai/profile-data assets/prefill.jpg; DeepEP's example
`Buffer.set_num_sms(24)`)."""
EPLB_DEFAULT_OVER_PERFECT = 59337 / 50302
"""SGLang's H100 EP32 prefill at 4K: simulated perfect balance over its EPLB placement."""


def flop_weighted_rate(shapes: tuple[tuple[int, int, int], ...]) -> float:
    """TFLOP/s of a sequence of GEMMs of the same rows: total FLOPs over total time."""
    return sum(n * k for n, k, _ in shapes) / sum(n * k / r for n, k, r in shapes)


def terms_table() -> str:
    """The H800 profile's step (the clean case: balanced routing) term by term against the
    kernels' published rates."""
    cat = load_catalog()
    d = next(x for x in DEPLOYMENTS if x.gpu == "h800")
    sm = step_model(cat, d)
    p = parts(sm, d)
    t = d.tokens_per_gpu
    us = 1e6 / t  # seconds per step -> microseconds per token
    gemm = sm.gemm_flops_per_s / 1e12
    dense_rate, grouped_rate = flop_weighted_rate(DEEPGEMM_DENSE), flop_weighted_rate(
        DEEPGEMM_GROUPED)
    dense_us = p["dense_cmp"] * us * gemm / dense_rate
    expert_us = p["expert_cmp"] * us * gemm / grouped_rate
    attn_us, fixed_us = p["attn_cmp"] * us, p["overhead"] * us
    compute_us = (dense_us + expert_us + attn_us + fixed_us) / TBO_COMPUTE_SMS
    # DeepEP's normal kernels send a token once to each node holding one of its experts and
    # forward it over NVLink there (models/layout.py ep_all_to_all_normal: capplan's prefill
    # step); the low-latency kernels of decode steps send every remote copy.
    gpu = h800(cat)
    cal = default_calibration(gpu)
    links = Links(gpu.interconnect.bytes_per_s * cal.allreduce_bw_frac, cal.allreduce_latency_s,
                  gpu.network.bytes_per_s * cal.allreduce_bw_frac, gpu.network.latency_s,
                  gpu.interconnect.max_gpus_per_node)
    moe = cat.model("deepseek-v3").moe
    normal = ep_all_to_all_normal(7168, moe, d.ranks, links)
    low = ep_all_to_all(7168, moe.num_experts_per_tok, d.ranks, links)
    layers = sm.num_moe_layers
    node_us = layers * normal.s_per_token_per_gpu * 1e6
    copy_us = layers * low.s_per_token_per_gpu * 1e6
    published_us = 1e6 / d.published
    rows = [
        ("dense GEMMs (fp8)", p["dense_cmp"] * us, dense_us,
         f"DeepGEMM on the six projections' shapes: {dense_rate:,.0f} TFLOP/s against capplan's "
         f"{gemm:,.0f}"),
        ("expert GEMMs (fp8, grouped)", p["expert_cmp"] * us, expert_us,
         f"DeepGEMM contiguous grouped GEMMs: {grouped_rate:,.0f} TFLOP/s"),
        ("attention (MLA in MHA form, bf16)", attn_us, attn_us, "capplan's rate kept"),
        ("fixed costs", fixed_us, fixed_us, "capplan's kept"),
        ("computation stream", (p["step"] - p["comm"]) * us, compute_us,
         f"two-batch overlap: computation on {TBO_COMPUTE_SMS:.3f} of the SMs"),
        ("EP dispatch + combine", p["comm"] * us, node_us,
         f"DeepEP normal mode: {normal.network_copies:.2f} remote nodes per token (the "
         f"low-latency kernels' {low.network_copies:.0f} remote copies: {copy_us:.0f} us); "
         "overlapped by the two-batch overlap, added by capplan"),
        ("step", p["step"] * us, max(compute_us, node_us),
         "capplan: the sum; the kernels' rates: the larger of the two streams"),
    ]
    lines = ["| term (per prompt token, one GPU) | capplan (us) | at the kernels' published "
             "rates (us) | source of the rate |", "|---|---|---|---|"]
    lines += [f"| {name} | {a:.1f} | {b:.1f} | {src} |" for name, a, b, src in rows]
    lines.append(f"| measured (DeepSeek's profile, balanced routing) | - | {published_us:.1f} | "
                 f"62,713 tokens/s per node |")
    lines.append(f"\nSGLang's EPLB placement over its simulated perfect balance at the same "
                 f"layout: {EPLB_DEFAULT_OVER_PERFECT:.2f}x the step.")
    return "\n".join(lines) + "\n"


TABLES = {"published_prefill:deployments": deployments_table,
          "published_prefill:terms": terms_table}


def main() -> None:
    for key, make in TABLES.items():
        text = make()
        print(text)
        if "--write-docs" in sys.argv:
            write_block(DOC, key, text)


if __name__ == "__main__":
    main()
