"""The planner's search: the analytic search (search.py) bisecting only the configurations that
can reach the output.

The output shows the best configuration of each family (GPU, TP, dtypes; planner._shortlist),
so every family's best must be exact, but not every configuration's SLO rate. Six halvings of
the capacity bisection over every configuration bracket each capacity within a few per cent;
the SLO rate is below it, so the replicas are at least r, those the bracket's top needs. One
evaluation of the SLOs at x_up, one grid step of the SLO bisection above target / r, tells
where the bisection would end needing exactly r (the SLO margin falls with the rate, so
meeting the SLOs at x_up means meeting them at the grid point the bisection tests there); one
at x_lo = target / r, over the rest, where it needs more. Those configurations' replicas are
then known, and with them their cost and the tie-break (p99 TTFT at the planned rate, one
more evaluation). Only each family's best known configuration and those that could still beat
it are bisected (the capacity's last halvings and the SLO rate over them alone: every bound in
models/queueing/ is each row's own, so their figures are the full search's). A bisected
configuration whose replicas differ from those known, or a search where nothing is usable (the
nearest-miss message reads every configuration), falls back to the full search; so does the
goodput objective, which ranks by the SLO rate itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import fields, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from capplan.limits import DEFAULT_HEADROOM
from capplan.models.perf import StepModel
from capplan.models.queueing import Limits, QueueModel
from capplan.models.queueing.steady import _CAP_BISECT
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
    slot_shortfall,
)

if TYPE_CHECKING:
    from capplan.plan.slo import SloSet

_CAP_COARSE = 6
"""Halvings of the capacity bisection run over every configuration (the bracket, a few % of
the capacity wide, bounds the replicas); the rest run over those bisected for their SLO rate."""
_ROUNDS = 3
"""Replica counts tested per configuration (the first its capacity allows, then one more each
time the SLOs are missed below it)."""
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

    def take(a: Any, dtype: Any = float) -> np.ndarray:
        return np.broadcast_to(np.asarray(a, dtype), shape)[i, j][:, None]

    lay = lim.layout
    if lim.windowed:
        lay = replace(lay, **{f.name: take(getattr(lay, f.name), None) for f in fields(lay)})
    limits = Limits(take(lim.max_num_seqs), take(lim.max_num_batched_tokens),
                    take(lim.kv_cache_tokens), take(lim.state_tokens_per_seq),
                    take(lim.block_size), lay)
    return QueueModel(StepModel(**kw), qm.inp, qm.out, limits, qm.ca2, qm.policy, qm.prefix)


def planner_search(groups: list[ConfigGroup], t: Traffic, headroom: float = DEFAULT_HEADROOM,
                   objective: str = "min_cost", best_only: bool = False,
                   submit: Submit | None = None) -> SearchResult:
    """analytic_search's answers for every configuration that can reach the planner's output
    (each family's best, and anything that could be), bisecting only those. `best_only`: for
    a caller that reads only the plan's best (the fp8 and no-prefix-cache alternatives, the
    per-lane pools): only the best known configuration and what could beat it. `submit`: an
    idle worker finishes part of the bisected configurations (`_exact`)."""
    if objective == "max_goodput_per_dollar" or not groups:
        return analytic_search(groups, t, headroom)
    qm, seqs, kv = _queue_model(groups, t)
    need = {tgt.metric for tgt in t.slos}
    with np.errstate(all="ignore"):
        bracket = qm.capacity_bracket(_CAP_COARSE)
        r, known, lb = _replicas_known(qm, t, headroom, bracket, kv)
        weights = _weights(groups, objective) if best_only else None
        ttft = np.full(kv.shape, np.inf)
        ki, kj = _least_per_family(groups, known, r, weights)
        if ki.size:
            ttft[ki, kj] = _ttft(qm, t, (ki, kj), r[ki, kj])
    def ttft_at(i: np.ndarray, j: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return _ttft(qm, t, (i, j), lb[i, j])

    rows = _to_bisect(groups, known, lb <= MAX_REPLICAS, (r, lb, ttft), weights, ttft_at)
    found = _exact(groups, t, headroom, qm, (bracket, seqs, kv), rows, need, submit)
    if found is None or not _agrees(found, known, r):
        return analytic_search(groups, t, headroom)
    return found


def _replicas_known(qm: QueueModel, t: Traffic, headroom: float,
                    bracket: tuple[np.ndarray, np.ndarray], kv: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(r, known, lb): where `known`, the full search gives r replicas and a usable
    configuration; elsewhere its replicas are at least lb (inf: not a candidate).

    The SLO bisection's points lie below the capacity, which lies in `bracket` (c_lo, c_hi):
    the replicas are at least those at c_hi. For a count L at least that and at least what
    c_lo's top point needs, the bisection's grid has a lowest point needing L, g*, under
    x_up = target / L + c_hi / 2^13 (one grid step). The SLO margin falls with the rate:
    meeting the SLOs at x_up, the bisection ends at or above g* (L replicas); missing them at
    x_lo = target / L (under g*), it ends below (more than L), and L + 1 is tested next, for
    up to _ROUNDS counts. A miss's test at x_lo and its test at L + 1's x_up run in one
    evaluation (two rates per configuration: the second is read only where the first
    misses), except in the last round."""
    target = t.rate_per_s * (1 + headroom)
    c_lo, c_hi = bracket
    lb = np.where(kv > 0, _replicas(target, c_hi), np.inf)
    top = _replicas(target, c_lo * (1 - 2.0 ** -(_BISECT - 1)))
    known = np.zeros(kv.shape, bool)

    def x_up(i: np.ndarray, j: np.ndarray, n: np.ndarray) -> np.ndarray:
        return target / n + c_hi[i, j] * 2.0 ** -_BISECT * (1 + 1e-6)

    i, j = np.nonzero((kv > 0) & (top <= lb))
    ok = _meets(_subset(qm, (i, j)), t, x_up(i, j, lb[i, j])[:, None])[:, 0]
    for k in range(_ROUNDS):
        n = lb[i, j]
        # usable whatever the SLO rate: more than 0, not near the floor (g* over 10% of cap)
        known[i, j] = ok & ((n == 1) | (target / (n + 1e-9) >= NEAR_FLOOR_FRAC * c_hi[i, j]))
        miss = ~ok
        if not np.any(miss):
            break
        i, j, n = i[miss], j[miss], n[miss]
        x_lo = target / (n + 1e-9) * (1 - 1e-12)
        last = k == _ROUNDS - 1
        rates = x_lo[:, None] if last else np.stack([x_lo, x_up(i, j, n + 1)], axis=1)
        res = _meets(_subset(qm, (i, j)), t, rates)
        more = ~res[:, 0]
        lb[i[more], j[more]] += 1
        if last:
            break
        i, j, ok = i[more], j[more], res[more, 1]
    return np.where(known, lb, 0), known, lb


