"""Continuous batching, iteration-level scheduling as vLLM V1 does it.

Each step: every running sequence whose prompt is computed decodes one token; the rest of the
token budget (`max_num_batched_tokens` minus decode tokens) goes to prefill chunks of running,
partially prefilled sequences, then to waiting ones (ordered by priority, then arrival) while
`max_num_seqs` and free KV blocks allow. Blocks (`ceil(tokens / block_size)`) are allocated as
tokens are computed. A running sequence that needs a block when none is free preempts (recompute)
the lowest-priority, most recently admitted sequence: its blocks are freed, it goes back to the
waiting queue, and its prompt plus the tokens it generated are computed again. A step with a
preemption admits no waiting request (vLLM V1 `Scheduler.schedule`).

Speed: per-sequence state is lazy (a decoding sequence stores the step it started decoding), sums
are kept incrementally, finishes sit in a heap and block-boundary crossings in per-step buckets,
so a step costs O(events) in Python. Step times come from `StepModel.step`, evaluated for a
window of steps in one vectorised call; only arrival times need the clock, so a window is
scheduled against estimated step times and checked against the exact ones; from the first step
where an arrival would have been seen differently, the window is rolled back and replayed with
exact times. Results are exact.

References: vLLM `vllm/v1/core/sched/scheduler.py`; Kwon et al., "Efficient Memory Management for
Large Language Model Serving with PagedAttention", SOSP 2023; Yu et al., "Orca", OSDI 2022.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any

import numpy as np

from capplan.errors import InputError
from capplan.sim.entities import RunRecord
from capplan.sim.workload import Requests

# per-sequence record fields
TGT, NC, GEN, G0, EP, LAST, FIRST, FIN, ADM, ARRS, KEY = range(11)
NUM_STEP_INPUTS = 10
WINDOW_MAX = 32
"""Longest speculated window in open loop: longer ones are mostly rolled back."""
_STEP_KEYS = ("num_decode", "decode_kv_tokens", "decode_kv_tokens_window", "prefill_tokens",
              "prefill_pairs", "prefill_pairs_window", "prefill_kv_read",
              "prefill_kv_read_window", "num_prefill_seqs", "num_logits")


def step_times(step_model: Any, comps: np.ndarray) -> np.ndarray:
    """Exact step times (s) of many steps, one row of `_STEP_KEYS` aggregates each."""
    kw = {k: comps[:, i] for i, k in enumerate(_STEP_KEYS)}
    out = np.asarray(step_model.step(**kw)["step_s"], float)
    return np.array(np.broadcast_to(out, (len(comps),)), float)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class ContinuousEngine:
    """A vLLM-V1-style engine over a step-time model; `run()` simulates a request set."""

    def __init__(self, step_model: Any, num_gpu_blocks: int, block_size: int, max_num_seqs: int,
                 max_num_batched_tokens: int, enable_chunked_prefill: bool = True) -> None:
        if max_num_batched_tokens < max_num_seqs:
            raise InputError(f"--max-num-batched-tokens {max_num_batched_tokens} must be >= "
                             f"--max-num-seqs {max_num_seqs} (vLLM rejects it too)")
        if num_gpu_blocks < 1:
            raise InputError("no KV-cache blocks: the model does not fit; see `capplan memory`")
        self.step_model = step_model
        self.total_blocks = int(num_gpu_blocks)
        self.bs = int(block_size)
        self.max_seqs = int(max_num_seqs)
        self.max_tokens = int(max_num_batched_tokens)
        self.chunked = bool(enable_chunked_prefill)
        w = float(getattr(step_model, "window", 2**62))
        self.win = w < 1e15
        self.w = int(w) if self.win else 0

    # ------------------------------------------------------------------------------------------
    def run(self, reqs: Requests, priorities: np.ndarray | None = None,
            progress: Callable[[int], None] | None = None) -> RunRecord:
        """Simulate `reqs` to completion. `priorities[lane]`: lower runs first."""
        n = len(reqs)
        need = reqs.input_tokens + reqs.output_tokens
        cap = self.total_blocks * self.bs
        if n and int(need.max()) > cap:
            i = int(np.argmax(need))
            raise InputError(f"request {i} needs {int(need[i])} KV tokens but the cache holds "
                             f"{cap}: raise --gpu-memory-utilization or shorten requests")
        prio = np.zeros(1, np.int64) if priorities is None else np.asarray(priorities)
        st = _State(self, reqs, prio[reqs.lane].tolist())
        st.simulate(progress)
        return st.record()


class _State:
    def __init__(self, eng: ContinuousEngine, reqs: Requests, prio: list[int]) -> None:
        self.e = eng
        self.reqs = reqs
        self.n = n = len(reqs)
        self.P = reqs.input_tokens.tolist()
        self.O = reqs.output_tokens.tolist()
        self.prio = prio
        self.closed = reqs.concurrency is not None
        self.arr = reqs.arrival_at_s.tolist()
        self.arr_np = np.asarray(reqs.arrival_at_s, float)
        self.rec = [[p, 0, 0, -1, 0, -1, -1, -1, -1, -1, None] for p in self.P]
        self.running: dict[int, int] = {}
        self.prefilling: list[int] = []
        self.waiting: list[tuple] = []
        self.fin_heap: list[tuple] = []
        self.blk_due: dict[int, list[tuple[int, int]]] = {}
        """step -> decoding sequences whose next token starts a new KV block then"""
        self.win_heap: list[tuple] = []
        self.g = 0
        self.nxt = 0
        self.free = eng.total_blocks
        self.n_dec = self.sum_nc = self.sum_capw = self.n_below = 0
        self.admit_ctr = self.preemptions = self.done = 0
        self.log: list[tuple] = []
        self.gaps: list[tuple[int, int]] = []
        self.saved: dict[int, list] = {}
        self.starts: list[np.ndarray] = []
        self.durs: list[np.ndarray] = []
        if self.closed:
            c = min(int(reqs.concurrency or 0), n)
            for s in range(c):
                self._enqueue(s, -1)
            self.nxt = c

    # -- bookkeeping ------------------------------------------------------------------------
    def _touch(self, s: int) -> None:
        if s not in self.saved:
            self.saved[s] = self.rec[s][:]

    def _enqueue(self, s: int, arrival_step: int) -> None:
        r = self.rec[s]
        r[ARRS] = arrival_step
        r[KEY] = (self.prio[s], arrival_step if self.closed else self.arr[s], s)
        heappush(self.waiting, r[KEY])

    def _arrive(self, t: float) -> None:
        if self.closed:
            return
        arr, n, nxt = self.arr, self.n, self.nxt
        while nxt < n and arr[nxt] <= t:
            self._enqueue(nxt, -1)
            nxt += 1
        self.nxt = nxt

    def _snapshot(self) -> tuple:
        self.saved = {}
        return (dict(self.running), self.prefilling[:], self.waiting[:], self.fin_heap[:],
                {k: v[:] for k, v in self.blk_due.items()}, self.win_heap[:], len(self.log),
                len(self.gaps),
                (self.g, self.nxt, self.free, self.n_dec, self.sum_nc, self.sum_capw,
                 self.n_below, self.admit_ctr, self.preemptions, self.done))

    def _restore(self, snap: tuple) -> None:
        for s, fields in self.saved.items():
            self.rec[s][:] = fields
        self.saved = {}
        (self.running, self.prefilling, self.waiting, self.fin_heap, self.blk_due,
         self.win_heap, nlog, ngaps, scal) = (dict(snap[0]), snap[1][:], snap[2][:], snap[3][:],
                                              {k: v[:] for k, v in snap[4].items()}, snap[5][:],
                                              snap[6], snap[7], snap[8])
        del self.log[nlog:]
        del self.gaps[ngaps:]
        (self.g, self.nxt, self.free, self.n_dec, self.sum_nc, self.sum_capw, self.n_below,
         self.admit_ctr, self.preemptions, self.done) = scal

    # -- preemption -------------------------------------------------------------------------
    def _victim(self) -> int:
        prio, running = self.prio, self.running
        return max(running, key=lambda s: (prio[s], running[s]))

    def _preempt(self, v: int) -> None:
        """Recompute preemption: free v's blocks, back to the waiting queue (vLLM V1)."""
        e, r, g = self.e, self.rec[v], self.g
        self._touch(v)
        if r[G0] >= 0:  # decoding: its context this step is nc + 1
            nc = r[NC] + (g - r[G0])
            gen = r[GEN] + (g - r[G0])
            ctx = nc + 1
            self.n_dec -= 1
            self.sum_nc -= nc
            if e.win:
                self.sum_capw -= min(ctx, e.w)
                self.n_below -= ctx < e.w
            if self.dec_done:  # its block for this step is allocated and its token budgeted
                nc += 1
                self.budget += 1
            r[LAST] = g - 1
            r[GEN] = gen
        else:
            nc = r[NC] + self.chunks.pop(v, 0)
            self.prefilling.remove(v)
        self.free += _cdiv(nc, e.bs)
        r[NC], r[TGT], r[G0] = 0, self.P[v] + r[GEN], -1
        r[EP] += 1
        del self.running[v]
        heappush(self.waiting, r[KEY])
        self.preemptions += 1
        self.preempted_now = True

    # -- one step ---------------------------------------------------------------------------
    def _decode_blocks(self) -> None:
        g, rec, bs = self.g, self.rec, self.e.bs
        due = self.blk_due.pop(g, None)
        if not due:
            return
        need = [s for s, ep in due if rec[s][EP] == ep and rec[s][G0] >= 0]
        if self.free < len(need):
            pending = set(need)
            while self.free < len(pending):
                v = self._victim()
                self._preempt(v)
                pending.discard(v)
            need = [s for s in need if s in pending]
        self.free -= len(need)
        nxt = self.blk_due.setdefault(g + bs, [])
        for s in need:
            nxt.append((s, rec[s][EP]))

    def _prefill_running(self) -> None:
        rec, bs = self.rec, self.e.bs
        for s in list(self.prefilling):
            if self.budget <= 0:
                break
            if s not in self.running:
                continue
            r = rec[s]
            c = min(r[TGT] - r[NC], self.budget)
            nb = _cdiv(r[NC] + c, bs) - _cdiv(r[NC], bs)
            while self.free < nb:
                v = self._victim()
                self._preempt(v)
                if v == s:
                    break
            if s not in self.running:
                continue
            self.free -= nb
            self.chunks[s] = c
            self.budget -= c

    def _admit_waiting(self) -> None:
        e, rec, wq = self.e, self.rec, self.waiting
        while wq and self.budget > 0 and len(self.running) < e.max_seqs:
            s = wq[0][2]
            r = rec[s]
            c = min(r[TGT], self.budget)
            if c < r[TGT] and not e.chunked:
                if self.chunks or self.n_dec:
                    break
                c = r[TGT]  # a prompt over the budget runs alone, whole
            nb = _cdiv(c, e.bs)
            if nb > self.free:
                break
            heappop(wq)
            self._touch(s)
            self.free -= nb
            self.running[s] = self.admit_ctr
            self.admit_ctr += 1
            if r[ADM] < 0:
                r[ADM] = self.g
            self.prefilling.append(s)
            self.chunks[s] = c
            self.budget -= c

    def _composition(self) -> tuple:
        e, rec = self.e, self.rec
        ptok = pairs = pairs_w = pread = pread_w = ncomp = 0
        w = e.w
        for s, c in self.chunks.items():
            r = rec[s]
            p = r[NC]
            pr = c * p + c * (c + 1) // 2
            ptok += c
            pairs += pr
            pread += p
            if e.win:  # as StepModel.prefill_chunk: each query sees at most w keys
                cw = min(c, w)
                pairs_w += min(pr, c * w - (0 if p > 0 else cw * (cw - 1) // 2))
                pread_w += min(p, w)
            ncomp += p + c == r[TGT]
        kv = self.sum_nc + self.n_dec
        if not e.win:
            pairs_w, pread_w, kvw = pairs, pread, kv
        else:
            kvw = self.sum_capw
        return (self.n_dec, kv, kvw, ptok, pairs, pairs_w, pread, pread_w, len(self.chunks),
                self.n_dec + ncomp, len(self.running), len(self.waiting),
                self.e.total_blocks - self.free, self.nxt)

    def _finish(self, s: int, nc: int) -> None:
        self.rec[s][FIN] = self.g
        del self.running[s]
        self.free += _cdiv(nc, self.e.bs)
        self.done += 1
        if self.closed and self.nxt < self.n:
            self._enqueue(self.nxt, self.g)
            self.nxt += 1

    def _advance(self) -> None:
        """After the step: prefill progress, first tokens, finishes, decoders move on."""
        e, g, rec, out_len = self.e, self.g, self.rec, self.O
        new_dec = []
        for s, c in self.chunks.items():
            r = rec[s]
            self._touch(s)
            r[NC] += c
            if r[NC] == r[TGT]:
                self.prefilling.remove(s)
                if r[GEN] == 0:
                    r[FIRST] = g
                else:
                    self.gaps.append((r[LAST], g))
                r[GEN] += 1
                r[LAST] = g
                if r[GEN] >= out_len[s]:
                    self._finish(s, r[NC])
                else:
                    new_dec.append(s)
        fh = self.fin_heap
        while fh and fh[0][0] <= g:
            _, s, ep = heappop(fh)
            r = rec[s]
            if r[EP] != ep or r[G0] < 0:
                continue
            nc = r[NC] + (g - r[G0])
            self.n_dec -= 1
            self.sum_nc -= nc
            if e.win:
                self.sum_capw -= min(nc + 1, e.w)
                self.n_below -= nc + 1 < e.w
            self._touch(s)
            r[NC], r[GEN], r[G0], r[LAST] = nc + 1, out_len[s], -1, g
            self._finish(s, nc + 1)
        self.sum_nc += self.n_dec
        g1 = g + 1
        if e.win:
            self.sum_capw += self.n_below
            wh = self.win_heap
            while wh and wh[0][0] <= g1:
                _, s, ep = heappop(wh)
                if rec[s][EP] == ep and rec[s][G0] >= 0:
                    self.n_below -= 1
        for s in new_dec:
            r = rec[s]
            r[G0] = g1
            r[EP] += 1
            ep, nc = r[EP], r[NC]
            self.n_dec += 1
            self.sum_nc += nc
            if e.win:
                ctx = nc + 1
                self.sum_capw += min(ctx, e.w)
                if ctx < e.w:
                    self.n_below += 1
                    heappush(self.win_heap, (g1 + e.w - ctx, s, ep))
            heappush(fh, (g1 + out_len[s] - r[GEN] - 1, s, ep))
            self.blk_due.setdefault(g1 + (-nc) % e.bs, []).append((s, ep))
        self.g = g1

    def _exec(self) -> tuple:
        self.chunks: dict[int, int] = {}
        self.preempted_now = False
        self.dec_done = False
        self.budget = self.e.max_tokens
        self._decode_blocks()
        self.dec_done = True
        self.budget -= self.n_dec
        self._prefill_running()
        if not self.preempted_now:
            self._admit_waiting()
        comp = self._composition()
        self.log.append(comp)
        self._advance()
        return comp

    # -- the clock --------------------------------------------------------------------------
    def _idle(self) -> bool:
        return not self.running and not self.waiting

    def simulate(self, progress: Callable[[int], None] | None) -> None:
        t_s = 0.0
        window = 64
        cap = 1024 if self.closed else WINDOW_MAX  # closed loop needs no clock to schedule
        est = _Estimator(self.e.step_model, self.e.max_tokens)
        while self.done < self.n:
            self._arrive(t_s)
            if self._idle():
                assert not self.closed and self.nxt < self.n, "engine idle with work left"
                t_s = max(t_s, self.arr[self.nxt])
                continue
            w0 = len(self.log)
            snap = self._snapshot()
            est.refit(self.log[-1] if self.log else None)
            t, elig = t_s, []
            for k in range(window):  # speculate: estimated clock
                if k:
                    self._arrive(t)
                    if self._idle():
                        break
                elig.append(self.nxt)
                t += est(self._exec())
                if self.done >= self.n:
                    break
            comps = np.array(self.log[w0:], float)
            dur = step_times(self.e.step_model, comps[:, :NUM_STEP_INPUTS])
            starts = t_s + np.concatenate(([0.0], np.cumsum(dur)[:-1]))
            bad = (np.flatnonzero(np.searchsorted(self.arr_np, starts, "right")
                                  != np.asarray(elig)) if not self.closed else [])
            if len(bad):
                m = int(bad[0])
                self._restore(snap)
                for k in range(m + 1):
                    if k:
                        self._arrive(float(starts[k]))
                        if self._idle():
                            break
                    self._exec()
                done_steps = len(self.log) - w0
                dur = dur[:done_steps].copy()
                starts = starts[:done_steps]
                if done_steps == m + 1:
                    last = np.array([self.log[-1]], float)[:, :NUM_STEP_INPUTS]
                    dur[m] = step_times(self.e.step_model, last)[0]
                window = max(16, m + 8)
            else:
                window = min(cap, 2 * window)
            self.saved = {}
            self.starts.append(starts)
            self.durs.append(dur)
            t_s = float(starts[-1] + dur[-1])
            if progress is not None:
                progress(self.done)

    # -- results ----------------------------------------------------------------------------
    def record(self) -> RunRecord:
        starts = np.concatenate(self.starts) if self.starts else np.zeros(0)
        dur = np.concatenate(self.durs) if self.durs else np.zeros(0)
        ends = starts + dur
        log = np.array(self.log, np.int64).reshape(-1, 14)
        rec = np.array([r[:KEY] for r in self.rec], np.int64).reshape(-1, KEY)
        if self.closed:
            arrs = rec[:, ARRS]
            arrival = np.where(arrs >= 0, ends[np.maximum(arrs, 0)] if len(ends) else 0.0, 0.0)
        else:
            arrival = self.arr_np
        gaps = np.array(self.gaps, np.int64).reshape(-1, 2)
        return RunRecord(
            arrival_at_s=arrival,
            admitted_at_s=starts[rec[:, ADM]],
            first_token_at_s=ends[rec[:, FIRST]],
            finished_at_s=ends[rec[:, FIN]],
            input_tokens=np.asarray(self.reqs.input_tokens),
            output_tokens=np.asarray(self.reqs.output_tokens),
            lane=np.asarray(self.reqs.lane),
            step_start_s=starts, step_dur_s=dur,
            step_tbt_count=log[:, 0],
            extra_gaps_s=ends[gaps[:, 1]] - ends[gaps[:, 0]],
            step_running=log[:, 10], step_waiting=log[:, 11], step_kv_blocks=log[:, 12],
            num_gpu_blocks=self.e.total_blocks, preemptions=self.preemptions,
            scheduler="continuous",
        )


class _Estimator:
    """An estimate of step time that guides speculation (accuracy only affects speed).

    Around a pure-decode base step: linear in the decode aggregates, plus a table over the
    prefill tokens of the step (the prefill term is far from linear near the roofline ridge).
    """

    def __init__(self, step_model: Any, max_tokens: int) -> None:
        self.m = step_model
        self.base: list[float] | None = None
        self.grid = np.unique(np.concatenate([np.arange(0, 256, 8),
                                              np.geomspace(256, max(max_tokens, 257), 96)]))

    def refit(self, comp: tuple | None) -> None:
        nd, kv, kvw = (float(x) for x in (comp[:3] if comp else (1, 1, 1)))
        if self.base is not None:
            bn, bk = self.base[0], self.base[1]
            if abs(nd - bn) <= 0.03 * bn + 1 and abs(kv - bk) <= 0.2 * bk + 256:
                return
        nd, kv, kvw = max(nd, 1.0), max(kv, 1.0), max(kvw, 1.0)
        x = self.grid
        rows = np.zeros((6 + len(x), NUM_STEP_INPUTS))
        rows[:, :3] = nd, kv, kvw
        rows[:, 9] = nd
        rows[1, [0, 9]] += 1
        rows[2, 1:3] += 1000
        rows[3, 4:6] = 3e4
        rows[4, 8] += 1
        rows[5, 9] += 1
        rows[6:, 3] = x
        rows[6:, 4] = rows[6:, 5] = x * (x + 1) / 2
        rows[6:, 8] = x > 0
        rows[6:, 9] += x > 0
        d = step_times(self.m, rows)
        self.base = [nd, kv]
        self.d0 = float(d[0])
        self.g_nd = float(d[1] - d[0])
        self.g_kv = float(d[2] - d[0]) / 1000
        self.g_pairs = float(d[3] - d[0]) / 3e4
        self.g_nps = float(d[4] - d[0])
        self.g_logits = float(d[5] - d[0])
        self.table = (d[6:] - d[0]).tolist()
        self.x = x.tolist()

    def __call__(self, comp: tuple) -> float:
        self.refit(comp)
        d = self.d0 + (comp[0] - self.base[0]) * self.g_nd + (comp[1] - self.base[1]) * self.g_kv
        pt = comp[3]
        if pt:
            x = self.x
            i = min(bisect_left(x, pt), len(x) - 1)
            lo = max(i - 1, 0)
            f = 0.0 if x[i] == x[lo] else (pt - x[lo]) / (x[i] - x[lo])
            d += self.table[lo] + f * (self.table[i] - self.table[lo])
            d += (comp[4] - pt * (pt + 1) / 2) * self.g_pairs + (comp[8] - 1) * self.g_nps
            d += (comp[9] - comp[0] - 1) * self.g_logits
        return d
