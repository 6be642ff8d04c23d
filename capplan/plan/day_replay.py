"""Verify a day plan by replaying its trace over the fleet (capplan.sim.fleet.replay_schedule).

Two replays over the same windows: the planned schedule (scale-ups started `replica_start_s`
ahead, so a window's replicas serve from its start) and a reactive policy (each window runs the
replicas the previous window needed, and the added ones serve only after the start-up lag).
Each window gets its SLO attainment (the fraction of its arrivals whose TTFT, TPOT and E2E meet
the SLOs) and its replayed p99s under both (TTFT, TBT, TPOT, E2E; TPOT's mean too). A window
meets the SLOs when every objective the lanes give holds within SLO_TOLERANCE, nothing is left
unfinished and its backlog did not grow (the fleet served what it was offered).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from capplan.plan.slo import SloSet, SloTarget
from capplan.sim.workload import Requests

SLO_TOLERANCE = 0.10
"""A replayed p99 within 10% of its SLO counts as meeting it (the acceptance's tolerance: the
analytic plan and the replay agree to about this much, docs/queueing.md)."""


def replica_deployment(cat: Any, model: str, cand: Any) -> Any:
    """The Deployment of one replica of a candidate configuration (what the replay runs)."""
    from capplan.plan.deployment import resolve_deployment

    return resolve_deployment(cat, model, cand.gpu.key, cand.settings, cand.group.calibration)


def _deployment(cat: Any, dp: Any) -> Any:
    """The Deployment of one replica of the plan's best configuration."""
    return replica_deployment(cat, dp.plan.model, dp.plan.best.candidate)


def _selected(n: int, peak: int, which: str) -> tuple[int, int]:
    """[first, last) window indices to replay: all, or the peak and its two neighbours."""
    if which == "all":
        return 0, n
    return max(0, peak - 1), min(n, peak + 2)


def _subset(reqs: Requests, start_s: float, end_s: float, last: bool) -> Requests:
    """The requests arriving in [start_s, end_s) (to end_s inclusive for the last window:
    a trace's last window ends at its last arrival)."""
    t = np.asarray(reqs.arrival_at_s)
    lo = int(np.searchsorted(t, start_s))
    hi = int(np.searchsorted(t, end_s, side="right" if last else "left"))
    ids = None if reqs.hash_ids is None else reqs.hash_ids[lo:hi]  # shared content, kept
    return Requests(t[lo:hi], np.asarray(reqs.input_tokens)[lo:hi],
                    np.asarray(reqs.output_tokens)[lo:hi], np.zeros(hi - lo, np.int64),
                    hash_ids=ids, hash_block_tokens=reqs.hash_block_tokens)


def router_for(reqs: Requests) -> str:
    """least-outstanding (llm-d's queue scorer); round-robin when the requests share content
    (a Mooncake trace's hash_ids), which the fleet's least-outstanding loop does not replay:
    it spreads the load evenly as the plan assumes (prefix-affinity would send every request
    of a shared system prompt to one replica)."""
    return "round-robin" if reqs.has_prefix else "least-outstanding"


def replay_windows(reqs: Requests, dep: Any, windows: list[tuple[float, float, int]],
                   startup_lag_s: float, slos: SloSet) -> list[dict[str, Any]]:
    """The one call into the fleet replay: per-window stats as dicts."""
    from capplan.sim import compiled_available
    from capplan.sim.fleet import FleetReplaySpec, replay_schedule

    # the compiled loop whatever each replica's share (a replay runs a replica per window and
    # per policy: numba's ~1 s load is paid once)
    engine = "compiled" if compiled_available() else "auto"
    res = replay_schedule(FleetReplaySpec(
        requests=reqs, engine_config=dep, windows=windows, router=router_for(reqs),
        # per request, the fleet checks TPOT (its mean gap) against slo_tbt_s: a TPOT SLO
        # when the lanes give one, else the TBT one
        startup_lag_s=startup_lag_s, slo_ttft_s=slos.ttft_p99_s,
        slo_tbt_s=slos.tpot_p99_s or slos.tpot_mean_s or slos.tbt_p99_s,
        slo_e2e_s=slos.e2e_p99_s, sim_engine=engine))
    return [w.to_dict() for w in res.windows]


