"""The compiled engine's step loop for a fleet of identical replicas behind a router.

`simulate_fleet` runs `capplan.sim.compiled`'s `_step` and `_bulk` (the same scheduler, the
same per-step record) for R replicas on one time line: before routing the arrival at time t,
every replica has run the steps that start before t (the single engine pushes an arrival before
a step that starts at or after it), so the router reads each replica's state as it is at t:
- outstanding requests (running plus waiting) for least-outstanding, with the completions of a
  step still running at t not yet counted;
- whether it accepts (ready at or before t, not yet draining) for every router.
A replica's own run is exactly the single engine's on the requests it receives, prefix cache
included (tests: one replica equals `simulate_loop`; round-robin and prefix-affinity over k
equal k separate runs). `plain_module()` is this source as plain Python (`--sim-engine
python`), on the scheduler's plain twin.

Per replica: the scalars, the running set, the waiting heap, the step lists, the float
aggregates and the prefix cache's ref counts, stamps and free queue (rows of 2-D and 3-D
arrays, `fleet_prefix_cache`) and its LoRA adapters' running and waiting counts; per request
(shared, each request is on one replica): its state `q`, times, flags and block keys. The
per-step TBT samples go to one table per window of the caller's schedule (a step's window is
the one its start falls in; a decode stretch stops at a window edge), the extra gaps with the
window of their step's end.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from types import ModuleType

import numpy as np

from capplan.sim.compiled import (
    DONE,
    ERR,
    FREE,
    KEEP_STEPS,
    LAST_DEC,
    LAST_FIN,
    LORA_CAND,
    MAX_LORAS,
    MAX_SEQS,
    NGAPS,
    NHEAP,
    NPARK,
    NRUN,
    NTBT,
    NUM_SCALARS,
    NUM_TF,
    STATE,
    STEP,
    STRIDE,
    T_END,
    TOTAL,
    WAITING,
    _bulk_all,
    _gaps_full,
    _grow,
    _lora_wait,
    _njit,
    _njit_borrow,
    _njit_inline,
    _push,
    _step,
    _table_full,
    _tbt_add,
    lora_state,
    numba,
)
from capplan.sim.workload import Requests

RUN_, HEAP_, PF_, CHL_, NEEDL_, FDL_, FIN_, PARK_ = range(8)
"""The per-replica index arrays (rows: replicas): running set, waiting heap, prefilling list,
chunk list, decoders due a block, pending first decodes, a step's completions (closed loops
only: unused here), LoRA's parked requests (as long as the heap: `_ensure_room`)."""
PLAIN_MODULE = "capplan.sim._fleet_loop_plain"
"""This source loaded a second time on `capplan.sim.compiled`'s plain twin (`plain_module`)."""
ROUTER_CODES = {"round-robin": 0, "least-outstanding": 1, "prefix-affinity": 2}
SERIES_DUMMY = 64
"""The per-step time-series samples are not kept for a fleet (one scratch buffer)."""


def new_affinity_map() -> object:
    """An empty request-key -> replica map for prefix affinity (numba's typed dict when the
    loop is compiled, a dict otherwise)."""
    if numba is None or numba.config.DISABLE_JIT:
        return {}
    from numba import types
    from numba.typed import Dict

    return Dict.empty(key_type=types.int64, value_type=types.int64)


@_njit_borrow
def _window(t: float, bounds: np.ndarray) -> int:
    """Index of the window holding t (bounds: the W window starts; before the first: 0)."""
    w = np.searchsorted(bounds, t, side="right") - 1
    return max(int(w), 0)


@_njit
def _grow_table(tb: np.ndarray) -> tuple:
    """The table with twice the slots, entries re-inserted; (table, entries)."""
    out = np.zeros((2 * tb.shape[0], 2), np.float64)
    sc = np.zeros(NUM_SCALARS, np.int64)
    for i in range(tb.shape[0]):
        if tb[i, 1] != 0:
            _tbt_add(tb[i, 0], tb[i, 1], out, sc)
    return out, sc[NTBT]


@_njit
def _accepts(r: int, t: float, ready: np.ndarray, stop: np.ndarray) -> bool:
    return ready[r] <= t < stop[r]


