"""The planner's search: the analytic search (search.py) bisecting only the configurations that
can reach the output.

The output shows the best configuration of each family (GPU, TP, dtypes; planner._shortlist),
so every family's best must be exact, but not every configuration's SLO rate. A configuration's
SLO rate is below its capacity, so its replicas are at least r_lb, what its highest bisection
point would need. Whether the bisection would end at a point needing r_lb replicas is one
evaluation: the SLOs at g*, the lowest point of the bisection's grid that needs r_lb (the SLO
margin falls with the rate, so the bisection ends at or above g* exactly when g* meets the
SLOs). Those configurations' replicas are then known, and with them their cost and the
tie-break (p99 TTFT at the planned rate, one more evaluation). Only the configurations that
could still beat their family's best known one, and each family's best, are bisected (their
SLO rate, binding constraint and planned-rate predictions are the full search's). A bisected
configuration whose replicas differ from what g* said, or a search where nothing is usable
(the nearest-miss message reads every configuration), falls back to the full search; so does
the goodput objective, which ranks by the SLO rate itself.
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

import numpy as np

from capplan.limits import DEFAULT_HEADROOM
from capplan.models.perf import StepModel
from capplan.models.queueing import Limits, QueueModel
from capplan.plan.search import (
    _BISECT,
    Candidate,
    ConfigGroup,
    SearchResult,
    Traffic,
    _binding,
    _queue_model,
    _slo_rate,
    analytic_search,
)

MAX_REPLICAS = 4096
"""A configuration needing more replicas is a rounding artefact of the bisection near zero
rate, not a plan (planner._shortlist)."""
NEAR_FLOOR_FRAC = 0.10
"""SLOs that let a replica carry less than this fraction of the load it sustains are near the
unloaded latency floor: the fleet grows without bound as the SLO approaches the floor."""


def _replicas(rate: float, lo: np.ndarray) -> np.ndarray:
    """Replicas covering `rate` (the target with headroom) at per-replica rates lo (as
    search.analytic_search)."""
    return np.maximum(1.0, np.ceil(rate / np.maximum(lo, 1e-12) - 1e-9))


def _grid_points(cap: np.ndarray, rate: float) -> tuple[np.ndarray, np.ndarray]:
    """(r_lb, g*): the replicas the bisection's highest point needs (a lower bound: the SLO
    rate is at most that point), and the lowest point of the bisection's grid needing no more,
    computed with the bisection's own arithmetic (the same floats as its midpoints)."""
    hi0 = np.maximum(cap, 1e-9)
    lo, hi = np.zeros_like(cap), hi0.copy()
    for _ in range(_BISECT):  # always up: the highest point
        lo = 0.5 * (lo + hi)
    r_lb = _replicas(rate, lo)
    lo, hi = np.zeros_like(cap), hi0.copy()
    for _ in range(_BISECT):
        mid = 0.5 * (lo + hi)
        low = _replicas(rate, mid) > r_lb
        lo, hi = np.where(low, mid, lo), np.where(low, hi, mid)
    return r_lb, hi


def _subset(qm: QueueModel, rows: tuple[np.ndarray, np.ndarray]) -> QueueModel:
    """The queue model of the configurations at (group, combination) positions `rows`, as a
    column (its step constants and limits gathered)."""
    i, j = rows
    kw: dict[str, Any] = {}
    for f in fields(StepModel):
        v = getattr(qm.step, f.name)
        kw[f.name] = v[i] if isinstance(v, np.ndarray) and v.ndim else v
    shape = np.shape(qm.cap)
    lim = qm.limits

    def take(a: Any) -> np.ndarray:
        return np.broadcast_to(np.asarray(a, float), shape)[i, j][:, None]

    limits = Limits(take(lim.max_num_seqs), take(lim.max_num_batched_tokens),
                    take(lim.kv_cache_tokens), take(lim.state_tokens_per_seq),
                    take(lim.block_size))
    return QueueModel(StepModel(**kw), qm.inp, qm.out, limits, qm.ca2, qm.policy, qm.prefix)


