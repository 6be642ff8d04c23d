"""Decode curves and prefill times for one deployment (composition only; formulas in models/)."""

from __future__ import annotations

from typing import Any

import numpy as np

from capplan.models.perf import BOUNDS, knee_batch
from capplan.plan.deployment import Deployment

KNEE_SEARCH_MAX = 4096
"""The knee is searched over the powers of two up to this batch (and the batches given)."""


def decode_curve(dep: Deployment, batches: list[int], contexts: list[int]) -> dict[str, Any]:
    """Rows of (batch, context) with step time, throughput, per-sequence speed and bound.

    A batch or context given twice is one row (the first place it appears keeps the order).
    `knee_checked_up_to`: per context, the largest batch the knee search evaluated (the powers
    of two up to KNEE_SEARCH_MAX and the given batches, as far as they fit: `max_batch`)."""
    batches, contexts = list(dict.fromkeys(batches)), list(dict.fromkeys(contexts))
    b = np.asarray(batches, float)[:, None]
    c = np.asarray(contexts, float)[None, :]
    r = dep.step.decode_step(b, c)
    step = np.broadcast_to(r["step_s"], (b.size, c.size))
    bound = np.broadcast_to(r["bound_index"], (b.size, c.size))
    rows, excluded = [], []
    for j, ctx in enumerate(contexts):
        for i, bs in enumerate(batches):
            if bs > max_batch(dep, ctx):
                excluded.append({"batch": int(bs), "context_len": int(ctx)})
                continue
            t = float(step[i, j])
            rows.append({"batch": int(bs), "context_len": int(ctx), "step_time_s": t,
                         "tokens_per_s_total": bs / t, "tokens_per_s_per_seq": 1.0 / t,
                         "bound": BOUNDS[int(bound[i, j])]})
    knees: dict[int, int | None] = {}
    checked: dict[int, int | None] = {}
    for ctx in contexts:
        dense = np.unique(np.concatenate([np.asarray(batches),
                                          2 ** np.arange(0, int(np.log2(KNEE_SEARCH_MAX)) + 1)]))
        dense = dense[dense <= max_batch(dep, ctx)]
        t = dep.step.decode_step(dense, ctx)["step_s"] if dense.size else np.zeros(0)
        knees[int(ctx)] = knee_batch(dense, dense / t) if dense.size else None
        checked[int(ctx)] = int(dense[-1]) if dense.size else None
    return {"rows": rows, "knee_batch": knees, "knee_checked_up_to": checked,
            "excluded": excluded,
            "max_batch": {int(c): max_batch(dep, c) for c in contexts},
            "engine_settings": dep.settings_summary()}


def max_batch(dep: Deployment, context_len: int) -> int:
    """The largest batch the engine can run at this context: max_num_seqs, or KV capacity
    (whole blocks, sliding-window layers capped at their window's, plus a hybrid's recurrent
    state blocks: KvPool.sequences_at)."""
    # a replica of attention-DP ranks holds each rank's limits and KV pool (Deployment.limits)
    return int(min(dep.limits.max_num_seqs, dep.pool.sequences_at(context_len)))


def prefill_rows(dep: Deployment, prompt_lens: list[int]) -> list[dict[str, Any]]:
    """Prefill time of each prompt alone, chunked by max_num_batched_tokens, and the TTFT floor
    a client measures: that prefill plus the request overhead outside the engine's steps (the
    profile's or a calibration's, as `latency` adds it)."""
    lens = np.asarray(prompt_lens, float)
    t = dep.step.prefill_time(lens, dep.settings.max_num_batched_tokens)
    overhead = float(np.asarray(dep.step.request_overhead_s))
    return [{"prompt_len": int(n), "prefill_s": float(x), "ttft_floor_s": float(x) + overhead,
             "prefill_tokens_per_s": float(n / x)} for n, x in zip(prompt_lens, t, strict=True)]
