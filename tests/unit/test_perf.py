"""capplan.models.perf against step times computed by hand (arithmetic in the comments).

The calibrations here are built explicitly so that one term of the roofline is isolated:
an "ideal" one (full bandwidth, no overheads, GEMMs and attention effectively free) leaves only
bytes / bandwidth; others make one term dominate by many orders of magnitude. The expected
numbers come from the model's config.json shapes and the GPU datasheet, never from the code.

Relative tolerance 1e-6 unless stated: the suppressed terms are at most ~1e-8 of the kept ones
(smooth max of (a, b) with b/a = r exceeds a by a factor (1 + r^4)^(1/4) - 1 ~ r^4 / 4).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from capplan.models.calibration import Calibration
from capplan.models.engine import EngineSettings
from capplan.models.perf import build_step_model, knee_batch, smooth_max

REL = 1e-6
A100_BW = 2039e9  # B/s, a100-sxm-80gb datasheet (decimal GB/s)
A100_BF16 = 312e12  # dense bf16 FLOP/s
A100_LINK = 300e9  # NVLink3, B/s per direction

# Llama-3.1-8B (config.json: hidden 4096, 32 layers, 32 heads, 8 KV heads, head_dim 128,
# intermediate 14336, vocab 128256, untied LM head), parameters by kind at TP=1:
LLAMA_ATTN = 32 * (2 * 4096 * 32 * 128 + 2 * 4096 * 8 * 128)  # q,o + k,v = 1,342,177,280
LLAMA_MLP = 32 * 3 * 4096 * 14336  # gate, up, down = 5,637,144,576
LLAMA_NORMS = (2 * 32 + 1) * 4096  # 266,240
LLAMA_HEAD = 128256 * 4096  # 525,336,576 (the embedding table is only indexed, never streamed)
# Bytes streamed by one bf16 step: (1,342,177,280 + 5,637,144,576 + 266,240 + 525,336,576) * 2
LLAMA_STEP_BYTES = 15_009_849_344
LLAMA_KV_PER_TOKEN = 131_072  # 2 (K,V) * 32 layers * 8 heads * 128 * 2 B


def ideal(**changes: float) -> Calibration:
    """Full bandwidth, no fixed costs, compute ~free (1e9 x the datasheet), GEMMs at full
    efficiency from one row, free all-reduces."""
    base = Calibration(
        mem_bw_frac=1.0, gemm_frac=1e9, gemm_frac_low_precision=1e9, gemm_half_tokens=0.0,
        attn_frac=1e9, attn_bw_frac=1.0, step_overhead_s=0.0, per_seq_overhead_s=0.0,
        per_layer_overhead_s=0.0, allreduce_latency_s=0.0, allreduce_bw_frac=1e9,
        per_moe_layer_overhead_s=0.0,
        source="test ideal")
    return base.with_(**changes)


@pytest.fixture(scope="module")
def llama(catalog):
    return catalog.models["llama-3.1-8b"]


@pytest.fixture(scope="module")
def mixtral(catalog):
    return catalog.models["mixtral-8x7b"]


@pytest.fixture(scope="module")
def a100(catalog):
    return catalog.gpus["a100-sxm-80gb"]


def test_hand_constants_add_up():
    # Guard the hand arithmetic itself: the per-kind sum plus the 525,336,576-parameter
    # embedding is Llama-3.1-8B's published 8,030,261,248 parameters.
    assert LLAMA_ATTN + LLAMA_MLP + LLAMA_NORMS + 2 * LLAMA_HEAD == 8_030_261_248
    assert (LLAMA_ATTN + LLAMA_MLP + LLAMA_NORMS + LLAMA_HEAD) * 2 == LLAMA_STEP_BYTES


# ---------------------------------------------------------------------------------------------
# Memory-bound decode
# ---------------------------------------------------------------------------------------------


def test_batch1_decode_is_weight_bytes_over_bandwidth(llama, a100):
    sm = build_step_model(llama, a100, EngineSettings(), ideal())
    r = sm.decode_step(1, 0)
    # 15,009,849,344 B / 2.039e12 B/s = 7.361377...e-3 s
    expected = LLAMA_STEP_BYTES / A100_BW
    assert expected == pytest.approx(7.3614e-3, rel=1e-4)
    assert float(r["step_s"]) == pytest.approx(expected, rel=REL)
    assert float(r["memory_s"]) == pytest.approx(expected, rel=REL)
    assert float(r["communication_s"]) == 0.0 and float(r["overhead_s"]) == 0.0
    assert int(r["bound_index"]) == 0  # "memory"


def test_mem_bw_frac_scales_the_weight_term(llama, a100):
    sm = build_step_model(llama, a100, EngineSettings(), ideal(mem_bw_frac=0.5))
    # half the bandwidth: 2 * 7.361377e-3 s
    assert float(sm.decode_step(1, 0)["step_s"]) == pytest.approx(
        2 * LLAMA_STEP_BYTES / A100_BW, rel=REL)


def test_kv_read_term_batch32_context1024(llama, a100):
    sm = build_step_model(llama, a100, EngineSettings(), ideal())
    # Every sequence reads its whole KV cache: 32 seqs * 1024 tokens * 131,072 B
    # = 4,294,967,296 B; / 2.039e12 = 2.10641e-3 s, on top of the weights.
    kv = 32 * 1024 * LLAMA_KV_PER_TOKEN
    assert kv == 4_294_967_296
    with_kv = float(sm.decode_step(32, 1024)["step_s"])
    without = float(sm.decode_step(32, 0)["step_s"])
    assert without == pytest.approx(LLAMA_STEP_BYTES / A100_BW, rel=REL)
    assert with_kv - without == pytest.approx(kv / A100_BW, rel=1e-5)
    assert with_kv == pytest.approx((LLAMA_STEP_BYTES + kv) / A100_BW, rel=REL)


def test_attn_bw_frac_applies_to_kv_only(llama, a100):
    sm = build_step_model(llama, a100, EngineSettings(), ideal(attn_bw_frac=0.25))
    # weights at full bandwidth, KV at a quarter: (15,009,849,344 + 4 * 4,294,967,296) / BW
    kv = 32 * 1024 * LLAMA_KV_PER_TOKEN
    assert float(sm.decode_step(32, 1024)["step_s"]) == pytest.approx(
        (LLAMA_STEP_BYTES + 4 * kv) / A100_BW, rel=REL)


def test_overheads_add_linearly(llama, a100):
    cal = ideal(step_overhead_s=1e-3, per_seq_overhead_s=10e-6, per_layer_overhead_s=30e-6)
    # vLLM 0.11: synchronous scheduling, so the per-sequence host work adds to the step too
    sm = build_step_model(llama, a100, EngineSettings(engine="vllm@0.11"), cal)
    # 1 ms + 16 seqs * 10 us + 32 layers * 30 us = 1e-3 + 1.6e-4 + 9.6e-4 = 2.12e-3 s
    r = sm.decode_step(16, 0)
    assert float(r["overhead_s"]) == pytest.approx(2.12e-3, rel=1e-12)
    assert float(r["step_s"]) == pytest.approx(LLAMA_STEP_BYTES / A100_BW + 2.12e-3, rel=REL)


def test_empty_step_costs_nothing(llama, a100):
    sm = build_step_model(llama, a100, EngineSettings())  # default calibration, with overheads
    assert float(sm.decode_step(0, 1024)["step_s"]) == 0.0


# ---------------------------------------------------------------------------------------------
# Tensor parallelism: weights split, two all-reduces per layer
# ---------------------------------------------------------------------------------------------


def test_tp2_allreduce_term(llama, a100):
    cal = ideal(allreduce_latency_s=10e-6, allreduce_bw_frac=1.0)
    sm = build_step_model(llama, a100, EngineSettings(tp=2), cal)
    # Two all-reduces per layer, 32 layers = 64; each: 10 us + ring bytes 2 (tp-1)/tp * T *
    # hidden * 2 B = T * 8192 B at 300 GB/s:
    #   T=1:  64 * (10e-6 + 8192 / 3e11) = 6.4e-4 + 1.7476267e-6 = 6.417476e-4 s
    #   T=64: 64 * (10e-6 + 64 * 8192 / 3e11) = 6.4e-4 + 1.1184811e-4 = 7.518481e-4 s
    for t, expected in ((1, 6.4e-4 + 64 * 8192 / A100_LINK),
                        (64, 6.4e-4 + 64 * 64 * 8192 / A100_LINK)):
        assert float(sm.decode_step(t, 0)["communication_s"]) == pytest.approx(expected, rel=1e-9)
    assert 64 * 8192 / A100_LINK == pytest.approx(1.7476267e-6, rel=1e-6)
    # Per-GPU weights at TP=2: q,o 2*4096*16*128, k,v 2*4096*4*128 per layer -> 671,088,640;
    # MLP 2,818,572,288; norms replicated 266,240; LM head split 262,668,288
    # -> 3,752,595,456 params * 2 B = 7,505,190,912 B.
    weights = (LLAMA_ATTN / 2 + LLAMA_MLP / 2 + LLAMA_NORMS + LLAMA_HEAD / 2) * 2
    assert weights == 7_505_190_912
    assert float(sm.decode_step(1, 0)["step_s"]) == pytest.approx(
        weights / A100_BW + 6.4e-4 + 64 * 8192 / A100_LINK, rel=REL)


def test_tp1_has_no_communication(llama, a100):
    sm = build_step_model(llama, a100, EngineSettings(), ideal(allreduce_latency_s=1.0))
    assert float(sm.decode_step(8, 512)["communication_s"]) == 0.0


# ---------------------------------------------------------------------------------------------
# MoE: expected experts touched per layer, E (1 - (1 - k/E)^T)
# ---------------------------------------------------------------------------------------------

# Mixtral-8x7B: 8 experts, top-2, expert = gate/up/down 3 * 4096 * 14336 params * 2 B
MIX_EXPERT_BYTES = 3 * 4096 * 14336 * 2  # 352,321,536 B per expert per layer
# dense part: attention 1,342,177,280 + router 32*4096*8 = 1,048,576 + norms 266,240
# + LM head 32000*4096 = 131,072,000 -> 1,474,564,096 params * 2 B = 2,949,128,192 B
MIX_DENSE_BYTES = (32 * (2 * 4096 * 4096 + 2 * 4096 * 1024) + 32 * 4096 * 8 + 65 * 4096
                   + 32000 * 4096) * 2


@pytest.mark.parametrize(
    ("tokens", "touched"),
    [
        (1, 2.0),  # 8 (1 - 0.75) = 2: one token reads exactly its top-2
        (2, 3.5),  # 8 (1 - 0.5625) = 3.5
        (4, 8 * (1 - 0.75**4)),  # 8 (1 - 0.31640625) = 5.46875
        (256, 8.0),  # 0.75^256 ~ 1e-32: every expert
    ],
)
def test_moe_touched_experts(mixtral, a100, tokens, touched):
    assert MIX_DENSE_BYTES == 2_949_128_192
    sm = build_step_model(mixtral, a100, EngineSettings(), ideal())
    r = sm.decode_step(tokens, 0)
    # memory term = (dense bytes + 32 MoE layers * touched * 352,321,536 B) / BW;
    # e.g. T=1: (2,949,128,192 + 22,548,578,304) / 2.039e12 = 1.250500e-2 s
    expected = (MIX_DENSE_BYTES + 32 * touched * MIX_EXPERT_BYTES) / A100_BW
    assert float(r["memory_s"]) == pytest.approx(expected, rel=REL)
    assert float(r["step_s"]) == pytest.approx(expected, rel=REL)


def test_moe_batch1_reads_far_less_than_all_experts(mixtral, a100):
    sm = build_step_model(mixtral, a100, EngineSettings(), ideal())
    one, many = float(sm.decode_step(1, 0)["step_s"]), float(sm.decode_step(1024, 0)["step_s"])
    # (2.949e9 + 32*2*3.523e8) / (2.949e9 + 32*8*3.523e8) = 2.5498e10 / 9.3143e10 = 0.27375
    assert one / many == pytest.approx(
        (MIX_DENSE_BYTES + 64 * MIX_EXPERT_BYTES) / (MIX_DENSE_BYTES + 256 * MIX_EXPERT_BYTES),
        rel=1e-5)


# ---------------------------------------------------------------------------------------------
# Prefill: causal pairs c*p + c(c+1)/2
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("chunk", "prefix", "pairs"),
    [
        (256, 0, 32_896),  # 256 * 257 / 2
        (100, 50, 10_050),  # 100 * 50 + 100 * 101 / 2 = 5000 + 5050
        (1, 1023, 1_024),  # one query over 1023 cached keys and itself
    ],
)
def test_prefill_attention_pairs(llama, a100, chunk, prefix, pairs):
    # Attention FLOPs dominate: attn_frac 1e-3 -> 3.12e11 FLOP/s; everything else ~free
    # (bandwidth 1e9 x datasheet). 4 * 32 heads * 128 = 16,384 FLOPs per pair, 32 layers:
    # e.g. 10,050 pairs: 32 * 10,050 * 16,384 / 3.12e11 = 1.6888e-2 s
    cal = ideal(attn_frac=1e-3, mem_bw_frac=1e9, attn_bw_frac=1e9)
    sm = build_step_model(llama, a100, EngineSettings(), cal)
    expected = 32 * pairs * 16_384 / (A100_BF16 * 1e-3)
    got = float(sm.prefill_chunk(chunk, prefix)["step_s"])
    assert got == pytest.approx(expected, rel=REL)


def test_prefill_linear_compute_bound(llama, a100):
    # GEMMs dominate: gemm_frac 1 (312 TFLOP/s, full efficiency from one row), bandwidth ~free.
    # 2 FLOPs per linear parameter per token (1,342,177,280 + 5,637,144,576 = 6,979,321,856),
    # LM head only for the last token's logits (2 * 525,336,576):
    # 2048 tokens: (2048 * 13,958,643,712 + 1,050,673,152) / 3.12e14 = 9.16605e-2 s
    cal = ideal(gemm_frac=1.0, mem_bw_frac=1e9, attn_bw_frac=1e9)
    sm = build_step_model(llama, a100, EngineSettings(), cal)
    flops = 2048 * 2 * (LLAMA_ATTN + LLAMA_MLP) + 2 * LLAMA_HEAD
    assert float(sm.prefill_chunk(2048, 0)["step_s"]) == pytest.approx(flops / A100_BF16,
                                                                        rel=REL)
    assert int(sm.prefill_chunk(2048, 0)["bound_index"]) == 1  # "compute"


def test_prefill_rate_frac_slows_prompt_tokens_only(llama, a100):
    # An engine profile's prefill_rate_frac 0.5: each prompt token's linear FLOPs count twice,
    # the last token's LM head (a logit, not a prompt GEMM row) once:
    # (2 * 2048 * 13,958,643,712 + 1,050,673,152) / 3.12e14 = 0.18332 s; attention pairs twice:
    # 32 * 10,050 * 16,384 / 3.12e11 = 1.6888e-2 s -> 3.3776e-2 s; a decode step unchanged.
    cal = ideal(gemm_frac=1.0, mem_bw_frac=1e9, attn_bw_frac=1e9)
    sm = build_step_model(llama, a100, EngineSettings(), cal)
    slow = replace(sm, prefill_rate_frac=0.5)
    flops = 2 * 2048 * 2 * (LLAMA_ATTN + LLAMA_MLP) + 2 * LLAMA_HEAD
    assert float(slow.prefill_chunk(2048, 0)["step_s"]) == pytest.approx(flops / A100_BF16,
                                                                          rel=REL)
    att = build_step_model(llama, a100, EngineSettings(),
                           ideal(attn_frac=1e-3, mem_bw_frac=1e9, attn_bw_frac=1e9))
    got = float(replace(att, prefill_rate_frac=0.5).prefill_chunk(100, 50)["step_s"])
    assert got == pytest.approx(2 * 32 * 10_050 * 16_384 / (A100_BF16 * 1e-3), rel=REL)
    assert float(slow.decode_step(32, 1000)["step_s"]) == float(sm.decode_step(32, 1000)["step_s"])


def test_gemm_half_tokens_halves_efficiency(llama, a100):
    # With gemm_half_tokens = T the GEMM runs at half efficiency: twice the FLOP time.
    cal = ideal(gemm_frac=1.0, gemm_half_tokens=2048.0, mem_bw_frac=1e9, attn_bw_frac=1e9)
    sm = build_step_model(llama, a100, EngineSettings(), cal)
    flops = 2048 * 2 * (LLAMA_ATTN + LLAMA_MLP) + 2 * LLAMA_HEAD
    assert float(sm.prefill_chunk(2048, 0)["step_s"]) == pytest.approx(2 * flops / A100_BF16,
                                                                        rel=REL)


def test_mixed_step_reads_weights_once_plus_every_kv_token(llama, a100):
    """8 decodes at context 1000 plus a 16-token chunk after a 512-token cached prefix, on the
    bandwidth-only calibration: one weight read, the decodes' KV, the prefix's KV read by the
    chunk and the chunk's own KV: (15,009,849,344 + 131,072 x (8,000 + 512 + 16)) B /
    2.039e12 B/s = (15,009,849,344 + 1,116,209,152) / 2.039e12 = 7.90888...e-3 s."""
    sm = build_step_model(llama, a100, EngineSettings(), ideal())
    mixed = sm.step(num_decode=8, decode_kv_tokens=8 * 1000, prefill_tokens=16,
                    prefill_pairs=16 * 512 + 16 * 17 / 2, prefill_kv_read=512,
                    num_prefill_seqs=1)
    expected_s = (LLAMA_STEP_BYTES + LLAMA_KV_PER_TOKEN * (8000 + 512 + 16)) / A100_BW
    assert float(mixed["step_s"]) == pytest.approx(expected_s, rel=REL)
    # a second weight read would add 7.36 ms: the mixed step is far below decode + prefill
    alone = sm.step(prefill_tokens=16, prefill_pairs=16 * 512 + 136, prefill_kv_read=512,
                    num_prefill_seqs=1)
    decode = sm.decode_step(8, 1000)
    gap_s = float(decode["step_s"]) + float(alone["step_s"]) - float(mixed["step_s"])
    assert gap_s == pytest.approx(LLAMA_STEP_BYTES / A100_BW, rel=REL)


def test_empty_prefill_chunk_is_the_decode_step(llama, a100):
    sm = build_step_model(llama, a100, EngineSettings())
    # default per_seq_overhead 10 us: the empty chunk should add nothing
    assert float(sm.prefill_chunk(0, 0, num_decode=8, decode_kv_tokens=8000)["step_s"]) == (
        float(sm.decode_step(8, 1000)["step_s"]))


# ---------------------------------------------------------------------------------------------
# Weight dtype
# ---------------------------------------------------------------------------------------------


def test_fp8_weights_halve_linear_bytes(llama, a100):
    bf16 = build_step_model(llama, a100, EngineSettings(weight_dtype="bf16"), ideal())
    fp8 = build_step_model(llama, a100, EngineSettings(weight_dtype="fp8"), ideal())
    # fp8: linear weights 1 B + a 4 B scale per 128x128 block: 6,979,321,856 * (1 + 4/16384)
    # = 6,981,025,792 B; norms and LM head stay bf16: (266,240 + 525,336,576) * 2
    # = 1,051,205,632 B -> 8,032,231,424 B.
    unquantized = (LLAMA_NORMS + LLAMA_HEAD) * 2
    linear_bf16 = (LLAMA_ATTN + LLAMA_MLP) * 2  # 13,958,643,712 B
    linear_fp8 = (LLAMA_ATTN + LLAMA_MLP) * (1 + 4 / 16384)
    assert unquantized + linear_fp8 == 8_032_231_424
    t16 = float(bf16.decode_step(1, 0)["step_s"]) * A100_BW
    t8 = float(fp8.decode_step(1, 0)["step_s"]) * A100_BW
    assert t16 == pytest.approx(LLAMA_STEP_BYTES, rel=REL)
    assert t8 == pytest.approx(8_032_231_424, rel=REL)
    # the linear part halves (to within the 0.024% of block scales)
    assert (t8 - unquantized) / (t16 - unquantized) == pytest.approx(0.5, rel=3e-4)
    assert linear_fp8 / linear_bf16 == pytest.approx(0.5, rel=3e-4)


def test_fp8_kv_halves_kv_term(llama, a100):
    sm = build_step_model(llama, a100, EngineSettings(kv_dtype="fp8"), ideal())
    # fp8 KV: 65,536 B/token -> 32 * 1024 * 65,536 = 2,147,483,648 B
    assert float(sm.decode_step(32, 1024)["step_s"]) == pytest.approx(
        (LLAMA_STEP_BYTES + 2_147_483_648) / A100_BW, rel=REL)


# ---------------------------------------------------------------------------------------------
# smooth_max and knee_batch
# ---------------------------------------------------------------------------------------------


def test_smooth_max_values():
    # p=4: (3^4 + 4^4)^(1/4) = 337^(1/4) = 4.284572...
    assert float(smooth_max(np.array(3.0), np.array(4.0))) == pytest.approx(337**0.25, rel=1e-12)
    assert 337**0.25 == pytest.approx(4.2845720, rel=1e-7)
    assert float(smooth_max(np.array(5.0), np.array(0.0))) == 5.0
    # equal arguments: 2^(1/4) a
    assert float(smooth_max(np.array(2.0), np.array(2.0))) == pytest.approx(2 * 2**0.25, rel=1e-12)
    # p=2 is the Euclidean norm: hypot(3, 4) = 5
    assert float(smooth_max(np.array(3.0), np.array(4.0), p=2.0)) == pytest.approx(5.0, rel=1e-12)
    a = np.array([1.0, 10.0, 0.1])
    b = np.array([2.0, 1.0, 0.1])
    s = smooth_max(a, b)
    assert np.all(s >= np.maximum(a, b)) and np.all(s <= 2**0.25 * np.maximum(a, b) * (1 + 1e-12))


def test_knee_batch_synthetic_curve():
    b = np.array([1, 2, 4, 8, 16])
    t = np.array([100.0, 190.0, 350.0, 380.0, 390.0])
    # 1->2: 190 >= 115; 2->4: 350 >= 218.5; 4->8: 380 < 350 * 1.15 = 402.5 -> knee at 4
    assert knee_batch(b, t) == 4
    # unsorted input, same curve
    order = np.array([3, 0, 4, 2, 1])
    assert knee_batch(b[order], t[order]) == 4
    # with a 5% threshold: 4->8 is +8.6% (>= 5%); 8->16 is +2.6% -> knee at 8
    assert knee_batch(b, t, gain=0.05) == 8


def test_knee_batch_none_when_linear_or_no_doublings():
    b = np.array([1, 2, 4, 8])
    assert knee_batch(b, 100.0 * b) is None  # doubling always doubles throughput
    # no b, 2b pair in the list at all
    assert knee_batch(np.array([1, 3, 5]), np.array([10.0, 10.0, 10.0])) is None
    assert knee_batch(np.array([]), np.array([])) is None


def test_knee_batch_flat_curve_is_first_batch():
    b = np.array([1, 2, 4])
    assert knee_batch(b, np.array([50.0, 50.0, 50.0])) == 1


def test_decode_throughput_rises_then_flattens_default_calibration(llama, a100):
    # Default A100 calibration: memory bound at batch 1 (~11 ms), so doubling the batch almost
    # doubles throughput there; the ratio at 1->2 must exceed 1.9 (hand: step grows by ~1%).
    sm = build_step_model(llama, a100, EngineSettings())
    t1, t2 = (float(sm.decode_step(b, 1024)["step_s"]) for b in (1, 2))
    assert (2 / t2) / (1 / t1) > 1.9
    assert math.isfinite(t1) and t1 > LLAMA_STEP_BYTES / A100_BW  # derated bandwidth: slower