def planner_search(groups: list[ConfigGroup], t: Traffic, headroom: float = DEFAULT_HEADROOM,
                   objective: str = "min_cost", best_only: bool = False) -> SearchResult:
    """analytic_search's answers for every configuration that can reach the planner's output
    (each family's best, and anything that could be), bisecting only those. `best_only`: for
    a caller that reads only the plan's best (the fp8 and no-prefix-cache alternatives, the
    per-lane pools): only the best known configuration and what could beat it."""
    if objective == "max_goodput_per_dollar" or not groups:
        return analytic_search(groups, t, headroom)
    qm, seqs, kv = _queue_model(groups, t)
    need = {tgt.metric for tgt in t.slos}
    target = t.rate_per_s * (1 + headroom)
    with np.errstate(all="ignore"):
        cap = qm.capacity_rate()
        r_lb, g_star = _grid_points(cap, target)
        res = qm.at_rate(g_star, need)
        ok = np.asarray(res["stable"], bool) & np.asarray(t.slos.ok(res), bool)
        valid = (kv > 0) & (r_lb <= MAX_REPLICAS)
        # known: replicas r_lb, usable (> 0 rate, not near the floor whatever the SLO rate)
        known = valid & ok & ((r_lb == 1) | (g_star >= NEAR_FLOOR_FRAC * cap))
        ttft = np.full(cap.shape, np.inf)
        if np.any(known):
            ki, kj = np.nonzero(known)
            at = _subset(qm, (ki, kj)).at_rate((t.rate_per_s / r_lb[ki, kj])[:, None],
                                               {"ttft_s"})
            ttft[ki, kj] = np.asarray(at["ttft_s"]["p99"])[:, 0]
    rows = _to_bisect(groups, known, valid, (ok, r_lb, ttft),
                      _weights(groups, objective) if best_only else None)
    found = _exact(groups, t, headroom, qm, (cap, seqs, kv), rows, need)
    if found is None or not _agrees(found, known, r_lb):
        return analytic_search(groups, t, headroom)
    return found


def _to_bisect(groups: list[ConfigGroup], known: np.ndarray, valid: np.ndarray,
               figures: tuple[np.ndarray, np.ndarray, np.ndarray],
               weights: _Weights | None) -> tuple[np.ndarray, np.ndarray]:
    """Each family's best known configuration (with `weights`, the best known of all), and
    every configuration not known that could beat it: the lower bound of its replicas not
    above the best's (with `weights`: its GPUs and cost at that bound not above the best's,
    in the objective's order)."""
    ok, r_lb, ttft = figures
    family: list[Any] = _families(groups) if weights is None else [0] * len(groups)
    best: dict[Any, tuple[tuple[float, ...], int, int]] = {}
    for i, j in zip(*np.nonzero(known), strict=True):
        key = (*_order(r_lb[i, j], i, weights), round(float(ttft[i, j]), 3),
               groups[i].combos[j][0])
        f = family[i]
        if f not in best or key < best[f][0]:
            best[f] = (key, i, j)
    # a configuration not known needs more than r_lb replicas where g* missed the SLOs
    lb = np.where(ok, r_lb, r_lb + 1)
    take = valid & ~known
    for i in range(len(groups)):
        if family[i] in best:
            bound = best[family[i]][0][:2]
            take[i] &= np.asarray([_order(x, i, weights) <= bound for x in lb[i]])
    for _, i, j in best.values():
        take[i, j] = True
    return np.nonzero(take)


_Weights = tuple[np.ndarray, np.ndarray, bool]
"""GPUs per replica and price per GPU-hour of each group, and whether GPUs rank before cost."""


def _order(replicas: float, i: int, weights: _Weights | None) -> tuple[float, float]:
    """The leading figures of search.rank_key for group i's configuration at `replicas`:
    (replicas, 0) within a family (where cost and GPUs follow the replicas); with `weights`,
    (cost, GPUs), or (GPUs, cost) for min_gpus."""
    if weights is None:
        return (float(replicas), 0.0)
    per_replica, price, gpus_first = weights
    gpus = float(replicas) * per_replica[i]
    cost = gpus * price[i]
    return (gpus, cost) if gpus_first else (cost, gpus)