def stat_key(t: SloTarget) -> str:
    """The replay's key of an objective: 'ttft_p99_s', 'tpot_mean_s', 'e2e_p99_s' ..."""
    return f"{t.margin_key}_s"


def meets(stats: dict[str, Any], slos: SloSet, tolerance: float = SLO_TOLERANCE) -> bool:
    """Every objective of `slos` within `tolerance` (a window without completions has no p99
    to check), nothing unfinished, and a backlog that did not grow (an overloaded window
    fails whatever its p99s: they grow with the length of the overload)."""
    lim = 1 + tolerance
    for t in slos:
        v = stats.get(stat_key(t))
        if v is not None and np.isfinite(v) and v > lim * t.limit_s:
            return False
    return stats.get("unfinished", 0) == 0 and not stats.get("overloaded", False)


MAX_ROUNDS = 4
"""Replays that may add a replica to the windows still missing the SLOs."""


def _replay_range(part: Requests, dep: Any, w: Any, lo: int, hi: int, slos: SloSet
                  ) -> list[dict[str, Any]]:
    """Replay windows [lo, hi) of `w` at their replica counts."""
    return replay_windows(part, dep, [(x.start_s, x.end_s, max(x.replicas, 0))
                                      for x in w[lo:hi]], 0.0, slos)


def _misses(stats: list[dict[str, Any]], slos: SloSet, lo: int) -> list[int]:
    """Indices (from lo) of the replayed windows that miss the SLOs."""
    return [lo + i for i, p in enumerate(stats) if not meets(p, slos)]


def _add_replicas(part: Requests, dep: Any, dp: Any, lo: int, hi: int, slos: SloSet
                  ) -> tuple[np.ndarray, np.ndarray, Any, list[dict[str, Any]], bool]:
    """Up to MAX_ROUNDS replays, each adding a replica to the windows still missing the SLOs
    while that helps (_better): (replicas, added, windows, last stats, whether the rounds ran
    out while replicas still helped)."""
    w = dp.windows
    reps = np.array([x.replicas for x in w])
    added = np.zeros(len(w), np.int64)
    stats = _replay_range(part, dep, w, lo, hi, slos)
    for _ in range(MAX_ROUNDS):
        miss = _misses(stats, slos, lo)
        if not miss or dp.rebuild is None:
            return reps, added, w, stats, False
        trial = reps.copy()
        trial[miss] += 1
        w_trial = dp.rebuild(trial)
        again = _replay_range(part, dep, w_trial, lo, hi, slos)
        if not _better(again, stats, [i - lo for i in miss]):
            # a replica more does not help these windows: keep the count, say so
            return reps, added, w, stats, False
        reps, w, stats = trial, w_trial, again
        added[miss] += 1
    return reps, added, w, stats, bool(_misses(stats, slos, lo))


