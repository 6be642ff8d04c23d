"""Request-level batching for comparison: static and dynamic batches run to completion, padded.

- static: fixed groups of `batch_size` requests in arrival order; a group waits for all its
  requests, then runs; the next group starts when the previous one ends.
- dynamic: when the engine is free, a batch closes at `batch_size` waiting requests or
  `timeout_s` after the first waiting request arrived, whichever is first (Triton's dynamic
  batcher, TorchServe `max_batch_delay`); no request joins a running batch.

A batch runs one prefill step of every prompt padded to the longest (no chunking), then decode
steps for the longest output, every slot padded to the longest context. Tokens stream: a request's
first token is at the end of the prefill step, it completes with its own last token, but its slot
stays busy until the batch ends. A batch also stops growing before its padded KV
(`size * ceil((longest prompt + longest output - 1) / block_size)` token blocks, the blocks its
last decode step holds) exceeds the cache, as a static engine pre-allocates it; sliding-window
layers hold at most their window's blocks (`layout`, models/layers.BlockLayout.blocks: the rule
of continuous batching's pool, in its block unit), with the cap of a step whose chunk is the
whole padded prompt (`BlockLayout.for_budget`: the window behind the prompt's first token, so
the prefill step holds every prompt block and a batch fits only if its prefill step does). Step
times come from the same `StepModel.step`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from capplan.errors import InputError
from capplan.models.layers import DENSE_LAYOUT, BlockLayout
from capplan.models.perf import chunk_attention
from capplan.sim.engine import NO_WINDOW, step_times
from capplan.sim.entities import STEP_INPUTS, RunRecord
from capplan.sim.workload import Requests


class BatchEngine:
    """Static or dynamic request-level batching over a step-time model."""

    def __init__(self, step_model: Any, num_gpu_blocks: int, block_size: int, batch_size: int,
                 mode: str = "static", timeout_s: float = 0.0,
                 layout: BlockLayout = DENSE_LAYOUT) -> None:
        if mode not in ("static", "dynamic"):
            raise InputError(f"batching mode {mode!r}: expected static or dynamic")
        if batch_size < 1:
            raise InputError(f"--batch-size {batch_size}: must be a positive integer")
        if not np.isfinite(timeout_s) or timeout_s < 0:
            raise InputError(f"--batch-timeout {timeout_s}: must be a finite number >= 0")
        self.m = step_model
        # counted in the layout's unit, as the continuous engine's pool
        self.layout = layout
        self.total_blocks, self.bs = layout.sim_blocks(num_gpu_blocks), int(block_size)
        self.B, self.mode, self.timeout_s = int(batch_size), mode, float(timeout_s)

    def _layout_for(self, prompt: Any) -> BlockLayout:
        """The layout of a batch whose padded prompts are `prompt` tokens: one prefill chunk
        each, so the window layers' cap is that chunk's (BlockLayout.for_budget)."""
        return self.layout.for_budget(self.bs, prompt)

    def _fits(self, lo: int, hi: int, reqs: Requests) -> int:
        """Largest k <= hi - lo such that requests lo..lo+k-1 fit the cache padded: k
        sequences of ceil((longest prompt + longest output - 1) / block_size) token blocks
        each, the most `_run_batch` holds (its last decode step's context; window layers at the
        cap of the padded prompt's chunk, at least its prefill step's blocks)."""
        inp = np.maximum.accumulate(reqs.input_tokens[lo:hi])
        out = np.maximum.accumulate(reqs.output_tokens[lo:hi])
        k = np.arange(1, hi - lo + 1)
        tokens = inp + np.maximum(out, 1) - 1
        per_seq = self._layout_for(inp).blocks(-(-tokens // self.bs))
        ok = k * per_seq <= self.total_blocks
        if not ok[0]:
            # in tokens, the unit of memory's kv_cache_tokens (the pool's blocks are in the
            # layout's unit): the longest sequence of this prompt whose blocks fit
            most = self._layout_for(int(inp[0])).token_blocks_within(
                self.total_blocks, -(-int(tokens[0]) // self.bs)) * self.bs
            raise InputError(f"request {lo} needs {int(tokens[0])} KV tokens but the cache "
                             f"holds {most}")
        return int(np.argmin(ok)) if not ok.all() else hi - lo

    def run(self, reqs: Requests,
            priorities: np.ndarray | None = None,  # noqa: ARG002 - the continuous engine's API
            progress: Any = None) -> RunRecord:
        """Simulate `reqs` (open loop or trace; closed loop is rejected)."""
        if reqs.concurrency is not None:
            raise InputError(f"{self.mode} batching simulates open-loop traffic; use --rate or "
                             f"--trace (--concurrency needs --scheduler continuous)")
        n = len(reqs)
        arr = np.asarray(reqs.arrival_at_s, float)
        adm = np.zeros(n)
        first = np.zeros(n)
        fin = np.zeros(n)
        steps: list[tuple[np.ndarray, ...]] = []
        t_free, i = 0.0, 0
        while i < n:
            hi = min(i + self.B, n)
            if self.mode == "static":
                k = self._fits(i, hi, reqs)
                start = max(t_free, arr[i + k - 1])
            else:
                close = arr[i] + self.timeout_s
                if hi - i == self.B:
                    close = min(close, arr[hi - 1])
                start = max(t_free, arr[i], close)
                hi = min(hi, int(np.searchsorted(arr, start, "right")))
                k = self._fits(i, hi, reqs)
            idx = slice(i, i + k)
            t_free, st = self._run_batch(reqs, idx, start, adm, first, fin)
            steps.append(st)
            i += k
            if progress is not None:
                progress(i)
        start_s, dur_s, tbt, run, kvb = (np.concatenate([s[j] for s in steps]) for j in range(5))
        waiting = np.searchsorted(arr, start_s, "right") - np.searchsorted(adm, start_s, "right")
        return RunRecord(
            arrival_at_s=arr, admitted_at_s=adm, first_token_at_s=first, finished_at_s=fin,
            input_tokens=np.asarray(reqs.input_tokens),
            output_tokens=np.asarray(reqs.output_tokens),
            lane=np.asarray(reqs.lane), step_start_s=start_s, step_dur_s=dur_s,
            step_tbt_count=tbt, step_tbt_gap_s=dur_s, extra_gaps_s=np.zeros(0),
            step_running=run, step_waiting=waiting, step_kv_blocks=kvb,
            num_gpu_blocks=self.total_blocks, preemptions=0, scheduler=self.mode)

    def _run_batch(self, reqs: Requests, idx: slice, start: float, adm: np.ndarray,
                   first: np.ndarray, fin: np.ndarray) -> tuple[float, tuple[np.ndarray, ...]]:
        inp = reqs.input_tokens[idx]
        out = reqs.output_tokens[idx]
        b, lmax, omax = len(inp), int(inp.max()), int(out.max())
        k = np.arange(1, omax, dtype=float)  # decode steps 1..omax-1
        w = float(getattr(self.m, "window", NO_WINDOW))
        # step 0: every prompt padded to the longest, one chunk each; then padded decode steps
        pairs, pairs_w, _ = chunk_attention(float(lmax), 0.0, w)
        cols = {key: np.zeros(omax) for key in STEP_INPUTS}
        cols["prefill_tokens"][0] = b * lmax
        cols["prefill_pairs"][0] = b * pairs
        cols["prefill_pairs_window"][0] = b * pairs_w
        cols["num_prefill_seqs"][0] = cols["num_logits"][0] = b
        ctx = lmax + k
        cols["num_decode"][1:] = cols["num_logits"][1:] = b
        cols["decode_kv_tokens"][1:] = b * ctx
        cols["decode_kv_tokens_window"][1:] = b * np.minimum(ctx, w)
        dur = step_times(self.m, cols)
        ends = start + np.cumsum(dur)
        adm[idx] = start
        first[idx] = ends[0]
        fin[idx] = ends[out - 1]
        # TBT: decode step j (1-based) gives a token to every request with out - 1 >= j.
        counts = np.zeros(omax, np.int64)
        counts[1:] = b - np.searchsorted(np.sort(out - 1), np.arange(1, omax), "left")
        kv_blocks = b * self._layout_for(lmax).blocks(
            -(-(lmax + np.concatenate(([0.0], k))) // self.bs))
        starts = ends - dur
        return float(ends[-1]), (starts, dur, counts, np.full(omax, b), kv_blocks.astype(np.int64))
