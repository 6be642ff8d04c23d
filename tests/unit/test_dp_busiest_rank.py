"""Attention data parallelism: a step waits for its busiest rank, and a prompt runs on one.

Independent figures: the rule itself (TensorRT-LLM tech blog 10, "ADP Balance Strategy": the
iteration time is the maximum over the DP ranks' times) written out by hand for a few counts,
and the step of one prompt on a DP 8 replica compared with the same replica's step at DP 1
(one rank holding the whole prompt, the experts seeing the same global tokens)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capplan.api import deployment
from capplan.models.perf import busiest_share, chunk_attention


@pytest.mark.parametrize(("chunks", "dp", "want"), [
    (1, 8, 1.0),        # one prompt: all its work on one rank
    (4, 8, 1 / 4),      # four prompts over eight ranks: one each, the busiest holds a quarter
    (8, 8, 1 / 8),      # one per rank: balanced
    (20, 8, 1 / 8),     # more chunks than ranks: each rank fills its own budget
    (0.3, 8, 1.0),      # a mean below one chunk is one prompt's
    (0, 8, 1.0),        # no prompt: nothing to share (its tokens are 0)
    (5, 1, 1.0),        # no data parallelism: exactly the whole step
    (0.5, 1, 1.0),
])
def test_busiest_share_by_hand(chunks, dp, want):
    assert busiest_share(chunks, float(dp)) == pytest.approx(want, rel=1e-15)


@pytest.fixture(scope="module")
def dp8():
    # SGLang --tp 8 --enable-dp-attention --dp 8 --ep-size 8: 8 ranks of one GPU each
    return deployment("deepseek-v3", "h200", engine="sglang", tp=8, attention_dp=8,
                      expert_parallel=8, max_model_len=16384, engine_notation=True).step


def _prompts(step, n: int, tokens: int) -> float:
    pairs, pairs_w, _ = chunk_attention(tokens, 0, tokens)
    return float(step.step(prefill_tokens=n * tokens, prefill_pairs=n * pairs,
                           prefill_pairs_window=n * pairs_w, num_prefill_seqs=n,
                           detail=False)["step_s"])


def test_one_prompt_at_dp8_costs_what_one_rank_holding_it_costs(dp8):
    # the dense layers and attention of the 1,024 tokens all run on one rank; the experts and
    # the MoE communication see the same global tokens either way
    one_rank = replace(dp8, attention_dp=1.0)
    assert _prompts(dp8, 1, 1024) == pytest.approx(_prompts(one_rank, 1, 1024), rel=1e-12)


def test_prompts_on_separate_ranks_run_side_by_side(dp8):
    one, eight = _prompts(dp8, 1, 1024), _prompts(dp8, 8, 1024)
    # eight prompts, one per rank: the dense part stays one prompt's; only the experts' and
    # the all-to-all's share of eight times the tokens grows, so far less than eight steps
    assert one < eight < 4 * one
    # and a replica that split one prompt evenly over its ranks would be faster than it is
    even = float(dp8.step(prefill_tokens=128 * 8, prefill_pairs=8 * chunk_attention(128, 0,
                          128)[0], num_prefill_seqs=8, detail=False)["step_s"])
    assert even < one


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), tokens=st.integers(16, 4096))
def test_more_prompts_never_take_less_time(dp8, n, tokens):
    assert _prompts(dp8, n + 1, tokens) >= _prompts(dp8, n, tokens) * (1 - 1e-12)


def test_decoders_still_split_evenly(dp8):
    # a decode-only step has no prompt: every rank reads the KV of 1/8 of the sequences, far
    # less than one rank holding them all would
    bd = np.array([256.0, 1024.0])
    got = dp8.step(num_decode=bd, decode_kv_tokens=bd * 4000, detail=False)["step_s"]
    one_rank = replace(dp8, attention_dp=1.0)
    all_on_one = one_rank.step(num_decode=bd, decode_kv_tokens=bd * 4000, detail=False)["step_s"]
    assert np.all(got < 0.8 * all_on_one)
