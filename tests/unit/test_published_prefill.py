"""capplan's prefill step of DeepSeek-V3 at DeepSeek's published prefill layout, written out by
hand (benchmarks/published_prefill.py compares it with the published throughput:
docs/perf.md, "Prefill of DeepSeek-V3/R1 against published deployments").

The layout: EP32, MLA and shared experts DP32, one GPU per rank (deepseek-ai/profile-data
README), 16,384 prompt tokens per GPU of 4,096-token prompts, fp8 weights, H800 (an H100 SXM
with 400 GB/s NVLink).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
P = importlib.import_module("published_prefill")

from capplan.catalog.loader import load_catalog  # noqa: E402

RANKS, ISL, TOKENS = 32, 4096, 16384
H, Q_LORA, KV_LORA, ROPE, NOPE, V, HEADS = 7168, 1536, 512, 64, 128, 128, 128
LAYERS, MOE_LAYERS, INTER, MOE_INTER, EXPERTS, TOP_K, VOCAB = 61, 58, 18432, 2048, 256, 8, 129280
FP8_PEAK, BF16_PEAK = 1978.9e12, 989.4e12  # H100/H800 SXM dense tensor FLOP/s (catalog)


@pytest.fixture(scope="module")
def step() -> tuple:
    cat = load_catalog()
    d = next(x for x in P.DEPLOYMENTS if x.gpu == "h800")
    assert (d.ranks, d.isl, d.tokens_per_gpu) == (RANKS, ISL, TOKENS)
    return d, P.parts(P.step_model(cat, d), d)


def test_compute_terms_by_hand(step: tuple) -> None:
    """Each GPU's dense GEMMs, expert GEMMs and attention, from DeepSeek-V3's config.json:
    the GEMMs at the fp8 rate 0.68 x peak, skinny-GEMM efficiency T / (T + 32), attention at
    0.55 x the bf16 peak (docs/perf.md defaults)."""
    _, p = step
    mla = (H * Q_LORA + Q_LORA * HEADS * (NOPE + ROPE) + H * (KV_LORA + ROPE)
           + KV_LORA * HEADS * (NOPE + V) + HEADS * V * H + Q_LORA + KV_LORA)  # + its 2 norms
    dense = (LAYERS * mla + 3 * 3 * H * INTER + MOE_LAYERS * 3 * H * MOE_INTER
             + MOE_LAYERS * H * EXPERTS)  # attention, 3 dense MLPs, shared experts, routers
    seqs = TOKENS / ISL  # prompts per GPU, each sampling one token through the LM head
    rate = FP8_PEAK * 0.68
    dense_s = (TOKENS * 2 * dense + seqs * 2 * VOCAB * H) / (rate * TOKENS / (TOKENS + 32))
    assert p["dense_cmp"] == pytest.approx(dense_s, rel=1e-9)
    # every token's 8 expert copies spread over 32 GPUs: 16,384 x 8 / 8 experts per GPU rows
    rows = TOKENS * RANKS * TOP_K / EXPERTS
    expert_s = TOKENS * 2 * MOE_LAYERS * TOP_K * 3 * H * MOE_INTER / (rate * rows / (rows + 32))
    assert p["expert_cmp"] == pytest.approx(expert_s, rel=1e-6)
    pairs = seqs * ISL * (ISL + 1) / 2  # causal
    attn_s = LAYERS * pairs * 2 * HEADS * (NOPE + ROPE + V) / (BF16_PEAK * 0.55)
    assert p["attn_cmp"] == pytest.approx(attn_s, rel=1e-9)
    # 0.37 + 0.50 + 0.31 s for 16,384 tokens: 72 us per token; DeepSeek's profile measures
    # 8 x 16,384 / 62,713 per node = 2.09 s a step, 128 us a token
    assert (dense_s + expert_s + attn_s) / TOKENS == pytest.approx(72.0e-6, rel=0.01)


def test_ep_traffic_by_hand(step: tuple) -> None:
    """The EP term of a prefill step (models/layout.py ep_all_to_all_normal, DeepEP's normal
    kernels): a token crosses the NIC once per other node holding one of its experts, FP8 out
    with a 4-byte scale per 128 channels, BF16 back, at 0.7 x 50 GB/s; each GPU sends its
    16,384 tokens. 4 nodes of 2 expert groups, 4 groups of 8 per token: a node is missed with
    probability C(6,4) / C(8,4) = 15/70. The NVLink forwarding (28 GPUs x 0.5 x (1 - C(24,2) /
    C(32,2)) = 6.21 copies at 0.7 x 200 GB/s: 0.96 us a layer) is under the NIC's 1.46 us."""
    _, p = step
    per_copy = H * (1 + 4 / 128) + 2 * H
    remote = 3 * (1 - 15 / 70)
    comm = MOE_LAYERS * (2 * 10e-6 + TOKENS * remote * per_copy / (0.7 * 50e9))
    assert p["comm"] == pytest.approx(comm, rel=1e-9)
    nvlink = 28 * 0.5 * (1 - 276 / 496) * per_copy / (0.7 * 200e9)
    assert nvlink < remote * per_copy / (0.7 * 50e9)
    # 84.9 us per prompt token, against 216.0 us were every remote copy sent (low-latency)
    assert comm / TOKENS == pytest.approx(84.9e-6, rel=0.002)


def test_deepgemm_rates_are_flop_weighted() -> None:
    """Gate-up (N 4096, K 7168) at 1,297 and down (N 7168, K 2048) at 1,099 TFLOP/s: the
    gate-up has twice the down's FLOPs, so 3 / (2 / 1297 + 1 / 1099)."""
    assert P.flop_weighted_rate(P.DEEPGEMM_GROUPED) == pytest.approx(3 / (2 / 1297 + 1 / 1099))
