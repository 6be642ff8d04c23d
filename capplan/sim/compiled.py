"""The continuous-batching scheduler: the one implementation of its rules, a step loop that
numba compiles and that runs as plain Python from the same source.

The rules are `capplan.sim.engine`'s module docstring (vLLM V1's mixed chunked prefill with
recompute preemption, SGLang's prefill-first steps, TensorRT-LLM's whole prompts with the output
reserved, sliding windows, priorities, hybrid models' state blocks, vLLM's automatic prefix
caching, closed-loop clients); `ContinuousEngine` runs them here as one `numba.njit` loop over
struct-of-arrays state, on the exact clock, one step at a time:

- per request, one int32 row per field of `q[FIELD, request]` (prompt, output, priority,
  reserved blocks, target, computed and generated tokens, state, the steps of its last and
  first token, finish and admission, a pending first-decode gap, this step's chunk, the
  context at which it next needs a KV block);
- the running set as an index array in admission order (so running prefills come in vLLM's
  order, and the preemption victim, the largest (priority, admission order), is found by one
  scan from the newest end); the waiting queue as a binary heap keyed (priority, arrival,
  index);
- the step time from `capplan.models.perf.step_parts`, the same Python function `StepModel`
  evaluates with numpy, compiled with `numba.njit` and called per step with the model's
  constants as floats;
- per step nothing that grows with the steps (`RunRecord.steps`): the TBT gap and count into a
  hash table of distinct gaps (the batch shapes recur: 4.3M steps at 10% load are ~33k
  entries), the time integrals of running and waiting, the peak of KV blocks, a strided sample
  for the time series; per request its admission, first-token and finish times, stamped in the
  loop; `keep_steps` keeps the per-step arrays too;
- decode stretches between events run in closed form (`_bulk`: only their step times and
  records);
- hybrid models: `state_blocks` pool blocks per running sequence, held from admission to
  finish or preemption besides its token blocks;
- sliding-window models: the block layout in cfg (`_units`, `_edge`): k token blocks cost
  cfg[FULL_U] k + cfg[WIN_U] min(k, cfg[WIN_CAP]) pool blocks (layers.window_blocks);
- closed loops: `concurrency` clients, each sending its next request when its last one
  finishes; it reaches the engine its delay after the end of that step (models.engine.
  closed_loop_delay: the overhead's own exponential delay, or a fixed part plus jitter), and
  with a varying delay requests take the next index in arrival order;
- prefix caching: each request's shareable block keys as dense int64 ids (`prefix_cache`), per
  key a ref count and the stamp of its free cached block, the free queue as an array in stamp
  order (eviction pops its front, skipping stale entries); a preempted request's own full
  blocks as a count per request whose queue entries carry the key -1 - request (`_live`);
- LoRA (cfg[MAX_LORAS] slots): each request's adapter in q[ADAPTER], per adapter its running
  and waiting requests (`lora_state`), the distinct adapters running and the waiting requests
  that may run beside them as scalars, kept as requests arrive, are admitted, preempted and
  finish; the admission scan skips requests of further adapters (`_admit_waiting`) and each
  step's constants carry the running set's distinct adapters (`_with_adapters`).

The same source as plain Python: without numba this module's functions stay Python; with it,
`plain_module()` loads this file a second time as `PLAIN_MODULE` with the JIT off (debugging,
`--sim-engine python`, and step models other than `StepModel`, whose step time the plain loop
asks for step by step). tests/sim/test_jit_equality.py checks that both runs agree to 1e-9 s.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from capplan.models import lora, perf
from capplan.models.engine import NO_JITTER, ClientJitter, closed_loop_delay
from capplan.models.layers import NO_CAP
from capplan.sim.engine_options import NO_WINDOW, check_overhead
from capplan.sim.entities import STEP_INPUTS, RunRecord, StepSummary
from capplan.sim.interrupt import pending as _pending_signals
from capplan.sim.interrupt import signals_as_flag
from capplan.sim.metrics import series_steps
from capplan.sim.workload import Requests

PLAIN_MODULE = "capplan.sim._compiled_plain"
"""This source loaded a second time with the JIT off (`loop_module`): the plain-Python loop."""



def _import_array_functions() -> None:
    """Import numba's array functions (numba.np.arraymath) with scipy's BLAS hidden. On import
    that module probes `scipy.linalg.cython_blas`, which imports all of scipy.linalg (~0.3 s of
    CPU, a third of loading the cached loop); the probe only picks how numba's np.convolve and
    np.correlate take inner products, and this module calls neither. Skipped when scipy.linalg
    is loaded already (the probe then costs nothing); numba's own BLAS calls (np.dot,
    np.linalg) import scipy.linalg when they are compiled, as before."""
    if "scipy.linalg" in sys.modules or "numba.np.arraymath" in sys.modules:
        return
    sys.modules["scipy.linalg.cython_blas"] = None  # type: ignore[assignment]  # ImportError
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        del sys.modules["scipy.linalg.cython_blas"]


try:
    if __name__ == PLAIN_MODULE:
        raise ImportError  # the plain twin: every function below stays Python
    import numba
    from numba.extending import register_jitable

    _import_array_functions()
except ImportError:  # pragma: no cover - exercised in a subprocess test
    numba = None


# rows of q[FIELD, request]
(PROMPT, OUTPUT, PRIO, RESERVED, TARGET, COMPUTED, GENERATED, STATE, LAST_TOK, FIRST_STEP,
 FIN_STEP, ADM_STEP, FD_LAST, CHUNK, DUE, ADAPTER) = range(16)
NUM_FIELDS = 16
# q[STATE]
ARRIVING, WAITING, PREFILLING, DECODING, FINISHED, NEW_DECODER = range(6)
# scalars sc[...]
(FREE, NDEC, BUDGET, PREEMPTED_NOW, DEC_DONE, BLOCKED, ADMISSIONS, PREEMPTIONS, DONE, NRUN,
 NHEAP, NCH, STEP, LAST_DEC, NGAPS, ERR, SUMCTX, SUMCTXW, NPF, NNEED, NFD, NTBT, STRIDE, NSER,
 KV_MAX) = range(25)
SEQCAP = 35
"""sc[SEQCAP]: the most prompt tokens one sequence may take this step (`_seq_cap`)."""
INBUDGET = 40
"""sc[INBUDGET]: what is left this step of the prompt budget a further prompt must come in
under whole (cfg[WHOLE_AFTER]: `_whole_below`)."""
NUM_SCALARS = 41
BULK_MIN_STEPS = 2
"""Shortest decode stretch `_bulk` runs: a one-step stretch costs more passes over the running
set than a full step (overload, where a large batch completes a sequence every step)."""
LAST_FIN = 25
"""sc[LAST_FIN]: completions in the last step of a decode stretch (`_bulk`)."""
NXT, SENT, NFIN, NPEND = 26, 27, 28, 29
"""sc[...]: requests that reached the waiting queue, requests sent (all of them in an open loop;
a closed loop sends one when one finishes), completions of this step (closed loop: they send),
requests sent and on their way (client jitter)."""
NCACHED, STAMP, LRU_HEAD, LRU_TAIL, HIT_TOKENS = 30, 31, 32, 33, 34
"""sc[...], prefix caching: free blocks that keep a key, the next free-queue stamp, the free
queue's live span, prompt tokens found in the cache."""
NLOADED, WLOAD, LORA_CAND, NPARK = 36, 37, 38, 39
"""sc[...], LoRA (cfg[MAX_LORAS] > 0): distinct adapters of the running set (the loaded ones),
waiting requests that may run beside them (an adapter loaded, or none), the waiting request the
last admission scan stopped at for want of blocks or budget while it is still the first the
scan would try (-1: not known; `_lora_wait`, `_lora_run` forget it), and the waiting requests
parked out of the heap (`_admit_waiting`). Waiting requests: sc[NHEAP] + sc[NPARK]."""
# float scalars tf[...]: this step's start and end, the end of the last decode step and of step
# 0, the time integrals of the running set and of the requests in the system (s * requests),
# a closed loop's request overhead, the start of the last step run and this step's admission
# cutoff (requests that reached the engine later wait: cfg[AHEAD], `_cutoff`)
T_START, T_END, T_LAST_DEC, T_STEP0, RUN_INT, SYS_INT, OVERHEAD, T_PREV, T_CUT = range(9)
NUM_TF = 9
# per-request times qt[FIELD, request]: admission (a step's start), first token, finish (a
# step's end); and in qtok[FIELD, request] (dropped after the run) last token and pending
# first-decode gap (a step's end)
ADM_T, FIRST_T, FIN_T = range(3)
LAST_T, FD_T = range(2)
SERIES_CAP = 1 << 16
"""Step samples kept for the time series: every step up to this many, then every 2nd, 4th..
(the series of runs up to SERIES_CAP steps is exactly the reference's)."""
# configuration cfg[...]
(TOTAL, BS, MAX_SEQS, MAX_TOKENS, WINDOW, HAS_WINDOW, PREFILL_FIRST, CHUNKED, CAN_PREEMPT,
 STATE_BLOCKS, KEEP_STEPS, SERIES_CAP_, CONC, JITTER, PC, KV_PRESENT, DP, AHEAD,
 MAX_LORAS, PREEMPT_KEEP, FULL_U, WIN_U, WIN_CAP, WHOLE_AFTER, MAX_PREFILL) = range(25)
"""cfg[WHOLE_AFTER], cfg[MAX_PREFILL]: SchedulerPolicy.whole_prompts_after_first and the
prompt budget a step's further prompts are admitted within (SGLang's max_prefill_tokens;
`_whole_below`)."""
"""cfg[FULL_U], cfg[WIN_U], cfg[WIN_CAP]: the block layout (models/layers.BlockLayout): pool
blocks per token block in the full and the window layers, and the token blocks at which the
window layers stop growing (`_units`). A prefix-cache entry is a token block's full-layer blocks
(cfg[FULL_U] pool blocks; window-layer blocks are not cached), or with no full layers its
window-layer blocks (cfg[WIN_U]; `_entry`, BlockLayout.entry), a request's first cfg[WIN_CAP]
token blocks at most (BlockLayout.cached_cap: `prefix_cache`, `_preempt`)."""
KEEP_NONE, KEEP_PROMPT, KEEP_COMPUTED = range(3)
PREEMPT_KEEPS = {"none": KEEP_NONE, "prompt": KEEP_PROMPT, "computed": KEEP_COMPUTED}
"""cfg[PREEMPT_KEEP] of SchedulerPolicy.preempt_cached: which full blocks a preempted sequence
leaves in the prefix cache for its recompute (`_release`, `_lookup`; with cfg[PC] only)."""
# LoRA, bufs[12] = (counts, parked): counts[RUN_A, a] running and counts[WAIT_A, a] waiting
# requests of adapter a; parked[:sc[NPARK]]: waiting requests an admission scan skipped, out of
# the heap until a slot frees (`_admit_waiting`)
RUN_A, WAIT_A = range(2)
_LORA_N1 = perf.STEP_CONSTANTS.index("lora_n1")
_LORA_CAP = perf.STEP_CONSTANTS.index("lora_max_loras")
"""The popularity groups' constants lora_n1..lora_q4 lie between these (`_with_adapters`)."""
# a closed loop's arrivals: af[ROW, .] floats, ai[ROW, .] ints; by request index: its send time
# (the end of the step that sent it), its jitter and the step that sent it; by sending order
# (client jitter: a request gets the next index when it arrives): arrival time, send time,
# jitter, sending step, the pending heap; the jitter's spread by request, its noise by sending
SENT_T, JIT, PT, PST, PJ, SPREAD, NOISE = range(7)
ASTEP, PG, PHEAP = range(3)
# prefix caching, pcx = (koff, kid, isref, kref, kstamp, lru): request s's block keys are
# kid[koff[s]:koff[s + 1]] (dense ids of Requests.block_keys), isref the same slots' flag "a
# shared entry it holds"; per key: holders of its registered block (kref, vLLM's ref count)
# and, for a free block that keeps it, when it was freed (kstamp, -1: none); lru[(key, stamp),
# i]: the free queue in stamp order (entries whose stamp is no longer the key's are stale);
# own[(count, end), s]: a preempted request's own cached blocks (its full blocks beyond its
# shared keys, cfg[PREEMPT_KEEP]), the first `count` of them, whose free-queue entries carry
# key -1 - s and are the `count` stamps before `end` (`_live`)
KOFF, KID, ISREF, KREF, KSTAMP, LRU, OWN = range(7)
# error codes sc[ERR]
ERR_NO_PREEMPTION, ERR_NO_VICTIM, ERR_NO_WORK = 1, 2, 3
ERRORS = {ERR_NO_PREEMPTION: "out of KV blocks under a policy without preemption: the "
                             "admission reservation must prevent this",
          ERR_NO_VICTIM: "no running sequence to preempt",
          ERR_NO_WORK: "a step with neither prefill nor decode work"}


