"""The mean steady state of one replica and its stability (capacity) bound.

Little's law gives the running batch for an arrival rate; the step time depends on that batch,
so the mean step is the fixed point tau = T(B(tau), P(tau)) (docs/queueing.md). The concurrency
cap is the batch whose KV footprint fits at the 99th percentile. A rate is stable when the fixed
point exists, the prefill queue and the slot queue are below saturation and a step's prefill
demand fits the token budget; the capacity is the largest stable rate.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from capplan.models.closed_loop import block_rounding_tokens
from capplan.models.engine import EngineSettings, SchedulerPolicy
from capplan.models.layers import DENSE_LAYOUT, BlockLayout
from capplan.models.perf import StepModel
from capplan.models.prefill import packed_prefill_step
from capplan.models.prefix import PrefixCache
from capplan.models.queueing.laws import Z99, LengthStats

_TAU_MAX_S = 60.0
_CAP_BISECT = 13
"""Halvings of capacity_rate's bracket."""
_FP_ITERS_MAX = 60
_FP_ROUNDING_TOL = 1e-13
"""A bracket this narrow (relative) moves by no more than that in further iterations."""
_FP_REPACK = 0.7
"""The fixed point's working set is cut to its unsettled rows when they fall under this share
of it (gathering the step constants costs about one evaluation)."""


@dataclass(frozen=True)
class Limits:
    """Engine limits of one replica."""

    max_num_seqs: Any
    max_num_batched_tokens: Any
    kv_cache_tokens: Any
    state_tokens_per_seq: Any = 0.0
    """KV capacity (tokens) a running sequence's recurrent state holds whatever its length:
    hybrid models' state blocks * block_size (plan/deployment.KvPool)."""
    block_size: Any = 1
    """Tokens per KV block: a sequence holds whole blocks (1: counted in tokens)."""
    layout: BlockLayout = DENSE_LAYOUT
    """How a sequence's tokens fill the pool: sliding-window layers capped at their window's
    blocks (plan/deployment.KvPool.layout; fields may be arrays of the rows, `stack_layouts`).
    kv_cache_tokens counts a token in every attention layer; a sequence of h tokens holds
    layout.kv_tokens(h, block_size) of them."""

    @classmethod
    def of_replica(cls, settings: EngineSettings, kv_cache_tokens: Any, pool: Any) -> Limits:
        """One replica's limits: the engine's per-rank max_num_seqs and max_num_batched_tokens
        times its attention-DP ranks (each rank schedules its own batch), its KV tokens, and
        `pool`'s (plan/deployment.KvPool) state, block size and layout."""
        dp = settings.attention_dp
        return cls(settings.max_num_seqs * dp, settings.max_num_batched_tokens * dp,
                   kv_cache_tokens, pool.state_tokens_per_seq, pool.block_size, pool.layout)

    @property
    def windowed(self) -> bool:
        """Whether any row holds sliding-window layers capped at their window."""
        return self.layout.has_window

    def held_kv(self, tokens: Any) -> Any:
        """KV capacity (kv_cache_tokens' unit) a sequence of `tokens` tokens holds, window
        layers capped (models/layers.BlockLayout.kv_tokens: the rule `memory` and the replay
        count by)."""
        return self.layout.kv_tokens(tokens, self.block_size)


CALL_ROWS = 600
"""What one evaluation of the queue model costs beyond its rows' own work, in rows: numpy's
per-call cost of its ~100 operations (a call over 600 configurations costs about twice one over
a few; `tree_bisect` weighs probes per call against calls)."""


