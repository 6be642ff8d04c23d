"""Automatic prefix caching (vLLM V1): what a workload's shared prompts save.

The rules, each from vLLM's design (docs/design/prefix_caching.md; source v0.11-v0.19, see
docs/research/engines.md section 5):
- Only full blocks are cached; a block's hash chains from its parent's, so a block hits only
  when every block before it hit (`kv_cache_utils.hash_block_tokens`).
- A hit is capped at `num_tokens - 1`: at least one prompt token is always computed, and the hit
  is block-aligned below that (`kv_cache_manager.get_computed_blocks`).
- Blocks in use are shared: a hit on a running request's block raises its ref count, so a
  shared prefix occupies KV once however many requests hold it (`block_pool.touch`).
- Freed blocks keep their hash in the free queue, count as free and are evicted when popped for
  a new allocation, least recently freed first, a request's tail blocks first
  (`block_pool.get_new_blocks`, `FreeKVCacheBlockQueue`).

From the last rule: a freed block survives `cache_time_s = free_blocks / allocated_blocks_per_s`
(the free queue is FIFO under allocation). A prefix is cached when a request that shares it
arrived within its holding time plus `cache_time_s`: for Poisson arrivals of rate r sharing it,
P(hit) = 1 - exp(-r (hold_s + cache_time_s)).

Workloads (docs/prefix_caching.md):
- shared prefix: a fraction `share_frac` of requests starts with the same `shared_tokens`;
- multi-turn: sessions of `turns` turns, turn k resends turns 1..k-1 (prompts and answers),
  then a new message drawn from the lane's input length;
- an explicit `hit_rate`: the fraction of prompt tokens served from the cache (not shared in
  KV between running requests: a conservative reading).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from capplan.errors import InputError


@dataclass(frozen=True)
class PrefixSpec:
    """How a lane's prompts share content (at most one of the three forms besides turns)."""

    shared_tokens: int = 0
    """Tokens of the prefix shared by `share_frac` of the requests."""
    share_frac: float = 0.0
    """Fraction of requests that start with the shared prefix."""
    turns: int = 1
    """Turns per session; turn k's prompt resends turns 1..k-1."""
    think_s: float = 0.0
    """Between a session's turns (open loop: from one turn's arrival to the next's)."""
    hit_rate: float | None = None
    """Explicit fraction of prompt tokens found in the cache."""

    def __post_init__(self) -> None:
        if self.shared_tokens < 0 or not 0.0 <= self.share_frac <= 1.0:
            raise InputError(f"shared prefix {self.shared_tokens} tokens on "
                             f"{self.share_frac} of requests: need tokens >= 0 and 0..1")
        if self.turns < 1 or not (math.isfinite(self.think_s) and self.think_s >= 0):
            raise InputError(f"turns {self.turns}, think {self.think_s} s: need turns >= 1 "
                             "and a think time >= 0")
        if self.hit_rate is not None and not 0.0 <= self.hit_rate <= 1.0:
            raise InputError(f"prefix hit rate {self.hit_rate}: must be between 0 and 1")
        forms = (self.shared_tokens > 0 and self.share_frac > 0, self.turns > 1,
                 self.hit_rate is not None)
        if sum(forms) > 1:
            raise InputError("a lane's prefix is one of: a shared prefix, multi-turn sessions "
                             "or an explicit hit rate, not several")

    @property
    def active(self) -> bool:
        return (self.shared_tokens > 0 and self.share_frac > 0) or self.turns > 1 or bool(
            self.hit_rate)


NO_PREFIX = PrefixSpec()


def block_hit_tokens(shareable_tokens: ArrayLike, prompt_tokens: ArrayLike,
                     block_size: int) -> np.ndarray:
    """Tokens a request finds cached when its first `shareable_tokens` are in the cache: full
    blocks only, at least one prompt token left to compute:
    block_size * floor(min(shareable, prompt - 1) / block_size).

    Worked: a 128-token prefix on a 200-token prompt, blocks of 16 -> 128 (8 blocks); on a
    128-token prompt -> 112 (the 128th token is recomputed, and its block with it)."""
    s = np.minimum(np.asarray(shareable_tokens, float), np.asarray(prompt_tokens, float) - 1)
    return block_size * np.floor(np.maximum(s, 0.0) / block_size)


@dataclass(frozen=True)
class PrefixCache:
    """What caching does to one lane's requests (means per request, tokens)."""

    cached_tokens_mean: float = 0.0
    """Prompt tokens served from the cache: prefill skips them, attention still reads them."""
    prefill_tokens: tuple[float, ...] = ()
    """Samples of the tokens each prompt computes (prompt - hit); empty = no caching."""
    shared_kv_tokens_per_seq: float = 0.0
    """Tokens of a running request held in blocks it shares with other running requests."""
    resident_kv_tokens: float = 0.0
    """KV held once for the shared blocks (the shared prefix)."""
    hit_prob: float = 1.0
    """Probability that the shared content is still cached when a request arrives."""
    common_prefix_tokens: int = 0
    """Tokens of a prefix every request starts with (0 otherwise): `vllm bench serve
    --random-prefix-len` reproduces such a workload."""

    @property
    def active(self) -> bool:
        return self.cached_tokens_mean > 0