if numba is not None:
    register_jitable(perf.smooth_max)
    for _f in (perf.busiest_share, perf.feature_inputs, perf.fixed_parts, perf.attention_parts,
               perf.combine_parts):
        register_jitable(_f)

    @numba.extending.overload(perf.select)
    def _select_scalar(cond, a, b):  # noqa: ANN001, ANN202, ARG001
        return lambda cond, a, b: a if cond else b

    _njit = numba.njit(cache=True)
    # The functions on a step's path are inlined into `_step` and `_bulk_all` (numba IR
    # inlining) or called, and none of them allocates: they are compiled without numba's runtime
    # reference counting (`_njit_borrow`: the `_nrt=False` option numba's own string helpers are
    # compiled with), so they borrow their arrays from the caller, which holds them for the
    # call. With it, every compiled call, and every inlined one (its parameters are rebound),
    # increfs each array of its (tuple) arguments on entry and decrefs it on exit: atomic
    # operations (NRT_incref, NRT_decref) that were two thirds of the loop's time (perf
    # samples), the state tuples holding ~30 arrays. A function that allocates (`_grow`,
    # `_tbt_grow`, `simulate_loop`) or returns an array keeps the runtime (`_njit`): without it
    # a returned array would not be owned, nor a replaced one freed. `_step`, `_bulk_all` and
    # `_run_steps` stay calls (inlining them too tripled the compile time).
    _njit_inline = numba.njit(cache=True, inline="always")
    _njit_borrow = numba.njit(cache=True, _nrt=False)
    _step_parts = numba.njit(cache=True)(perf.step_parts)

    @_njit
    def _fixed_parts(x: tuple, consts: tuple, moe: bool) -> tuple:
        return perf.fixed_parts(x, consts, moe)

    @_njit
    def _decode_s(x: tuple, fixed: tuple, consts: tuple) -> float:
        """A decode step's time from the parts that do not read the KV cache (`fixed`)."""
        return float(perf.combine_parts(fixed, perf.attention_parts(x, consts))[0])

    @_njit_inline
    def _stand_in(c: Any) -> bool:  # noqa: ARG001
        """Whether the step constants are a stand-in step model (never, compiled)."""
        return False

    @_njit
    def _poll_signals() -> bool:
        """Back in the interpreter for a moment (objmode): pending signal handlers run there
        and record Ctrl-C / SIGTERM (sim/interrupt.py); True when one came."""
        with numba.objmode(n="int64"):
            n = _pending_signals()
        return n > 0
else:
    def _njit(f: Callable) -> Callable:
        return f

    _njit_inline = _njit_borrow = _njit

    def _stand_in_s(x: tuple, model: Any) -> float:
        """The step time of a step model other than `StepModel` (the tests' stand-ins): its
        own `step` for this step's inputs."""
        kw = dict(zip(STEP_INPUTS, x, strict=True))
        return float(np.asarray(model.step(**kw, detail=False)["step_s"]))

    def _step_parts(x: tuple, consts: Any, moe: bool) -> Any:
        if hasattr(consts, "step"):
            return (_stand_in_s(x, consts),)
        return perf.step_parts(x, consts, moe)

    def _fixed_parts(x: tuple, consts: Any, moe: bool) -> Any:
        return None if hasattr(consts, "step") else perf.fixed_parts(x, consts, moe)

    def _decode_s(x: tuple, fixed: Any, consts: Any) -> float:
        if hasattr(consts, "step"):
            return _stand_in_s(x, consts)
        return float(perf.combine_parts(fixed, perf.attention_parts(x, consts))[0])

    def _stand_in(c: Any) -> bool:
        """Whether `c` is a stand-in step model (its own `step` prices a step) rather than
        `StepModel`'s constants."""
        return hasattr(c, "step")

    def _poll_signals() -> bool:
        return _pending_signals() > 0


POLL_STEPS = 4096
"""Steps between signal polls (a power of two): a step takes ~1 us compiled, so a poll every
~4 ms ends the run well within a second of Ctrl-C; the objmode round trip costs ~1 us."""


# -- the waiting queue: a binary heap of request indices keyed (priority, arrival, index) ----
@_njit_inline
def _before(a: int, b: int, q: np.ndarray, arr: np.ndarray) -> bool:
    if q[PRIO, a] != q[PRIO, b]:
        return q[PRIO, a] < q[PRIO, b]
    if arr[a] != arr[b]:
        return arr[a] < arr[b]
    return a < b


@_njit_inline
def _push(s: int, heap: np.ndarray, sc: np.ndarray, q: np.ndarray, arr: np.ndarray) -> None:
    i = sc[NHEAP]
    sc[NHEAP] += 1
    heap[i] = s
    while i > 0:
        p = (i - 1) // 2
        if not _before(heap[i], heap[p], q, arr):
            break
        heap[i], heap[p] = heap[p], heap[i]
        i = p


@_njit_inline
def _pop(heap: np.ndarray, sc: np.ndarray, q: np.ndarray, arr: np.ndarray) -> int:
    top = heap[0]
    n = sc[NHEAP] - 1
    sc[NHEAP] = n
    heap[0] = heap[n]
    i = 0
    while True:
        lo, r, m = 2 * i + 1, 2 * i + 2, i
        if lo < n and _before(heap[lo], heap[m], q, arr):
            m = lo
        if r < n and _before(heap[r], heap[m], q, arr):
            m = r
        if m == i:
            return top
        heap[i], heap[m] = heap[m], heap[i]
        i = m


# -- arrivals: open loop (given times) or closed loop (a completion sends the next request) ----
@_njit_borrow
def _pbefore(a: int, b: int, af: np.ndarray, ai: np.ndarray) -> bool:
    """Client jitter: request a (in sending order) reaches the engine before b: by arrival
    time, then sending step, then delay (the reference's pool order)."""
    if af[PT, a] != af[PT, b]:
        return af[PT, a] < af[PT, b]
    if ai[PG, a] != ai[PG, b]:
        return ai[PG, a] < ai[PG, b]
    if af[PJ, a] != af[PJ, b]:
        return af[PJ, a] < af[PJ, b]
    return a < b


@_njit_borrow
def _ppush(k: int, sc: np.ndarray, af: np.ndarray, ai: np.ndarray) -> None:
    heap = ai[PHEAP]
    i = sc[NPEND]
    sc[NPEND] += 1
    heap[i] = k
    while i > 0:
        p = (i - 1) // 2
        if not _pbefore(heap[i], heap[p], af, ai):
            break
        heap[i], heap[p] = heap[p], heap[i]
        i = p


@_njit_borrow
def _ppop(sc: np.ndarray, af: np.ndarray, ai: np.ndarray) -> int:
    heap = ai[PHEAP]
    top = heap[0]
    n = sc[NPEND] - 1
    sc[NPEND] = n
    heap[0] = heap[n]
    i = 0
    while True:
        lo, r, m = 2 * i + 1, 2 * i + 2, i
        if lo < n and _pbefore(heap[lo], heap[m], af, ai):
            m = lo
        if r < n and _pbefore(heap[r], heap[m], af, ai):
            m = r
        if m == i:
            return top
        heap[i], heap[m] = heap[m], heap[i]
        i = m


@_njit_inline
def _next_arrival(sc: np.ndarray, cfg: np.ndarray, arr: np.ndarray, bufs: tuple) -> float:
    """When the next request reaches the engine (inf: none is on its way)."""
    if sc[NXT] >= sc[SENT]:
        return np.inf
    if cfg[JITTER] and sc[NXT] >= cfg[CONC]:
        af, ai = bufs[9]
        return af[PT, ai[PHEAP, 0]]
    return arr[sc[NXT]]


@_njit_inline
def _arrive(t: float, q: np.ndarray, sc: np.ndarray, cfg: np.ndarray, heap: np.ndarray,
            arr: np.ndarray, bufs: tuple) -> None:
    """The requests that reached the engine by t join the waiting queue, in arrival order (with
    client jitter each takes the next request index as it arrives: its lengths)."""
    af, ai = bufs[9]
    while sc[NXT] < sc[SENT]:
        s = sc[NXT]
        if cfg[JITTER] and s >= cfg[CONC]:  # (the first clients' requests arrive at 0)
            k = ai[PHEAP, 0]
            if af[PT, k] > t:
                return
            _ppop(sc, af, ai)
            arr[s], af[SENT_T, s], af[JIT, s] = af[PT, k], af[PST, k], af[PJ, k]
            ai[ASTEP, s] = ai[PG, k]
        elif arr[s] > t:
            return
        q[STATE, s] = WAITING
        _push(s, heap, sc, q, arr)
        if cfg[MAX_LORAS]:
            _lora_wait(s, 1, q, sc, bufs[12][0], arr)
        sc[NXT] = s + 1


@_njit_inline
def _send_next(split: int, sc: np.ndarray, cfg: np.ndarray, arr: np.ndarray, bufs: tuple
               ) -> None:
    """A closed loop: each request finished this step sends its client's next one, which
    reaches the engine its delay after the step ends (`overhead`, the fixed part, plus spread
    x noise: closed_loop_rows, models.engine.closed_loop_delay) (the reference's
    `_finish`). The reference finishes prompts in chunk order, then decoders in index order
    (its finish heap): the decoders' part, from `split`, is sorted (the order pairs a finished
    request's output length with the next request's jitter noise)."""
    nfin = sc[NFIN]
    sc[NFIN] = 0
    finl, tf = bufs[8], bufs[6]
    af, ai = bufs[9]
    for i in range(split + 1, nfin):  # insertion sort: a handful a step
        x, j = finl[i], i - 1
        while j >= split and finl[j] > x:
            finl[j + 1] = finl[j]
            j -= 1
        finl[j + 1] = x
    for i in range(nfin):
        k = sc[SENT]
        if k >= arr.shape[0]:
            return
        sc[SENT] = k + 1
        t_end = tf[T_END]
        if cfg[JITTER]:  # on its way with its own delay, in arrival order
            j = af[SPREAD, finl[i]] * af[NOISE, k]
            af[PT, k], af[PST, k], af[PJ, k] = (t_end + j) + tf[OVERHEAD], t_end, j
            ai[PG, k] = sc[STEP]
            _ppush(k, sc, af, ai)
        else:
            arr[k], af[SENT_T, k] = t_end + tf[OVERHEAD], t_end
            ai[ASTEP, k] = sc[STEP]


# -- LoRA adapters: vLLM's max_loras rule ---------------------------------------------------
@_njit_inline
def _lora_ok(s: int, q: np.ndarray, sc: np.ndarray, cfg: np.ndarray, cnt: np.ndarray) -> bool:
    """Whether waiting request s may run beside the running set: it uses no adapter, its
    adapter is loaded (a running sequence holds it), or a slot is free (vLLM
    vllm/v1/core/sched/scheduler.py `Scheduler.schedule`: a waiting request of a further
    adapter is skipped once max_loras distinct adapters are scheduled)."""
    a = q[ADAPTER, s]
    return a < 0 or cnt[RUN_A, a] > 0 or sc[NLOADED] < cfg[MAX_LORAS]


