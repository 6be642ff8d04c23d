"""Whether an open-loop run kept up with its arrivals: the backlog test of every replay
(`simulate`, `latency`'s replay, the planner's verification in plan/verify.py, fleets per replica,
disaggregated pools per worker).

A stable queue's backlog is stationary; an overloaded one grows by (offered - served) per
second, so its latencies depend on the run's length. The test reads the second half of the
arrival window, (t_mid, t_last] (the first half is the warm-up: the batch fills and nothing has
finished yet), and counts there the arrivals A and the first tokens F (of any request). A - F is
exactly how much the number of requests still waiting for their first token grew over that
half. Requests admitted into the running batch but not yet decoding count as waiting; the
completions are reported too, but not tested (a running batch that fills and empties moves
them by tens of requests in a stable run near capacity).

Tolerance (one home: `backlog_tolerance`): in a stable queue each request waits its own TTFT,
so the number waiting is, as in an M/G/infinity queue, a Poisson count of the arrivals during
one TTFT, mean m = lambda E[TTFT] (Little's law). Its values at t_mid and t_last are independent
when the half is longer than a TTFT, so the growth has variance 2 m; a renewal process's count
variance is its inter-arrival gaps' squared coefficient of variation times its mean (its
asymptotic variance t sigma^2 / mu^3 = lambda t cv^2; Cox, Renewal Theory, 1962), so bursty
arrivals scale it by that (never below Poisson's 1).
Near capacity and under bursts the number waiting wanders far more than a Poisson count (a
queue near saturation keeps an excursion for many TTFTs), so its variance is taken as at least
what the half shows: the count's variance about its linear trend, read at each arrival
(`_spread`; the trend of a growing backlog is the signal and is left out of it).
Overloaded: growth above OVERLOAD_SIGMAS standard deviations, plus one for the last arrival,
which is always still waiting at t_last. m is taken as at least 1: the count is discrete, and
below one the normal tail understates a Poisson count's (a growth of 2 at m = 0.1 happens in
about 1 run in 10).
The Poisson count assumes the two ends of the half are a TTFT apart or more. When the half's
arrivals wait longer than the half itself for their first token on average (`delay_capped`),
its ends share their waiting requests and m is every arrival of the half, a tolerance no
growth can exceed. A mean first-token wait longer than half the arrival window is itself the
mark of a queue that never drained within the run (no SLO a server is planned for allows it):
such a run is overloaded once its backlog grew by more than OVERLOAD_SIGMAS Poisson standard
deviations of its arrivals' count, deliberately not scaled by their burstiness (the waits
themselves are the evidence; a cv2-scaled count would again approach every arrival) (a
200-request Mooncake trace on one H100: mean TTFT 39 s
against a 36 s half, 63 of the half's 92 arrivals still waiting at its end, against 30; the
tolerance without this rule was 111, above the 92 arrivals).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

OVERLOAD_SIGMAS = 3.0
"""Standard deviations of a stable backlog's growth that a run must exceed to be overloaded
(normal one-sided: about 1 stable run in 700 flagged; the Poisson count's tail is lighter)."""


def gap_scv(t: np.ndarray) -> float:
    """SCV of the gaps between consecutive arrivals t, sorted (1.0 with fewer than 3)."""
    if len(t) < 3:
        return 1.0
    gaps = np.diff(t)
    mean = gaps.mean()
    return float(gaps.var() / (mean * mean)) if mean > 0 else 1.0


def backlog_tolerance(waiting_mean: float, arrival_cv2: float) -> float:
    """Requests by which a stable run's backlog may grow over the test's half-window:
    OVERLOAD_SIGMAS * sqrt(2 * max(cv2, 1) * max(m, 1)) + 1 (module docstring)."""
    return OVERLOAD_SIGMAS * math.sqrt(2.0 * max(arrival_cv2, 1.0) * max(waiting_mean, 1.0)) + 1


def arrival_window(arrival_at_s: Any, first_token_at_s: Any, finished_at_s: Any
                   ) -> dict[str, float]:
    """The backlog test's figures over the second half of the arrival window (module
    docstring): `start_s`, `end_s`, `arrived`, `first_tokens`, `completed` (counts in
    (start_s, end_s]; a NaN time never happened), `offered_requests_per_s` and
    `served_requests_per_s` (arrived and completed over its length), `backlog_growth`
    (arrived - first_tokens) and `tolerance`. Empty for fewer than two arrivals or no span."""
    arr = np.asarray(arrival_at_s, float)
    if arr.size < 2 or not float(arr.max()) > float(arr.min()):
        return {}
    first = np.asarray(first_token_at_s, float)
    t0, t1 = float(arr.min()), float(arr.max())
    mid = (t0 + t1) / 2
    half_s = t1 - mid

    def count(t: np.ndarray) -> int:
        return int(np.count_nonzero((t > mid) & (t <= t1)))  # NaN compares false

    arrived, started = count(arr), count(first)
    completed = count(np.asarray(finished_at_s, float))
    mine = arr > mid
    ttft = first[mine] - arr[mine]
    # E[TTFT] of the half's arrivals, capped at the half (beyond it the two counts share no
    # arrival); one never served counts as the whole half
    waited_s = float(np.mean(np.where(np.isfinite(ttft), ttft, half_s)))
    delay_s = min(waited_s, half_s)
    cv2 = gap_scv(np.sort(arr))
    waiting = arrived / half_s * delay_s
    return {"start_s": mid, "end_s": t1, "arrived": arrived, "first_tokens": started,
            "completed": completed, "offered_requests_per_s": arrived / half_s,
            "served_requests_per_s": completed / half_s,
            "backlog_growth": arrived - started,
            "tolerance": backlog_tolerance(max(waiting, _spread(arr, first, mid, t1) / 2),
                                           cv2),
            "delay_capped": waited_s >= half_s,
            "capped_tolerance": OVERLOAD_SIGMAS * math.sqrt(max(arrived, 1)) + 1}


def _spread(arr: np.ndarray, first: np.ndarray, mid: float, t1: float) -> float:
    """The variance of the number waiting for a first token over (mid, t1], about its linear
    trend (a growing backlog's ramp is the signal, not noise), read at each arrival there:
    near capacity and under bursts the count wanders far more than a Poisson count (a queue
    near saturation holds its excursions for many TTFTs), which the formula's m misses."""
    t = np.sort(arr[(arr > mid) & (arr <= t1)])
    if t.size < 3:
        return 0.0
    firsts = np.sort(first[np.isfinite(first)])
    n = (np.searchsorted(np.sort(arr), t, side="right")
         - np.searchsorted(firsts, t, side="right")).astype(float)
    tc, nc = t - t.mean(), n - n.mean()
    ss = float(np.dot(tc, tc))  # least squares by hand: arrivals at one instant have no trend
    resid = nc - (float(np.dot(tc, nc)) / ss * tc if ss > 0 else 0.0)
    return float(np.var(resid))


def backlog_grows(window: dict[str, float] | None) -> bool:
    """True when the backlog grew by more than its tolerance (`arrival_window`'s figures), or,
    in a run whose arrivals waited longer than the half for a first token (`delay_capped`), by
    more than the arrivals' count's spread (`capped_tolerance`; module docstring)."""
    if not window:
        return False
    growth = float(window["backlog_growth"])
    return growth > float(window["tolerance"]) or (
        bool(window.get("delay_capped")) and growth > float(window["capped_tolerance"]))