def tree_bisect(ok_at: Callable[[np.ndarray], np.ndarray], lo: np.ndarray, hi: np.ndarray,
                steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) after `steps` halvings of each row's bracket, lo kept where `ok_at(mid)`:
    the bisection `for _ in range(steps): mid = (lo + hi) / 2; ok = ok_at(mid); lo, hi = ...`,
    with the same probes to the last bit, so the same answer wherever `ok_at` is each row's own.

    A call may evaluate the next d levels of every row's probe tree at once (the 2^d - 1
    midpoints the bisection could visit, on a new leading axis) and then walk down it: d
    halvings for one call over (2^d - 1) x the rows. With numpy's per-call cost (CALL_ROWS)
    that is cheaper where the rows are few (a single configuration's capacity: 13 halvings in
    4 calls of 15 probes)."""
    lo, hi = np.array(lo, float), np.array(hi, float)
    done = 0
    while done < steps:
        # at most 6 levels a call (63 probes a row): past that a call's rows dwarf its cost
        d = min(range(1, min(steps - done, 6) + 1),
                key=lambda k: (CALL_ROWS + lo.size * (2**k - 1)) / k)
        ends = (lo[None], hi[None])
        levels = []
        for _ in range(d):  # level by level: the children of (l, h) are (l, mid), (mid, h)
            mid = 0.5 * (ends[0] + ends[1])
            levels.append(mid)
            ends = (np.stack([ends[0], mid], 1).reshape(-1, *lo.shape),
                    np.stack([mid, ends[1]], 1).reshape(-1, *lo.shape))
        probes = np.concatenate(levels)
        ok = np.broadcast_to(np.asarray(ok_at(probes), bool), probes.shape)
        node = np.zeros(lo.shape, int)
        for level in range(d):
            at = (2**level - 1 + node)[None]
            p = np.take_along_axis(probes, at, 0)[0]
            o = np.take_along_axis(ok, at, 0)[0]
            lo, hi = np.where(o, p, lo), np.where(o, hi, p)
            node = 2 * node + o
        done += d
    return lo, hi


def _weigh(g: np.ndarray, ends: tuple[np.ndarray, np.ndarray],
           stale: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(g_hi, g_lo) of a regula falsi bracket after a step to a point of value g: where the
    same side was kept twice (`stale`: hi kept, lo kept), the kept end's g is scaled by the
    Anderson-Bjorck factor 1 - g / g(the end x replaced), halved where that is not positive
    (Anderson and Bjorck 1973; Illinois halves always)."""
    g_lo, g_hi = ends
    stale_hi, stale_lo = stale
    m_hi = 1.0 - g / np.where(g_lo != 0, g_lo, 1.0)  # x replaced lo
    m_lo = 1.0 - g / np.where(g_hi != 0, g_hi, 1.0)  # x replaced hi
    return (np.where(stale_hi, np.where(m_hi > 0, m_hi, 0.5) * g_hi, g_hi),
            np.where(stale_lo, np.where(m_lo > 0, m_lo, 0.5) * g_lo, g_lo))


def _gather(stacks: list[tuple[list[str], np.ndarray]], rows: np.ndarray
            ) -> dict[str, np.ndarray]:
    """{name: its values at `rows`} of constants stacked as the columns of a matrix (one
    gather of whole matrix rows per matrix: the same values as one gather per constant, at a
    third of the cost; each constant a column view of the result)."""
    out: dict[str, np.ndarray] = {}
    for names, mat in stacks:
        out.update(zip(names, mat[rows].T, strict=True))
    return out


