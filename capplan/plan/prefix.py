"""A lane's prefix sharing, for the analytic model: prompt samples (a multi-turn lane's grow
with its history) and what the cache saves (models/prefix.py; docs/prefix_caching.md)."""

from __future__ import annotations

import numpy as np

from capplan.errors import InputError
from capplan.models.prefix import (
    PrefixCache,
    PrefixSpec,
    cache_time_s,
    hit_probability,
    multi_turn_lengths,
    prefix_cache,
    prefix_cache_history,
)
from capplan.plan.lengths import clipped, sample_lengths


def lane_lengths(spec: PrefixSpec | None, input_len: str | int, output_len: str | int,
                 max_model_len: int | None, block_size: int, rate_per_s: float | None = None,
                 kv_cache_tokens: float | None = None
                 ) -> tuple[np.ndarray, np.ndarray, PrefixCache]:
    """(prompt samples, output samples, cache effect) of one lane.

    A multi-turn lane's input length is each turn's new message: prompts are built by
    multi_turn_lengths. With a rate and a KV size, the hit probability follows from how long a
    freed block survives (models/prefix.py): the free queue is taken as the whole KV cache
    (an upper bound on survival: running requests hold part of it)."""
    inp, out = sample_lengths(input_len, output_len, max_model_len)
    if spec is None or not spec.active:
        return inp, out, PrefixCache()
    if spec.turns > 1:
        n = len(inp) - len(inp) % spec.turns
        prompt, out, hist = multi_turn_lengths(inp[:n], out[:n], spec.turns)
        prompt, out = clipped(prompt.astype(float), out.astype(float), max_model_len)
        p = _survival(spec, rate_per_s, kv_cache_tokens, prompt, out)
        return prompt, out, prefix_cache_history(prompt, np.minimum(hist, prompt), block_size, p)
    check_prefix_fits(spec, float(np.mean(inp)))
    p = _survival(spec, rate_per_s, kv_cache_tokens, inp, out)
    return inp, out, prefix_cache(spec, inp, block_size, p)


def check_prefix_fits(spec: PrefixSpec | None, mean_input_tokens: float) -> None:
    """A shared prefix is the start of each prompt (part of input_len): it must leave a token of
    the prompt its own. Longer, it was accepted and a verify line read `--random-input-len
    -16776216` (input - prefix)."""
    if spec is not None and spec.shared_tokens and spec.shared_tokens >= mean_input_tokens:
        raise InputError(f"shared prefix of {spec.shared_tokens:,} tokens is the start of each "
                         f"prompt and must be shorter than it (mean input length "
                         f"{mean_input_tokens:,.0f} tokens): lower the shared prefix or raise "
                         "the input length")


def _survival(spec: PrefixSpec, rate_per_s: float | None, kv_tokens: float | None,
              inp: np.ndarray, out: np.ndarray) -> float:
    if not rate_per_s or not kv_tokens:
        return 1.0
    t_c = cache_time_s(kv_tokens, rate_per_s * float(np.mean(inp) + np.mean(out)))
    if spec.turns > 1:  # the next turn comes think_s after: LRU keeps it iff t_c covers it
        return 1.0 if spec.think_s <= t_c else 0.0
    if spec.hit_rate is not None:
        return 1.0
    return hit_probability(rate_per_s * spec.share_frac, 0.0, t_c)


def pooled_prefix(lanes: list[tuple[float, PrefixSpec | None, str | int, str | int]],
                  max_model_len: int | None, block_size: int = 16
                  ) -> tuple[np.ndarray, np.ndarray, PrefixCache]:
    """Lanes (rate, prefix, input_len, output_len) sharing a pool: samples mixed in proportion
    to rates (as plan/lengths.pooled_stats), cache effects pooled the same way; shared prefixes
    of different lanes are held once each. The block size is vLLM's default (16): the pool's
    candidates are searched before their block size is known."""
    from capplan.plan.lengths import LENGTH_SAMPLES

    total = sum(r for r, _, _, _ in lanes)
    ins, outs, pfs, caches = [], [], [], []
    for rate, spec, i_len, o_len in lanes:
        i, o, pc = lane_lengths(spec, i_len, o_len, max_model_len, block_size)
        n = len(i) if len(lanes) == 1 else max(200, int(LENGTH_SAMPLES * rate / total))
        ins.append(i[:n])
        outs.append(o[:n])
        pfs.append(np.asarray(pc.prefill_tokens, float)[:n] if pc.active else i[:n])
        caches.append((rate / total, pc))
    return np.concatenate(ins), np.concatenate(outs), PrefixCache(
        sum(w * pc.cached_tokens_mean for w, pc in caches),
        tuple(np.concatenate(pfs).tolist()),
        sum(w * pc.shared_kv_tokens_per_seq for w, pc in caches),
        sum(pc.resident_kv_tokens for _, pc in caches),
        common_prefix_tokens=caches[0][1].common_prefix_tokens if len(caches) == 1 else 0)