def _trim(part: Requests, dep: Any, dp: Any, span: tuple[int, int], slos: SloSet,
          state: tuple[np.ndarray, np.ndarray, Any, list[dict[str, Any]]]
          ) -> tuple[np.ndarray, np.ndarray, Any, list[dict[str, Any]]]:
    """After the fix-point, give back the replicas it added where they are no longer needed:
    a window may have missed only through the backlog an earlier window left, which that
    window's own added replica then cleared. Takes one added replica from every window that
    has one and replays; kept when no window that met the SLOs misses. Otherwise the first
    window that now misses names the cause: the last window at or before it that gave one
    back keeps it (a window's backlog comes from itself or earlier), and the rest are tried
    again; then the next replica of each window that still has added ones. At most
    2 x MAX_ROUNDS replays. (replicas, added, windows, stats) as _add_replicas."""
    lo, hi = span
    reps, added, w, stats = state
    needed: set[int] = set()
    budget = 2 * MAX_ROUNDS
    while budget > 0:
        before = set(_misses(stats, slos, lo))
        # a window that still misses keeps what was added to it (giving it back harms it
        # though `new` below cannot see it)
        cand = [int(i) for i in np.flatnonzero(added) if int(i) not in needed | before]
        kept = False
        while cand and budget > 0:
            budget -= 1
            trial = reps.copy()
            trial[cand] -= 1
            w_trial = dp.rebuild(trial)
            again = _replay_range(part, dep, w_trial, lo, hi, slos)
            new = set(_misses(again, slos, lo)) - before
            if not new:
                reps, w, stats, kept = trial, w_trial, again, True
                added[cand] -= 1
                break
            cause = max((c for c in cand if c <= min(new)), default=None)
            if cause is None:
                return reps, added, w, stats
            needed.add(cause)
            cand.remove(cause)
        if not kept:
            break
    return reps, added, w, stats


def _correct(part: Requests, dep: Any, dp: Any, lo: int, hi: int, slos: SloSet
             ) -> tuple[np.ndarray, np.ndarray, list[Any], list[dict[str, Any]], list[str]]:
    """Replay the planned windows [lo, hi); where one misses the SLOs (beyond the 10%
    tolerance), add a replica to it and replay again, up to MAX_ROUNDS times, then drop the
    added replicas no longer needed (_trim). Returns the replica counts, the replicas added,
    the windows, the last replay's stats and notes (the replay is right where it and the
    analytic model disagree)."""
    reps, added, w, stats, exhausted = _add_replicas(part, dep, dp, lo, hi, slos)
    still = _misses(stats, slos, lo)
    notes = []
    if still and exhausted:  # replicas still helped when the rounds ran out: keep them
        notes.append(f"window(s) {', '.join(map(str, still))} still miss the SLOs in the replay "
                     f"after {MAX_ROUNDS} rounds of added replicas: add replicas there")
    elif still:  # replicas did not fix these: keep the analytic count, say what limits them
        reps[still] -= added[still]
        added[still] = 0
        w = dp.rebuild(reps) if dp.rebuild is not None else w
        stats = _replay_range(part, dep, w, lo, hi, slos)
        notes.append(f"window(s) {', '.join(map(str, still))} miss the SLOs in the replay "
                     "and more replicas do not fix it: the limit is per request (long "
                     "prompts, prefill chunks, bursts), not the fleet's size; loosen the SLOs, "
                     "shorten requests or choose a smaller chunk")
    if added.any() and dp.rebuild is not None:
        reps, added, w, stats = _trim(part, dep, dp, (lo, hi), slos, (reps, added, w, stats))
    notes[:0] = [f"the replay missed the SLOs in window {i} on the analytic count: "
                 f"{added[i]} replica(s) added ({reps[i]})" for i in np.flatnonzero(added)]
    return reps, added, w, stats, notes


def _better(new: list[dict[str, Any]], old: list[dict[str, Any]], idx: list[int]) -> bool:
    """Whether a replay improved any of the windows idx (attainment, an overload cleared or a
    p99)."""
    for i in idx:
        a, b = new[i], old[i]
        if (a.get("attainment") or 0) > (b.get("attainment") or 0) + 1e-9:
            return True
        if b.get("overloaded") and not a.get("overloaded"):
            return True
        for k in ("ttft_p99_s", "tbt_p99_s", "tpot_p99_s", "e2e_p99_s"):
            x, y = a.get(k), b.get(k)
            if x is not None and y is not None and x < 0.98 * y:
                return True
    return False


SIZED_NOTE = "sized at the peak window"
"""How plan/day.py's note on the peak window's capacity starts (_rescaled restates it)."""