def _least_per_family(groups: list[ConfigGroup], known: np.ndarray, r: np.ndarray,
                      weights: _Weights | None) -> tuple[np.ndarray, np.ndarray]:
    """The known configurations whose leading figures (`_order` of their replicas) are their
    family's least: only these can be its best, so only their tie-break (p99 TTFT) is read."""
    family = _family_keys(groups, weights)
    ki, kj = np.nonzero(known)
    order = [_order(r[i, j], i, weights) for i, j in zip(ki, kj, strict=True)]
    least: dict[Any, tuple[float, float]] = {}
    for i, o in zip(ki, order, strict=True):
        least[family[i]] = min(least.get(family[i], o), o)
    at = np.asarray([o == least[family[i]] for i, o in zip(ki, order, strict=True)], bool)
    return ki[at], kj[at]


def _ttft(qm: QueueModel, t: Traffic, rows: tuple[np.ndarray, np.ndarray],
          replicas: np.ndarray) -> np.ndarray:
    """p99 TTFT of the configurations at `rows` at the planned rate over `replicas`."""
    at = _subset(qm, rows).at_rate((t.rate_per_s / replicas)[:, None], {"ttft_s"})
    return np.asarray(at["ttft_s"]["p99"])[:, 0]


def _meets(qm: QueueModel, t: Traffic, rate: np.ndarray) -> np.ndarray:
    """Where the configurations are stable and meet every SLO at `rate`."""
    res = qm.at_rate(rate, {tgt.metric for tgt in t.slos})
    return np.asarray(res["stable"], bool) & np.asarray(t.slos.ok(res), bool)