def _weights(groups: list[ConfigGroup], objective: str) -> _Weights:
    """GPUs per replica of each group and its GPU's price per hour (inf when unknown, as
    rank_key), and whether the objective ranks GPUs first."""
    per = np.asarray([g.settings.tp * g.settings.pp * g.settings.attention_dp for g in groups],
                     float)
    price = np.asarray([math.inf if g.gpu.price_per_hour_usd is None
                        else g.gpu.price_per_hour_usd for g in groups], float)
    return per, price, objective == "min_gpus"


def _families(groups: list[ConfigGroup]) -> list[Any]:
    """Candidate.family of each group's configurations (the same for all of a group's)."""
    out = []
    for g in groups:
        s = g.settings
        if s.attention_dp > 1 or s.expert_parallel > 1:
            out.append((g.gpu.key, s.tp, s.weight_dtype, s.kv_dtype, s.attention_dp,
                        s.expert_parallel))
        else:
            out.append((g.gpu.key, s.tp, s.weight_dtype, s.kv_dtype))
    return out


def _exact(groups: list[ConfigGroup], t: Traffic, headroom: float, qm: QueueModel,
           arrays: tuple[np.ndarray, np.ndarray, np.ndarray],
           rows: tuple[np.ndarray, np.ndarray], need: set[str]) -> SearchResult | None:
    """The full search's figures of the configurations at `rows` (bisected over them alone);
    None when none of them is usable."""
    cap, seqs, kv = arrays
    if rows[0].size == 0:
        return None
    sub = _subset(qm, rows)
    c = cap[rows][:, None]
    with np.errstate(all="ignore"):
        lo = _slo_rate(sub, c, t.slos, need)
        binding = _binding(sub.at_rate(np.maximum(lo * 1.03, 1e-6), need), t.slos, sub,
                           seqs[rows][:, None])
        reps = _replicas(t.rate_per_s * (1 + headroom), lo)
        pred = sub.at_rate(np.where(lo > 0, t.rate_per_s / reps, 1e-6))
    found = [Candidate(
        group=groups[i], settings=groups[i].settings.with_(
            max_num_seqs=groups[i].combos[j][0], max_num_batched_tokens=groups[i].combos[j][1]),
        kv_cache_tokens=int(kv[i, j]), max_rate_per_s=float(lo[k, 0]),
        capacity_per_s=float(cap[i, j]), binding_constraint=str(binding[k, 0]), index=(i, j),
        replicas=int(reps[k, 0]), ttft_p99_s=float(pred["ttft_s"]["p99"][k, 0]))
        for k, (i, j) in enumerate(zip(*rows, strict=True))]
    usable = [c for c in found if c.max_rate_per_s > 0 and c.replicas <= MAX_REPLICAS
              and not (c.replicas > 1 and c.max_rate_per_s < NEAR_FLOOR_FRAC * c.capacity_per_s)]
    if not usable:
        return None
    return SearchResult(found, qm, _scatter(pred, rows, np.shape(cap)), frozenset(need),
                        searched=int(np.count_nonzero(kv > 0)))


def _scatter(pred: dict[str, Any], rows: tuple[np.ndarray, np.ndarray],
             shape: tuple[int, ...]) -> dict[str, Any]:
    """Predictions over a column of configurations, placed at their (group, combination)
    positions of the search's arrays (NaN elsewhere: nothing reads them)."""
    def place(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: place(x) for k, x in v.items()}
        a = np.asarray(v)
        if a.ndim == 0:
            return v
        out = np.full(shape, np.nan if a.dtype.kind == "f" else 0, dtype=a.dtype)
        out[rows] = np.broadcast_to(a, (rows[0].size, 1))[:, 0]
        return out
    return {k: place(v) for k, v in pred.items()}


def _agrees(found: SearchResult, known: np.ndarray, r_lb: np.ndarray) -> bool:
    """Whether every bisected configuration that g* said needs r_lb replicas does (the SLO
    margin fell with the rate there)."""
    return all(c.replicas == int(r_lb[c.index]) for c in found.candidates if known[c.index])
