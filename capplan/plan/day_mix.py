"""Each window's capacity per replica at its own lane mix (and, for a trace, its own
burstiness): the day plan's replica rule divides a window's sizing rate by it (plan/day.py).

Lanes whose rates peak at different hours change the traffic's mix over the day: a night of
long RAG prompts costs a replica far more per request than an afternoon of short chats. The
peak window's mix sized every window, so the night was about 2x under-provisioned (a chat
lane of 500 tokens peaking at 30 req/s at 14:00 and an 8,000-token RAG lane peaking at 6 req/s
at 02:00, Llama-3.1-8B on H100, TTFT 2 s, TBT 60 ms: 30.8 req/s per replica at 14:00's mix,
4.9 at 02:00's). Each window's mix is the lanes' rates
at the instant its sizing rate is reached (`WindowSeries.lane_rps`), as shares rounded to
MIX_STEP; windows sharing a rounded mix share one capacity search (plan/burst.py: two
vectorised calls of the analytic model, ~50 ms), so a day costs at most one search per
distinct mix and SCV level (that day: 48 mixes in 96 windows, 2.3 s; 184 in 1,440 one-minute
windows, 9 s; one lane: one search).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from capplan.plan.rate_curve import WindowSeries
from capplan.plan.schema import PlanFile
from capplan.plan.search import Candidate, Traffic, replay_found

MIX_STEP = 1 / 256
"""Lane shares are rounded to this step: at most 257 mixes of two lanes over a day, and a
capacity within ~1.5% of the exact mix's (the steepest case measured: a chat share of 0.95 in
the 8,000-token RAG mix above, where the capacity moves ~100 req/s per unit of share)."""
TRICKLE = 1e-3
"""A lane's least share in a mix: a lane at 0 keeps its SLOs counted (as day_peak's peak
window gives it a trickle)."""


@dataclass(frozen=True)
class Sizing:
    """One replica of the chosen configuration per window: its capacity within the SLOs and
    the analytic p99s at a per-replica rate."""

    capacity_rps: np.ndarray
    predict: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
    mixes: int = 1
    """Distinct lane mixes the windows were sized at."""


def _mix_groups(total: WindowSeries, lanes: int) -> tuple[np.ndarray, np.ndarray]:
    """(group of each window, the groups' shares (groups, lanes)): each window's lane shares
    rounded to MIX_STEP, windows with the same rounded shares in one group."""
    n = len(total)
    if total.lane_rps is None or lanes < 2:
        return np.zeros(n, np.int64), np.ones((1, max(lanes, 1)))
    lr = np.asarray(total.lane_rps, float).T  # (windows, lanes)
    tot = lr.sum(axis=1, keepdims=True)
    share = np.where(tot > 0, lr / np.maximum(tot, 1e-300), 1.0 / lanes)
    q = np.round(share / MIX_STEP).astype(np.int64)
    keys, group = np.unique(q, axis=0, return_inverse=True)
    shares = np.maximum(keys * MIX_STEP, TRICKLE)
    return group.reshape(-1), shares / shares.sum(axis=1, keepdims=True)


def _traffics(cand: Candidate, peak: PlanFile, model: Any, shares: np.ndarray
              ) -> list[Traffic]:
    """The traffic of each mix: the peak plan's lanes (their lengths, arrival processes and
    SLOs) at the mix's shares, lengths cut to the max_model_len the plan launches."""
    from capplan.plan.planner import traffic_for

    context = model.context_len(peak.engine.max_model_len)
    launched = cand.settings.max_model_len or context
    max_len = min(context, launched)
    return [traffic_for([ln.model_copy(update={"rate_per_s": float(s)})
                         for ln, s in zip(peak.workloads, row, strict=True)], max_len)
            for row in shares]


def day_sizing(cand: Candidate, peak: PlanFile, model: Any, total: WindowSeries,
               traced: bool) -> Sizing:
    """Per-window capacity and predictions at each window's lane mix, and its arrival SCV
    when a trace measured it (plan/burst.py), else the mix's (its lanes' 1 / burstiness).

    Rate curves: every capacity is scaled by the planner's capacity over the search's at the
    peak window, so that window gets the recommendation's replicas (one lane: every window's
    capacity is the planner's). Traces: each window's capacity at its own SCV; when the
    planner's replay gave the capacity (its analytic count missed in simulation, or a replica
    missed at the screen's capacity and the replay confirmed a lower rate), scaled by that
    rate against the search at the lanes' SCV."""
    from capplan.plan.burst import capacities, predict
    from capplan.plan.planner import served_traffic

    group, shares = _mix_groups(total, len(peak.workloads))
    traffic = _traffics(cand, peak, model, shares)
    scv = (np.asarray(total.arrival_scv, float) if traced
           else np.array([traffic[g].arrival_scv for g in group]))
    caps = np.empty(len(total))
    for g, t in enumerate(traffic):
        m = group == g
        caps[m] = capacities(cand, t, scv[m])
    if traced:
        # the replay's rate where it gave one (it sized the replicas, or confirmed a rate
        # below the screen's): the windows' capacities follow it, not the analytic screen's
        if cand.sized_by_replay or replay_found(cand.binding_constraint):
            t = served_traffic(peak.workloads, peak, model)
            # the screen's capacity at the lanes' SCV, on the same SCV steps as the windows'
            screen = float(capacities(cand, t, np.array([t.arrival_scv]))[0])
            caps = caps * min(1.0, cand.max_rate_per_s / screen)
    else:
        k = total.peak_index
        caps = caps * (cand.max_rate_per_s / caps[k] if caps[k] > 0 else 1.0)

    def predict_all(per_replica_rps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ttft, tbt = np.full(len(total), math.nan), np.full(len(total), math.nan)
        for g, t in enumerate(traffic):
            m = group == g
            ttft[m], tbt[m] = predict(cand, t, np.asarray(per_replica_rps)[m], scv[m])
        return ttft, tbt

    return Sizing(caps, predict_all, len(traffic))