def _to_bisect(groups: list[ConfigGroup], known: np.ndarray, valid: np.ndarray,
               figures: tuple[np.ndarray, np.ndarray, np.ndarray], weights: _Weights | None,
               ttft_at: Callable[[np.ndarray, np.ndarray], np.ndarray]
               ) -> tuple[np.ndarray, np.ndarray]:
    """Each family's best known configuration (with `weights`, the best known of all), and
    every configuration not known that could beat it: the lower bound of its replicas not
    above the best's (with `weights`: its GPUs and cost at that bound not above the best's,
    in the objective's order), and where equal, its tie-break at that bound (`ttft_at(i, j)`:
    p99 TTFT at the planned rate with lb replicas) not after the best's (with more replicas
    it would lose anyway)."""
    r, lb, ttft = figures
    family = _family_keys(groups, weights)
    best: dict[Any, tuple[tuple[float, ...], int, int]] = {}
    for i, j in zip(*np.nonzero(known), strict=True):
        key = (*_order(r[i, j], i, weights), slot_shortfall(groups[i].settings),
               round(float(ttft[i, j]), 3), groups[i].combos[j][0])
        f = family[i]
        if f not in best or key < best[f][0]:
            best[f] = (key, i, j)
    take, tie = valid & ~known, np.zeros_like(known)
    for i in range(len(groups)):
        if family[i] in best:
            bound = best[family[i]][0][:2]
            order = [_order(x, i, weights) for x in lb[i]]
            take[i] &= np.asarray([o <= bound for o in order])
            tie[i] = np.asarray([o == bound for o in order])
    tie &= take
    if np.any(tie):
        ti, tj = np.nonzero(tie)
        for i, j, v in zip(ti, tj, ttft_at(ti, tj), strict=True):
            # the first of equal keys is the family's best (planner._best_per_family)
            key = (*best[family[i]][0][:2], slot_shortfall(groups[i].settings),
                   round(float(v), 3), groups[i].combos[j][0])
            take[i, j] = key <= best[family[i]][0]
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


def _family_keys(groups: list[ConfigGroup], weights: _Weights | None) -> list[Any]:
    """Each group's family as `_to_bisect` compares bests: Candidate.family, or one family of
    every group when `weights` rank all configurations together (best_only)."""
    return _families(groups) if weights is None else [0] * len(groups)


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


Submit = Callable[..., Any]
"""`submit(fn, *args)`: a Future of fn(*args) run in a worker process, or None
(`ParallelVerifier.submit`)."""

WORKER_SHARE = 0.45
"""The share of the configurations `_exact` hands a worker: a little under half, as the forked
worker ran its half ~15% slower than the parent (its first writes copy the pages it shares with
the parent)."""
SPLIT_MIN_ROWS = 64
"""Fewer configurations to finish exactly than this are all finished here: a worker's share
would cost more to send than to compute."""