def _kv_cap(limits: Limits, policy: SchedulerPolicy, prefix: PrefixCache, inp: LengthStats,
            out: LengthStats) -> np.ndarray:
    """The KV concurrency cap: the most running sequences whose KV footprint fits the pool at
    the 99th percentile (`prefix`: the cache in effect, an inactive one without)."""
    # KV held by a running sequence: its prompt plus the part of its output generated so
    # far (uniform over its life): mean I + O/2, variance Var(I) + Var(O)/4 + E[O^2]/12.
    # B sequences hold a sum with mean B mu and sd sqrt(B) sigma; the cap is the largest B
    # whose 99th percentile fits: B mu + 2.33 sqrt(B) sigma = KV tokens (heavy-tailed
    # lengths leave less room than the mean suggests; vLLM would preempt beyond it).
    # An output reservation at admission raises it (SchedulerPolicy.held_tokens); blocks
    # shared with other running requests are held once (vLLM block_pool.touch); a hybrid's
    # recurrent state holds its fixed blocks whatever the length (vLLM MambaManager), and
    # the last block is partly empty (large for hybrids' raised block sizes).
    # Sliding-window layers hold at most their window's blocks (vLLM's hybrid allocator
    # frees the rest; layers.window_blocks): a sequence's tokens count as limits.held_kv
    # of them, and their spread as the spread of held_kv over mean +- one sd (its secant
    # there: 1 without window layers, the full layers' share past the window). Shared and
    # resident prefix blocks count as cached entries: their full layers' part only
    # (BlockLayout.cached_kv_tokens, as the replay holds them).
    lay = limits.layout
    held = (float(policy.held_tokens(inp.mean, out.mean))
            + block_rounding_tokens(inp.mean, out.mean, limits.block_size))
    mu = np.maximum(limits.held_kv(held)
                    - lay.cached_kv_tokens(prefix.shared_kv_tokens_per_seq, limits.block_size)
                    + np.asarray(limits.state_tokens_per_seq, float), 1.0)
    sigma = math.sqrt(inp.var + out.var / 4 + out.mean_sq / 12)
    if sigma > 0 and limits.windowed:
        lo_h = np.maximum(held - sigma, 0.0)
        secant = (limits.held_kv(held + sigma) - limits.held_kv(lo_h)) / (held + sigma - lo_h)
        # rows without window layers (a stack's dense rows) keep their own sd exactly
        sigma = np.where(np.asarray(lay.window) > 0, sigma * secant, sigma)
    kv = np.asarray(limits.kv_cache_tokens, float) - lay.cached_kv_tokens(
        prefix.resident_kv_tokens, limits.block_size)
    z = Z99
    root = (-z * sigma + np.sqrt(z * z * sigma * sigma + 4 * mu * np.maximum(kv, 0.0))) / (
        2 * mu)
    return root * root