@_njit
def _outstanding(r: int, t: float, SC: np.ndarray, t_r: np.ndarray, last_done: np.ndarray
                 ) -> int:
    """Requests in replica r at time t: running plus waiting, plus those its step running at t
    completes at its end (already applied)."""
    n = SC[r, NRUN] + SC[r, NHEAP] + SC[r, NPARK]
    if t_r[r] > t:
        n += last_done[r]
    return n


@_njit
def _least_outstanding(t: float, st: tuple, fl: tuple) -> int:
    """The accepting replica with the fewest requests in it at t (the first on ties; -1:
    none accepts)."""
    ready, stop = fl[0], fl[1]
    SC, t_r, last_done = st[0], st[1], st[2]
    best, bn = -1, 0
    for r in range(ready.shape[0]):
        if _accepts(r, t, ready, stop):
            o = _outstanding(r, t, SC, t_r, last_done)
            if best < 0 or o < bn:
                best, bn = r, o
    return best


@_njit
def _round_robin(t: float, rr: np.ndarray, ready: np.ndarray, stop: np.ndarray) -> int:
    """The next accepting replica in turn (-1: none accepts)."""
    na = 0
    for r in range(ready.shape[0]):
        na += _accepts(r, t, ready, stop)
    if na == 0:
        return -1
    j = rr[0] % na
    rr[0] += 1
    for r in range(ready.shape[0]):
        if _accepts(r, t, ready, stop):
            if j == 0:
                return r
            j -= 1
    return -1


@_njit
def _route(i: int, t: float, st: tuple, fl: tuple) -> int:
    """The replica for request i at time t (-1: none accepts): least-outstanding; or
    prefix-affinity's owner of the request's key while it accepts, else round-robin (which a
    keyed request's first routing makes its key's owner)."""
    ready, stop, router, keys, owner = fl[0], fl[1], fl[2], fl[3], fl[4]
    k = keys[i]
    if router == 2 and k >= 0 and k in owner:
        r = owner[k]
        if _accepts(r, t, ready, stop):
            return r
    if router == 1:
        return _least_outstanding(t, st, fl)
    r = _round_robin(t, st[3], ready, stop)
    if router == 2 and k >= 0 and r >= 0:
        owner[k] = r
    return r


@_njit_inline
def _heap_full(sc: np.ndarray, heap: np.ndarray) -> bool:
    """Whether a replica's heap lacks room for every request it holds plus one (a step can
    move each running one, and each LoRA-parked one, back to the waiting heap)."""
    return sc[NHEAP] + sc[NPARK] + sc[NRUN] + 2 > heap.shape[0]


@_njit
def _ensure_room(r: int, ia: list, SC: np.ndarray) -> None:
    """Room in replica r's heap (`_heap_full`), and as much for its parked requests."""
    if _heap_full(SC[r], ia[HEAP_][r]):
        ia[HEAP_] = _grow(ia[HEAP_])
        ia[PARK_] = _grow(ia[PARK_])


@_njit
def _advance(r: int, until: float, eng: tuple, st: tuple, tb: tuple, shared: tuple) -> None:
    """Replica r runs its steps that start before `until` (decode stretches stop there and at
    the end of their window). `eng` = (q, cfg, model, engine arrival times). The steps run in
    `_run_window`, which returns here at a window's end or to grow a buffer."""
    cfg = eng[1]
    SC, t_r, ia = st[0], st[1], st[5]
    tabs, nt, bounds, gl, ng, agg_rest = tb
    sc = SC[r]
    p = shared[4]  # the requests' block keys; replica r's ref counts, stamps and free queue
    pcx = (p[0], p[1], p[2], p[3][r], p[4][r], p[5][r], p[6])
    while (sc[NRUN] > 0 or sc[NHEAP] > 0) and t_r[r] < until and sc[ERR] == 0:
        w = _window(t_r[r], bounds)
        if _table_full(nt[w], tabs[w]):
            tabs[w], nt[w] = _grow_table(tabs[w])
        if _gaps_full(ng[0], cfg, gl[0]):
            gl[0], gl[1] = _grow(gl[0]), _grow(gl[1])
        _ensure_room(r, ia, SC)
        lists = ((ia[RUN_][r], ia[HEAP_][r]), gl[0], (tabs[w], agg_rest[0], agg_rest[1],
                                                       agg_rest[2]))
        bufs = (ia[PF_][r], ia[CHL_][r], ia[NEEDL_][r], shared[0], ia[FDL_][r], shared[1],
                st[4][r], shared[2], ia[FIN_][r], shared[3], eng[3], pcx,
                (shared[5][r], ia[PARK_][r]))
        _run_window((r, w, until), eng, st[:5], (nt, bounds, ng), gl[1], lists, bufs)


