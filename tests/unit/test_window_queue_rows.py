"""The queueing model's concurrency cap with sliding-window layers, against hand figures: the
p99 margin's sd scaled by the held-KV rule's secant, the search's stacked rows (each at its own
token budget's window cap) and a candidate's own queue model (plan/verified), the disaggregated
search's stacked decode pools, and prefix-cache residency counted in the full layers only (the
replay's prefix-cache entry).

The cap solves B mu + z sqrt(B) sigma = KV for the largest B (models/queueing/steady.py: mu and
sigma a running sequence's mean and sd of held KV, z the normal 99th percentile), so
sqrt(B) = (-z sigma + sqrt(z^2 sigma^2 + 4 mu KV)) / (2 mu); `_cap` below is that root squared,
fed with figures worked out by hand in each test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from capplan.catalog.loader import load_catalog
from capplan.models.layers import DENSE_LAYOUT, BlockLayout
from capplan.models.prefix import PrefixCache
from capplan.models.queueing import LengthStats, Limits, QueueModel
from capplan.plan.deployment import EngineOptions, resolve_deployment
from capplan.plan.disagg import _stacked
from capplan.plan.planner import _groups, search_space, traffic_for
from capplan.plan.schema import PlanFile
from capplan.plan.search import Candidate, ConfigGroup, Traffic, _queue_model
from capplan.plan.slo import SloSet
from capplan.plan.verified import queue_model

_CAT = load_catalog(())
Z = 2.3263478740408408  # the normal distribution's 99th percentile


def _cap(mu: float, sigma: float, kv: float) -> float:
    root = (-Z * sigma + math.sqrt(Z * Z * sigma * sigma + 4 * mu * kv)) / (2 * mu)
    return root * root


@pytest.fixture(scope="module")
def gpt_oss():
    return resolve_deployment(_CAT, "gpt-oss-120b", "h100-sxm",
                              EngineOptions(max_model_len=90_600))


def _limits(layout: BlockLayout) -> Limits:
    # 20,000 KV tokens counted one by one (block size 1: no rounding to blocks)
    return Limits(1024.0, 8192.0, 20_000.0, 0.0, 1.0, layout)


# A layout of 1 full and 1 window layer, window cap 1,000 tokens: a sequence of h tokens holds
# (h + min(h, 1,000)) / 2 tokens of both layers. Prompts of 950 tokens, outputs of 120: a
# running sequence holds 950 + 120 / 2 = 1,010 tokens on average, (1,010 + 1,000) / 2 = 1,005
# of KV; the sd of its tokens is sqrt(120^2 / 12) = sqrt(1,200) = 34.641.
LAYOUT = BlockLayout(1, 1, 1000, 999)
SD = math.sqrt(1200.0)
# held KV over 1,010 -+ 34.641: (1,044.641 + 1,000) / 2 - 975.359 = 46.962 of 69.282 tokens
# (slope 0.678): the sd of held KV is 46.962 / 2 = 23.481 (= 0.75 x 34.641 - 2.5)
SD_HELD = 0.75 * SD - 2.5


def test_sigma_is_scaled_by_the_held_kv_secant(gpt_oss):
    assert SD_HELD == pytest.approx(23.4808, abs=1e-4)
    qm = QueueModel(gpt_oss.step, LengthStats.fixed(950), LengthStats.fixed(120),
                    _limits(LAYOUT), 1.0, gpt_oss.profile.scheduler)
    want = _cap(1005.0, SD_HELD, 20_000.0)  # 19.66
    assert float(np.asarray(qm.cap)) == pytest.approx(want, rel=1e-9)
    # the unscaled sd would give 19.55: the test tells the two apart
    assert abs(_cap(1005.0, SD, 20_000.0) - want) > 0.1


def test_prefix_residency_counts_the_full_layers_only(gpt_oss):
    # 500 tokens of each sequence are a prefix shared with the others, held once (500 resident
    # tokens). A cached block is its full layers' part (the replay's prefix-cache entry, 1 of
    # the layout's 2 layers): the resident prefix takes 500 / 2 = 250 of the 20,000 KV tokens
    # and each sequence holds 1,005 - 250 = 755 of its own; the window layers' blocks are its
    # own whatever it shares.
    prefix = PrefixCache(cached_tokens_mean=496.0, prefill_tokens=(454.0,),
                         shared_kv_tokens_per_seq=500.0, resident_kv_tokens=500.0)
    qm = QueueModel(gpt_oss.step, LengthStats.fixed(950), LengthStats.fixed(120),
                    _limits(LAYOUT), 1.0, gpt_oss.profile.scheduler, prefix)
    assert float(np.asarray(qm.cap)) == pytest.approx(_cap(755.0, SD_HELD, 19_750.0),
                                                      rel=1e-9)


def test_cached_prefix_tokens_by_hand():
    # Gemma-3-27B's layout (5 full : 26 window units of 2 layers): a 2,000-token prefix is
    # 125 blocks of 16 tokens, 5 units each of 31 per block of all layers: 16 x 5 x 125 / 31 =
    # 322.6 tokens of kv_cache_tokens (of the 2,000 every layer would hold)
    assert BlockLayout(5, 26, 577, 1024).cached_kv_tokens(2000, 16) == pytest.approx(
        10_000 / 31)
    # window layers only (Mistral-7B-v0.1's shape): its window blocks, 50 token blocks at most
    assert BlockLayout(0, 1, 50, 999).cached_kv_tokens(500.0, 1) == 50.0
    assert DENSE_LAYOUT.cached_kv_tokens(500.0, 16) == 500.0


# --- gpt-oss-120b, prompts of 20,000 tokens and outputs of 500 -------------------------------
# A running request holds 20,000 + 500 / 2 = 20,250 tokens on average, plus its last block's
# mean padding: over outputs 1..500 from a block edge, 31 whole cycles of 16 average 7.5 and
# the last 4 pad 15 + 14 + 13 + 12 = 54, so (31 x 120 + 54) / 500 = 7.548 tokens: 20,257.548
# tokens = 1,266.097 blocks of 16. Window layers (window 128) hold min(that, cap) blocks, cap =
# cdiv(127 + budget, 16) + 1: 41 at a 512-token budget, 521 at 8,192. 18 full + 18 window layers
# (units of 18 layers, 2 per block of all 36): mu = 16 x (1,266.097 + cap) / 2 tokens of all
# layers. The output's sd sqrt(500^2 / 12) = 144.338 counts in the full layers only (past the
# cap the window layers do not grow): 72.169.
HELD_BLOCKS = (20_000 + 250 + (31 * 120 + 54) / 500) / 16
SD_LONG = math.sqrt(500**2 / 12) / 2


def _mu(cap: int) -> float:
    return 16 * (HELD_BLOCKS + cap) / 2


def _traffic(prompt: int) -> Traffic:
    return Traffic(1.0, LengthStats.fixed(prompt), LengthStats.fixed(500), 1.0,
                   SloSet(ttft_p99_s=60.0), ("x",))


def _search_groups() -> tuple[list[ConfigGroup], Traffic]:
    """The planner's configuration groups of gpt-oss-120b on one H100 at token budgets of 512
    and 8,192, and its traffic (20,000-token prompts, 500-token outputs)."""
    plan = PlanFile.model_validate({
        "model": "gpt-oss-120b", "candidates": {"gpus": ["h100-sxm"], "tp": [1]},
        "engine": {"max_num_batched_tokens": [512, 8192]},
        "workloads": [{"name": "x", "rate_per_s": 1, "input_len": "20000",
                       "output_len": "500", "slo": {"ttft_p99_s": 60.0}}]})
    resolved = _CAT.resolve_model(plan.model)
    t = traffic_for(list(plan.workloads), resolved.spec.context_len(plan.engine.max_model_len))
    space = search_space(_CAT, plan, resolved.spec, t, resolved.implied_weight_dtype)
    return _groups(_CAT, resolved.spec, space), t


def test_search_rows_hold_each_budgets_window(gpt_oss):
    assert (-(-(127 + 512) // 16) + 1, -(-(127 + 8192) // 16) + 1) == (41, 521)
    groups, t = _search_groups()
    qm, seqs, kv = _queue_model(groups, t)
    caps = np.broadcast_to(np.asarray(qm.cap), kv.shape)
    window_caps = np.broadcast_to(np.asarray(qm.limits.layout.window_cap), kv.shape)
    budgets = {512: 41, 8192: 521}
    seen = set()
    for i, g in enumerate(groups):
        for j, (_, budget) in enumerate(g.combos):
            if kv[i, j] <= 0:
                continue
            w = budgets[budget]
            assert window_caps[i, j] == w
            # or the replica's running-sequence cap (attention-DP ranks' together)
            want = min(seqs[i, j], _cap(_mu(w), SD_LONG, kv[i, j]))
            assert caps[i, j] == pytest.approx(want, rel=1e-6)
            seen.add(budget)
    assert seen == set(budgets)
    # e.g. one H100 at 64 sequences and a 512-token budget: 148,912 KV tokens, 14.18 requests
    assert (kv[0, 0], window_caps[0, 0]) == (148_912, 41)
    assert caps[0, 0] == pytest.approx(14.18, abs=0.005)


def test_verified_queue_model_holds_the_candidates_window():
    # plan/verified.queue_model (the replay-resized recommendations', day fleets' and the
    # nearest miss's predictions): one H100 at 64 sequences and a 512-token budget, 148,912
    # KV tokens: the window layers' cap at that budget, 41 blocks, gives
    # _cap(16 x (1,266.097 + 41) / 2, 72.169, 148,912) = 14.18 requests (every layer at full
    # length: about 7)
    groups, t = _search_groups()
    g = groups[0]
    seqs, budget = g.combos[0]
    assert (seqs, budget, g.kv_tokens[0]) == (64, 512, 148_912)
    c = Candidate(group=g, settings=g.settings.with_(max_num_seqs=seqs,
                                                    max_num_batched_tokens=budget),
                  kv_cache_tokens=148_912, max_rate_per_s=1.0, capacity_per_s=1.0,
                  binding_constraint="", index=(0, 0), replicas=1)
    cap = float(np.asarray(queue_model(c, t).cap))
    assert cap == pytest.approx(_cap(_mu(41), SD_LONG, 148_912.0), rel=1e-6)
    assert cap == pytest.approx(14.18, abs=0.005)
    # its pool (what its replay runs on): 148,912 / 16 = 9,307 blocks, the window cap 41
    assert (c.pool.num_blocks, c.pool.block_size, c.pool.layout.window_cap) == (9_307, 16, 41)


def test_each_combinations_pool_holds_its_budgets_window():
    # ConfigGroup.pool_at: each (max_num_seqs, budget) combination's blocks and window cap
    # (cdiv(127 + budget, 16) + 1: 41 at 512, 521 at 8,192)
    g = _search_groups()[0][0]
    for j, (_, budget) in enumerate(g.combos):
        p = g.pool_at(j)
        assert p.num_blocks == g.kv_tokens[j] // 16
        assert p.layout.window_cap == {512: 41, 8192: 521}[budget]


def test_pd_stacked_decode_pools_hold_each_budgets_window(gpt_oss):
    # two decode deployments stacked as the disaggregated search does (a row each): the
    # default 8,192-token budget (window cap 521) and 512 (41); each row's cap is its own
    small = resolve_deployment(_CAT, "gpt-oss-120b", "h100-sxm",
                               EngineOptions(max_model_len=90_600, max_num_seqs=256,
                                             max_num_batched_tokens=512))
    deps = [gpt_oss, small]
    assert [d.pool.layout.window_cap for d in deps] == [521, 41]
    caps = np.asarray(_stacked(deps, _traffic(20_000), "decode").cap).ravel()
    want = [_cap(_mu(w), SD_LONG, float(d.limits.kv_cache_tokens))
            for w, d in zip((521, 41), deps, strict=True)]
    assert caps == pytest.approx(want, rel=1e-6)