def cache_time_s(free_kv_tokens: float, allocated_tokens_per_s: float) -> float:
    """How long a freed block survives in vLLM's free queue: the queue is FIFO under
    allocation (`FreeKVCacheBlockQueue.popleft`), so a block freed now is popped after the
    blocks free before it, free_kv / allocation rate seconds later."""
    if allocated_tokens_per_s <= 0:
        return math.inf
    return max(free_kv_tokens, 0.0) / allocated_tokens_per_s


def hit_probability(share_rate_per_s: float, hold_s: float, cache_s: float) -> float:
    """P(the shared blocks are cached when a sharing request arrives), Poisson arrivals: some
    sharing request arrived within the last hold_s + cache_s (it still holds the blocks, or
    freed them less than cache_s ago): 1 - exp(-r (hold + cache))."""
    w = hold_s + cache_s
    if share_rate_per_s <= 0:
        return 0.0
    if math.isinf(w):
        return 1.0
    return float(1.0 - math.exp(-share_rate_per_s * max(w, 0.0)))


def prefix_cache(spec: PrefixSpec, prompt_tokens: ArrayLike,
                 block_size: int, hit_prob: float = 1.0) -> PrefixCache:
    """The cache's effect on one lane, from samples of its prompt and output lengths (for a
    multi-turn lane: the prompts as resent, see `multi_turn_lengths`).

    shared prefix: a sharing request hits block_hit_tokens(N, I); the prefix's full blocks
    are held once, floor(N / bs) * bs tokens. multi-turn: turn k hits the history its previous
    turn left in full blocks (its prompt plus its answer but the answer's last token, whose KV
    is never computed), capped by block_hit_tokens; nothing is shared between running requests.
    hit_rate h: h * I, block-aligned, capped the same way.
    """
    inp = np.asarray(prompt_tokens, float)
    if not spec.active or inp.size == 0:
        return PrefixCache()
    if spec.shared_tokens > 0 and spec.share_frac > 0:
        # The samples are i.i.d.: the first round(f p n) of them stand for the requests that
        # share the prefix and find it cached (a mixture, so quantiles keep both modes).
        k = round(spec.share_frac * hit_prob * inp.size)
        per = np.zeros_like(inp)
        per[:k] = block_hit_tokens(spec.shared_tokens, inp[:k], block_size)
        shared = float(per.mean())
        resident = block_size * math.floor(spec.shared_tokens / block_size)
    elif spec.turns > 1:
        raise InputError("multi-turn lanes: build the prompts with multi_turn_lengths and "
                         "pass its history to prefix_cache_history")
    else:
        h = float(spec.hit_rate or 0.0)
        per = block_hit_tokens(h * inp, inp, block_size) * hit_prob
        shared, resident = 0.0, 0.0
    common = spec.shared_tokens if spec.share_frac >= 1.0 else 0
    return PrefixCache(float(per.mean()), tuple((inp - per).tolist()), shared, resident,
                       hit_prob, common)


def multi_turn_lengths(message_tokens: ArrayLike, output_tokens: ArrayLike, turns: int
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prompts of sessions of `turns` turns: row s of the inputs is session s's new messages
    (u_1..u_K) and answers (o_1..o_K). Turn k's prompt is sum_{j<k} (u_j + o_j) + u_k, and the
    history its previous turn cached is sum_{j<k} (u_j + o_j) - 1 (turn k-1's last token).
    Returns flat (prompt, output, history) arrays, session-major."""
    u = np.asarray(message_tokens, np.int64).reshape(-1, turns)
    o = np.asarray(output_tokens, np.int64).reshape(-1, turns)
    done = np.cumsum(u + o, axis=1) - (u + o)  # tokens of the turns before k
    prompt = done + u
    history = np.where(done > 0, done - 1, 0)
    return prompt.ravel(), o.ravel(), history.ravel()


def prefix_cache_history(prompt_tokens: ArrayLike, history_tokens: ArrayLike,
                         block_size: int, hit_prob: float = 1.0) -> PrefixCache:
    """Multi-turn: each prompt hits the full blocks of its cached history."""
    inp = np.asarray(prompt_tokens, float)
    k = round(hit_prob * inp.size)
    per = np.zeros_like(inp)
    per[:k] = block_hit_tokens(np.asarray(history_tokens, float)[:k], inp[:k], block_size)
    return PrefixCache(float(per.mean()), tuple((inp - per).tolist()), 0.0, 0.0, hit_prob)
