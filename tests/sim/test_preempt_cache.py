"""A preempted request's blocks stay in the prefix cache and its recompute finds them (vLLM V1:
`KVCacheManager.free` keeps each full block's hash in the free queue, its last block first; the
rescheduled request's `get_computed_blocks` hits them unless an allocation evicted them)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from capplan.models.engine import SchedulerPolicy
from capplan.sim import ContinuousEngine, Requests, compiled_available
from tests.sim.conftest import ConstStep, step_by_step


class Recording(ConstStep):
    """ConstStep that keeps each step's prefill tokens (the plain loop asks step by step)."""

    def __init__(self) -> None:
        super().__init__(0.01)
        self.prefill: list[int] = []

    def step(self, **kw):  # noqa: ANN003, ANN201
        self.prefill.append(int(kw["prefill_tokens"]))
        return super().step(**kw)


def _hand_case(policy: SchedulerPolicy) -> tuple[Recording, object]:
    # 5 blocks of 2 tokens. A and B arrive at 0, 4-token prompts; A writes 5 tokens, B 3.
    # step 0: both prefill (8 tokens), 4 blocks held, 1 free; each has its first token.
    # step 1: both decode at context 4 and need a block, one is free: B (newest) is preempted.
    #   Its blocks b0 (tokens 0-1) and b1 (2-3) are full and stay cached, freed b1 first:
    #   free = 1 keyless + [b1, b0] cached. A takes the keyless block.
    # step 2: B (target 4 + 1 generated = 5 tokens) would reuse b0, b1 and need 1 more block:
    #   3 > 2 free, it waits. step 3: A's context 6 needs a block, none keyless: b1 (the least
    #   recently freed) is evicted; b0 stays cached. step 4: A finishes, its 4 blocks free.
    # step 5: B finds b0 (2 tokens; its chain stops at the evicted b1) and recomputes tokens
    #   2-4: 3 prefill tokens (without the cache: all 5). step 6: B decodes its last token.
    rec_model = Recording()
    r = Requests(np.zeros(2), np.array([4, 4]), np.array([5, 3]), np.zeros(2, np.int64))
    eng = ContinuousEngine(rec_model, 5, 2, 8, 64, policy)
    eng.jit = False
    with step_by_step():
        rec = eng.run(r)
    return rec_model, rec


def test_recompute_finds_blocks_left_cached():
    model, rec = _hand_case(SchedulerPolicy())
    assert rec.preemptions == 1
    assert model.prefill == [8, 0, 0, 0, 0, 3, 0]
    assert rec.finished_at_s.tolist() == pytest.approx([0.05, 0.07])
    assert rec.prefix_hit_tokens == 0  # shared-content hits only; none here


def test_recompute_without_prefix_caching_recomputes_all():
    for policy in (SchedulerPolicy(prefix_caching=False), SchedulerPolicy(preempt_cached="none")):
        model, rec = _hand_case(policy)
        assert model.prefill == [8, 0, 0, 0, 0, 5, 0]
        assert rec.finished_at_s.tolist() == pytest.approx([0.05, 0.07])


def test_prompt_only_keeps_prompt_blocks():
    # SGLang keeps the prompt (radix tree), not generated tokens: B's 4 computed tokens are all
    # prompt, so the case is the same.
    model, _ = _hand_case(SchedulerPolicy(preempt_cached="prompt"))
    assert model.prefill == [8, 0, 0, 0, 0, 3, 0]


@pytest.mark.skipif(not compiled_available(), reason="numba (the fast extra)")
@pytest.mark.parametrize("keep", ["computed", "prompt"])
def test_compiled_equals_plain_under_thrash(llama_h100, keep):
    rng = np.random.default_rng(3)
    n = 60
    r = Requests(np.cumsum(rng.exponential(0.05, n)), rng.integers(200, 900, n),
                 rng.integers(50, 400, n), np.zeros(n, np.int64))
    policy = replace(SchedulerPolicy(), preempt_cached=keep)
    out = []
    for jit in (True, False):
        eng = ContinuousEngine(llama_h100.step, 120, 16, 32, 1024, policy)
        eng.jit = jit
        out.append(eng.run(r))
    a, b = out
    assert a.preemptions == b.preemptions > 0
    for key in ("admitted_at_s", "first_token_at_s", "finished_at_s"):
        np.testing.assert_allclose(getattr(a, key), getattr(b, key), rtol=0, atol=1e-9)
