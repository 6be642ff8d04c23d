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
(`size * (longest prompt + longest output)` tokens) exceeds the cache, as a static engine
pre-allocates it. Step times come from the same `StepModel.step`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from capplan.errors import InputError
from capplan.sim.engine import NUM_STEP_INPUTS, step_times
from capplan.sim.entities import RunRecord
from capplan.sim.workload import Requests


class BatchEngine:
    """Static or dynamic request-level batching over a step-time model."""

    def __init__(self, step_model: Any, num_gpu_blocks: int, block_size: int, batch_size: int,
                 mode: str = "static", timeout_s: float = 0.0) -> None:
        if mode not in ("static", "dynamic"):
            raise InputError(f"batching mode {mode!r}: expected static or dynamic")
        if batch_size < 1:
            raise InputError(f"--batch-size {batch_size}: must be a positive integer")
        if not np.isfinite(timeout_s) or timeout_s < 0:
            raise InputError(f"--batch-timeout {timeout_s}: must be a finite number >= 0")
        self.m = step_model
        self.total_blocks, self.bs = int(num_gpu_blocks), int(block_size)
        self.B, self.mode, self.timeout_s = int(batch_size), mode, float(timeout_s)

    def _fits(self, lo: int, hi: int, reqs: Requests) -> int:
        """Largest k <= hi - lo such that requests lo..lo+k-1 fit the cache padded."""
        cap = self.total_blocks * self.bs
        inp = np.maximum.accumulate(reqs.input_tokens[lo:hi])
        out = np.maximum.accumulate(reqs.output_tokens[lo:hi])
        k = np.arange(1, hi - lo + 1)
        ok = k * (inp + out) <= cap
        if not ok[0]:
            raise InputError(f"request {lo} needs {int(inp[0] + out[0])} KV tokens but the "
                             f"cache holds {cap}")
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
        return RunRecord(arr, adm, first, fin, np.asarray(reqs.input_tokens),
                         np.asarray(reqs.output_tokens), np.asarray(reqs.lane), start_s, dur_s,
                         tbt, np.zeros(0), run, waiting, kvb,
                         self.total_blocks, 0, self.mode)

    def _run_batch(self, reqs: Requests, idx: slice, start: float, adm: np.ndarray,
                   first: np.ndarray, fin: np.ndarray) -> tuple[float, tuple[np.ndarray, ...]]:
        inp = reqs.input_tokens[idx]
        out = reqs.output_tokens[idx]
        b, lmax, omax = len(inp), int(inp.max()), int(out.max())
        k = np.arange(1, omax, dtype=float)  # decode steps 1..omax-1
        rows = np.zeros((omax, NUM_STEP_INPUTS))
        rows[0, 3] = b * lmax
        rows[0, 4] = rows[0, 5] = b * lmax * (lmax + 1) / 2  # causal pairs, no window cap
        rows[0, 8] = rows[0, 9] = b
        ctx = lmax + k
        rows[1:, 0] = rows[1:, 9] = b
        rows[1:, 1] = b * ctx
        w = float(getattr(self.m, "window", 2**62))
        rows[1:, 2] = b * np.minimum(ctx, w)
        if w < lmax:  # each query sees at most w keys
            rows[0, 5] = b * (lmax * w - w * (w - 1) / 2)
        dur = step_times(self.m, rows)
        ends = start + np.cumsum(dur)
        adm[idx] = start
        first[idx] = ends[0]
        fin[idx] = ends[out - 1]
        # TBT: decode step j (1-based) gives a token to every request with out - 1 >= j.
        counts = np.zeros(omax, np.int64)
        counts[1:] = b - np.searchsorted(np.sort(out - 1), np.arange(1, omax), "left")
        kv_blocks = b * -(-(lmax + np.concatenate(([0.0], k))) // self.bs)
        starts = ends - dur
        return float(ends[-1]), (starts, dur, counts, np.full(omax, b), kv_blocks.astype(np.int64))
