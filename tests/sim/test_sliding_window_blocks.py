"""Sliding-window models in the KV pool: the replay, `speed`'s fit check and `memory` count a
sequence's blocks by one rule (models/layers.BlockLayout, window_blocks_cap).

vLLM V1's hybrid KV cache manager keeps full-attention groups' blocks for the whole sequence
and a sliding-window group's cdiv(L, block_size) blocks of an L-token sequence, at most
cdiv(window - 1 + max_num_batched_tokens, block_size) + 1 (SlidingWindowSpec.
max_memory_usage_bytes; SlidingWindowManager.remove_skipped_blocks frees the blocks that fall out
of the window). The hand calculations below are independent of
the code: they use the catalog's layer counts and the memory report's KV bytes only.
"""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capplan.catalog.loader import load_catalog
from capplan.models.engine import EngineSettings, SchedulerPolicy
from capplan.models.layers import DENSE_LAYOUT, BlockLayout, block_layout, stage_layers
from capplan.plan.deployment import EngineOptions, resolve_deployment
from capplan.plan.speed import max_batch
from capplan.sim import ContinuousEngine, Requests, compiled_available

_CAT = load_catalog(())


@pytest.fixture(scope="module")
def gpt_oss():
    # the audit's `memory --max-model-len 90300` (its `simulate` runs the same pool)
    return resolve_deployment(_CAT, "gpt-oss-120b", "h100-sxm",
                              EngineOptions(max_model_len=SEQ_TOKENS))