@_njit_borrow
def _run_window(at: tuple, eng: tuple, st: tuple, tb: tuple, gwin: np.ndarray, lists: tuple,
                bufs: tuple) -> None:
    """Replica r's steps that start before `until` in window w, `at` = (r, w, until), while
    the window's table, the gap lists and r's heap have room (`_advance` grows them); `st`
    and `tb` are `_advance`'s without their lists (t_r.. TF; nt, bounds, ng). It
    allocates nothing, so it borrows its arguments (`compiled._njit_borrow`): no reference
    count changes per step."""
    r, w, until = at
    q, cfg, model, arr = eng
    SC, t_r, last_done, k_r, TF = st[0], st[1], st[2], st[3], st[4]
    nt, bounds, ng = tb
    sc, heap, gaps, tab = SC[r], lists[0][1], lists[1], lists[2][0]
    while (sc[NRUN] > 0 or sc[NHEAP] > 0) and t_r[r] < until and sc[ERR] == 0:
        t = t_r[r]
        if (_window(t, bounds) != w or _table_full(nt[w], tab) or _gaps_full(ng[0], cfg, gaps)
                or _heap_full(sc, heap)):
            return
        sc[NTBT], sc[NGAPS], sc[STEP] = nt[w], ng[0], k_r[r]
        d0 = sc[DONE]
        t = t + _step(t, q, sc, cfg, model, arr, lists, bufs)
        if sc[ERR]:
            return
        last_done[r] = sc[DONE] - d0
        we = _window(TF[r, T_END], bounds)
        for g in range(ng[0], sc[NGAPS]):  # extra gaps: the window of their step's end
            gwin[0, g] = we
        t_edge = bounds[w + 1] if w + 1 < bounds.shape[0] else np.inf
        t2 = _bulk_all(t, min(until, t_edge), q, sc, cfg, model, lists, bufs)
        if t2 != t:
            last_done[r] = sc[LAST_FIN]  # completions of the stretch's last step
        t_r[r] = t2
        k_r[r] = sc[STEP] + 1
        nt[w], ng[0] = sc[NTBT], sc[NGAPS]


@_njit
def _dispatch_time(t: float, ready: np.ndarray, stop: np.ndarray) -> float:
    """t when a replica accepts then, else the next time one becomes ready (inf: never)."""
    best = np.inf
    for r in range(ready.shape[0]):
        if _accepts(r, t, ready, stop):
            return t
        if t < ready[r] < stop[r]:
            best = min(best, ready[r])
    return best


@_njit
def _fleet_loop(eng: tuple, st: tuple, fl: tuple, tb: tuple, shared: tuple, rep: np.ndarray
                ) -> None:
    q, arr = eng[0], eng[3]
    SC, t_r, ia = st[0], st[1], st[5]
    R = t_r.shape[0]
    for i in range(arr.shape[0]):
        d = _dispatch_time(arr[i], fl[0], fl[1])
        if d == np.inf:
            continue  # no replica ever takes it: unfinished
        for r in range(R):  # (the test here spares a call for an idle replica)
            if (SC[r, NRUN] > 0 or SC[r, NHEAP] > 0) and t_r[r] < d:
                _advance(r, d, eng, st, tb, shared)
                if SC[r, ERR]:
                    return
        r = _route(i, d, (SC, t_r, st[2], fl[5]), fl)
        rep[i] = r
        arr[i] = d  # the engine sees the request when the router sends it
        if SC[r, NRUN] == 0 and SC[r, NHEAP] == 0:
            t_r[r] = max(t_r[r], d)
        _ensure_room(r, ia, SC)
        q[STATE, i] = WAITING
        _push(i, ia[HEAP_][r], SC[r], q, arr)
        if eng[1][MAX_LORAS]:
            _lora_wait(i, 1, q, SC[r], shared[5][r], arr)
    for r in range(R):
        _advance(r, np.inf, eng, st, tb, shared)