@_njit_inline
def _lora_wait(s: int, d: int, q: np.ndarray, sc: np.ndarray, cnt: np.ndarray,
               arr: np.ndarray) -> None:
    """s joins (d = 1) or leaves (d = -1) the waiting queue: its adapter's waiting count and
    sc[WLOAD], the waiting requests that may run beside the running set (no adapter, or a
    loaded one); joining ahead of sc[LORA_CAND] makes that one unknown."""
    c = sc[LORA_CAND]
    if d > 0 and c >= 0 and _before(s, c, q, arr):
        sc[LORA_CAND] = -1
    a = q[ADAPTER, s]
    if a < 0:
        sc[WLOAD] += d
        return
    cnt[WAIT_A, a] += d
    if cnt[RUN_A, a] > 0:
        sc[WLOAD] += d


@_njit_inline
def _lora_run(s: int, d: int, q: np.ndarray, sc: np.ndarray, cnt: np.ndarray) -> None:
    """s joins (d = 1) or leaves (d = -1) the running set: an adapter loads with its first
    running sequence and unloads with its last, its waiting requests following it in and out
    of sc[WLOAD]; which requests may run changes, so sc[LORA_CAND] is unknown."""
    a = q[ADAPTER, s]
    if a < 0:
        return
    cnt[RUN_A, a] += d
    if cnt[RUN_A, a] == (1 if d > 0 else 0):
        sc[NLOADED] += d
        sc[WLOAD] += d * cnt[WAIT_A, a]
        sc[LORA_CAND] = -1


