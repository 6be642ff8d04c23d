"""A faster continuous-batching engine with the reference engine's exact results.

`FastEngine` runs the reference scheduler (`capplan.sim.engine`: the same policy code, step
records, windowed clock and results) and changes three things:

- Preemption victims come from a heap keyed by (priority, admission order), largest first,
  with lazy deletion (an entry is live while its sequence still runs under that admission
  number), instead of `max()` over every running sequence at each preemption: O(log n) per
  victim instead of O(batch). The victim is the same sequence: the reference's
  `max(running, key=(priority, admission))`, keys being unique.
- Event skipping: between arrivals, completions, window crossings and a block allocation that
  would preempt, decode steps have the same shape (the same decoders, each one token longer), so
  a stretch of `RUN_MIN` to `RUN_MAX` such steps is written as arrays in closed form, its step
  times evaluated in one vectorised `StepModel.step` call on the exact clock from a window's
  start (no speculation, so no rollback), block-boundary allocations applied in step order.
- Step records of finished windows are kept as numpy structured arrays of the five columns the
  results need (40 bytes a step), not one Python object of fifteen fields per step.

Measured (docs/performance.md): the per-step Python of the shared scheduler code and the
per-call cost of `StepModel.step` (~0.1 ms) dominate both engines, so these changes give about
the reference's speed, not the issue's goal; they are the base a compiled step loop would build
on.

Per-request TTFT, TBT and E2E equal the reference's (tests/sim/test_fast_engine.py compares
them to 1e-9 over seeds, loads and every scheduler feature). Features the reference gains later
(e.g. prefix caching) run on the reference until this engine declares them (`supports`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from heapq import heapify, heappop, heappush
from itertools import islice
from typing import Any

import numpy as np
from numpy.lib.recfunctions import repack_fields

from capplan.sim.engine import ContinuousEngine, _State, step_times
from capplan.sim.entities import STEP_DTYPE, RunRecord, StepRecord, step_array

ENGINE_IMPLS = ("auto", "compiled", "fast", "reference")
"""`--sim-engine`: auto takes the compiled engine (numba installed, a large run), else the fast
one, whenever it supports the run (`capplan.sim.engine_impl`)."""
INSTALL_HINT = "--sim-engine compiled needs numba: pip install 'capplan[fast]'"
COMPILED_UNSUPPORTED: tuple[str, ...] = ()
"""Features the compiled engine (capplan.sim.compiled) leaves to this one or the reference."""


def compiled_supports(**features: Any) -> bool:
    """Whether the compiled engine runs a simulation with these features (here, so the choice
    needs no numba import): none of COMPILED_UNSUPPORTED, nor any it does not know."""
    return not any(v for k, v in features.items()
                   if k not in ("closed_loop", "prefix_caching"))


RUN_MIN = 32
"""Shortest stretch of same-shape decode steps worth a vectorised step-time call."""
RUN_MAX = 4096
"""Longest stretch evaluated at once (bounds the arrays of one stretch)."""


KEPT = ("tbt_count", "tbt_from_step", "num_running", "num_waiting", "kv_blocks_used")
"""Step record fields a finished window keeps (the results need them; the step-time inputs
were used once)."""


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    """Structured step arrays end to end (np.concatenate promotes fields, far slower)."""
    out = np.empty(sum(len(p) for p in parts), STEP_DTYPE)
    i = 0
    for p in parts:
        out[i:i + len(p)] = p
        i += len(p)
    return out


class _FastState(_State):
    """The reference state with a victim heap and a logged waiting queue."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        self._vheap: list[tuple[int, int, int]] = []
        """(-priority, -admission order, sequence): the top live entry is the victim"""
        self._chunks: list[np.ndarray] = []
        """step records of finished windows and stretches, in step order"""
        self._last: StepRecord | None = None
        super().__init__(*args, **kw)

    def _restore(self, snap: tuple) -> None:
        super()._restore(snap)
        self._rebuild_victims()

    # -- event skipping ----------------------------------------------------------------------
    def _quiet_bound(self) -> int:
        """Decode steps from now that must have the same shape: 0 unless nothing waits or
        prefills; else until the next completion or window crossing (arrivals and block
        allocations are checked by `_run`)."""
        if self.waiting or self.prefilling or self.first_decodes or not self.num_decoding:
            return 0
        d0, seqs = self.decode_step, self.seqs
        fh, wh = self.fin_heap, self.win_heap
        while fh and (seqs[fh[0][1]].epoch != fh[0][2] or seqs[fh[0][1]].decode_from < 0):
            heappop(fh)  # stale (the reference skips these when they come due)
        k = min(RUN_MAX, fh[0][0] - d0) if fh else RUN_MAX
        if self.e.has_window:
            while wh and (seqs[wh[0][1]].epoch != wh[0][2] or seqs[wh[0][1]].decode_from < 0):
                heappop(wh)
            if wh:
                k = min(k, wh[0][0] - d0)
        return k

    def _next_arrival_s(self) -> float:
        """When the next request reaches the engine, on the window's clock (inf: none in
        flight, or a closed loop without overhead, whose arrivals come with completions)."""
        if self.closed and not self.timed:
            return math.inf
        sent = self.next_request if self.closed else self.n
        return self._arrival_time(self.next_arrival) if self.next_arrival < sent else math.inf

    def _run(self, t: float, kmax: int) -> tuple[int, np.ndarray]:
        """Up to kmax same-shape decode steps from t (exact: a window's start), their exact
        times in one call, cut before the first that would see an arrival or preempt;
        returns how many ran and their durations (s)."""
        nd, s0, j = self.num_decoding, self.sum_computed, np.arange(1, kmax + 1)
        rec = np.zeros(kmax, STEP_DTYPE)
        rec["num_decode"] = rec["num_logits"] = rec["tbt_count"] = nd
        rec["decode_kv_tokens"] = s0 + nd * j
        rec["decode_kv_tokens_window"] = (self.sum_ctx_window + self.num_below_window * (j - 1)
                                          if self.e.has_window else rec["decode_kv_tokens"])
        dur = step_times(self.e.step_model, rec)
        ends = t + np.cumsum(dur)
        # a step sees every arrival up to its start: the stretch ends before one that sees one
        k = int(min(kmax, 1 + np.searchsorted(ends[:-1], self._next_arrival_s(), "left")))
        k = self._run_blocks(rec, k)
        if k == 0:
            return 0, dur[:0]
        rec = rec[:k]
        g0 = self.step
        rec["num_running"] = len(self.running)
        rec["tbt_from_step"] = np.arange(g0 - 1, g0 + k - 1)
        rec["tbt_from_step"][0] = self.last_decode_step if self.prefill_first else g0 - 1
        self.sum_computed += k * nd
        if self.e.has_window:
            self.sum_ctx_window += k * self.num_below_window
            d1, wh, seqs = self.decode_step + k, self.win_heap, self.seqs
            while wh and wh[0][0] <= d1:
                _, s, ep = heappop(wh)
                if seqs[s].epoch == ep and seqs[s].decode_from >= 0:
                    self.num_below_window -= 1
        self._last = StepRecord(*rec[-1].tolist())
        self.step += k
        self.decode_step += k
        self.last_decode_step = self.step - 1
        self._chunks.append(repack_fields(rec[list(KEPT)]))
        return k, dur[:k]

    def _run_blocks(self, rec: np.ndarray, k: int) -> int:
        """Block-boundary allocations of the stretch's steps, in order, while free blocks last
        (a step that would preempt ends the stretch before it); fills kv_blocks_used."""
        d0, seqs, bs, due = self.decode_step, self.seqs, self.e.block_size, self.blk_due
        used = rec["kv_blocks_used"]
        total = self.e.total_blocks
        for i in range(k):
            bucket = due.get(d0 + i)
            if bucket is not None:
                need = [s for s, ep in bucket if seqs[s].epoch == ep and seqs[s].decode_from >= 0]
                if len(need) > self.free_blocks:
                    return i
                del due[d0 + i]
                if need:
                    self.free_blocks -= len(need)
                    nxt = due.setdefault(d0 + i + bs, [])
                    for s in need:
                        nxt.append((s, seqs[s].epoch))
            used[i] = total - self.free_blocks
        return k

    def _log_array(self, items: list) -> np.ndarray:
        """Step records as one array: `self.log` holds StepRecords (steps run one by one)
        and arrays (stretches)."""
        parts, rows = [], []
        for item in items:
            if isinstance(item, np.ndarray):
                if rows:
                    parts.append(step_array(rows))
                    rows = []
                parts.append(item)
            else:
                rows.append(item)
        if rows or not parts:
            parts.append(step_array(rows))
        return parts[0] if len(parts) == 1 else _concat(parts)

    def _flush_log(self) -> None:
        """Step records of finished windows into one array each (the last one stays at hand
        for the estimator to refit on)."""
        if self.log:
            last = self.log[-1]
            self._last = StepRecord(*last[-1].tolist()) if isinstance(last, np.ndarray) else last
            self._chunks.append(repack_fields(self._log_array(self.log)[list(KEPT)]))
            self.log = []

    def simulate(self, progress: Callable[[int], None] | None) -> None:
        """The reference's windowed clock; a stretch of same-shape decode steps runs on the
        exact clock from a window's start (`_run`), so it is never rolled back."""
        t_s = 0.0
        window, cap, est = self._clock()
        while self.done < self.n:
            jump = self._wait(t_s)
            if jump is not None:
                t_s = jump
                continue
            self._flush_log()
            kq = self._quiet_bound()
            if kq >= RUN_MIN:
                n_run, dur = self._run(t_s, kq)
                if n_run:
                    ends = t_s + np.cumsum(dur)
                    t_s = self._commit_steps(np.concatenate(([t_s], ends[:-1])), dur, ends,
                                             progress)
                    continue
            w0, first = len(self.log), self.next_arrival
            snap = self._snapshot()
            est.refit(self._last)
            t, seen = t_s, []
            for k in range(window):  # speculate on the estimated clock
                if k:
                    self._arrive(t)
                    # idle, or a stretch starts: it runs from the next window's exact start
                    if self._idle() or self._quiet_bound() >= RUN_MIN:
                        break
                seen.append(self.next_arrival)
                rec = self._exec()
                self._last = rec
                t += est(rec)
                if self.timed:
                    self.window_ends.append(t)
                if self.done >= self.n:
                    break
            dur = step_times(self.e.step_model, self._log_array(self.log[w0:]))
            starts, dur, ends, window, replayed = self._settle_window(snap, t_s, dur, first, seen,
                                                                       w0, window, cap)
            if replayed:
                self._last = self.log[-1] if self.log else None
            t_s = self._commit_steps(starts, dur, ends, progress)

    def record(self) -> RunRecord:
        self._flush_log()
        full = np.zeros(sum(len(c) for c in self._chunks), STEP_DTYPE)
        i = 0
        for c in self._chunks:
            full[list(KEPT)][i:i + len(c)] = c
            i += len(c)
        self._chunks = []
        self.log = full  # type: ignore[assignment]
        return super().record()

    # -- admissions and preemptions ---------------------------------------------------------
    def _admit_waiting(self) -> None:
        before = self.admissions
        super()._admit_waiting()
        new = self.admissions - before
        if new:
            seqs, vh = self.seqs, self._vheap
            for s, order in islice(reversed(self.running.items()), new):
                heappush(vh, (-seqs[s].priority, -order, s))
            if len(vh) > 2 * len(self.running) + 64:
                self._rebuild_victims()

    def _rebuild_victims(self) -> None:
        seqs = self.seqs
        self._vheap = [(-seqs[s].priority, -order, s) for s, order in self.running.items()]
        heapify(self._vheap)

    def _victim(self) -> int:
        assert self.can_preempt, ("out of KV blocks under a policy without preemption: the "
                                  "admission reservation must prevent this")
        vh, running = self._vheap, self.running
        while vh:
            _, neg_order, s = vh[0]
            if running.get(s) == -neg_order:
                return s
            heappop(vh)  # a stale entry (finished or preempted): drop it
        raise AssertionError("no running sequence to preempt")

class FastEngine(ContinuousEngine):
    """`ContinuousEngine` with the same results, faster under overload (module docstring)."""

    impl = "fast"

    @staticmethod
    def supports(**features: Any) -> bool:
        """Whether this engine runs a simulation with these extra features (closed loops yes;
        any other truthy feature, e.g. prefix caching, goes to the reference engine)."""
        return not any(v for k, v in features.items() if k != "closed_loop")

    @property
    def _state_cls(self) -> type[_State]:
        return _FastState
