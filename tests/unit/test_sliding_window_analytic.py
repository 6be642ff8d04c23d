"""The analytic models count sliding-window layers at their window, as `memory` and the replay do.

vLLM V1's hybrid KV cache manager keeps a full-attention layer's blocks for the whole sequence
and a sliding-window layer's cdiv(L, block_size) blocks of an L-token sequence, at most
cdiv(window - 1 + max_num_batched_tokens, block_size) + 1 (SlidingWindowSpec.
max_memory_usage_bytes; SlidingWindowManager.remove_skipped_blocks frees the blocks behind the
window). The queueing model's concurrency cap, the closed loop's, the static batcher's fit and
the disaggregated decode slots must hold as many sequences as that rule lets fit; the figures
below are worked out by hand from the catalog's numbers.
"""

from __future__ import annotations

import numpy as np
import pytest

from capplan.catalog.loader import load_catalog
from capplan.models.closed_loop import BenchmarkProtocol, closed_loop_latency, kv_concurrency_cap
from capplan.models.layers import DENSE_LAYOUT, stack_layouts
from capplan.models.queueing import LengthStats, Limits, QueueModel
from capplan.plan.deployment import EngineOptions, resolve_deployment
from capplan.plan.load import LoadSpec, analytic_latency
from capplan.plan.pd import PdModel, make_layout
from capplan.plan.search_bound import _subset
from capplan.sim import BatchEngine, ContinuousEngine, Requests

_CAT = load_catalog(())