@_njit_inline
def _with_adapters(c: Any, sc: np.ndarray, cfg: np.ndarray) -> Any:
    """The step constants with the running set's distinct adapters in place of their expected
    count: the popularity groups become one group of sc[NLOADED] adapters at probability 1, so
    `perf.fixed_parts`' sum n (1 - (1 - q)^S) is sc[NLOADED] for any batch S >= 1 (capped at
    max_loras there, as every step is). Without LoRA, or for a stand-in step model (the
    tests'), the constants as they are."""
    if cfg[MAX_LORAS] == 0 or _stand_in(c):
        return c
    return (c[:_LORA_N1] + (float(sc[NLOADED]), 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
            + c[_LORA_CAP:])


# -- prefix caching (the reference's _lookup, _hit, _take, _register, _release, _cache) ------
@_njit_inline
def _lookup(s: int, num_tokens: int, cfg: np.ndarray, pcx: tuple) -> int:
    """Full blocks of the longest cached chain of s's keys, capped at num_tokens - 1 tokens
    (vLLM kv_cache_manager.get_computed_blocks)."""
    koff, kid, kref, kstamp = pcx[KOFF], pcx[KID], pcx[KREF], pcx[KSTAMP]
    a = koff[s]
    nk, cap = koff[s + 1] - a, (num_tokens - 1) // cfg[BS]
    m = min(cap, nk)
    h = 0
    while h < m and (kref[kid[a + h]] > 0 or kstamp[kid[a + h]] >= 0):
        h += 1
    if h == nk:  # the chain goes on through the blocks its preemption left cached
        h = min(cap, nk + pcx[OWN][0, s])
    return h


@_njit_inline
def _reused(s: int, nh: int, pcx: tuple) -> int:
    """Of s's first nh hit blocks, those taken out of the free queue (cached, not in use)."""
    kid, kstamp, a = pcx[KID], pcx[KSTAMP], pcx[KOFF][s]
    nk = pcx[KOFF][s + 1] - a
    n = max(nh - nk, 0)  # its own cached blocks are all in the free queue
    for i in range(min(nh, nk)):
        n += kstamp[kid[a + i]] >= 0
    return n


@_njit_borrow
def _hit(s: int, nh: int, q: np.ndarray, sc: np.ndarray, cfg: np.ndarray, pcx: tuple) -> None:
    """Reuse s's first nh blocks (block_pool.touch: ref count up, out of the free queue); the
    blocks its preemption left cached beyond them are no longer found (they stay free, keyless).
    Prefix hit tokens count shared blocks only."""
    kid, isref, kref, kstamp, a = pcx[KID], pcx[ISREF], pcx[KREF], pcx[KSTAMP], pcx[KOFF][s]
    nk, own = pcx[KOFF][s + 1] - a, pcx[OWN]
    if own[0, s] > 0:
        sc[NCACHED] -= own[0, s] * _entry(cfg)
        sc[FREE] -= max(nh - nk, 0) * _entry(cfg)
        own[0, s] = 0  # its queue entries are stale
    for i in range(min(nh, nk)):
        k = kid[a + i]
        if kstamp[k] >= 0:
            kstamp[k] = -1
            sc[NCACHED] -= _entry(cfg)
            sc[FREE] -= _entry(cfg)
        kref[k] += 1
        isref[a + i] = 1
    q[COMPUTED, s] = nh * cfg[BS]
    sc[HIT_TOKENS] += min(nh, nk) * cfg[BS]


@_njit_inline
def _take(n: int, sc: np.ndarray, cfg: np.ndarray, pcx: tuple) -> None:
    """Allocate n free blocks: keyless ones first, then evict cached ones least recently
    freed first (block_pool.get_new_blocks -> _maybe_evict_cached_block)."""
    if cfg[PC]:
        kstamp, lru = pcx[KSTAMP], pcx[LRU]
        evict = n - (sc[FREE] - sc[NCACHED])
        while evict > 0:
            i = sc[LRU_HEAD]
            sc[LRU_HEAD] = i + 1
            k = lru[0, i]
            if _live(k, lru[1, i], pcx):
                if k >= 0:
                    kstamp[k] = -1
                else:  # a preempted request's own block, its last one first
                    pcx[OWN][0, -1 - k] -= 1
                sc[NCACHED] -= _entry(cfg)
                evict -= _entry(cfg)
    sc[FREE] -= n


@_njit_inline
def _live(k: int, stamp: int, pcx: tuple) -> bool:
    """Whether the free-queue entry (k, stamp) is a cached block: a key's, while the key keeps
    that stamp; a preempted request's own (k = -1 - s), while it is one of the request's
    own[0, s] cached blocks (the last stamps before own[1, s])."""
    if k >= 0:
        return pcx[KSTAMP][k] == stamp
    own = pcx[OWN]
    return own[0, -1 - k] > 0 and stamp >= own[1, -1 - k] - own[0, -1 - k]


@_njit_borrow
def _register(s: int, before: int, after: int, cfg: np.ndarray, pcx: tuple) -> None:
    """Full blocks a scheduled chunk fills become shared entries when it is scheduled
    (kv_cache_manager.allocate_slots -> cache_blocks); an existing entry with the same key keeps
    the block private."""
    kid, isref, kref, kstamp = pcx[KID], pcx[ISREF], pcx[KREF], pcx[KSTAMP]
    a, bs = pcx[KOFF][s], cfg[BS]
    for j in range(before // bs, min(after // bs, pcx[KOFF][s + 1] - a)):
        k = kid[a + j]
        if kref[k] == 0 and kstamp[k] < 0:
            kref[k] = 1
            isref[a + j] = 1


@_njit_borrow
def _cache(k: int, sc: np.ndarray, cfg: np.ndarray, pcx: tuple) -> None:
    """A freed block keeps its key at the back of the free queue (compacted to its live
    entries when the array is full: at most one per block, half its room)."""
    kstamp, lru = pcx[KSTAMP], pcx[LRU]
    if sc[LRU_TAIL] == lru.shape[1]:
        j = 0
        for i in range(sc[LRU_HEAD], sc[LRU_TAIL]):
            if _live(lru[0, i], lru[1, i], pcx):
                lru[0, j], lru[1, j] = lru[0, i], lru[1, i]
                j += 1
        sc[LRU_HEAD], sc[LRU_TAIL] = 0, j
    i = sc[LRU_TAIL]
    lru[0, i], lru[1, i] = k, sc[STAMP]
    if k >= 0:
        kstamp[k] = sc[STAMP]
    sc[STAMP] += 1
    sc[LRU_TAIL] = i + 1
    sc[NCACHED] += _entry(cfg)


@_njit_inline
def _release(s: int, computed: int, keep: int, q: np.ndarray, sc: np.ndarray,
             cfg: np.ndarray, pcx: tuple) -> None:
    """Free s's blocks and its state's, tail first (single_type_kv_cache_manager.free): a
    shared entry frees its block when its last holder lets go; a freed full block with a key
    stays cached in the free queue. A preempted request's first `keep` full blocks beyond its
    shared keys stay cached too, as its own (vLLM V1 keeps every full block's hash: its
    recompute finds them unless evicted first, `_lookup`)."""
    bs = cfg[BS]
    held = max(q[RESERVED, s], (computed + bs - 1) // bs)
    sc[FREE] += cfg[STATE_BLOCKS] + _units(held, cfg)
    if not cfg[PC]:
        return
    kid, isref, kref, kstamp = pcx[KID], pcx[ISREF], pcx[KREF], pcx[KSTAMP]
    a = pcx[KOFF][s]
    nk, full = pcx[KOFF][s + 1] - a, computed // bs
    if keep > nk:  # its own blocks, tail first: the stamps before own[1, s] once cached
        own = pcx[OWN]
        own[0, s], own[1, s] = keep - nk, sc[STAMP] + keep - nk
        for _ in range(keep - nk):
            _cache(-1 - s, sc, cfg, pcx)
    for j in range(min(held, nk) - 1, -1, -1):
        k = kid[a + j]
        if isref[a + j]:
            isref[a + j] = 0
            kref[k] -= 1
            if kref[k] > 0:
                sc[FREE] -= _entry(cfg)  # another request still holds the block
                continue
            _cache(k, sc, cfg, pcx)
        elif j < full and kref[k] == 0 and kstamp[k] < 0:
            _cache(k, sc, cfg, pcx)
    for j in range(held, nk):
        isref[a + j] = 0


# -- blocks, the running set, preemption -----------------------------------------------------
@_njit_inline
def _units(k: int, cfg: np.ndarray) -> int:
    """Pool blocks of k token blocks: the window layers' min(k, cfg[WIN_CAP]), 0 for k = 0
    (layers.BlockLayout.blocks and window_blocks, vLLM V1 SlidingWindowManager)."""
    if cfg[WIN_U] == 0 or k <= 0:
        return cfg[FULL_U] * k
    return cfg[FULL_U] * k + cfg[WIN_U] * min(k, cfg[WIN_CAP])


@_njit_inline
def _edge(due: int, cfg: np.ndarray) -> int:
    """Pool blocks the token block that starts at context `due` (a block edge) adds."""
    k = due // cfg[BS]
    return _units(k + 1, cfg) - _units(k, cfg)


@_njit_inline
def _entry(cfg: np.ndarray) -> int:
    """Pool blocks of one prefix-cache entry (layers.BlockLayout.entry): a token block's
    full-layer blocks, its window-layer blocks in a layout without full layers."""
    return cfg[FULL_U] if cfg[FULL_U] > 0 else cfg[WIN_U]


@_njit_inline
def _held(s: int, computed: int, q: np.ndarray, cfg: np.ndarray) -> int:
    """KV blocks s holds with `computed` tokens: its recurrent-state blocks plus the pool blocks
    of max(reservation, ceil(computed / block_size)) token blocks (the reference's `_held`)."""
    bs = cfg[BS]
    return cfg[STATE_BLOCKS] + _units(max(q[RESERVED, s], (computed + bs - 1) // bs), cfg)


@_njit_inline
def _unrun(v: int, run: np.ndarray, sc: np.ndarray) -> None:
    """Take v out of the running set (kept in admission order)."""
    n = sc[NRUN]
    j = 0
    for i in range(n):
        if run[i] != v:
            run[j] = run[i]
            j += 1
    sc[NRUN] = j


@_njit_borrow
def _victim(run: np.ndarray, sc: np.ndarray, q: np.ndarray, cfg: np.ndarray) -> int:
    """The largest (priority, admission order) running sequence (vLLM V1 preempts the lowest
    priority, latest admitted one); -1 and an error code when there is none or no preemption.
    One scan from the newest end (preemptions are rare next to steps; a heap would cost a push
    per admission)."""
    if cfg[CAN_PREEMPT] == 0:
        sc[ERR] = ERR_NO_PREEMPTION
        return -1
    best = -1
    for i in range(sc[NRUN] - 1, -1, -1):  # newest first: ties keep the latest admitted
        s = run[i]
        if best < 0 or q[PRIO, s] > q[PRIO, best]:
            best = s
    if best < 0:
        sc[ERR] = ERR_NO_VICTIM
    return best


@_njit_borrow
def _preempt(v: int, q: np.ndarray, sc: np.ndarray, cfg: np.ndarray, run: np.ndarray,
             heap: np.ndarray, arr: np.ndarray, bufs: tuple) -> None:
    """Recompute preemption (the reference's `_preempt`): free v's blocks, back to the queue
    (its adapter leaves the running set); a decoder preempted after this step's decode was
    budgeted gives its token back."""
    if q[STATE, v] == DECODING:
        nc = q[COMPUTED, v]
        sc[NDEC] -= 1
        sc[SUMCTX] -= nc + 1
        sc[SUMCTXW] -= min(nc + 1, cfg[WINDOW])
        if sc[DEC_DONE]:  # its block for this step is allocated and its token budgeted
            nc += 1
            sc[BUDGET] += 1
    else:
        nc = q[COMPUTED, v] + q[CHUNK, v]
        q[CHUNK, v] = 0  # a chunk scheduled this step is dropped (its budget is not returned)
    keep = 0
    if cfg[PC] and cfg[PREEMPT_KEEP]:  # its computed full blocks (or its prompt's) stay cached
        kept = (q[COMPUTED, v] if cfg[PREEMPT_KEEP] == KEEP_COMPUTED
                else min(q[COMPUTED, v], q[PROMPT, v]))
        keep = kept // cfg[BS]
        if cfg[FULL_U] == 0:  # window layers only: BlockLayout.cached_cap
            keep = min(keep, cfg[WIN_CAP])
    _release(v, nc, keep, q, sc, cfg, bufs[11])
    q[COMPUTED, v] = 0
    q[TARGET, v] = q[PROMPT, v] + q[GENERATED, v]
    q[FD_LAST, v] = -1
    q[STATE, v] = WAITING
    _unrun(v, run, sc)
    _push(v, heap, sc, q, arr)
    if cfg[MAX_LORAS]:
        _lora_run(v, -1, q, sc, bufs[12][0])
        _lora_wait(v, 1, q, sc, bufs[12][0], arr)
    sc[PREEMPTIONS] += 1
    sc[PREEMPTED_NOW] = 1


@_njit_inline
def _decode_blocks(q: np.ndarray, sc: np.ndarray, cfg: np.ndarray, lists: tuple,
                   arr: np.ndarray, bufs: tuple) -> None:
    """Blocks for decoders whose token this step starts a new block (listed when the decoders
    last advanced); when too few are free, preempt victims until the remaining ones fit (the
    reference's `_decode_blocks`)."""
    run, heap = lists[0], lists[1]
    needl, flag = bufs[2], bufs[3]
    n_need = 0
    for i in range(sc[NNEED]):
        flag[needl[i]] = 1
        n_need += _edge(q[DUE, needl[i]], cfg)
    while sc[FREE] < n_need:
        v = _victim(run, sc, q, cfg)
        if v < 0:
            return
        _preempt(v, q, sc, cfg, run, heap, arr, bufs)
        if flag[v]:
            flag[v] = 0
            n_need -= _edge(q[DUE, v], cfg)
    _take(n_need, sc, cfg, bufs[11])
    for i in range(sc[NNEED]):
        s = needl[i]
        if flag[s]:
            flag[s] = 0
            q[DUE, s] += cfg[BS]  # the next block edge of its context
    sc[NNEED] = 0


# -- prefill scheduling ----------------------------------------------------------------------
@_njit_inline
def _add_chunk(s: int, c: int, q: np.ndarray, sc: np.ndarray, chl: np.ndarray) -> None:
    q[CHUNK, s] = c
    chl[sc[NCH]] = s
    sc[NCH] += 1
    sc[BUDGET] -= c
    sc[INBUDGET] -= c


@_njit_inline
def _prefill_running(q: np.ndarray, sc: np.ndarray, cfg: np.ndarray, lists: tuple,
                     arr: np.ndarray, bufs: tuple) -> None:
    """Next chunks of running, partially prefilled sequences, in admission order."""
    run, heap = lists[0], lists[1]
    pf, chl = bufs[0], bufs[1]
    for i in range(sc[NPF]):
        s = pf[i]
        if sc[BUDGET] <= 0:
            break
        if q[STATE, s] != PREFILLING:
            continue  # preempted earlier in this loop
        have = q[COMPUTED, s]
        c = min(q[TARGET, s] - have, sc[BUDGET], sc[SEQCAP])
        nb = _held(s, have + c, q, cfg) - _held(s, have, q, cfg)
        if nb > sc[FREE] and cfg[PREFILL_FIRST]:
            sc[BLOCKED] = 1  # a prefill-only step does not preempt: the chunk waits
            continue
        while sc[FREE] < nb:
            v = _victim(run, sc, q, cfg)
            if v < 0:
                return
            _preempt(v, q, sc, cfg, run, heap, arr, bufs)
            if v == s:
                break
        if q[STATE, s] != PREFILLING:
            continue
        _take(nb, sc, cfg, bufs[11])
        if cfg[PC]:
            _register(s, have, have + c, cfg, bufs[11])
        _add_chunk(s, c, q, sc, chl)


@_njit_inline
def _seq_cap(budget: int, cfg: np.ndarray) -> int:
    """The most prompt tokens one sequence takes in a step whose token budget is `budget`: with
    attention DP each rank chunks its own prompts within its own budget (vLLM's engine core per
    DP rank, its max_num_batched_tokens; SGLang's chunked_prefill_size over --dp per rank;
    TensorRT-LLM's max_num_tokens per rank), a D-th of the replica's; the whole budget at DP 1,
    without chunked prefill, or on a P/D decode worker (a prompt's KV arrives whole)."""
    if cfg[CHUNKED] and cfg[DP] > 1 and not cfg[KV_PRESENT]:
        return max(1, budget // cfg[DP])
    return budget


@_njit_inline
def _whole_below(sc: np.ndarray, cfg: np.ndarray) -> int:
    """The tokens a waiting prompt must come in under, whole, to be admitted into this step, or
    -1 when it may be chunked at the budget. SchedulerPolicy.whole_prompts_after_first (SGLang
    `PrefillAdder.add_one_req`, managers/schedule_policy.py 0.5.8): once the step holds a prompt
    (a continuing chunk counts) a further one is refused, ending the step's admissions, unless
    its tokens past its prefix-cache hit are fewer than what the step leaves of the prompt
    budget (max_prefill_tokens less the decodes riding in the step and the prompt tokens
    scheduled); one that is admitted is still chunked at the step's token budget."""
    if cfg[WHOLE_AFTER] and sc[NCH] > 0:
        return max(sc[INBUDGET], 0)
    return -1


@_njit_inline
def _admission(s: int, budget: int, cap: int, below: int, q: np.ndarray, sc: np.ndarray,
               cfg: np.ndarray, pcx: tuple) -> tuple:
    """Whether waiting request s is admitted with `budget` tokens left, at most `cap` of them
    its own (`_seq_cap`): (its chunk, new blocks, prefix-cache hit blocks), the chunk -1 when it
    is not (a whole prompt that does not fit the budget, a prompt not under `below` tokens
    (`_whole_below`, -1: no such bound), or too few free blocks: new ones beyond the hits, its
    state's, and the hit blocks taken out of the free queue)."""
    target = q[TARGET, s]
    nh = _lookup(s, target, cfg, pcx) if cfg[PC] else 0
    h = nh * cfg[BS]
    if below >= 0 and target - h >= below:
        return -1, 0, 0  # after the step's first prompt, only a whole one that fits
    c = min(target - h, budget, cap)
    if c < target - h and cfg[CHUNKED] == 0:
        return -1, 0, 0  # the whole prompt must fit what is left of the budget
    nb = _held(s, h + c, q, cfg) - nh * _entry(cfg)
    if nb + (_reused(s, nh, pcx) * _entry(cfg) if nh else 0) > sc[FREE]:
        return -1, 0, 0
    return c, nb, nh


@_njit_inline
def _lora_unchanged(q: np.ndarray, sc: np.ndarray, cfg: np.ndarray, heap: np.ndarray,
                    arr: np.ndarray, bufs: tuple) -> bool:
    """LoRA, before an admission scan (`_admit_waiting`): a freed slot lets every parked
    request run, so they go back to the heap; True when the request the last scan stopped at
    is still the first to try and still does not fit (the scan is not repeated), else the scan
    runs with that request forgotten."""
    parked = bufs[12][1]
    if sc[NPARK] and sc[NLOADED] < cfg[MAX_LORAS]:
        for i in range(sc[NPARK]):
            _push(parked[i], heap, sc, q, arr)
        sc[NPARK] = 0
    c = sc[LORA_CAND]
    if (c >= 0 and sc[BUDGET] > 0 and sc[NRUN] < cfg[MAX_SEQS]
            and _admission(c, sc[BUDGET], sc[SEQCAP], _whole_below(sc, cfg), q, sc, cfg,
                           bufs[11])[0] < 0):
        return True
    sc[LORA_CAND] = -1
    return False


@_njit_inline
def _admit_waiting(q: np.ndarray, sc: np.ndarray, cfg: np.ndarray, lists: tuple,
                   arr: np.ndarray, bufs: tuple) -> None:
    """Waiting requests in queue order while the budget, max_num_seqs and blocks allow.

    LoRA (cfg[MAX_LORAS] > 0), vLLM's rule (`_lora_ok`): a request whose adapter may not run
    beside the running set is skipped and stays waiting, and the scan goes on to the next.
    Bound: a skipped request is parked, O(1) after its heap pop, out of the heap, so no later
    scan passes over it again until a slot frees (an adapter unloads: every parked request is
    pushed back, each push charged to that event; a parked request cannot run before, its
    adapter not loaded and no slot free). The scan skips only while sc[WLOAD] says some
    waiting request may run (the first it reaches is admitted or ends the scan), and a scan
    that stopped at a request for want of blocks or budget is not repeated while that request
    is still the first to try (sc[LORA_CAND]: the next steps test it alone, O(1), until it
    fits or the loaded adapters or the queue ahead of it change). Without LoRA the scan is as
    it was."""
    run, heap = lists[0], lists[1]
    pf, chl, pcx = bufs[0], bufs[1], bufs[11]
    cnt, parked = bufs[12]
    if cfg[MAX_LORAS] and _lora_unchanged(q, sc, cfg, heap, arr, bufs):
        return  # the scan would reach sc[LORA_CAND] again and stop there
    while sc[NHEAP] > 0 and sc[BUDGET] > 0 and sc[NRUN] < cfg[MAX_SEQS]:
        s = heap[0]
        if arr[s] > bufs[6][T_CUT]:
            break  # reached the engine after this step's batch was formed (`_cutoff`)
        if cfg[MAX_LORAS] and not _lora_ok(s, q, sc, cfg, cnt):
            if sc[WLOAD] == 0:
                break  # no waiting request may run beside the loaded adapters
            parked[sc[NPARK]] = _pop(heap, sc, q, arr)
            sc[NPARK] += 1
            continue
        c, nb, nh = _admission(s, sc[BUDGET], sc[SEQCAP], _whole_below(sc, cfg), q, sc, cfg,
                               pcx)
        if c < 0:
            if cfg[MAX_LORAS]:
                sc[LORA_CAND] = s  # the first to try while nothing changes (`_bulk_ok` too)
            break
        _pop(heap, sc, q, arr)
        if cfg[MAX_LORAS]:
            _lora_wait(s, -1, q, sc, cnt, arr)
            _lora_run(s, 1, q, sc, cnt)
        if nh or (cfg[PC] and pcx[OWN][0, s]):
            _hit(s, nh, q, sc, cfg, pcx)
        _take(nb, sc, cfg, pcx)
        if cfg[PC]:
            h = nh * cfg[BS]
            _register(s, h, h + c, cfg, pcx)
        q[STATE, s] = PREFILLING
        sc[ADMISSIONS] += 1
        if q[ADM_STEP, s] < 0:
            q[ADM_STEP, s] = sc[STEP]
            bufs[5][ADM_T, s] = bufs[6][T_START]
        run[sc[NRUN]] = s
        sc[NRUN] += 1
        pf[sc[NPF]] = s
        sc[NPF] += 1
        _add_chunk(s, c, q, sc, chl)


@_njit_inline
def _schedule_prefill(budget: int, q: np.ndarray, sc: np.ndarray, cfg: np.ndarray,
                      lists: tuple, arr: np.ndarray, bufs: tuple) -> bool:
    sc[BUDGET] = budget
    sc[INBUDGET] = cfg[MAX_PREFILL] - (cfg[MAX_TOKENS] - budget)  # less the step's decodes
    sc[SEQCAP] = _seq_cap(budget, cfg)
    sc[BLOCKED] = 0
    _prefill_running(q, sc, cfg, lists, arr, bufs)
    if sc[PREEMPTED_NOW] == 0 and sc[BLOCKED] == 0:
        _admit_waiting(q, sc, cfg, lists, arr, bufs)
    for i in range(sc[NCH]):
        if q[CHUNK, bufs[1][i]] > 0:
            return True
    return False


# -- one step --------------------------------------------------------------------------------
@_njit_inline
def _inputs(decode: bool, q: np.ndarray, sc: np.ndarray, cfg: np.ndarray, chl: np.ndarray
            ) -> tuple:
    """The step's `StepModel.step` inputs (floats) from its chunks and the decode sums."""
    w = cfg[WINDOW]
    wf = float(w)
    ptok = pairs = pairs_w = pread = pread_w = 0.0
    nps = ncomp = 0
    for i in range(sc[NCH]):
        s = chl[i]
        c = q[CHUNK, s]
        if c == 0:
            continue  # dropped by a preemption
        p = q[COMPUTED, s]
        # perf.chunk_attention: c*p + c(c+1)/2 pairs; the window caps keys per query
        cf, pf = float(c), float(p)
        pr = cf * pf + cf * (cf + 1) / 2
        cw = min(cf, wf)
        ptok += cf
        pairs += pr
        pairs_w += min(pr, cf * wf - (p <= 0) * (cw * (cw - 1) / 2))
        pread += pf
        pread_w += min(pf, wf)
        nps += 1
        ncomp += p + c == q[TARGET, s]
    nd = kv = kvw = 0
    if decode:
        nd, kv = sc[NDEC], sc[SUMCTX]
        kvw = sc[SUMCTXW] if cfg[HAS_WINDOW] else kv
    if cfg[KV_PRESENT]:  # a P/D decode worker: a prompt's KV arrived, its step computes one
        # token after prompt - 1 cached ones (capplan.sim.pd.KvPresentStep's inputs)
        tokens = ptok + pread
        read = max(tokens - nps, 0.0)
        read_w = min(read, nps * wf)
        ptok, pairs, pairs_w, pread, pread_w = float(nps), tokens, read_w + nps, read, read_w
    return (float(nd), float(kv), float(kvw), ptok, pairs, pairs_w, pread, pread_w,
            float(nps), float(nd + ncomp))


@_njit_inline
def _finish(s: int, computed: int, q: np.ndarray, sc: np.ndarray, cfg: np.ndarray,
            bufs: tuple) -> None:
    q[FIN_STEP, s] = sc[STEP]
    bufs[5][FIN_T, s] = bufs[6][T_END]
    q[STATE, s] = FINISHED
    _release(s, computed, 0, q, sc, cfg, bufs[11])
    if cfg[MAX_LORAS]:
        _lora_run(s, -1, q, sc, bufs[12][0])
    sc[DONE] += 1
    if cfg[CONC]:  # a closed loop: its client sends the next request (`_send_next`)
        bufs[8][sc[NFIN]] = s
        sc[NFIN] += 1


@_njit_inline
def _gap(gap_s: float, sc: np.ndarray, gaps: np.ndarray) -> None:
    """A token gap outside the per-step counts (end of the step of a token to the end of the
    step of the next)."""
    i = sc[NGAPS]
    if i < gaps.shape[1]:
        gaps[0, i] = gap_s
    sc[NGAPS] = i + 1


@_njit_inline
def _advance_prefills(q: np.ndarray, sc: np.ndarray, cfg: np.ndarray, bufs: tuple,
                      gaps: np.ndarray) -> None:
    """After the step: prefill progress; a completed prompt gives a token and then decodes
    from the next decode step (NEW_DECODER until the decoders have advanced)."""
    g = sc[STEP]
    chl, qt, qtok, t_end = bufs[1], bufs[5], bufs[7], bufs[6][T_END]
    for i in range(sc[NCH]):
        s = chl[i]
        c = q[CHUNK, s]
        if c == 0:
            continue
        q[CHUNK, s] = 0
        q[COMPUTED, s] += c
        if q[COMPUTED, s] < q[TARGET, s]:
            continue
        if q[GENERATED, s] == 0:
            q[FIRST_STEP, s] = g
            qt[FIRST_T, s] = t_end
        else:
            _gap(t_end - qtok[LAST_T, s], sc, gaps)
        q[GENERATED, s] += 1
        q[LAST_TOK, s] = g
        qtok[LAST_T, s] = t_end
        if q[GENERATED, s] >= q[OUTPUT, s]:
            _finish(s, q[COMPUTED, s], q, sc, cfg, bufs)
        else:
            q[STATE, s] = NEW_DECODER
    sc[NCH] = 0
    pf, j = bufs[0], 0
    for i in range(sc[NPF]):  # the prefilling list keeps running prompts only
        if q[STATE, pf[i]] == PREFILLING:
            pf[j] = pf[i]
            j += 1
    sc[NPF] = j


@_njit_inline
def _start_decoding(s: int, q: np.ndarray, sc: np.ndarray, cfg: np.ndarray, bufs: tuple
                    ) -> None:
    """s decodes from the next decode step; its first block edge: the first context beyond
    what it holds (its reservation, or the blocks of its computed tokens)."""
    q[STATE, s] = DECODING
    nc, bs = q[COMPUTED, s], cfg[BS]
    q[DUE, s] = max(nc + (-nc) % bs, q[RESERVED, s] * bs)
    if cfg[PREFILL_FIRST]:
        q[FD_LAST, s] = sc[STEP]
        bufs[7][FD_T, s] = bufs[6][T_END]
        bufs[4][sc[NFD]] = s
        sc[NFD] += 1


@_njit_inline
def _advance_running(decode: bool, q: np.ndarray, sc: np.ndarray, cfg: np.ndarray,
                     run: np.ndarray, bufs: tuple) -> None:
    """Decoders get their token (finishing at their last), new decoders join, finished
    sequences leave the running set; then the decode sums and the decoders whose next token
    starts a block, in one pass."""
    g, w, needl = sc[STEP], cfg[WINDOW], bufs[2]
    qtok, t_end = bufs[7], bufs[6][T_END]
    j = nd = sumctx = sumw = nneed = 0
    for i in range(sc[NRUN]):
        s = run[i]
        st = q[STATE, s]
        if st == FINISHED:
            continue
        if st == DECODING and decode:
            c = q[COMPUTED, s] + 1
            q[COMPUTED, s] = c
            q[GENERATED, s] += 1
            q[LAST_TOK, s] = g
            qtok[LAST_T, s] = t_end
            if q[GENERATED, s] >= q[OUTPUT, s]:
                _finish(s, c, q, sc, cfg, bufs)
                continue
        elif st == NEW_DECODER:
            _start_decoding(s, q, sc, cfg, bufs)
        run[j] = s
        j += 1
        if q[STATE, s] == DECODING:
            c = q[COMPUTED, s]
            nd += 1
            sumctx += c + 1
            sumw += min(c + 1, w)
            if c == q[DUE, s]:
                needl[nneed] = s
                nneed += 1
    sc[NRUN] = j
    sc[NDEC], sc[SUMCTX], sc[SUMCTXW], sc[NNEED] = nd, sumctx, sumw, nneed
    if decode:
        sc[LAST_DEC] = g


@_njit_inline
def _first_decode_gaps(q: np.ndarray, sc: np.ndarray, bufs: tuple, gaps: np.ndarray) -> int:
    """prefill_first: decoders decoding for the first time since their token of a prefill
    step: their gap is listed one by one; returns how many."""
    n, fdl = 0, bufs[4]
    for i in range(sc[NFD]):
        s = fdl[i]
        if q[STATE, s] == DECODING and q[FD_LAST, s] >= 0:
            _gap(bufs[6][T_END] - bufs[7][FD_T, s], sc, gaps)
            q[FD_LAST, s] = -1
            n += 1
    sc[NFD] = 0
    return n


@_njit_inline
def _schedule(q: np.ndarray, sc: np.ndarray, cfg: np.ndarray, lists: tuple, arr: np.ndarray,
              bufs: tuple) -> bool:
    """Schedule one step (the reference's `_exec` up to its record); returns whether it
    decodes."""
    sc[PREEMPTED_NOW] = 0
    sc[DEC_DONE] = 0
    sc[NCH] = 0
    if cfg[PREFILL_FIRST]:
        decode = not _schedule_prefill(cfg[MAX_TOKENS], q, sc, cfg, lists, arr, bufs)
        if decode:
            if sc[NDEC] == 0:
                sc[ERR] = ERR_NO_WORK
                return False
            _decode_blocks(q, sc, cfg, lists, arr, bufs)
        return decode
    _decode_blocks(q, sc, cfg, lists, arr, bufs)
    sc[DEC_DONE] = 1
    _schedule_prefill(cfg[MAX_TOKENS] - sc[NDEC], q, sc, cfg, lists, arr, bufs)
    return True


@_njit
def _grow(a: np.ndarray) -> np.ndarray:
    """Room for half as many columns again (1.5x: less unused room than doubling)."""
    out = np.empty((a.shape[0], a.shape[1] + a.shape[1] // 2), a.dtype)
    out[:, :a.shape[1]] = a
    return out


@_njit_inline
def _tbt_add(x: float, w: float, tb: np.ndarray, sc: np.ndarray) -> None:
    """Add weight w to the TBT sample x in the open-addressing table tb[slot] = (value,
    weight), an empty slot of weight 0 (one array: one cache line a probe). Equal gaps (the
    same batch shape recurs across the run) share one entry: the multiset of samples, so its
    weighted percentiles, is unchanged."""
    mask = tb.shape[0] - 1
    m, e = math.frexp(x)
    b = int(m * 9007199254740992.0) ^ e  # the 53-bit significand and the exponent
    i = ((b ^ (b >> 29)) * 2654435761) & mask
    while tb[i, 1] != 0:
        if tb[i, 0] == x:
            tb[i, 1] += w
            return
        i = (i + 1) & mask
    tb[i, 0] = x
    tb[i, 1] = w
    sc[NTBT] += 1


@_njit
def _tbt_grow(tb: np.ndarray, sc: np.ndarray) -> np.ndarray:
    """The table with twice the slots, entries re-inserted."""
    out = np.zeros((2 * tb.shape[0], 2), np.float64)
    sc[NTBT] = 0
    for i in range(tb.shape[0]):
        if tb[i, 1] != 0:
            _tbt_add(tb[i, 0], tb[i, 1], out, sc)
    return out


@_njit_borrow
def _sample(t: float, sc: np.ndarray, cfg: np.ndarray, series: tuple) -> None:
    """Keep step sc[STEP]'s start, running, waiting and blocks in use (the caller calls at the
    multiples of the stride); a full buffer keeps every other sample and doubles the stride."""
    sf, si = series
    j = sc[NSER]
    sf[j] = t
    si[0, j], si[1, j], si[2, j] = sc[NRUN], sc[NHEAP] + sc[NPARK], cfg[TOTAL] - sc[FREE]
    sc[NSER] = j + 1
    if j + 1 == sf.shape[0]:
        _halve(sc, series)


@_njit_borrow
def _halve(sc: np.ndarray, series: tuple) -> None:
    """Every other sample, twice the stride."""
    sf, si = series
    j = sf.shape[0] // 2
    for i in range(j):
        sf[i] = sf[2 * i]
        si[0, i], si[1, i], si[2, i] = si[0, 2 * i], si[1, 2 * i], si[2, 2 * i]
    sc[NSER] = j
    sc[STRIDE] *= 2


@_njit_inline
def _record(t: float, dur: float, decode: bool, nfd: int, sc: np.ndarray, cfg: np.ndarray,
            tf: np.ndarray, agg: tuple) -> None:
    """Step samples as scheduled (before it advances), aggregated: the TBT gap and count into
    the table, the time integrals of running and waiting, the peak of blocks in use, the time
    series sample; with cfg[KEEP_STEPS] also the per-step rows (start, duration, gap; TBT count,
    running, waiting, blocks in use)."""
    tb, series, sf, si = agg
    k = sc[STEP]
    tbt, prev, gap = 0, -1, dur
    if decode:
        tbt, prev = sc[NDEC], k - 1
        if cfg[PREFILL_FIRST]:
            tbt, prev = sc[NDEC] - nfd, sc[LAST_DEC]
    # prefill_first: the gap since the previous decode step, this step's duration when that is
    # the step before, else between the two steps' ends (step 0's when there is none)
    if cfg[PREFILL_FIRST] and prev != k - 1:
        gap = (t + dur) - (tf[T_LAST_DEC] if prev >= 0 else tf[T_STEP0])
    if tbt > 0:
        _tbt_add(gap, tbt, tb, sc)
    if k == 0:
        tf[T_STEP0] = t + dur
    if decode:
        tf[T_LAST_DEC] = t + dur
    tf[RUN_INT] += sc[NRUN] * dur
    waiting = sc[NHEAP] + sc[NPARK]
    tf[SYS_INT] += (sc[NRUN] + waiting) * dur
    sc[KV_MAX] = max(sc[KV_MAX], cfg[TOTAL] - sc[FREE])
    if k == sc[NSER] * sc[STRIDE]:  # the next multiple of the stride
        _sample(t, sc, cfg, series)
    if cfg[KEEP_STEPS]:
        sf[0, k], sf[1, k], sf[2, k] = t, dur, gap
        si[0, k], si[1, k], si[2, k], si[3, k] = tbt, sc[NRUN], waiting, cfg[TOTAL] - sc[FREE]


@_njit_inline
def _cutoff(t: float, sc: np.ndarray, cfg: np.ndarray, tf: np.ndarray) -> None:
    """The admission cutoff of the step starting at t (tf[T_CUT]): an engine that forms each
    batch a step ahead (cfg[AHEAD], SchedulerPolicy.schedules_ahead) formed this one when the
    step before began, so only requests that had reached it by then are admitted; when no
    step ran up to t, or none is running, it schedules at t (and without cfg[AHEAD])."""
    ahead = cfg[AHEAD] and sc[NRUN] > 0 and tf[T_END] == t
    tf[T_CUT] = tf[T_PREV] if ahead else t


@_njit_borrow
def _step(t: float, q: np.ndarray, sc: np.ndarray, cfg: np.ndarray, model: tuple,
          arr: np.ndarray, lists: tuple, bufs: tuple) -> float:
    """Run step sc[STEP] from time t (schedule, time, record, advance); returns its duration.
    `model` = (constants, moe); `lists` = (running set, waiting heap, extra gaps, then the step
    aggregates of `_record`: TBT table, series samples, per-step rows)."""
    sched, gaps, agg = lists
    run = sched[0]
    tf = bufs[6]
    _cutoff(t, sc, cfg, tf)
    tf[T_START] = t
    tf[T_PREV] = t
    decode = _schedule(q, sc, cfg, sched, arr, bufs)
    if sc[ERR]:
        return 0.0
    dur = float(_step_parts(_inputs(decode, q, sc, cfg, bufs[1]),
                            _with_adapters(model[0], sc, cfg), model[1])[0])
    tf[T_END] = t + dur
    nfd = 0
    if decode and cfg[PREFILL_FIRST]:
        nfd = _first_decode_gaps(q, sc, bufs, gaps)
    _record(t, dur, decode, nfd, sc, cfg, tf, agg)
    _advance_prefills(q, sc, cfg, bufs, gaps)
    split = sc[NFIN]
    _advance_running(decode, q, sc, cfg, run, bufs)
    _send_next(split, sc, cfg, arr, bufs)
    return dur


@_njit_inline
def _bulk_ok(q: np.ndarray, sc: np.ndarray, cfg: np.ndarray, heap: np.ndarray, bufs: tuple
             ) -> bool:
    """Whether the next steps are pure decode steps of the same sequences (each one token
    longer) until an event: every running sequence decodes, no first-decode gap is pending,
    the last step decoded, and the waiting queue's head cannot be admitted (`_admit_waiting`'s
    tests, which a completion or an arrival can change, and a block allocation cannot undo; with
    LoRA the first request `_lora_ok` lets run), nor, formed a step ahead, waits for the step
    after the next (`_cutoff`)."""
    n = sc[NRUN]
    if n == 0 or sc[ERR] or sc[NDEC] != n or sc[NPF] or sc[NFD] or sc[LAST_DEC] != sc[STEP]:
        return False
    if sc[NPARK] and sc[NLOADED] < cfg[MAX_LORAS]:
        return False  # LoRA: a slot freed for the parked requests (`_admit_waiting`)
    if sc[NHEAP] == 0 or n >= cfg[MAX_SEQS]:
        return True
    if cfg[AHEAD] and bufs[10][heap[0]] > bufs[6][T_PREV]:
        return False  # admitted after the next step (`_cutoff`): no stretch to skip
    budget = cfg[MAX_TOKENS] - (0 if cfg[PREFILL_FIRST] else sc[NDEC])
    if budget <= 0:
        return True
    s = heap[0]
    if cfg[MAX_LORAS] and not _lora_ok(s, q, sc, cfg, bufs[12][0]):
        # LoRA: the first request the scan may admit is further back: none (only a
        # completion or an arrival changes that), or the one a scan stopped at
        if sc[WLOAD] == 0:
            return True
        if sc[LORA_CAND] < 0:
            return False  # not known without a scan: the full step scans
        s = sc[LORA_CAND]
    # the step's first prompt: chunked at the budget whatever cfg[WHOLE_AFTER]
    return _admission(s, budget, _seq_cap(budget, cfg), -1, q, sc, cfg, bufs[11])[0] < 0


@_njit_inline
def _bulk_len(q: np.ndarray, sc: np.ndarray, cfg: np.ndarray, run: np.ndarray) -> tuple:
    """(steps, sequences below the window, steps to the first block edge): how many decode
    steps keep the same decoders (the last may finish some) and take none across the sliding
    window (below it, a windowed context grows by one a step)."""
    w = cfg[WINDOW]
    b, below, edge = 1 << 30, 0, 1 << 30
    for i in range(sc[NRUN]):
        s = run[i]
        c = q[COMPUTED, s]
        b = min(b, q[OUTPUT, s] - q[GENERATED, s])
        edge = min(edge, q[DUE, s] - c)
        if c + 1 < w:
            below += 1
            b = min(b, w - c)
    return b, below, edge


@_njit_inline
def _bulk_blocks(adv: int, q: np.ndarray, sc: np.ndarray, cfg: np.ndarray, run: np.ndarray,
                 pcx: tuple) -> int:
    """The block edges `adv` steps into a stretch: the decoders whose context reaches their
    next block edge get a block (`_decode_blocks` without preemption). Returns the steps to the
    next edge, or -1 (nothing allocated) when too few blocks are free: a preemption, which the
    full step handles."""
    need = 0
    for i in range(sc[NRUN]):
        s = run[i]
        if q[COMPUTED, s] + adv == q[DUE, s]:
            need += _edge(q[DUE, s], cfg)
    if need > sc[FREE]:
        return -1
    _take(need, sc, cfg, pcx)
    edge = 1 << 30
    for i in range(sc[NRUN]):
        s = run[i]
        c = q[COMPUTED, s] + adv
        if c == q[DUE, s]:
            q[DUE, s] += cfg[BS]
        edge = min(edge, q[DUE, s] - c)
    return edge


@_njit_inline
def _bulk(t: float, t_next: float, q: np.ndarray, sc: np.ndarray, cfg: np.ndarray,
          model: tuple, lists: tuple, bufs: tuple) -> float:
    """Event skipping: the pure decode steps up to the next event (an arrival at t_next, a
    completion, a window crossing, a block edge that would preempt) with only their step time,
    block edges and record (the same `_step_parts` inputs and `_record` as `_step`, so the same
    results); at the end the sequences advance by all steps but the last at once, and by the
    last as `_step` advances them (`_advance_running`: tokens, completions, the next step's
    sums and block edges). Returns the clock; sc[STEP] is the last step run."""
    run, heap = lists[0][0], lists[0][1]
    if not _bulk_ok(q, sc, cfg, heap, bufs):
        return t
    b, below, edge = _bulk_len(q, sc, cfg, run)
    agg = lists[2]
    tb, sf = agg[0], agg[2]
    if cfg[KEEP_STEPS]:
        b = min(b, sf.shape[1] - sc[STEP] - 1)
    if b < BULK_MIN_STEPS:
        return t
    tf = bufs[6]
    nd = sc[NDEC]
    j = 0
    # the terms that do not read the KV cache are the same for every step of the stretch
    x = (float(nd), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, float(nd))
    consts = _with_adapters(model[0], sc, cfg)  # the running set's adapters: the stretch's
    fixed = _fixed_parts(x, consts, model[1])
    while j < b and t < t_next and not _table_full(sc[NTBT], tb):
        if j == edge:
            e = _bulk_blocks(j, q, sc, cfg, run, bufs[11])
            if e < 0:
                break
            edge = j + e
        sc[STEP] += 1
        kv = sc[SUMCTX]
        x = (float(nd), float(kv), float(sc[SUMCTXW] if cfg[HAS_WINDOW] else kv), 0.0, 0.0,
             0.0, 0.0, 0.0, 0.0, float(nd))
        dur = _decode_s(x, fixed, consts)
        _record(t, dur, True, 0, sc, cfg, tf, agg)
        sc[LAST_DEC] = sc[STEP]
        sc[SUMCTX] += nd
        sc[SUMCTXW] += below
        tf[T_PREV] = t
        t = t + dur
        j += 1
    if j == 0:
        return t
    tf[T_START], tf[T_END] = t, t
    for i in range(sc[NRUN]):
        s = run[i]
        q[COMPUTED, s] += j - 1
        q[GENERATED, s] += j - 1
    d0 = sc[DONE]
    _advance_running(True, q, sc, cfg, run, bufs)
    _send_next(0, sc, cfg, bufs[10], bufs)
    sc[LAST_FIN] = sc[DONE] - d0
    return t


@_njit_borrow
def _bulk_all(t: float, t_next: float, q: np.ndarray, sc: np.ndarray, cfg: np.ndarray,
              model: tuple, lists: tuple, bufs: tuple) -> float:
    """Decode stretches one after another (a completion ends one; the next starts when the
    waiting queue still cannot be admitted), each up to t_next or the next arrival (a closed
    loop's completions send requests)."""
    while True:
        tn = min(t_next, _next_arrival(sc, cfg, bufs[10], bufs))
        t2 = _bulk(t, tn, q, sc, cfg, model, lists, bufs)
        if t2 == t:
            return t
        t = t2


@_njit_inline
def _gaps_full(n_gaps: int, cfg: np.ndarray, gaps: np.ndarray) -> bool:
    """Whether the extra-gap list lacks room for the gaps one step can add (one per running
    sequence, and one more)."""
    return n_gaps + cfg[MAX_SEQS] + 1 > gaps.shape[1]


@_njit_inline
def _table_full(n: int, tb: np.ndarray) -> bool:
    """Whether a TBT table of n entries lacks room for the next (value, weight) pair."""
    return 2 * (n + 1) > tb.shape[0]


@_njit_inline
def _room(k: int, sc: np.ndarray, cfg: np.ndarray, lists: tuple) -> tuple:
    """The growing buffers with room for step k: per-step rows (cfg[KEEP_STEPS]), the extra
    gaps a step can add, the TBT table's next entry; the same `lists` when nothing grew."""
    (run, heap), gaps, (tb, series, sf, si) = lists
    grow = cfg[KEEP_STEPS] and k == sf.shape[1]
    if grow:
        sf, si = _grow(sf), _grow(si)
    if _gaps_full(sc[NGAPS], cfg, gaps):
        gaps = _grow(gaps)
        grow = True
    if _table_full(sc[NTBT], tb):
        tb = _tbt_grow(tb, sc)
        grow = True
    if not grow:
        return lists
    return (run, heap), gaps, (tb, series, sf, si)


@_njit_inline
def _full(k: int, sc: np.ndarray, cfg: np.ndarray, lists: tuple) -> bool:
    """Whether a growing buffer of `lists` lacks room for step k (`_room` grows it)."""
    gaps, tb, sf = lists[1], lists[2][0], lists[2][2]
    return ((cfg[KEEP_STEPS] and k == sf.shape[1]) or _gaps_full(sc[NGAPS], cfg, gaps)
            or _table_full(sc[NTBT], tb))


@_njit_borrow
def _run_steps(at: tuple, q: np.ndarray, sc: np.ndarray, cfg: np.ndarray, model: tuple,
               arr: np.ndarray, lists: tuple, bufs: tuple) -> tuple:
    """Steps from step k at time t, `at` = (t, k, stop_k), until every request finished, an
    error, a buffer that needs room (`_full`), or step stop_k; returns (t, k), the next step's
    time and index. It allocates nothing, so it borrows its arguments (`_njit_borrow`): no
    reference count changes in its loop."""
    t, k, stop_k = at
    n = arr.shape[0]
    while sc[DONE] < n and k < stop_k:
        _arrive(t, q, sc, cfg, lists[0][1], arr, bufs)
        if sc[NRUN] == 0 and sc[NHEAP] == 0 and sc[NPARK] == 0:
            t_next = _next_arrival(sc, cfg, arr, bufs)
            if t_next == np.inf:
                sc[ERR] = ERR_NO_WORK  # idle with requests left: cannot happen
                break
            t = max(t, t_next)
            continue
        if _full(k, sc, cfg, lists):
            break
        sc[STEP] = k
        dur = _step(t, q, sc, cfg, model, arr, lists, bufs)
        if sc[ERR]:
            break
        t = _bulk_all(t + dur, np.inf, q, sc, cfg, model, lists, bufs)
        k = sc[STEP] + 1
    return t, k


@_njit
def _run_loop(q: np.ndarray, sc: np.ndarray, cfg: np.ndarray, model: tuple, arr: np.ndarray,
              lists: tuple, bufs: tuple) -> tuple:
    """Steps until every request finished (or an error, or a signal); returns the lists as
    they grew. The steps run in `_run_steps`, which returns here to grow a buffer and every
    POLL_STEPS steps to poll for signals (bulk runs move k by more than one)."""
    t, k = 0.0, 0
    next_poll = POLL_STEPS
    while True:
        t, k = _run_steps((t, k, next_poll), q, sc, cfg, model, arr, lists, bufs)
        if sc[ERR] or sc[DONE] >= arr.shape[0]:
            return lists
        if k >= next_poll:
            next_poll = k + POLL_STEPS
            if _poll_signals():
                return lists  # Ctrl-C / SIGTERM: the caller re-raises it (sim/interrupt.py)
        lists = _room(k, sc, cfg, lists)


@_njit
def simulate_loop(arr: np.ndarray, q: np.ndarray, cfg: np.ndarray, consts: tuple, moe: bool,
                  ar: tuple, pcx: tuple) -> tuple:
    """Simulate requests (state `q`, filled in) to completion, in memory that does not grow
    with the steps (unless cfg[KEEP_STEPS]). Open loop (cfg[CONC] 0): `arr` holds the arrival
    times, sorted. Closed loop of cfg[CONC] clients: the first ones arrive at 0 and each
    completion sends the next request (`_send_next`), `arr` is filled in as they are sent;
    `ar` = (af, ai, overhead (s)): the closed loop's arrival rows (SENT_T.. above; SPREAD and
    NOISE given with client jitter, cfg[JITTER]); `pcx` the prefix cache's arrays (KOFF.. above,
    cfg[PC]). Returns (per-request times qt (3, n); extra
    gaps; the TBT table (values, weights) of the per-step gaps; the time series samples
    (starts; running, waiting, blocks) at stride sc[STRIDE]; float aggregates tf; scalars sc;
    with cfg[KEEP_STEPS] the per-step rows (start, duration, gap) and (TBT count, running,
    waiting, blocks), else empty)."""
    n = arr.shape[0]
    sc = np.zeros(NUM_SCALARS, np.int64)
    sc[FREE] = cfg[TOTAL]
    sc[LAST_DEC] = -1
    sc[STRIDE] = 1
    sc[LORA_CAND] = -1
    sc[SENT] = min(cfg[CONC], n) if cfg[CONC] else n
    cap = 1024 if cfg[KEEP_STEPS] else 0
    series = (np.empty(cfg[SERIES_CAP_], np.float64), np.empty((3, cfg[SERIES_CAP_]), np.int32))
    tf = np.zeros(NUM_TF, np.float64)
    tf[OVERHEAD] = ar[2]
    qt = np.zeros((3, n), np.float64)
    m = cfg[MAX_SEQS] + 1
    # prefilling list, chunk list, decoders due a block, their flags, pending first decodes,
    # per-request times, float scalars, per-request token times, this step's completions,
    # the closed loop's arrival rows, the arrival times, the prefix cache, LoRA's counts
    bufs = (np.empty(m, np.int64), np.empty(m, np.int64), np.empty(m, np.int64),
            np.zeros(n, np.int8), np.empty(2 * m, np.int64), qt, tf, np.zeros((2, n), np.float64),
            np.empty(m, np.int64), (ar[0], ar[1]), arr, pcx, lora_state(q))
    lists = ((np.empty(m, np.int64), np.empty(max(n, 1), np.int64)),
             np.empty((1, 1024), np.float64),
             (np.zeros((64, 2), np.float64), series, np.empty((3, cap), np.float64),
              np.empty((4, cap), np.int32)))
    lists = _run_loop(q, sc, cfg, (consts, moe), arr, lists, bufs)
    gaps, (tb, series, sf, si) = lists[1], lists[2]
    k = sc[STEP] + 1 if n else 0
    used = tb[:, 1] != 0
    return (qt, gaps[0, :sc[NGAPS]], tb[used, 0], tb[used, 1].astype(np.int64),
            series[0][:sc[NSER]], series[1][:, :sc[NSER]], tf, sc, sf[:, :k], si[:, :k])


@_njit
def lora_state(q: np.ndarray) -> tuple:
    """LoRA's per-engine state `bufs[12]`: per adapter of q[ADAPTER] its running and waiting
    requests (zeros), and room for the parked requests (every request)."""
    na = 1
    for s in range(q.shape[1]):
        na = max(na, q[ADAPTER, s] + 1)
    return np.zeros((2, na), np.int64), np.empty(max(q.shape[1], 1), np.int64)


def open_loop_arrivals() -> tuple:
    """`simulate_loop`'s `ar` for an open loop (no closed-loop rows)."""
    return np.zeros((7, 0), np.float64), np.zeros((3, 0), np.int64), 0.0


def no_prefix_cache(n: int, total_blocks: int = -1) -> tuple:
    """`simulate_loop`'s `pcx` without shared keys; with `total_blocks` a free queue for the
    blocks preempted requests leave cached (cfg[PREEMPT_KEEP])."""
    z = np.zeros(0, np.int64)
    return (np.zeros(n + 1, np.int64), z, np.zeros(0, np.int8), np.zeros(0, np.int32), z,
            np.zeros((2, 2 * total_blocks + 2), np.int64), np.zeros((2, n), np.int64))


def prefix_cache(reqs: Requests, block_size: int, total_blocks: int,
                 cached_cap: int = NO_CAP) -> tuple:
    """`simulate_loop`'s `pcx` for requests that share content: each request's
    `Requests.block_keys` as dense key ids (equal keys, equal ids), built with numpy; its first
    `cached_cap` blocks (BlockLayout.cached_cap) at most."""
    n = len(reqs)
    content, nblk = _key_codes(reqs, block_size)
    if int(nblk.max(initial=0)) > cached_cap:
        first = np.arange(len(content)) - np.repeat(np.cumsum(nblk) - nblk, nblk)
        content, nblk = content[first < cached_cap], np.minimum(nblk, cached_cap)
    koff = np.zeros(n + 1, np.int64)
    koff[1:] = np.cumsum(nblk)
    # a key is (content, end token): the content id with the block's index (its end / bs)
    j = np.arange(koff[-1]) - np.repeat(koff[:-1], nblk)
    span = int(j.max()) + 1 if len(j) else 1
    code = (content - (int(content.min()) if len(content) else 0)) * span + j  # one int each
    top = int(code.max()) + 1 if len(code) else 0
    if top <= max(4 * len(code), 1 << 20):  # dense ids by a table (a sort costs 5x more)
        seen = np.zeros(top, bool)
        seen[code] = True
        kid = (np.cumsum(seen) - 1)[code]
    else:
        kid = np.unique(code, return_inverse=True)[1]
    kid = np.asarray(kid, np.int64).reshape(-1)
    nk = int(kid.max()) + 1 if len(kid) else 0
    return (koff, kid, np.zeros(len(kid), np.int8), np.zeros(nk, np.int32),
            np.full(nk, -1, np.int64), np.zeros((2, 2 * total_blocks + 2), np.int64),
            np.zeros((2, n), np.int64))


def _key_codes(reqs: Requests, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per full shareable block of every request, in order, the id of its content (a trace's
    hash id, or -1 - the prefix group, as `Requests.block_keys` names them), and each
    request's number of such blocks."""
    inp = np.asarray(reqs.input_tokens, np.int64)
    if reqs.hash_ids is not None:
        g = reqs.hash_block_tokens
        parts, nblk = [], np.zeros(len(inp), np.int64)
        for i, ids in enumerate(reqs.hash_ids):
            limit = min(len(ids) * g, int(inp[i]))
            ends = np.arange(block_size, limit + 1, block_size)
            parts.append(np.asarray(ids, np.int64)[(ends - 1) // g])
            nblk[i] = len(ends)
        return (np.concatenate(parts) if parts else np.zeros(0, np.int64)), nblk
    grp = np.asarray(reqs.prefix_group, np.int64)
    nblk = np.where(grp >= 0, np.asarray(reqs.prefix_tokens, np.int64) // block_size, 0)
    return np.repeat(-1 - grp, nblk), nblk


def simulate_open_loop(arr: np.ndarray, q: np.ndarray, cfg: np.ndarray, consts: tuple,
                       moe: bool) -> tuple:
    """`simulate_loop` of open-loop requests without prefix caching (cfg[CONC], cfg[PC] 0)."""
    return simulate_loop(arr, q, cfg, consts, moe, open_loop_arrivals(),
                         no_prefix_cache(arr.shape[0]))


@_njit
def _probe(x: tuple, consts: tuple, moe: bool) -> float:
    return float(_step_parts(x, consts, moe)[0])


PROBE_STEPS = ((12.0, 5000.0, 4000.0, 300.0, 45150.0, 40000.0, 100.0, 100.0, 1.0, 13.0),
               (12.0, 5000.0, 4000.0, 3900.0, 586950.0, 520000.0, 1300.0, 1300.0, 13.0, 25.0))
"""Mixed steps, one prompt chunk and thirteen, whose compiled times are checked against
`StepModel.step` before a run (thirteen chunks: more than a rank each at attention DP 8)."""


def _check_kernel(step_model: Any, consts: tuple, moe: bool) -> None:
    """numba's cache tracks only the file of the function it compiles: after an edit of
    `perf.step_parts`, the cached loop (which has it compiled in) would keep the old formula.
    Probe steps compiled the same way must equal `StepModel.step`; otherwise drop every cached
    function of this module and compile afresh."""
    if numba is None:
        return
    want = [float(np.asarray(step_model.step(**dict(zip(STEP_INPUTS, x, strict=True)),
                                             detail=False)["step_s"])) for x in PROBE_STEPS]

    def same() -> bool:
        return all(math.isclose(_probe(x, consts, moe), w, rel_tol=1e-12, abs_tol=0.0)
                   for x, w in zip(PROBE_STEPS, want, strict=True))

    if same():
        return
    jitted = [f for f in globals().values() if isinstance(f, numba.core.dispatcher.Dispatcher)]
    for f in jitted:
        f._cache.flush()  # numba has no public call for this; recompile() flushes one at a time
    for f in jitted:
        f.recompile()
    assert same(), "the compiled step time differs from StepModel.step after recompiling"


def loop_module(eng: Any) -> ModuleType:
    """The module whose loop runs `eng`: this one (compiled) when numba imports, `eng.jit` and
    its step model is a `StepModel`; else this source's plain-Python twin (loaded once)."""
    if numba is None or (eng.jit and hasattr(eng.step_model, "constants")):
        return sys.modules[__name__]
    return plain_module()


def plain_module() -> ModuleType:
    """This source with every function plain Python (itself when numba is missing)."""
    if numba is None:
        return sys.modules[__name__]
    return load_twin(PLAIN_MODULE, __file__)


def load_twin(name: str, path: str, stand_ins: dict[str, ModuleType] | None = None
              ) -> ModuleType:
    """The source at `path` loaded once more as module `name` (cached in sys.modules); while it
    imports, each module named in `stand_ins` is replaced by its stand-in (a plain twin)."""
    mod = sys.modules.get(name)
    if mod is not None:
        return mod
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    saved = {k: sys.modules[k] for k in stand_ins or {}}
    sys.modules.update(stand_ins or {})
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        sys.modules.update(saved)
    return mod


def attention_ranks(eng: Any) -> int:
    """The attention-DP ranks of the engine's step model (1 without it)."""
    dp = float(np.max(np.asarray(getattr(eng.step_model, "attention_dp", 1.0), float)))
    return max(1, int(round(dp)))


def prompt_budget(eng: Any) -> int:
    """The prompt tokens a step admits further prompts within, whole, under
    SchedulerPolicy.whole_prompts_after_first: the policy's `max_prefill_tokens` per
    attention-DP rank times the ranks, else the step's token budget."""
    per_rank = int(eng.policy.max_prefill_tokens)
    if per_rank > 0:
        return per_rank * attention_ranks(eng)
    return int(eng.max_num_batched_tokens)


def build_arrays(eng: Any, reqs: Requests, prio: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Per-request state q[FIELD] and the configuration array of the loop."""
    n = len(reqs)
    q = np.full((NUM_FIELDS, n), -1, np.int32)  # tokens, steps < 2^31
    q[PROMPT] = q[TARGET] = reqs.input_tokens
    q[OUTPUT] = reqs.output_tokens
    q[PRIO] = prio[np.asarray(reqs.lane)]
    q[RESERVED] = eng.reserved_blocks(q[PROMPT], q[OUTPUT])
    q[COMPUTED] = q[GENERATED] = q[CHUNK] = 0
    q[STATE] = ARRIVING
    slots, q[ADAPTER] = adapters_of(eng, reqs)
    pol = eng.policy
    cfg = np.array([eng.total_blocks, eng.block_size, eng.max_num_seqs,
                    eng.max_num_batched_tokens, eng.window if eng.has_window else NO_WINDOW,
                    eng.has_window, pol.prefill_first, pol.chunked_prefill, pol.preemption,
                    eng.state_blocks, bool(eng.keep_steps), eng.series_cap, 0, 0, 0,
                    bool(getattr(eng, "kv_present", False)), attention_ranks(eng),
                    bool(getattr(pol, "schedules_ahead", False)), slots,
                    PREEMPT_KEEPS[getattr(pol, "preempt_cached", "none")] * pol.preemption,
                    eng.layout.full, eng.layout.window, eng.layout.window_cap,
                    bool(getattr(pol, "whole_prompts_after_first", False)),
                    prompt_budget(eng)],
                   np.int64)
    return q, cfg


def adapters_of(eng: Any, reqs: Requests) -> tuple[int, np.ndarray]:
    """(adapter slots of the replica, each request's adapter (-1: none)) for the loop: 0 slots
    without LoRA (the step model has no `lora_max_loras`, or 0); the requests' own adapters
    (`Requests.adapter`) when they carry them, else drawn from the step model's popularity
    groups (models/lora.py draw_adapters) with `eng.adapter_seed`. Attention DP: the replica
    runs as one engine of its ranks' slots together (each rank holds max_loras)."""
    step = eng.step_model
    slots = int(round(float(np.max(getattr(step, "lora_max_loras", 0.0)))))
    if slots <= 0:
        return 0, np.full(len(reqs), -1, np.int32)
    if reqs.adapter is not None:
        return slots * attention_ranks(eng), np.asarray(reqs.adapter, np.int32)
    rng = np.random.default_rng(int(getattr(eng, "adapter_seed", 0)))
    return slots * attention_ranks(eng), lora.draw_adapters(lora.step_groups(step), len(reqs),
                                                            rng)


def closed_loop_rows(reqs: Requests, cfg: np.ndarray, overhead_s: float,
                     jitter: ClientJitter | None) -> tuple:
    """A closed loop's arrival rows for `simulate_loop` (cfg gains the clients and the jitter
    flag); per-step rows are kept: a benchmark protocol drops its warm-ups' steps
    (protocol.measured_record)."""
    n = len(reqs)
    cfg[CONC] = max(min(int(reqs.concurrency or 0), n), 1)
    cfg[KEEP_STEPS] = 1
    af = np.zeros((7, n), np.float64)
    ai = np.full((3, n), -1, np.int64)
    fixed, _ = closed_loop_delay(overhead_s, jitter, 0.0)
    spreads = [closed_loop_delay(overhead_s, jitter, o)[1] for o in reqs.output_tokens.tolist()]
    if any(x > 0 for x in spreads):
        cfg[JITTER] = 1
        # Exp(1) per request in sending order, scaled by the spread of the finished request's
        # output length (closed_loop_delay: the overhead's own spread, or ClientJitter's)
        af[NOISE] = np.random.default_rng((jitter or NO_JITTER).seed).standard_exponential(n)
        af[SPREAD] = spreads
    return af, ai, fixed


def _model(step_model: Any) -> tuple:
    """The loop's step-time model: (StepModel.constants as floats, MoE), checked against
    `StepModel.step` when compiled; a stand-in step model itself (plain loop only)."""
    if not hasattr(step_model, "constants"):
        return step_model, False
    consts = tuple(float(v) for v in step_model.constants())
    moe = bool(float(step_model.num_experts) > 0)
    _check_kernel(step_model, consts, moe)
    return consts, moe


def _inputs_of(eng: Any, reqs: Requests, priorities: np.ndarray | None,
               overhead_s: float, jitter: ClientJitter | None) -> tuple:
    """simulate_loop's arguments for a run (arrival times, q, cfg, ar, pcx)."""
    prio = np.zeros(1, np.int64) if priorities is None else np.asarray(priorities, np.int64)
    q, cfg = build_arrays(eng, reqs, prio)
    if reqs.concurrency is not None:
        arr = np.zeros(len(reqs), np.float64)
        ar = closed_loop_rows(reqs, cfg, overhead_s, jitter)
    else:
        arr = np.ascontiguousarray(reqs.arrival_at_s, np.float64)
        ar = open_loop_arrivals()
    pcx = no_prefix_cache(len(reqs))
    if eng.policy.prefix_caching and (reqs.has_prefix or cfg[PREEMPT_KEEP]):
        cfg[PC] = 1
        pcx = (prefix_cache(reqs, eng.block_size, eng.total_blocks, eng.layout.cached_cap)
               if reqs.has_prefix else
               no_prefix_cache(len(reqs), eng.total_blocks))
    return arr, q, cfg, ar, pcx


def run_engine(eng: Any, reqs: Requests, priorities: np.ndarray | None,
               progress: Callable[[int], None] | None, request_overhead_s: float,
               client_jitter: ClientJitter | None) -> RunRecord:
    """`ContinuousEngine.run` with this module's loop: open loops (arrival times given) and
    closed loops (`reqs.concurrency` clients; `request_overhead_s` and `client_jitter` delay
    each next request, models/engine.ClientJitter)."""
    check_overhead(request_overhead_s)
    eng._check_requests(reqs)
    arr, q, cfg, ar, pcx = _inputs_of(eng, reqs, priorities, request_overhead_s, client_jitter)
    consts, moe = _model(eng.step_model)
    with signals_as_flag():  # a signal stops the loop, then is raised here
        (qt, gaps, tbt_v, tbt_w, ser_t, ser_i, tf, sc, sf, si) = simulate_loop(
            arr, q, cfg, consts, moe, ar, pcx)
    if sc[ERR]:
        raise AssertionError(ERRORS[int(sc[ERR])])
    if progress is not None:
        progress(int(sc[DONE]))
    # the series' steps, read off the samples kept every sc[STRIDE] steps (the nearest)
    num_steps = int(sc[STEP]) + 1 if len(arr) else 0
    j = np.minimum(np.rint(series_steps(num_steps) / sc[STRIDE]).astype(np.int64),
                   max(len(ser_t) - 1, 0))
    steps = StepSummary(
        num_steps=num_steps, tbt_gap_s=tbt_v, tbt_count=tbt_w,
        running_s=float(tf[RUN_INT]), in_system_s=float(tf[SYS_INT]),
        kv_blocks_max=int(sc[KV_MAX]), series_start_s=ser_t[j], series_running=ser_i[0, j],
        series_waiting=ser_i[1, j], series_kv_blocks=ser_i[2, j])
    if cfg[CONC]:  # sent when a step ended (ASTEP -1: at 0), the overhead and jitter later
        af, ai = ar[0], ar[1]
        arr = np.where(ai[ASTEP] >= 0, af[SENT_T] + ar[2] + af[JIT], 0.0)
        steps = None  # the per-step rows are kept: the metrics read them
    return RunRecord(
        arrival_at_s=arr,
        admitted_at_s=qt[ADM_T], first_token_at_s=qt[FIRST_T], finished_at_s=qt[FIN_T],
        input_tokens=np.asarray(reqs.input_tokens),
        output_tokens=np.asarray(reqs.output_tokens),
        lane=np.asarray(reqs.lane),
        step_start_s=sf[0], step_dur_s=sf[1], step_tbt_count=si[0], step_tbt_gap_s=sf[2],
        extra_gaps_s=gaps,
        step_running=si[1], step_waiting=si[2], step_kv_blocks=si[3],
        num_gpu_blocks=eng.total_blocks, preemptions=int(sc[PREEMPTIONS]),
        scheduler="continuous", steps=steps, prefix_hit_tokens=int(sc[HIT_TOKENS]),
    )