@_njit
def simulate_fleet(arr: np.ndarray, q: np.ndarray, cfg: np.ndarray, consts: tuple, moe: bool,
                   fleet: tuple, pcx: tuple) -> tuple:
    """Route and simulate open-loop requests (arrival times `arr`, sorted; state `q`) over the
    replicas of `fleet` = (ready_at_s, stop_at_s, router code, per-request affinity keys,
    window starts, the affinity map (empty)); `pcx` the prefix cache (`fleet_prefix_cache`:
    each replica its own, cfg[PC]). Returns (replica per request (-1: never routed),
    dispatch time, per-request times qt (3, n), per-step TBT samples (gap, weight, window),
    extra gaps (gap, window), per-replica scalars, per-replica float aggregates)."""
    ready, stop, router, keys, bounds, owner = fleet
    n, R, W = arr.shape[0], ready.shape[0], bounds.shape[0]
    cfg = cfg.copy()
    cfg[KEEP_STEPS] = 0  # a fleet keeps no per-step arrays (no room for them below)
    m = cfg[MAX_SEQS] + 1
    SC = np.zeros((R, NUM_SCALARS), np.int64)
    for r in range(R):
        SC[r, FREE], SC[r, LAST_DEC], SC[r, STRIDE], SC[r, LORA_CAND] = cfg[TOTAL], -1, 1, -1
    ia = [np.empty((R, m), np.int64), np.empty((R, 64), np.int64), np.empty((R, m), np.int64),
          np.empty((R, m), np.int64), np.empty((R, m), np.int64), np.empty((R, 2 * m), np.int64),
          np.empty((R, m), np.int64), np.empty((R, 64), np.int64)]
    TF = np.zeros((R, NUM_TF), np.float64)
    st = (SC, np.zeros(R), np.zeros(R, np.int64), np.zeros(R, np.int64), TF, ia)
    fl = (ready, stop, router, keys, owner, np.zeros(1, np.int64))
    tabs = [np.zeros((64, 2), np.float64) for _ in range(W)]
    nt = np.zeros(W, np.int64)
    gl = [np.empty((1, 1024), np.float64), np.empty((1, 1024), np.float64)]
    ng = np.zeros(1, np.int64)
    agg_rest = ((np.empty(SERIES_DUMMY, np.float64), np.empty((3, SERIES_DUMMY), np.int32)),
                np.empty((3, 0), np.float64), np.empty((4, 0), np.int32))
    qt = np.zeros((3, n), np.float64)
    cnt = lora_state(q)[0]  # LoRA: each replica its own adapter counts
    shared = (np.zeros(n, np.int8), qt, np.zeros((2, n), np.float64),
              (np.zeros((7, 0), np.float64), np.zeros((3, 0), np.int64)), pcx,
              np.zeros((R, cnt.shape[0], cnt.shape[1]), np.int64))
    eng_arr = arr.copy()
    rep = np.full(n, -1, np.int64)
    _fleet_loop((q, cfg, (consts, moe), eng_arr), st, fl, (tabs, nt, bounds, gl, ng, agg_rest),
                shared, rep)
    total = 0
    for w in range(W):
        total += nt[w]
    tv, tw, twin = np.empty(total), np.empty(total), np.empty(total, np.int64)
    j = 0
    for w in range(W):
        tab = tabs[w]
        for i in range(tab.shape[0]):
            if tab[i, 1] != 0:
                tv[j], tw[j], twin[j] = tab[i, 0], tab[i, 1], w
                j += 1
    k = ng[0]
    return (rep, eng_arr, qt, tv[:j], tw[:j], twin[:j], gl[0][0, :k].copy(),
            gl[1][0, :k].astype(np.int64), SC, TF)


def fleet_prefix_cache(pcx: tuple, replicas: int) -> tuple:
    """`simulate_fleet`'s `pcx` from `capplan.sim.compiled`'s (`prefix_cache`, or
    `no_prefix_cache`): the requests' block keys as they are (each request is on one replica),
    the per-key ref counts and stamps and the free queue one row per replica (each replica
    caches its own blocks)."""
    koff, kid, isref, kref, kstamp, lru, own = pcx
    return (koff, kid, isref, np.repeat(kref[None], replicas, 0),
            np.repeat(kstamp[None], replicas, 0), np.repeat(lru[None], replicas, 0), own)


