"""The simulator's prefix cache against hand-written traces of vLLM V1's rules.

LinearStep: a step takes 1 ms per token computed plus 0.1 ms per decode KV token read, so each
step below is computed by hand. Blocks of 16 tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capplan.models.engine import SchedulerPolicy
from capplan.sim import ContinuousEngine, Requests
from tests.sim.conftest import LinearStep

VLLM = SchedulerPolicy()


def reqs(arrivals, prompts, outputs, groups, shared) -> Requests:
    n = len(prompts)
    return Requests(np.asarray(arrivals, float), np.asarray(prompts), np.asarray(outputs),
                    np.zeros(n, np.int64), prefix_group=np.asarray(groups, np.int64),
                    prefix_tokens=np.asarray(shared, np.int64))


def run(r, blocks=100, policy=VLLM, seqs=4, tokens=64):
    return ContinuousEngine(LinearStep(), blocks, 16, seqs, tokens, policy).run(r)


def test_a_later_request_skips_the_cached_full_blocks_of_the_shared_prefix():
    # A: prompt 40 (32 shared), output 2, at 0. step 0: 40 tokens, 40 ms, token 1; step 1:
    # decode, context 41: 1 + 4.1 ms; A done at 45.1 ms, its two full prefix blocks stay cached.
    # B (same 32-token prefix, prompt 40) at 1 s: hits 2 blocks (32 tokens), computes 8: 8 ms.
    rec = run(reqs([0.0, 1.0], [40, 40], [2, 2], [0, 0], [32, 32]))
    assert rec.first_token_at_s.tolist() == pytest.approx([0.040, 1.008])
    assert rec.step_dur_s.tolist() == pytest.approx([0.040, 0.0051, 0.008, 0.0051])
    assert rec.prefix_hit_tokens == 32


def test_without_prefix_caching_the_prefix_is_computed_again():
    rec = run(reqs([0.0, 1.0], [40, 40], [2, 2], [0, 0], [32, 32]),
              policy=SchedulerPolicy(prefix_caching=False))
    assert rec.first_token_at_s.tolist() == pytest.approx([0.040, 1.040])
    assert rec.prefix_hit_tokens == 0


def test_a_fully_cached_prompt_still_computes_its_last_block():
    # B's 32-token prompt is all cached, but a hit is capped at 31 tokens, block-aligned: 16.
    rec = run(reqs([0.0, 1.0], [40, 32], [2, 2], [0, 0], [32, 32]))
    assert rec.first_token_at_s[1] == pytest.approx(1.016)
    assert rec.prefix_hit_tokens == 16


def test_a_running_request_shares_its_computed_prefix_blocks():
    # B arrives while A decodes (A's prompt blocks are computed and registered): B hits them.
    # A: step 0 prefill 40 (40 ms); B arrives at 41 ms, during step 1 (A decodes, 5.1 ms,
    # output 3 so A keeps running). step 2: A decodes (ctx 42: 1 + 4.2 ms) and B computes
    # 8 tokens (8 ms): 13.2 ms.
    rec = run(reqs([0.0, 0.041], [40, 40], [3, 2], [0, 0], [32, 32]))
    assert rec.step_dur_s[:3].tolist() == pytest.approx([0.040, 0.0051, 0.0132])
    assert rec.prefix_hit_tokens == 32


def test_eviction_takes_the_tail_block_of_the_least_recent_request_first():
    # 4 blocks. A (prompt 40, shared 32, output 2) frees 3 blocks: a keyless tail block and its
    # two prefix blocks, freed tail first, so the queue holds [prefix block 1, prefix block 0].
    # C (unshared, prompt 40, output 2) needs 3 blocks: the 2 keyless free blocks, then evicts
    # prefix block 1. B (A's prefix) then hits block 0 only: 16 tokens, computes 24.
    r = reqs([0.0, 1.0, 2.0], [40, 40, 40], [2, 2, 2], [0, -1, 0], [32, 0, 32])
    rec = run(r, blocks=4)
    assert rec.prefix_hit_tokens == 16
    assert rec.first_token_at_s[2] == pytest.approx(2.024)


def test_shared_blocks_are_held_once():
    # Two requests with a 32-token shared prefix and 40-token prompts run together:
    # 2 shared + 2 x 1 private block = 4 held; without sharing they would hold 6.
    r = reqs([0.0, 0.041], [40, 40], [3, 3], [0, 0], [32, 32])
    rec = run(r, blocks=5)
    assert rec.preemptions == 0
    assert int(rec.step_kv_blocks.max()) == 4


POLICIES = [VLLM, SchedulerPolicy(prefill_first=True, reserve_output_frac=0.7),
            SchedulerPolicy(chunked_prefill=False, reserve_output_frac=1.0, preemption=False)]
"""vLLM, SGLang-like (prefill first, part of the output reserved), TensorRT-LLM-like."""


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 80), st.integers(1, 20), st.integers(-1, 2)),
                min_size=1, max_size=14),
       st.integers(6, 30), st.sampled_from([0, 16, 48]), st.sampled_from(range(3)))
def test_block_conservation_and_completion(spec, blocks, shared, pol):
    """Every request finishes, hits never exceed prompt - 1, KV never over-commits, under
    each engine's policy."""
    prompts = [p for p, _, _ in spec]
    outs = [o for _, o, _ in spec]
    if max(p + o for p, o in zip(prompts, outs, strict=True)) > blocks * 16:
        return
    groups = [g for _, _, g in spec]
    r = reqs(np.arange(len(spec)) * 0.003, prompts, outs, groups, [shared] * len(spec))
    rec = run(r, blocks=blocks, seqs=3, tokens=128, policy=POLICIES[pol])
    assert np.all(rec.finished_at_s >= rec.first_token_at_s)
    assert int(rec.step_kv_blocks.max()) <= blocks
    assert rec.prefix_hit_tokens <= sum(max(p - 1, 0) for p in prompts) * (1 + rec.preemptions)