def _exact(groups: list[ConfigGroup], t: Traffic, headroom: float, qm: QueueModel,
           arrays: tuple[tuple[np.ndarray, np.ndarray], np.ndarray, np.ndarray],
           rows: tuple[np.ndarray, np.ndarray], need: set[str], submit: Submit | None = None
           ) -> SearchResult | None:
    """The full search's figures of the configurations at `rows` (their capacity bisection
    finished and their SLO rate bisected over them alone); None when none is usable. With
    `submit`, a worker finishes the last WORKER_SHARE of the rows meanwhile (each row's figures
    are its own, so the parts give the figures of the whole)."""
    (c_lo, c_hi), seqs, kv = arrays
    n = rows[0].size
    if n == 0:
        return None

    def inputs(part: slice) -> tuple:  # _figures' arguments for the rows[part]
        r = (rows[0][part], rows[1][part])
        return (_subset(qm, r), (c_lo[r][:, None], c_hi[r][:, None]), seqs[r][:, None],
                (t.slos, t.rate_per_s, headroom, need))

    cut, theirs = n - int(n * WORKER_SHARE), None
    if submit is not None and n >= SPLIT_MIN_ROWS:
        theirs = submit(_figures, *inputs(slice(cut, None)))
    if theirs is None:
        c, lo, binding, reps, pred = _figures(*inputs(slice(None)))
    else:
        mine = _figures(*inputs(slice(0, cut)))
        c, lo, binding, reps, pred = _joined(
            mine, _collected(theirs, lambda: _figures(*inputs(slice(cut, None)))),
            (cut, n - cut))
    found = [Candidate(
        group=groups[i], settings=groups[i].settings.with_(
            max_num_seqs=groups[i].combos[j][0], max_num_batched_tokens=groups[i].combos[j][1]),
        kv_cache_tokens=int(kv[i, j]), max_rate_per_s=float(lo[k, 0]),
        capacity_per_s=float(c[k, 0]), binding_constraint=str(binding[k, 0]), index=(i, j),
        replicas=int(reps[k, 0]), ttft_p99_s=float(pred["ttft_s"]["p99"][k, 0]))
        for k, (i, j) in enumerate(zip(*rows, strict=True))]
    usable = [c for c in found if c.max_rate_per_s > 0 and c.replicas <= MAX_REPLICAS
              and not (c.replicas > 1 and c.max_rate_per_s < NEAR_FLOOR_FRAC * c.capacity_per_s)]
    if not usable:
        return None
    return SearchResult(found, qm, _scatter(pred, rows, np.shape(kv)), frozenset(need),
                        searched=int(np.count_nonzero(kv > 0)))


def _figures(sub: QueueModel, bracket: tuple[np.ndarray, np.ndarray], seqs: np.ndarray,
             traffic: tuple[SloSet, float, float, set[str]]) -> tuple:
    """(capacity, SLO rate, binding constraint, replicas, predictions at the planned rate) of
    the column of configurations `sub`: its capacity bisection finished from `bracket`, its SLO
    rate bisected. `traffic`: the SLOs, the target rate, the headroom and the metrics read. A
    module function of picklable arguments: a worker may run it (`_exact`)."""
    slos, rate, headroom, need = traffic
    with np.errstate(all="ignore"):
        c = sub.capacity_bracket(_CAP_BISECT - _CAP_COARSE, bracket)[0]
        lo = _slo_rate(sub, c, slos, need)
        binding = _binding(sub.at_rate(np.maximum(lo * 1.03, 1e-6), need), slos, sub, seqs)
        reps = _replicas(rate * (1 + headroom), lo)
        pred = sub.at_rate(np.where(lo > 0, rate / reps, 1e-6))
    return c, lo, binding, reps, pred


def _collected(future: Any, here: Callable[[], Any]) -> Any:
    """A worker's result, or `here()` where it was still queued (cancelled: this process got
    there first) or where its worker died."""
    from concurrent.futures.process import BrokenProcessPool

    if future.cancel():
        return here()
    try:
        return future.result()
    except BrokenProcessPool:
        return here()


def _joined(a: Any, b: Any, sizes: tuple[int, int]) -> Any:
    """Two halves' results (tuples and dicts of row arrays) joined in row order; values that
    are not per row (0-d) are the first's."""
    if isinstance(a, dict):
        return {k: _joined(a[k], b[k], sizes) for k in a}
    if isinstance(a, tuple):
        return tuple(_joined(x, y, sizes) for x, y in zip(a, b, strict=True))
    if np.ndim(a) == 0:
        return a
    return np.concatenate([np.broadcast_to(v, (m, *np.shape(v)[1:]))
                           for v, m in zip((a, b), sizes, strict=True)])


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


def _agrees(found: SearchResult, known: np.ndarray, r: np.ndarray) -> bool:
    """Whether every bisected configuration known to need r replicas does (the SLO margin
    fell with the rate there)."""
    return all(c.replicas == int(r[c.index]) for c in found.candidates if known[c.index])