# --- gpt-oss-120b on one H100, vLLM defaults (the audit's case) ------------------------------
# 18 full + 18 sliding (window 128) attention layers; KV per token per layer:
# 2 (K, V) * 8 KV heads * 64 head_dim * 2 B = 2,048 B. vLLM groups the layers 18 and 18: a
# pool block is 16 tokens in 18 layers, 18 * 16 * 2,048 B = 576 KiB.
GROUP_BLOCK_BYTES = 18 * 16 * 2 * 8 * 64 * 2  # 589,824 B
SEQ_TOKENS = 90_300
FULL_BLOCKS = -(-SEQ_TOKENS // 16)  # 5,644
WINDOW_BLOCKS = -(-(128 - 1 + 8192) // 16) + 1  # 521: the window behind an 8,192-token chunk
SEQ_BLOCKS = FULL_BLOCKS + WINDOW_BLOCKS  # 6,165


def test_gpt_oss_pool_and_sequence_blocks_by_hand(gpt_oss):
    assert (FULL_BLOCKS, WINDOW_BLOCKS, SEQ_BLOCKS) == (5644, 521, 6165)
    st_ = stage_layers(gpt_oss.model)
    assert (st_.count("full_attention"), st_.count("sliding_attention")) == (18, 18)
    assert gpt_oss.memory.kv_bytes_per_token_per_gpu == 36 * 2048
    # vLLM's pool: the KV cache over 576 KiB blocks. The audit's 7.66 GiB (rounded) gives
    # 13,944; the report's exact 8,221,658,184 B give 13,939. The replay's pool is the memory
    # report's 6,969 blocks of all 36 layers, 2 group blocks each: 13,938, within the one block
    # the report's floor to a 36-layer block can lose (tolerance: 1 block).
    vllm_blocks = int(gpt_oss.memory.kv_cache_bytes_per_gpu // GROUP_BLOCK_BYTES)
    assert vllm_blocks == 13_939
    pool = gpt_oss.pool
    assert pool.layout == BlockLayout(1, 1, WINDOW_BLOCKS, 128)
    sim_blocks = pool.num_blocks * pool.layout.units
    assert sim_blocks == 13_938 and abs(sim_blocks - vllm_blocks) <= 1
    assert pool.layout.blocks(FULL_BLOCKS) == SEQ_BLOCKS
    # two 90,300-token sequences fit (2.26 of them), as `memory`'s max concurrency says
    assert sim_blocks // SEQ_BLOCKS == 2 == int(gpt_oss.memory.max_concurrency)
    assert gpt_oss.memory.max_concurrency == pytest.approx(vllm_blocks / SEQ_BLOCKS, abs=0.01)
    assert pool.sequences_at(SEQ_TOKENS) == 2


def test_gpt_oss_two_long_sequences_run_together_without_preemption(gpt_oss):
    # the audit's simulate: a closed loop of 2 clients, 90,000 + 300 tokens each
    n = 4
    reqs = Requests(np.zeros(n), np.full(n, 90_000), np.full(n, 300), np.zeros(n, np.int64),
                    concurrency=2)
    pool, s = gpt_oss.pool, gpt_oss.settings
    eng = ContinuousEngine(gpt_oss.step, pool.num_blocks, pool.block_size, s.max_num_seqs,
                           s.max_num_batched_tokens, s.profile.scheduler, layout=pool.layout)
    eng.jit = False
    rec = eng.run(reqs)
    assert rec.preemptions == 0
    assert int(rec.step_running.max()) == 2
    # the peak: both sequences near their last decode (6,165 blocks at 90,289-90,300 tokens);
    # the two are a few tokens apart, so one may be a block short (tolerance: 1 block each)
    peak = int(rec.step_kv_blocks.max())
    assert 2 * SEQ_BLOCKS - 2 <= peak <= 2 * SEQ_BLOCKS <= rec.num_gpu_blocks == 13_938
    # counted at full length (the rule before window layers were capped) they preempt
    full = ContinuousEngine(gpt_oss.step, pool.num_blocks, pool.block_size, s.max_num_seqs,
                            s.max_num_batched_tokens, s.profile.scheduler)
    full.jit = False
    assert full.run(reqs).preemptions > 0


def test_gemma3_speed_fits_what_memory_says():
    # Gemma-3-27B: 10 full + 52 sliding (window 1,024) layers; the unit is 16 tokens in
    # gcd(10, 52) = 2 layers, so a 32,768-token sequence holds 5 * 2,048 + 26 * 577 = 25,242
    # units (577 = cdiv(1,023 + 8,192, 16) + 1) of the pool's num_gpu_blocks * 31 units
    # the audit's `memory --max-model-len 32768` and `speed --context 32768`
    dep = resolve_deployment(_CAT, "gemma-3-27b", "h100-sxm", EngineOptions(max_model_len=32_768))
    assert dep.pool.layout == BlockLayout(5, 26, 577, 1024)
    units = dep.memory.num_gpu_blocks * 31
    assert units // (5 * 2048 + 26 * 577) == 2
    # memory's 2.66x rule, floored (exact integers)
    assert dep.memory.max_concurrency == pytest.approx(2.66, abs=0.005)
    assert int(dep.memory.max_concurrency) == 2
    assert max_batch(dep, 32_768) == 2
    # all layers at full length, 34,672 tokens would hold one
    assert dep.memory.kv_cache_tokens // 32_768 == 1


def test_gpt_oss_below_the_window_cap_speed_holds_what_vllm_allocates():
    # max_model_len 800 = 50 blocks, below the cap (521). vLLM allocates a window layer
    # cdiv(800, 16) = 50 blocks (SingleTypeKVCacheManager.get_num_blocks_to_allocate; none is
    # behind the window at the prefill of an 800-token prompt), so a sequence holds 50 + 50 =
    # 100 group blocks of the 6,969 * 2 = 13,938 (test above): 139 sequences in `speed` and
    # the replay. `memory`'s max concurrency is vLLM's start-up figure, whose reservation
    # counts cdiv(min(127 + 8,192, 800), 16) + 1 = 51 window blocks (max_memory_usage_bytes):
    # 13,939 // 101 = 138.
    dep = resolve_deployment(_CAT, "gpt-oss-120b", "h100-sxm", EngineOptions(max_model_len=800))
    assert dep.pool.layout.blocks(50) == 50 + 50
    assert dep.pool.num_blocks * 2 // 100 == 139
    assert max_batch(dep, 800) == 139 == dep.pool.sequences_at(800)
    assert int(dep.memory.max_concurrency) == 138 == 13_939 // 101


def test_too_long_request_error_quotes_the_limit_it_decides_by(gpt_oss):
    # one sequence fits while full * k + min(k, 521) <= 13,938 group blocks: k = 13,417
    # token blocks, 214,672 tokens (counted at full length the cache would hold 111,504)
    pool, s = gpt_oss.pool, gpt_oss.settings
    eng = ContinuousEngine(gpt_oss.step, pool.num_blocks, 16, 8, 8192, s.profile.scheduler,
                           layout=pool.layout)
    limit = (13_938 - WINDOW_BLOCKS) * 16
    assert limit == 214_672

    def one(tokens: int) -> Requests:
        return Requests(np.zeros(1), np.array([tokens - 1]), np.array([1]), np.zeros(1, np.int64))

    eng._check_requests(one(limit))
    want = f"needs {limit + 1} KV tokens but the cache holds {limit}:"
    with pytest.raises(Exception, match=want):
        eng._check_requests(one(limit + 1))


def test_engines_that_keep_out_of_window_blocks_count_them():
    dep = resolve_deployment(_CAT, "gpt-oss-120b", "h100-sxm")
    pool, s = dep.pool, dep.settings
    keeps = replace(s.profile.scheduler, frees_out_of_window=False)
    eng = ContinuousEngine(dep.step, pool.num_blocks, 16, 8, 8192, keeps, layout=pool.layout)
    assert eng.layout.window == 0 and eng.total_blocks == 2 * pool.num_blocks
    assert eng.layout.blocks(FULL_BLOCKS) == 2 * FULL_BLOCKS


def test_keeping_out_of_window_blocks_is_one_rule_for_memory_and_the_engine():
    # 18 full + 18 window layers (gcd 18): 1 + 1 pool blocks per token block, both growing with
    # the sequence as full layers do: 2 per token block, and a prefix-cache entry holds both
    # (window layers as full ones), whether the layout is built for the policy or the engine
    # is handed the freeing layout
    dep = resolve_deployment(_CAT, "gpt-oss-120b", "h100-sxm")
    kept = block_layout(dep.model, 16, 8192, frees_out_of_window=False)
    assert (kept.blocks(FULL_BLOCKS), kept.entry, kept.window) == (2 * FULL_BLOCKS, 2, 0)
    keeps = replace(dep.settings.profile.scheduler, frees_out_of_window=False)
    eng = ContinuousEngine(dep.step, dep.pool.num_blocks, 16, 8, 8192, keeps,
                           layout=dep.pool.layout)
    assert eng.layout == kept


# --- the dense replay is unchanged ----------------------------------------------------------
# Fingerprints of dense replays (Llama-3.1-8B, a 300-block pool that preempts) recorded with
# the code before window layers were capped: every per-request time and per-step array, bit
# for bit, both loops.
DENSE_FINGERPRINTS = {
    ("vllm", 1, 0): "6637ebddf147ee8c", ("vllm", 1, 3): "5dac8b3e0158dc99",
    ("vllm", 2, 0): "e6136ad86e36b6e0", ("pc", 1, 0): "7d4d5771fee78262",
    ("pc", 2, 3): "85b7bdde131bef48", ("pf", 3, 0): "4a225ce95c267b6c",
    ("ne", 1, 3): "58463365a6f0d825",
}
_DENSE_POLICIES = {
    "vllm": SchedulerPolicy(), "pc": SchedulerPolicy(prefix_caching=True),
    "pf": SchedulerPolicy(prefill_first=True, prefix_caching=True),
    "ne": SchedulerPolicy(chunked_prefill=False, reserve_output_frac=1.0, preemption=False)}


def _dense_requests(seed: int, shared: bool, n: int = 160) -> Requests:
    rng = np.random.default_rng(seed)
    inp, out = rng.integers(16, 700, n), rng.integers(1, 200, n)
    r = Requests(np.cumsum(rng.exponential(1 / 60.0, n)), inp, out, rng.integers(0, 2, n))
    if shared:
        r = replace(r, prefix_group=rng.integers(-1, 4, n),
                    prefix_tokens=np.minimum(inp, rng.integers(0, 600, n)))
    return r


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize(("policy", "seed", "state"), list(DENSE_FINGERPRINTS))
def test_dense_replay_bit_for_bit(jit, policy, seed, state):
    if jit and not compiled_available():
        pytest.skip("numba (the fast extra)")
    dep = resolve_deployment(_CAT, "llama-3.1-8b", "h100-sxm",
                             EngineSettings(max_num_seqs=256, max_num_batched_tokens=8192))
    assert dep.pool.layout == DENSE_LAYOUT
    eng = ContinuousEngine(dep.step, 300, 16, 24, 1024, _DENSE_POLICIES[policy],
                           state_blocks=state, layout=dep.pool.layout)
    eng.jit = jit
    rec = eng.run(_dense_requests(seed, policy in ("pc", "pf")), np.array([1, 0]))
    h = hashlib.sha256()
    for k in ("admitted_at_s", "first_token_at_s", "finished_at_s", "extra_gaps_s",
              "step_kv_blocks", "step_running", "step_dur_s"):
        h.update(np.ascontiguousarray(getattr(rec, k)).tobytes())
    h.update(repr((rec.preemptions, rec.prefix_hit_tokens, rec.num_gpu_blocks)).encode())
    assert h.hexdigest()[:16] == DENSE_FINGERPRINTS[(policy, seed, state)]


# --- block accounting invariant for windowed layouts -----------------------------------------
@contextmanager
def _checked_blocks(layout: BlockLayout, state: int, seen: list):
    """The plain loop with a check after every step's advance: the pool blocks in use equal
    the sum, over the running sequences, of their state plus layout.blocks(max(reservation,
    ceil(computed / block_size))) (no shared prefixes: each block has one holder), and never
    exceed the pool."""
    from capplan.sim import compiled

    mod = compiled.plain_module()
    orig = mod._advance_running

    def checked(decode, q, sc, cfg, run, bufs):  # noqa: ANN001, ANN202
        orig(decode, q, sc, cfg, run, bufs)
        bs, total = int(cfg[mod.BS]), int(cfg[mod.TOTAL])
        want = 0
        for s in run[:sc[mod.NRUN]]:
            tok = max(int(q[mod.RESERVED, s]), -(-int(q[mod.COMPUTED, s]) // bs))
            want += state * layout.units + layout.blocks(tok)
        used = total - int(sc[mod.FREE])
        assert used == want <= total
        seen.append(int(sc[mod.NRUN]))

    mod._advance_running = checked
    try:
        yield
    finally:
        mod._advance_running = orig


class _LinearStep:
    """A step-time stand-in: 1 ms per token computed, 0.1 ms per decode KV token read."""

    window = 2.0**62

    def step(self, num_decode=0, decode_kv_tokens=0, prefill_tokens=0, **kw):  # noqa: ANN001, ANN003, ANN201, ARG002
        nd, kv, pt = (np.asarray(x, float) for x in (num_decode, decode_kv_tokens,
                                                      prefill_tokens))
        return {"step_s": 1e-3 * (nd + pt) + 1e-4 * kv}


_WINDOW_POLICIES = (SchedulerPolicy(prefix_caching=False), SchedulerPolicy(),
                    SchedulerPolicy(prefill_first=True),
                    SchedulerPolicy(chunked_prefill=False, reserve_output_frac=1.0,
                                    preemption=False))


@settings(max_examples=25, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(_WINDOW_POLICIES),
       shape=st.sampled_from([(1, 1), (5, 26), (1, 3)]), cap=st.integers(2, 30),
       state=st.sampled_from([0, 1]), blocks=st.integers(60, 160),
       rate=st.sampled_from([None, 40.0]))
def test_window_blocks_never_exceed_the_pool_and_follow_the_rule(seed, policy, shape, cap,
                                                                 state, blocks, rate):
    layout = BlockLayout(*shape, cap, 64)
    rng = np.random.default_rng(seed)
    n = 40
    arr = np.zeros(n) if rate is None else np.cumsum(rng.exponential(1 / rate, n))
    reqs = Requests(arr, rng.integers(16, 700, n), rng.integers(1, 120, n),
                    np.zeros(n, np.int64))
    _run_checked(_checked_blocks, layout, policy, blocks, state, reqs)


def _run_checked(checker, layout: BlockLayout, policy, blocks: int, state: int, reqs) -> None:  # noqa: ANN001
    """The plain loop over `reqs` with `checker` asserting its invariants after every step;
    every step's blocks within the pool, every request finished."""
    eng = ContinuousEngine(_LinearStep(), blocks, 16, 32, 1024, policy, state_blocks=state,
                           layout=layout)
    eng.jit = False
    seen: list = []
    with checker(layout, state, seen):
        rec = eng.run(reqs)
    assert seen and (rec.step_kv_blocks <= blocks * layout.units).all()
    assert np.isfinite(rec.finished_at_s).all()


@contextmanager
def _checked_cache(layout: BlockLayout, state: int, seen: list):
    """The plain loop with prefix caching checked after every step's advance: a shared block is
    held once, so the pool blocks in use equal the running sequences' state plus
    layout.blocks(...) less layout.entry per extra holder of a shared key; they never exceed the
    pool; the cached free blocks (layout.entry each, never 0) are free blocks, and the free
    queue's live entries are them, within its array."""
    from capplan.sim import compiled

    mod = compiled.plain_module()
    orig = mod._advance_running

    def checked(decode, q, sc, cfg, run, bufs):  # noqa: ANN001, ANN202
        orig(decode, q, sc, cfg, run, bufs)
        pcx = bufs[11]
        bs, total, entry = int(cfg[mod.BS]), int(cfg[mod.TOTAL]), layout.entry
        assert entry > 0
        want = 0
        for s in run[:sc[mod.NRUN]]:
            tok = max(int(q[mod.RESERVED, s]), -(-int(q[mod.COMPUTED, s]) // bs))
            want += state * layout.units + layout.blocks(tok)
        want -= entry * int(np.maximum(pcx[mod.KREF].astype(np.int64) - 1, 0).sum())
        used = total - int(sc[mod.FREE])
        assert used == want <= total
        lru, head, tail = pcx[mod.LRU], int(sc[mod.LRU_HEAD]), int(sc[mod.LRU_TAIL])
        assert 0 <= head <= tail <= lru.shape[1]
        live = sum(bool(mod._live(int(lru[0, i]), int(lru[1, i]), pcx))
                   for i in range(head, tail))
        assert 0 <= int(sc[mod.NCACHED]) == live * entry <= int(sc[mod.FREE])
        seen.append(int(sc[mod.NCACHED]))

    mod._advance_running = checked
    try:
        yield
    finally:
        mod._advance_running = orig


@settings(max_examples=30, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(_WINDOW_POLICIES[1:]),
       shape=st.sampled_from([(0, 1), (1, 1), (5, 26), (1, 3)]), cap=st.integers(2, 30),
       state=st.sampled_from([0, 1]), blocks=st.integers(60, 160),
       rate=st.sampled_from([None, 40.0]))
def test_window_blocks_with_shared_prefixes_keep_the_pool_and_free_queue(seed, policy, shape,
                                                                         cap, state, blocks,
                                                                         rate):
    # window-only (Mistral-7B-v0.1, Phi-3-mini) and hybrid layouts with prefix caching on and
    # prompts sharing one of four contents: hits, evictions and preempted blocks kept cached
    layout = BlockLayout(*shape, cap, 64)
    rng = np.random.default_rng(seed)
    n = 40
    arr = np.zeros(n) if rate is None else np.cumsum(rng.exponential(1 / rate, n))
    inp = rng.integers(16, 700, n)
    reqs = Requests(arr, inp, rng.integers(1, 120, n), np.zeros(n, np.int64),
                    prefix_group=rng.integers(-1, 4, n),
                    prefix_tokens=np.minimum(inp, rng.integers(0, 600, n)))
    _run_checked(_checked_cache, layout, policy, blocks, state, reqs)


def test_window_only_prefix_hits_hold_evictable_memory():
    # Mistral-7B-v0.1's shape: a cached block is its window-layer block, so hits are evicted
    # when the pool needs them (the free queue stays in its array) and both loops agree
    layout = BlockLayout(0, 1, 8, 64)
    assert (layout.entry, layout.cached_cap) == (1, 8)
    n = 60
    reqs = Requests(np.arange(n) * 0.5, np.full(n, 200), np.full(n, 4), np.zeros(n, np.int64),
                    prefix_group=np.arange(n), prefix_tokens=np.full(n, 200))
    runs = []
    for jit in (False, True):
        if jit and not compiled_available():
            continue
        eng = ContinuousEngine(_LinearStep(), 40, 16, 8, 1024, SchedulerPolicy(),
                               layout=layout)
        eng.jit = jit
        runs.append(eng.run(reqs))
    assert np.isfinite(runs[0].finished_at_s).all()
    for r in runs[1:]:
        np.testing.assert_allclose(r.finished_at_s, runs[0].finished_at_s, rtol=0, atol=1e-9)


def test_a_layout_with_window_layers_needs_their_cap():
    # window_blocks has no uncapped case: window layers without a cap would count every token
    # block plus none freed, so such a layout is refused at construction (kept_whole is the
    # layout of an engine that keeps out-of-window blocks)
    with pytest.raises(ValueError, match="window_cap"):
        BlockLayout(1, 1)
    with pytest.raises(ValueError, match="window_cap"):
        BlockLayout(np.array([[1, 1]]), np.array([[0, 1]]), np.array([[1 << 40, 1 << 40]]),
                    np.array([[0, 128]]))
    assert BlockLayout(2).window == 0
    assert BlockLayout(1, 1, 6, 64).kept_whole() == BlockLayout(2)