def kernel_probe(q: np.ndarray, cfg: np.ndarray, consts: tuple, moe: bool) -> tuple:
    """(this loop's, `simulate_loop`'s) (per-request times, prefix hit tokens) for two requests
    like q's first sharing a prompt block with prefix caching, the second arriving after the
    first finished (a hit on a freed cached block)."""
    from capplan.sim import compiled as C

    two = np.ascontiguousarray(np.repeat(q[:, :1], 2, axis=1))
    bs = int(cfg[C.BS])
    two[C.PROMPT] = two[C.TARGET] = 2 * bs
    two[C.OUTPUT] = np.minimum(two[C.OUTPUT], 4)
    arr = np.array([0.0, 30.0])
    cfg = cfg.copy()
    cfg[C.PC] = 1
    reqs = Requests(arr, two[C.PROMPT].astype(np.int64), two[C.OUTPUT].astype(np.int64),
                    np.zeros(2, np.int64), prefix_group=np.zeros(2, np.int64),
                    prefix_tokens=np.full(2, bs))
    pcx = C.prefix_cache(reqs, bs, int(cfg[C.TOTAL]))
    want = C.simulate_loop(arr, two.copy(), cfg, consts, moe, C.open_loop_arrivals(), pcx)
    fleet = (np.zeros(1), np.full(1, np.inf), 0, np.full(2, -1, np.int64), np.zeros(1),
             new_affinity_map())
    got = simulate_fleet(arr, two.copy(), cfg, consts, moe, fleet,
                         fleet_prefix_cache(C.prefix_cache(reqs, bs, int(cfg[C.TOTAL])), 1))
    return (got[2], int(got[8][0, C.HIT_TOKENS])), (want[0], int(want[7][C.HIT_TOKENS]))


def check_kernel(q: np.ndarray, cfg: np.ndarray, consts: tuple, moe: bool) -> None:
    """numba's cache tracks only this file: after an edit of the step-time formula or of
    `capplan.sim.compiled` (whose functions this loop has compiled in), the cached loop would
    keep the old code. `kernel_probe`'s run must equal `simulate_loop`'s (which
    `compiled._check_kernel` keeps current); otherwise drop this module's cached functions and
    compile afresh."""
    if numba is None or numba.config.DISABLE_JIT or not q.shape[1]:
        return
    got, want = kernel_probe(q, cfg, consts, moe)
    if np.array_equal(got[0], want[0]) and got[1] == want[1]:
        return
    jitted = [f for f in globals().values() if isinstance(f, numba.core.dispatcher.Dispatcher)]
    for f in jitted:
        f._cache.flush()  # numba has no public call for this (as compiled._check_kernel)
    for f in jitted:
        f.recompile()


def plain_module() -> ModuleType:
    """This loop as plain Python (`--sim-engine python`): this source loaded a second time
    with `capplan.sim.compiled` standing for its plain twin while it imports, so the twin's
    functions (the same scheduler source, the JIT off) are the ones it calls; itself when numba
    is missing."""
    from capplan.sim import compiled

    if numba is None:
        return sys.modules[__name__]
    return compiled.load_twin(PLAIN_MODULE, __file__, {compiled.__name__: compiled.plain_module()})


def drop_stale_cache(jitted: Iterable, sources: Iterable[str]) -> int:
    """numba's cache checks only the file of the function it compiled: this module's cached
    functions have `capplan.sim.compiled`'s scheduler and the step formula compiled in, so a
    cache older than either source (an update that edits them and not this file) holds the old
    code, which `check_kernel`'s two-request probe does not always exercise. Each such cache is
    dropped (`flush`: numba has no public call for it) and its function compiles afresh.
    Returns how many were dropped."""
    newest = max((os.path.getmtime(f) for f in sources), default=0.0)
    dropped = 0
    for f in jitted:
        index = f._cache._cache_file._index_path
        if os.path.exists(index) and os.path.getmtime(index) < newest:
            f._cache.flush()
            dropped += 1
    return dropped


if numba is not None and not numba.config.DISABLE_JIT:
    from capplan.models import perf as _perf
    from capplan.sim import compiled as _compiled

    drop_stale_cache([f for f in list(globals().values())
                      if isinstance(f, numba.core.dispatcher.Dispatcher)],
                     (_compiled.__file__, _perf.__file__))