# --- gpt-oss-120b on one H100, vLLM defaults, max_model_len 90,600 -----------------------------
# 36 layers: 18 full attention + 18 sliding (window 128); 8 KV heads x 64 head_dim x 2 (K, V)
# x 2 B = 2,048 B per token per layer, 72 KiB per token in all 36. The memory report's pool:
# 6,969 blocks of 16 tokens in all 36 layers = 111,504 tokens; vLLM groups the layers 18 and 18,
# so a pool block of one group is 16 tokens in 18 layers: 6,969 x 2 = 13,938 group blocks.
POOL_TOKENS = 6_969 * 16  # 111,504
GROUP_BLOCKS = 6_969 * 2  # 13,938
# The window layers' cap: cdiv(128 - 1 + 8,192, 16) + 1 = 520 + 1 = 521 blocks.
WINDOW_BLOCKS = -(-(128 - 1 + 8_192) // 16) + 1
PROMPT, OUTPUT = 90_000, 500
# A request at its peak (90,499 tokens in the cache at its last decode step; 90,500 once the
# last token is written): cdiv(90,500, 16) = 5,657 full blocks + 521 window blocks.
PEAK_SEQ_BLOCKS = -(-(PROMPT + OUTPUT) // 16) + WINDOW_BLOCKS  # 6,178
# At its prompt: 5,625 + 521 = 6,146.
PROMPT_SEQ_BLOCKS = PROMPT // 16 + WINDOW_BLOCKS  # 6,146
FIT = GROUP_BLOCKS // PEAK_SEQ_BLOCKS  # 2 (2.256); counted at full length: 1 (1.23)


@pytest.fixture(scope="module")
def gpt_oss():
    return resolve_deployment(_CAT, "gpt-oss-120b", "h100-sxm",
                              EngineOptions(max_model_len=90_600))


def _queue(dep) -> QueueModel:
    return QueueModel(dep.step, LengthStats.fixed(PROMPT), LengthStats.fixed(OUTPUT),
                      dep.limits, 1.0, dep.profile.scheduler)


def test_hand_figures():
    assert (WINDOW_BLOCKS, PEAK_SEQ_BLOCKS, PROMPT_SEQ_BLOCKS) == (521, 6_178, 6_146)
    assert (POOL_TOKENS, GROUP_BLOCKS, FIT) == (111_504, 13_938, 2)
    assert POOL_TOKENS // (PROMPT + OUTPUT) == 1  # every layer at full length


def test_queue_cap_counts_window_layers_at_their_window(gpt_oss):
    assert gpt_oss.memory.kv_cache_tokens == POOL_TOKENS
    qm = _queue(gpt_oss)
    # A running request holds, on average, its prompt and half its output: between its
    # prompt's 6,146 group blocks and its peak's 6,178, so the pool holds between
    # 13,938 / 6,178 = 2.256 and 13,938 / 6,146 = 2.268 of them; the p99 margin (the output's
    # spread, sd 500 / sqrt(12) = 144 tokens, of which the full layers' half counts: about
    # 2.33 x sqrt(2.26) x 72 = 252 of a request's ~49,300 tokens of all 36 layers) takes
    # 0.005 off. Counted at full length: 111,504 / 90,250 = 1.24.
    cap = float(np.asarray(qm.cap))
    assert GROUP_BLOCKS / PEAK_SEQ_BLOCKS - 0.01 < cap < GROUP_BLOCKS / PROMPT_SEQ_BLOCKS
    assert int(cap) == FIT


def test_closed_loop_cap_by_hand(gpt_oss):
    # vLLM's mean held tokens: 90,000 + 500 / 2 = 90,250, in whole blocks 5,641 (90,256
    # tokens); with the window layers' 521: 6,162 group blocks = 6,162 x 16 / 2 = 49,296 tokens
    # of all 36 layers; 111,504 // 49,296 = 2 (at full length 111,504 // 90,256 = 1)
    pool = gpt_oss.pool
    cap = kv_concurrency_cap(POOL_TOKENS, PROMPT, OUTPUT, 16, gpt_oss.profile.scheduler, 0.0,
                             pool.layout)
    assert cap == POOL_TOKENS // ((5_641 + WINDOW_BLOCKS) * 16 // 2) == 2


# A sequence's KV of all 36 layers at t tokens (bs 16, mean lengths taken fractionally): the
# full layers' t / 16 token blocks plus the window layers' min(t / 16, 521), 16 tokens each, over
# the 2 units: (t + 521 x 16) / 2 past the window. The decode context's mean: 90,000 + (500^2 -
# 500) / (2 x 499) = 90,250 tokens -> (90,250 + 8,336) / 2 = 49,293; the prompt's: (90,000 +
# 8,336) / 2 = 49,168; a whole request's 90,500: (90,500 + 8,336) / 2 = 49,418.
HELD_CTX, HELD_PROMPT, HELD_PEAK = 49_293.0, 49_168.0, 49_418.0


def test_kv_utilization_counts_window_layers_at_their_window(gpt_oss):
    # QueueModel._occupancy (`latency`'s kv_mean_utilization and kv_peak_utilization): b = 0.25
    # decoding sequences at the mean context and lam x own = 1 x 0.5 prompts being prefilled:
    # mean (0.25 x 49,293 + 0.5 x 49,168) / 111,504 = 36,907.25 / 111,504 = 0.33099; peak at
    # b's Poisson p99, 0.25 + 2.3263 x 0.5 = 1.41317 sequences: (1.41317 x 49,293 + 24,584) /
    # 111,504 = 0.84520. At full length: 0.4247 and 1 (capped).
    qm = _queue(gpt_oss)
    _, mean, peak = qm._occupancy(np.asarray(1.0), np.asarray(0.25), np.asarray(0.5))
    z = 2.3263478740408408  # the normal distribution's 99th percentile
    assert float(mean) == pytest.approx((0.25 * HELD_CTX + 0.5 * HELD_PROMPT) / POOL_TOKENS,
                                        rel=1e-9)
    assert float(peak) == pytest.approx(
        ((0.25 + z * 0.5) * HELD_CTX + 0.5 * HELD_PROMPT) / POOL_TOKENS, rel=1e-9)
    assert (float(mean), float(peak)) == pytest.approx((0.33099, 0.84520), abs=1e-5)


def test_closed_loop_kv_peak_utilization_counts_window_layers_at_their_window(gpt_oss):
    # 4 clients, 2 running (test_closed_loop_cap_by_hand), each at its whole 90,500 tokens:
    # 2 x 49,418 / 111,504 = 0.88638 (at full length 2 x 90,500 / 111,504 > 1: capped at 1)
    s, pool = gpt_oss.settings, gpt_oss.pool
    res = closed_loop_latency(gpt_oss.step, PROMPT, OUTPUT, s.max_num_seqs,
                              s.max_num_batched_tokens, POOL_TOKENS, 16, BenchmarkProtocol(4),
                              gpt_oss.profile.scheduler, 0.0, pool.layout)
    assert res["concurrency_cap"] == 2
    assert res["kv_peak_utilization"] == pytest.approx(2 * HELD_PEAK / POOL_TOKENS, rel=1e-9)
    assert res["kv_peak_utilization"] == pytest.approx(0.88638, abs=1e-5)


def test_latency_closed_loop_holds_the_deployments_layout(gpt_oss):
    # `latency --concurrency 4` (plan/load._closed_loop): the cap of test_closed_loop_cap_by_hand,
    # 2 (at full length 1), and its KV peak as above
    load = LoadSpec(None, 4, LengthStats.fixed(PROMPT), LengthStats.fixed(OUTPUT))
    res = analytic_latency(gpt_oss, load)
    assert res["concurrency_cap"] == 2
    assert res["kv_peak_utilization"] == pytest.approx(2 * HELD_PEAK / POOL_TOKENS, rel=1e-9)


def test_static_batch_fits_by_hand(gpt_oss):
    # A static batch prefills every 90,000-token prompt in one chunk, so its window layers'
    # cap is that chunk's: cdiv(128 - 1 + 90,000, 16) + 1 = 5,633 + 1 = 5,634 blocks. Its
    # prefill step holds 5,625 + 5,625 = 11,250 group blocks a request, its last decode step
    # (90,499 tokens) 5,657 + min(5,657, 5,634) = 11,291: one request in 13,938 (two need
    # 22,500 at the prefill step). With the 8,192-token chunk's cap (521) it would claim 2.
    whole_cap = -(-(128 - 1 + PROMPT) // 16) + 1
    assert whole_cap == 5_634
    peak = 5_657 + min(5_657, whole_cap)
    assert (peak, GROUP_BLOCKS // peak, GROUP_BLOCKS // (2 * 5_625)) == (11_291, 1, 1)
    n = 4
    reqs = Requests(np.zeros(n), np.full(n, PROMPT), np.full(n, OUTPUT), np.zeros(n, np.int64))
    pool = gpt_oss.pool
    eng = BatchEngine(gpt_oss.step, pool.num_blocks, pool.block_size, 8, "static",
                      layout=pool.layout)
    rec = eng.run(reqs)
    assert int(rec.step_running.max()) == 1
    assert rec.num_gpu_blocks == GROUP_BLOCKS
    assert int(rec.step_kv_blocks[0]) == 2 * 5_625  # the prefill step
    assert int(rec.step_kv_blocks.max()) == peak


def test_static_batch_short_prompts_hold_their_blocks(gpt_oss):
    # 100-token prompts, 20-token outputs, padded: the last decode step holds 119 tokens,
    # cdiv(119, 16) = 8 token blocks; below the window's cap a window layer holds as many
    # blocks as the sequence's (vLLM allocates cdiv(L, 16)), so a request holds 8 + 8 = 16
    # group blocks and a batch of 8 holds 128 at its peak (the prefill step: 8 x (7 + 7) = 112)
    n = 8
    reqs = Requests(np.zeros(n), np.full(n, 100), np.full(n, 20), np.zeros(n, np.int64))
    pool = gpt_oss.pool
    rec = BatchEngine(gpt_oss.step, pool.num_blocks, pool.block_size, 8, "static",
                      layout=pool.layout).run(reqs)
    assert int(rec.step_running.max()) == 8
    assert (int(rec.step_kv_blocks[0]), int(rec.step_kv_blocks.max())) == (112, 128)


def test_static_batch_too_long_request_error_in_tokens(gpt_oss):
    # a 150,000-token prompt with one output token (150,000 tokens at its peak): its prompt's
    # window cap is cdiv(127 + 150,000, 16) + 1 = 9,384 blocks, beyond the pool's own length,
    # so the window layers count as many blocks as the full ones: 13,938 // 2 = 6,969 token
    # blocks = 111,504 tokens fit (the memory report's kv_cache_tokens), stated in tokens
    reqs = Requests(np.zeros(1), np.array([150_000]), np.array([1]), np.zeros(1, np.int64))
    pool = gpt_oss.pool
    eng = BatchEngine(gpt_oss.step, pool.num_blocks, pool.block_size, 8, "static",
                      layout=pool.layout)
    with pytest.raises(Exception, match="request 0 needs 150000 KV tokens but the cache holds "
                                        "111504$"):
        eng.run(reqs)


def test_decode_slots_count_window_layers_at_their_window(gpt_oss):
    # the disaggregated decode pool's slots: KV tokens over a sequence's held_kv, the mean
    # 90,500 tokens = 5,656.25 token blocks -> 5,656.25 + 521 = 6,177.25 group blocks =
    # 49,418 tokens of all 36 layers: 111,504 / 49,418 = 2.256 (at full length 1.23)
    lim = gpt_oss.limits
    held = float(lim.held_kv(PROMPT + OUTPUT))
    assert held == pytest.approx((90_500 / 16 + WINDOW_BLOCKS) * 16 / 2)
    model = PdModel(make_layout(gpt_oss, 1, gpt_oss, 1), LengthStats.fixed(PROMPT),
                    LengthStats.fixed(OUTPUT))
    assert model.decode_slots() == pytest.approx(
        POOL_TOKENS / ((90_500 / 16 + WINDOW_BLOCKS) * 16 / 2), rel=1e-9)
    assert model.decode_slots() == pytest.approx(2.256, abs=0.001)
    # the replay's whole blocks (5,657 + 521 = 6,178 group blocks) give 13,938 / 6,178 = 2.2561
    # against the mean's fractional 2.2563
    assert model.decode_slots() == pytest.approx(GROUP_BLOCKS / PEAK_SEQ_BLOCKS, rel=1e-3)
    assert type(model.decode_slots()) is float  # a plain float, as for every layout


def test_analytic_and_replay_agree_on_sequences_that_fit(gpt_oss):
    # A saturated closed loop of 4 clients: the replay decodes at most as many 90,500-token
    # sequences in one step as its pool holds whole (a third may hold a prefill chunk's blocks
    # beside them until it is preempted), and the queueing model's cap (floored) says the same.
    n = 6
    reqs = Requests(np.zeros(n), np.full(n, PROMPT), np.full(n, OUTPUT), np.zeros(n, np.int64),
                    concurrency=4)
    pool, s = gpt_oss.pool, gpt_oss.settings
    eng = ContinuousEngine(gpt_oss.step, pool.num_blocks, pool.block_size, s.max_num_seqs,
                           s.max_num_batched_tokens, s.profile.scheduler, layout=pool.layout)
    eng.jit = False
    rec = eng.run(reqs)
    replay_fit = int(rec.step_tbt_count.max())
    assert replay_fit == int(float(np.asarray(_queue(gpt_oss).cap))) == FIT
    assert pool.sequences_at(PROMPT + OUTPUT) == replay_fit


def test_stacked_rows_equal_their_own_models(gpt_oss):
    # the search's stacked limits (a window model's row beside a dense one) give each row the
    # cap of its own limits
    lim = gpt_oss.limits
    dense = Limits(lim.max_num_seqs, lim.max_num_batched_tokens, lim.kv_cache_tokens,
                   lim.state_tokens_per_seq, lim.block_size)
    both = Limits(np.asarray([[lim.max_num_seqs]] * 2, float),
                  np.asarray([[lim.max_num_batched_tokens]] * 2, float),
                  np.asarray([[lim.kv_cache_tokens]] * 2, float), np.zeros((2, 1)),
                  np.full((2, 1), 16.0), stack_layouts([[lim.layout], [DENSE_LAYOUT]]))
    lengths = (LengthStats.fixed(PROMPT), LengthStats.fixed(OUTPUT))
    caps = [float(np.asarray(QueueModel(gpt_oss.step, *lengths, x, 1.0,
                                        gpt_oss.profile.scheduler).cap)) for x in (lim, dense)]
    stacked = QueueModel(gpt_oss.step, *lengths, both, 1.0, gpt_oss.profile.scheduler).cap
    assert np.asarray(stacked).ravel() == pytest.approx(caps)
    assert np.asarray(stacked).ravel()[1] == caps[1]  # the dense row bit for bit
    assert caps[1] == pytest.approx(1.23, abs=0.01)  # at full length: 111,504 / 90,250 - p99


def test_search_subset_keeps_each_rows_layout(gpt_oss):
    # the planner's bisection takes some configurations' rows (search_bound._subset): each
    # keeps its own window layout, so its cap is the one of the whole model's row
    lim = gpt_oss.limits
    both = Limits(np.full((1, 2), float(lim.max_num_seqs)),
                  np.full((1, 2), float(lim.max_num_batched_tokens)),
                  np.full((1, 2), float(lim.kv_cache_tokens)), np.zeros((1, 2)),
                  np.full((1, 2), 16.0), stack_layouts([[lim.layout, DENSE_LAYOUT]]))
    qm = QueueModel(gpt_oss.step, LengthStats.fixed(PROMPT), LengthStats.fixed(OUTPUT), both,
                    1.0, gpt_oss.profile.scheduler)
    sub = _subset(qm, (np.array([0, 0]), np.array([1, 0])))
    assert np.asarray(sub.cap).ravel() == pytest.approx(np.asarray(qm.cap).ravel()[::-1])
    assert int(np.asarray(qm.cap).ravel()[0]) == FIT


def test_whole_prompt_closed_loop_caps_the_window_at_its_raised_budget():
    # TensorRT-LLM (no chunked prefill) on an H200 with an 8,192-token budget: a 20,000-token
    # prompt runs whole, so AIConfigurator's closed loop raises the budget to 20,000 and the
    # window layers' cap follows it: cdiv(127 + 20,000, 32) + 1 = 630 blocks of 32 tokens (at
    # the configured budget cdiv(127 + 8,192, 32) + 1 = 261). The engine reserves each
    # request's output (GUARANTEED_NO_EVICT): 20,500 tokens = 641 blocks, and 641 + 630 =
    # 1,271 blocks of 18 layers = 1,271 x 32 / 2 = 20,336 tokens of all 36 layers; the pool's
    # 1,011,552 hold 49 (with the cap 261: 70, beyond the 64 clients).
    from capplan.plan.aiconfigurator import AggRun, agg_closed_loop

    run = AggRun(backend="trtllm", model="openai/gpt-oss-120b", system="h200_sxm",
                 precision="fp4", tp=1, isl=20_000, osl=500, batch_size=64, concurrency=64)
    dep = resolve_deployment(_CAT, "gpt-oss-120b", "h200",
                             EngineOptions(engine="trtllm", max_num_batched_tokens=8192,
                                           max_num_seqs=64))
    assert dep.pool.layout.window_cap == -(-(127 + 8192) // 32) + 1 == 261
    assert dep.memory.kv_cache_tokens == 1_011_552
    assert -(-(127 + 20_000) // 32) + 1 == 630
    want = 1_011_552 // ((641 + 630) * 32 // 2)
    assert (want, 1_011_552 // ((641 + 261) * 32 // 2)) == (49, 70)
    assert agg_closed_loop(dep, run, measured=4 * 64)["concurrency_cap"] == want