class SteadyState:
    """Mean steady state of one replica for given lengths and limits, and its stability."""

    def __init__(self, step: StepModel, inp: LengthStats, out: LengthStats, limits: Limits,
                 arrival_scv: float = 1.0, policy: SchedulerPolicy | None = None,
                 prefix: PrefixCache | None = None):
        """arrival_scv: squared coefficient of variation of inter-arrival times (1 = Poisson;
        gamma arrivals with burstiness k have 1/k), used in Kingman's G/G correction.
        policy: the engine profile's scheduler (default vLLM's): prefill-first steps stall the
        decoders, whole-prompt engines take a prompt in one step, and an output reservation
        lowers the KV concurrency cap (docs/engines.md).
        prefix: automatic prefix caching (models/prefix.py, docs/prefix_caching.md): prompts
        compute only their uncached tokens (`self.pf`), attention still reads the cached ones,
        and blocks shared between running requests are held once."""
        self.step, self.inp, self.out, self.limits = step, inp, out, limits
        self.policy = policy or SchedulerPolicy()
        self.prefix = prefix if (prefix is not None and prefix.active
                                 and self.policy.prefix_caching) else PrefixCache()
        self.cached = self.prefix.cached_tokens_mean
        self.pf = (LengthStats.from_samples(self.prefix.prefill_tokens) if self.prefix.active
                   else inp)
        """Prompt tokens each request computes (all of them without a cache hit)."""
        self.ca2 = float(arrival_scv)
        self.pack_prompts = False
        """Cost a chunk longer than a prompt as whole prompts (models/prefill.py): always with
        attention DP; on request otherwise (the disaggregated pools, capplan.plan.pd.pool_queue:
        `latency`'s and the P/D search's), while
        the aggregated answers keep one sequence's chunk (docs/multinode.md, known limits)."""
        self._dp = bool(np.any(np.asarray(step.attention_dp) > 1))
        self.dec_tokens = max(out.mean - 1.0, 0.0)
        # Time-averaged context of a decoding sequence, lengths independent:
        # E[(O-1)(I + O/2)] / E[O-1] = E[I] + (E[O^2] - E[O]) / (2 E[O-1]).
        self.ctx_mean = inp.mean + ((out.mean_sq - out.mean) / (2 * self.dec_tokens)
                                    if self.dec_tokens > 0 else 0.0)
        mnbt = np.asarray(limits.max_num_batched_tokens, float)
        self.cap = np.maximum(np.minimum(np.asarray(limits.max_num_seqs, float),
                                         _kv_cap(limits, self.policy, self.prefix, inp, out)), 0.0)
        # A whole prompt joins at most budget - prompt running decodes (the mean of the prompt
        # tokens a step computes, as the replay's admission counts them, each by its own
        # length): the prompt's own sequence plus those.
        beside = self.policy.decodes_beside_prompt(mnbt, self.pf.mean)
        if beside is not None:
            self.cap = np.minimum(self.cap, beside + 1.0)
        self.mnbt = mnbt
        self._flat: dict[Any, dict[str, np.ndarray]] = {}
        """Array constants flattened to a shape (_rows), and T(0) of that shape."""
        # Whole-prompt engines (no chunked prefill) cannot run a prompt over the token budget:
        # TensorRT-LLM rejects it (max_num_tokens), so such a configuration has no steady state.
        longest = max(inp.table) if inp.table else inp.mean
        self.whole_prompts_fit = (np.ones_like(mnbt, bool) if self.policy.chunked_prefill
                                  else mnbt >= longest)

    # -- step times ------------------------------------------------------------------------
    def _decode(self, b: np.ndarray) -> np.ndarray:
        return self.step.step(**self._decode_inputs(b), detail=False)["step_s"]

    def _decode_inputs(self, b: np.ndarray) -> dict[str, np.ndarray]:
        """A decode step of b sequences at the mean context."""
        w = self.step.window
        return {"num_decode": b, "decode_kv_tokens": b * self.ctx_mean,
                "decode_kv_tokens_window": b * np.minimum(self.ctx_mean, w)}

    def _steps(self, b: np.ndarray, chunks: tuple[np.ndarray, ...], decode: bool = False
               ) -> list[np.ndarray]:
        """[_decode(b) when `decode`] + [_mixed(b, chunk) for each chunk], in one evaluation of
        the step model where each chunk is one sequence's (StepModel.steps)."""
        if self.pack_prompts or self._dp:
            return [self._decode(b)] * decode + [self._mixed(b, c) for c in chunks]
        calls = [self._decode_inputs(b)] * decode + [self._chunk_inputs(b, c) for c in chunks]
        return self.step.steps(*calls)

    def _mixed(self, b: np.ndarray, chunk: np.ndarray) -> np.ndarray:
        """A step with b decode sequences and `chunk` prefill tokens (mean prefix); a
        prefill-first engine runs the chunk alone (the decoders wait).

        Attention DP splits the chunk over the ranks, each its own sequences' chunk; a rank's
        chunk longer than a prompt packs whole prompts (chunk / prompt of them), whose causal
        pairs add per prompt, not as one sequence of the chunk's length (models/prefill.py)."""
        if not (self.pack_prompts or self._dp):
            return self._one_sequence_chunk(b, chunk)
        dp_rows = np.asarray(self.step.attention_dp) > 1
        pb = np.zeros_like(np.asarray(b, float)) if self.policy.prefill_first else b
        packed = packed_prefill_step(self.step, chunk, self.pf.mean, self.cached, pb,
                                     pb * self.ctx_mean)
        if self.pack_prompts or np.all(dp_rows):
            return packed
        # a search holding attention-DP and plain rows: each row costed as it would be alone
        return np.where(dp_rows, packed, self._one_sequence_chunk(b, chunk))

    def _one_sequence_chunk(self, b: np.ndarray, chunk: np.ndarray) -> np.ndarray:
        return self.step.step(**self._chunk_inputs(b, chunk), detail=False)["step_s"]

    def _chunk_inputs(self, b: np.ndarray, chunk: np.ndarray) -> dict[str, np.ndarray]:
        """`_mixed`'s step where the chunk is one sequence's (after the mean prefix; a
        prefill-first engine runs it without the decoders)."""
        prefix = self.cached + np.maximum(self.pf.mean - chunk, 0.0) / 2
        if self.policy.prefill_first:
            b = np.zeros_like(np.asarray(b, float))
        return self.step.prefill_chunk_inputs(chunk, prefix, num_decode=b,
                                              decode_kv_tokens=b * self.ctx_mean)

    def _chunk_budget(self, b: np.ndarray) -> np.ndarray:
        if self.policy.prefill_first:  # the prefill step holds no decode tokens
            return np.maximum(self.mnbt + 0 * np.asarray(b, float), 1.0)
        return np.maximum(self.mnbt - b, 1.0)

    def _n_chunks(self, budget: np.ndarray) -> np.ndarray:
        if not self.policy.chunked_prefill:  # whole prompts: one step each
            return np.ones_like(np.asarray(budget, float))
        # each attention-DP rank chunks its own prompts within its D-th of the budget (the
        # simulator's compiled._seq_cap); x 1.0 at DP 1
        per_budget = self.pf.mean * np.asarray(self.step.attention_dp, float) / budget
        return np.maximum(1.0, per_budget + 0.5 * np.minimum(1.0, per_budget))

    def _mean_step(self, lam: np.ndarray, tau: np.ndarray) -> dict[str, np.ndarray]:
        # Decoders get a token every step (mixed), or only in decode steps (prefill-first:
        # the gap between tokens is tau / (1 - f)). Little's law for the decoding batch:
        # B = lambda (O - 1) gap. At least a sliver of a sequence, so that a step always costs
        # its fixed overheads.
        if self.policy.prefill_first:
            budget = self._chunk_budget(np.zeros_like(np.asarray(tau, float)))
            n = self._n_chunks(budget)
            f = 1.0 - np.exp(-lam * tau * n)
            gap = tau / np.maximum(1.0 - f, 1e-3)
            b = np.maximum(np.minimum(lam * self.dec_tokens * gap, self.cap), 1e-9)
        else:
            b = np.maximum(np.minimum(lam * self.dec_tokens * tau, self.cap), 1e-9)
            budget = self._chunk_budget(b)
            n = self._n_chunks(budget)
            f = 1.0 - np.exp(-lam * tau * n)
        p_bar = lam * self.pf.mean * tau
        chunk = np.clip(p_bar / np.maximum(f, 1e-12), 1.0, budget)
        t_dec, t_pf = self._steps(b, (chunk,), decode=True)
        if not self.policy.chunked_prefill:  # a whole prompt per prefill step
            chunk = np.maximum(chunk, np.minimum(self.pf.mean, budget))
        mean = (1 - f) * t_dec + f * t_pf
        return {"tau": mean, "b": b, "f": f, "t_dec": t_dec, "t_pf": t_pf, "budget": budget,
                "chunk": chunk, "n": n}

    def token_gap(self, s: dict[str, np.ndarray], tau: np.ndarray) -> np.ndarray:
        """Mean gap between a sequence's tokens: the mean step, or for a prefill-first engine
        the mean step over the share of steps that decode."""
        if self.policy.prefill_first:
            return tau / np.maximum(1.0 - s["f"], 1e-3)
        return tau

    def _fixed_point(self, lam: np.ndarray, every_row: bool = True
                     ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """Mean step time solving tau = T(tau), whether it exists, and `_mean_step` at it (the
        evaluation that set each row's tau, kept rather than computed again).

        g(tau) = T(tau) - tau is positive at tau = 0 and, when a fixed point exists, negative
        at _TAU_MAX_S. T is close to affine in tau (B and P grow linearly with it), so regula
        falsi with the Anderson-Bjorck weighting converges in a few vectorised steps (Anderson
        and Bjorck 1973: the stale end's g scaled by 1 - g(x) / g(replaced end), or halved as
        Illinois where that is not positive); near saturation it can need more (up to
        _FP_ITERS_MAX; a stalled bracket left tau at _TAU_MAX_S: an unstable verdict between two
        stable rates). Where a fixed point exists the first point tried is T(_TAU_MAX_S), the
        step with the batch and the chunks at their caps: T grows with tau, so it lies above
        the root, much closer to it than _TAU_MAX_S.

        Each row stops on its own: once within _FP_ROUNDING_TOL, or at an exact root (g(hi) ==
        0: x = hi again, so hi stays), its bracket is frozen, so a row's answer does not depend
        on the rows solved with it (the planner's search solves subsets of the
        configurations). Iterations evaluate only the working set, cut to the unsettled rows
        when they fall under _FP_REPACK of it. Rows where no fixed point exists are iterated
        only when `every_row` (a caller that reads no tau of those rows: stable()).
        """
        shape = np.broadcast_shapes(np.shape(lam), np.shape(self.cap))
        lam_w = np.broadcast_to(lam, shape).reshape(-1)
        a = np.zeros(lam_w.size)
        ga = self._step_at_zero(lam, shape)
        b = np.full_like(a, _TAU_MAX_S)
        at_hi = {k: np.broadcast_to(v, shape).reshape(-1).copy()
                 for k, v in self._mean_step(lam, b.reshape(shape)).items()}
        gb = at_hi["tau"] - b
        exists = gb <= 0
        hi, sd, go_on = b, np.zeros_like(a), exists | every_row
        rows, part = np.arange(a.size), self._rows(np.arange(a.size), shape)
        first = at_hi["tau"].copy()  # T(_TAU_MAX_S)
        for it in range(_FP_ITERS_MAX):
            done = (b - a <= _FP_ROUNDING_TOL * b) | (gb == 0) | ~go_on
            if np.all(done):
                break
            if np.count_nonzero(~done) < _FP_REPACK * rows.size:
                hi[rows[done]] = b[done]
                keep = ~done
                rows, a, b, ga, gb, sd, go_on, lam_w, done = (
                    v[keep] for v in (rows, a, b, ga, gb, sd, go_on, lam_w, done))
                part = self._rows(rows, shape)
            den = ga - gb
            x = np.where(den > 0, (a * -gb + b * ga) / np.where(den > 0, den, 1.0),
                         0.5 * (a + b))
            if it == 0:  # where a fixed point exists (elsewhere T(_TAU_MAX_S) is above it)
                x = np.where(gb <= 0, first[rows], x)
            x = np.clip(x, a, b)
            s = part._mean_step(lam_w, x)
            g = s["tau"] - x
            pos, neg = (g > 0) & ~done, (g <= 0) & ~done  # a done row's bracket stays
            moved = rows[neg]  # x is their new hi
            for k, v in s.items():
                at_hi[k][moved] = (v if np.shape(v) == x.shape else np.broadcast_to(v, x.shape)
                                   )[neg]
            gb, ga = _weigh(g, (ga, gb), (pos & (sd > 0), neg & (sd < 0)))
            a, ga = np.where(pos, x, a), np.where(pos, g, ga)
            b, gb = np.where(neg, x, b), np.where(neg, g, gb)
            sd = np.where(pos, 1.0, np.where(neg, -1.0, sd))
        hi[rows] = b
        return hi.reshape(shape), exists.reshape(shape), {k: v.reshape(shape)
                                                          for k, v in at_hi.items()}

    def _step_at_zero(self, lam: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """T(0) - 0 of the fixed point, flat: at tau = 0 no sequence decodes and no prompt
        arrives, whatever the (finite) rate, so it is computed once per shape."""
        if not np.all(np.isfinite(lam)):  # inf x 0: the rate's own NaNs
            return self._mean_step(lam, np.zeros(shape))["tau"].reshape(-1)
        key = ("T(0)", shape, self.pack_prompts)
        if key not in self._flat:
            self._flat[key] = {"g": self._mean_step(
                np.zeros(shape), np.zeros(shape))["tau"].reshape(-1)}
        return self._flat[key]["g"].copy()

    def _rows(self, rows: np.ndarray, shape: tuple[int, ...]) -> SteadyState:
        """This model restricted to the flat positions `rows` of arrays of `shape` (its step
        constants and limits as 1-D arrays; the lengths and the policy are shared)."""
        flat = self._flat.get(shape)
        if flat is None:  # the array constants flattened to `shape`, once per shape: stacked by
            # dtype, so one gather takes every constant's rows (`_gather`)
            arrays = {f.name: getattr(self.step, f.name) for f in fields(self.step)}
            arrays.update(cap=self.cap, mnbt=self.mnbt)
            arrays = {k: np.broadcast_to(v, shape).reshape(-1) for k, v in arrays.items()
                      if isinstance(v, np.ndarray) and v.ndim}
            flat = self._flat[shape] = {"stacks": [
                ([k for k in arrays if arrays[k].dtype == dt],
                 np.stack([v for v in arrays.values() if v.dtype == dt], axis=1))
                for dt in dict.fromkeys(v.dtype for v in arrays.values())]}
        got = _gather(flat["stacks"], rows)
        part = copy.copy(self)
        part._flat = {}  # its own shapes
        part.cap, part.mnbt = got.pop("cap", self.cap), got.pop("mnbt", self.mnbt)
        part.step = self.step.gathered(got)
        return part

    def stable(self, rate_per_s: ArrayLike) -> np.ndarray:
        """The stability test of at_rate() alone (cheaper: no percentiles)."""
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            lam = np.asarray(rate_per_s, float)
            lam = np.broadcast_to(lam, np.broadcast_shapes(lam.shape, np.shape(self.cap))).copy()
            tau, exists, s = self._fixed_point(lam, every_row=False)
            b, budget = s["b"], s["budget"]
            pf = self.pf.mean
            t_full, t_own = self._steps(b, (budget, np.minimum(pf, budget)))
            rho_p = lam * pf * t_full / budget
            own_mean = np.where(pf <= budget, t_own, pf / budget * t_full)
            # a request holds its slot for its prefill and its tokens' gaps (as at_rate)
            a = lam * (own_mean + self.dec_tokens * self.token_gap(s, tau))
            return self.whole_prompts_fit & exists & (rho_p < 1) & (
                a < np.maximum(self.cap, 1.0)) & (
                lam * pf * tau < budget)

    def capacity_rate(self) -> np.ndarray:
        """Largest stable arrival rate (requests/s), by bisection on the stability test."""
        return self.capacity_bracket(_CAP_BISECT)[0]

    def capacity_bracket(self, steps: int, start: tuple[np.ndarray, np.ndarray] | None = None
                         ) -> tuple[np.ndarray, np.ndarray]:
        """(lo, hi) after `steps` halvings of capacity_rate's bisection, from its first bracket
        or from `start` (a bracket it left): capacity_rate is lo after _CAP_BISECT in all. A
        row's steps are its own, so the bisection may be continued over some rows only."""
        if start is not None:
            lo, hi = (np.array(v, float) for v in start)
        else:
            lo = np.zeros(np.shape(self.cap))
            # Upper bounds: a step computes at most mnbt tokens and lasts at least a 1-token
            # step; prompts go no faster than full-budget prefill chunks.
            one = self._decode(np.ones_like(lo))
            full = self._mixed(np.zeros_like(lo), self.mnbt)
            per_req = max(self.pf.mean + self.dec_tokens, 1.0)
            hi = np.minimum(self.mnbt / np.maximum(one, 1e-9) / per_req,
                            self.mnbt / np.maximum(full, 1e-9) / max(self.pf.mean, 1.0))
            hi = np.broadcast_to(hi * 1.05, lo.shape).copy()
        return tree_bisect(self.stable, lo, hi, steps)