def _rescaled(dp: Any, cap: float, peak: int) -> Any:
    """dp with the capacity per replica its replay's corrections imply at the peak window
    (`cap`: what the windows not replayed are sized at), its note restating it."""
    w = dp.windows[peak]
    note = (f"{SIZED_NOTE} ({w.sizing_rps:.3g} req/s, window {peak}); each replica carries "
            f"{cap:.3g} req/s within the SLOs (simulated: as the day replay's corrections "
            f"imply), headroom {dp.headroom:.0%}")
    notes = [note if n.startswith(SIZED_NOTE) else n for n in dp.notes]
    return replace(dp, capacity_rps=cap, simulated_capacity_rps=cap, notes=notes)


NOT_EXERCISED = ("the reactive policy was not exercised: no replayed window changes its "
                 "replicas from the window before, so the reactive replay runs the planned "
                 "fleet (`replay: all` replays the scale-ups)")


def exercised(windows: Any) -> bool:
    """Whether a reactive replay of these windows differs from the planned one: some window
    runs other replicas than it plans (the previous window's count)."""
    return any(x.reactive_replicas != x.replicas for x in windows)


def verify_day(cat: Any, dp: Any, reqs: Requests, which: str = "peak") -> Any:
    """The day plan with each replayed window's `replay` filled in (planned and reactive);
    replayed windows that miss the SLOs get replicas until they meet them (_correct)."""
    w = dp.windows
    peak = max(range(len(w)), key=lambda i: w[i].sizing_rps)
    lo, hi = _selected(len(w), peak, which)
    part = _subset(reqs, w[lo].start_s, w[hi - 1].end_s, hi == len(w))
    slos = SloSet.strictest(SloSet.of(ln.slo) for ln in dp.plan.lanes)
    if len(part) == 0:
        return dp
    dep = _deployment(cat, dp)
    # prompts cut so that prompt + output fit max_model_len, as the planner's lengths are
    part, cut = part.clip_to_context(dep.settings.max_model_len)
    reps, grew, w, planned, added = _correct(part, dep, dp, lo, hi, slos)
    if which != "all" and grew.any() and dp.rescale is not None:
        # the replay found the analytic capacity too high: the windows it did not replay
        # get the capacity its corrections imply (day.scaled_counts)
        counts, scale = dp.rescale({int(i): int(reps[i]) for i in np.flatnonzero(grew)})
        counts[lo:hi] = reps[lo:hi]
        if (counts != reps).any():
            w = dp.rebuild(counts)
            added.append(f"the other windows are sized at {scale:.0%} of the capacity per "
                         "replica, as the replayed windows needed (not replayed: "
                         "`replay: all` checks them)")
        if scale < 1 and dp.capacity_rps is not None:  # what the windows are now sized at
            dp = _rescaled(dp, dp.capacity_rps * scale, peak)
    if cut:
        added.append(f"{cut} replayed prompt(s) cut to fit max_model_len "
                     f"{dep.settings.max_model_len}")
    reactive = replay_windows(part, dep, [(x.start_s, x.end_s, x.reactive_replicas)
                                          for x in w[lo:hi]], dp.lag.total_s, slos)
    out = list(w)
    for i, (p, r) in enumerate(zip(planned, reactive, strict=True)):
        keep = ("replicas", "served_rps", "ttft_p99_s", "tbt_p99_s", "tpot_p99_s",
                "tpot_mean_s", "e2e_p99_s", "attainment", "completed", "unfinished",
                "overloaded")
        out[lo + i] = replace(out[lo + i], replay={
            "planned": {**{k: p[k] for k in keep}, "meets_slo": meets(p, slos)},
            "reactive": {**{k: r[k] for k in keep}, "meets_slo": meets(r, slos)}})
    notes = [*dp.notes, *added,
             f"replayed windows {lo} to {hi - 1} ({len(part)} requests) over the "
             f"planned schedule and a reactive one ({router_for(part)} routing; a replica the "
             f"reactive policy adds serves after {dp.lag.total_s:.0f} s)"]
    if not exercised(w[lo:hi]):
        notes.append(NOT_EXERCISED)
    return replace(dp, windows=out, notes=notes)
