"""Invariants of the analytic prefix model (models/prefix.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from capplan.errors import InputError
from capplan.models.prefix import (
    PrefixSpec,
    block_hit_tokens,
    cache_time_s,
    hit_probability,
    multi_turn_lengths,
    prefix_cache,
)


@given(st.integers(0, 10_000), st.integers(1, 10_000), st.sampled_from([1, 16, 32, 64]))
def test_a_hit_is_whole_blocks_and_leaves_a_token(shared, prompt, bs):
    h = float(block_hit_tokens(shared, prompt, bs))
    assert h % bs == 0
    assert 0 <= h <= min(shared, prompt - 1)
    assert h > min(shared, prompt - 1) - bs  # the longest such run of blocks


@given(st.integers(1, 512), st.floats(0, 1), st.integers(1, 2000))
def test_prefill_tokens_are_the_prompt_minus_the_hit(shared, frac, prompt):
    pc = prefix_cache(PrefixSpec(shared, frac), np.full(400, prompt), 16)
    pf = np.asarray(pc.prefill_tokens) if pc.active else np.full(400, prompt)
    assert np.all(pf >= 1) and np.all(pf <= prompt)
    assert pc.cached_tokens_mean == pytest.approx(prompt - pf.mean())


def test_multi_turn_prompts_by_hand():
    # one session of 3 turns, messages 10, 20, 30, answers 5, 6, 7
    prompt, out, hist = multi_turn_lengths([10, 20, 30], [5, 6, 7], 3)
    assert prompt.tolist() == [10, 15 + 20, 15 + 26 + 30]
    assert hist.tolist() == [0, 14, 40]  # the previous turn's last token has no KV
    assert out.tolist() == [5, 6, 7]


def test_survival_of_freed_blocks_by_hand():
    # 1M free KV tokens, 10 req/s allocating 1000 tokens each: a freed block lives 100 s;
    # a prefix shared at 0.05 req/s is cached with probability 1 - exp(-5).
    t = cache_time_s(1e6, 10 * 1000)
    assert t == 100
    assert hit_probability(0.05, 0.0, t) == pytest.approx(1 - math.exp(-5))
    assert hit_probability(0.0, 0.0, t) == 0.0


def test_one_form_per_lane():
    with pytest.raises(InputError):
        PrefixSpec(shared_tokens=64, share_frac=1.0, turns=2)
