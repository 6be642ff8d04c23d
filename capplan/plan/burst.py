"""Each window's burstiness in the capacity of a replica.

The planner sizes a replica with one arrival variability, the squared coefficient of variation
of inter-arrival gaps (SCV; 1 = Poisson), in the queueing model's waiting times
(models/queueing/: Kingman's / Allen-Cunneen's factor (c_a^2 + c_s^2) / 2). A day's windows
differ: each has its own gaps' SCV (plan/rate_curve.py). This module gives the capacity within
the SLOs, and the predicted p99s, of the chosen configuration at each window's SCV, searched on
the analytic model as the planner's search does (search.analytic_search).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from capplan.plan.search import Candidate, Traffic

SCV_STEP = 0.25
"""SCVs are rounded up to this step (capacities computed once per level; up, to be safe)."""
SCV_RANGE = (0.25, 50.0)
GRID = 32


def levels(scv: np.ndarray) -> np.ndarray:
    """The SCVs rounded up to SCV_STEP, within SCV_RANGE."""
    x = np.ceil(np.asarray(scv, float) / SCV_STEP - 1e-9) * SCV_STEP
    return np.clip(np.nan_to_num(x, nan=1.0), *SCV_RANGE)


def _queue(cand: Candidate, t: Traffic, scv: float):  # noqa: ANN202 - a QueueModel
    from capplan.plan.planner import _queue_model

    return _queue_model(cand, replace(t, arrival_scv=float(scv)))


def capacity_at(cand: Candidate, t: Traffic, scv: float) -> float:
    """The highest per-replica rate meeting every SLO of t at arrival SCV scv: the largest
    rate of a GRID-point grid over (0, stable capacity] that meets them, refined once by a
    second grid inside the step above it (resolution 1 / GRID^2 of the stable capacity; two
    vectorised calls of the analytic model instead of a bisection's thirteen)."""
    qm = _queue(cand, t, scv)
    need = {tgt.metric for tgt in t.slos}
    with np.errstate(all="ignore"):
        hi = max(float(np.asarray(qm.capacity_rate()).ravel()[0]), 1e-9)
        lo = 0.0
        for _ in range(2):
            rates = lo + (hi - lo) * np.arange(1, GRID + 1) / GRID
            res = qm.at_rate(rates, need)
            ok = np.asarray(res["stable"], bool) & np.asarray(t.slos.ok(res), bool)
            # the SLOs hold up to a rate and fail beyond it: the first failure bounds it
            k = int(np.argmin(ok)) if not ok.all() else GRID
            lo, hi = (lo if k == 0 else float(rates[k - 1])), float(rates[min(k, GRID - 1)])
            if k == GRID:
                break
    return lo


def capacities(cand: Candidate, t: Traffic, scv: np.ndarray) -> np.ndarray:
    """Capacity within the SLOs of one replica at each window's SCV (levels())."""
    lv = levels(scv)
    cap = {float(v): capacity_at(cand, t, v) for v in np.unique(lv)}
    return np.array([cap[float(v)] for v in lv])


def predict(cand: Candidate, t: Traffic, per_replica_rps: np.ndarray, scv: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """Analytic TTFT and TBT p99 at each window's per-replica rate and SCV level."""
    lv = levels(scv)
    rate = np.maximum(np.asarray(per_replica_rps, float), 1e-6)
    ttft, tbt = np.full(len(rate), math.nan), np.full(len(rate), math.nan)
    for v in np.unique(lv):
        m = lv == v
        with np.errstate(all="ignore"):
            res = _queue(cand, t, float(v)).at_rate(rate[m])
        ttft[m] = np.asarray(res["ttft_s"]["p99"], float)
        tbt[m] = np.asarray(res["tbt_s"]["p99"], float)
    return ttft, tbt
