"""The planner's simulator check: which of the best plans the replay confirms, at what rate, and
the replicas it sizes where the analytic screen's count misses (README, "Recommendations").

A plan claims two things of each replica: it carries its share of the traffic plus the
headroom (what the replica count was sized for), and it carries up to its capacity within the
SLOs (the figure printed and the day planner's sizing). Each of the best plans is replayed one
replica at a time at its share plus the headroom, then, if that passes, at its capacity; a
replica that misses at its capacity keeps the rate the replay confirmed as its capacity. A plan
that misses at its share plus the headroom is replayed with more replicas in the next round;
when no plan passes, the replay sizes the replicas by bisection (`_scaled_out`). Fleets that
would keep each replica under NEAR_FLOOR_FRAC of its capacity are left out unless the plan
allows them, as the analytic screen leaves them out.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np

from capplan.catalog.schema import ModelSpec
from capplan.errors import InfeasibleError
from capplan.models.queueing import Limits, QueueModel, summarize
from capplan.plan.result import Prediction, Recommendation, Verification
from capplan.plan.schema import Lane, PlanFile
from capplan.plan.search import (
    Candidate,
    RankKey,
    SearchSpace,
    Traffic,
    replay_binding,
    replay_bound,
)
from capplan.plan.search_bound import MAX_REPLICAS, NEAR_FLOOR_FRAC
from capplan.plan.verify import VerifyJob, verification_engine

VerifyFn = Callable[[VerifyJob], Verification]
Meanwhile = Callable[[Recommendation], object]
"""Work for the parent while verification workers simulate (`_verify`)."""

VERIFY_ROUNDS = 3
"""Rounds of replays (of at most `verify.top` plans each) before the replay sizes the replicas
of the best that missed: a round replays the plans ranked ahead of the best one confirmed (the
first: the best `verify.top`), those that missed with more replicas (`_one_more`)."""
SCALE_OUT_MAX = 4
"""How far the replay may raise a configuration's replicas over the analytic count (a multiple)
when every shortlisted configuration missed its SLOs in simulation."""
MORE_REPLICAS = 1.1
"""A configuration that missed in simulation is replayed next round with this many times its
replicas (at least one more): the analytic screen's capacity was 5-20% over the replay's in the
cases audited."""
VERIFY_MIN_REQUESTS = 2000
"""Requests a replay check runs at least (as `latency`'s open-loop replay: the tails of fewer
are unsettled), unless the plan's `verify.requests` is smaller."""
VERIFY_STEPS = 200_000
"""Engine steps a replay check may take (about requests x mean output / running batch; the
compiled loop runs them at ~0.1-0.2 us each with its decode stretches skipped): a heavily loaded
replica, whose p99 settles slowest, gets up to `verify.requests` requests (default 10,000: near
capacity a 2,000-request replay's TTFT p99 was 0.3-0.6x a 20,000-request one's); a lightly
loaded one, whose tails settle fast but whose long decodes take many steps, down to
VERIFY_MIN_REQUESTS."""


@dataclass(frozen=True)
class PlanPool:
    """One pool being planned: the model, its lanes and their pooled traffic."""

    model: ModelSpec
    lanes: list[Lane]
    traffic: Traffic
    space: SearchSpace


def queue_model(c: Candidate, t: Traffic) -> QueueModel:
    """The analytic queue of one replica of candidate c under traffic t."""
    # engine limits are per attention-DP rank: a replica holds dp x them (as the search's)
    return QueueModel(c.step, t.inp, t.out,
                      Limits.of_replica(c.settings, c.kv_cache_tokens, c.pool),
                      t.arrival_scv, c.settings.profile.scheduler, t.prefix)


def near_floor(c: Candidate) -> bool:
    """More than one replica only because the SLOs sit just above the unloaded latency."""
    return c.replicas > 1 and c.max_rate_per_s < NEAR_FLOOR_FRAC * c.capacity_per_s


def floor_replicas(c: Candidate, t: Traffic, headroom: float) -> int:
    """The most replicas that keep each over NEAR_FLOOR_FRAC of its capacity at its share plus
    the headroom (`near_floor`: more than one replica under that is near the floor)."""
    return max(1, math.floor(t.rate_per_s * (1 + headroom)
                             / (NEAR_FLOOR_FRAC * c.capacity_per_s) + 1e-9))


def verify_job(r: Recommendation, pool: PlanPool, max_requests: int, rate_per_s: float
               ) -> VerifyJob:
    """A replay of one replica of r at `rate_per_s` (per replica, the lanes' shares), with
    enough requests for its p99s to settle within the step budget (VERIFY_STEPS)."""
    c, s = r.candidate, r.candidate.settings
    t = pool.traffic
    # The running batch grows at least in proportion to the rate (Little's law); the
    # prediction is at the planned share.
    share = r.per_replica_rate_per_s
    batch = max(r.predicted.mean_running_batch * (rate_per_s / share if share > 0 else 1.0),
                1.0)
    n_req = int(min(max_requests, max(VERIFY_MIN_REQUESTS,
                                      VERIFY_STEPS * batch / max(t.out.mean, 1.0))))
    return VerifyJob(lanes=pool.lanes, replicas=t.rate_per_s / rate_per_s, step=c.step,
                     num_gpu_blocks=c.pool.num_blocks, block_size=c.pool.block_size,
                     state_blocks=c.pool.state_blocks_per_seq, layout=c.pool.layout,
                     # per rank x ranks, as `simulate` runs it
                     max_num_seqs=s.max_num_seqs * s.attention_dp,
                     max_num_batched_tokens=s.max_num_batched_tokens * s.attention_dp,
                     max_model_len=s.max_model_len, requests=n_req,
                     policy=s.profile.scheduler,
                     request_overhead_s=float(np.asarray(c.step.request_overhead_s)))


def prepare(verify: Any, groups: list, pool: PlanPool) -> None:
    """Give a parallel verifier a small job shaped like the plan's (the first configuration
    that fits), to load its workers' compiled engine while the analytic search runs."""
    g = next((g for g in groups if g.pool is not None and any(g.kv_tokens)), None)
    if g is None:
        return
    s, j = g.settings, int(np.argmax(g.kv_tokens))
    p = g.pool_at(j)
    verify.prepare(VerifyJob(lanes=pool.lanes, replicas=1, step=g.step,
                             num_gpu_blocks=p.num_blocks, block_size=p.block_size,
                             state_blocks=p.state_blocks_per_seq, layout=p.layout,
                             max_num_seqs=g.combos[j][0], max_num_batched_tokens=g.combos[j][1],
                             max_model_len=s.max_model_len, requests=64,
                             policy=s.profile.scheduler))


@dataclass
class _Misses:
    """What the replays left out: the last miss of each configuration (by its search index:
    the recommendation and the replay that missed), its analytic replica count, and the plans
    the replay would take under the latency floor where the plan does not allow that."""

    missed: dict[tuple[int, int], tuple[Recommendation, Verification]] = field(
        default_factory=dict)
    screened: dict[tuple[int, int], int] = field(default_factory=dict)
    floored: list[Recommendation] = field(default_factory=list)


def verified(ranked: list[Recommendation], pool: PlanPool, plan: PlanFile,
             verify: VerifyFn | None, warnings: list[str], key: RankKey,
             meanwhile: Meanwhile | None = None) -> list[Recommendation]:
    """`ranked` (best first) as the replay leaves it: the plans ranked ahead of the best one it
    confirmed are replayed (at most `verify.top` a round, VERIFY_ROUNDS rounds; a miss is
    replayed with more replicas next round, with a warning), the rest kept as they are.
    When none passed, the replay sizes the best that missed (`_scaled_out`); raises
    InfeasibleError when that fails too, naming the miss closest to its SLOs. `meanwhile`:
    `_verify`'s, in the first round."""
    if verify is None or plan.verify.top <= 0:
        return ranked
    out = _Misses()
    for i in range(VERIFY_ROUNDS):  # the best shown is always one the replay passed
        todo = _ahead_of_confirmed(ranked)[:plan.verify.top]
        if not todo:
            break
        before = None if i or meanwhile is None else partial(meanwhile, todo[0])
        ranked = sorted(_verify(todo, pool, plan, verify, warnings, out, before)
                        + ranked[len(todo):], key=lambda r: key(r.candidate))
    ranked = ranked[len(_ahead_of_confirmed(ranked)):]  # unconfirmed ahead of it: left out
    if not ranked and out.missed:
        last = sorted(out.missed.values(), key=lambda m: key(m[0].candidate))
        ranked = sorted(_scaled_out(last[:plan.verify.top], pool, plan, verify, warnings, out),
                        key=lambda r: key(r.candidate))
    if not ranked:
        raise _replay_refusal(out, pool.traffic, plan.headroom)
    return [_unverified(r) for r in ranked]


UNVERIFIED_BINDING = "(unverified)"
"""Suffix of the binding of a plan the replay resized after a miss but did not replay at its
new replica count (`_unverified`)."""


def _unverified(r: Recommendation) -> Recommendation:
    """r as shown: one resized by the replay after a miss (`_one_more`) and not replayed since
    (ranked behind the best confirmed, the rounds stop) states no "(replay)" binding: its
    capacity, its share plus the headroom, is what no replay confirmed ("TTFT SLO
    (unverified)")."""
    c = r.candidate
    if r.verified is not None or not c.sized_by_replay:
        return r
    what = replay_bound(c.binding_constraint)
    return r.with_(candidate=replace(c, binding_constraint=f"{what} {UNVERIFIED_BINDING}"))


def _ahead_of_confirmed(ranked: list[Recommendation]) -> list[Recommendation]:
    """The plans ranked ahead of the first the replay confirmed (all of them if none)."""
    first = next((k for k, r in enumerate(ranked) if r.verified is not None), len(ranked))
    return ranked[:first]


def _verify(todo: list[Recommendation], pool: PlanPool, plan: PlanFile, verify: VerifyFn,
            warnings: list[str], out: _Misses, meanwhile: Callable[[], object] | None = None
            ) -> list[Recommendation]:
    """The plans of `todo` as the replay leaves them, each replayed one replica at its share
    plus the headroom (the load the headroom is for). One that passes there is replayed again at the
    capacity the analytic screen gives it, where that is higher: passing there too, that
    capacity stands (the replay covers it); else the rate it passed at is its capacity
    (`_confirmed`). One that misses is replaced by itself with more replicas (`_one_more`;
    each miss recorded in `out`), or left out. A verifier with worker processes
    (`map_while`) runs `meanwhile()` here as they simulate."""
    h, n = plan.headroom, plan.verify.requests_per_check
    for r in todo:
        out.screened.setdefault(r.candidate.index, r.replicas)
    results = replays(verify, [verify_job(r, pool, n, _with_headroom(r, h)) for r in todo],
                       meanwhile)
    claims = [r.candidate.max_rate_per_s for r in todo]
    again = [k for k, (r, v) in enumerate(zip(todo, results, strict=True))
             if v.ok and claims[k] > _with_headroom(r, h) * (1 + 1e-6)]
    at_claim = dict(zip(again, replays(verify, [verify_job(todo[k], pool, n, claims[k])
                                                 for k in again]), strict=True))
    kept: list[Recommendation | None] = []
    for k, (r, v) in enumerate(zip(todo, results, strict=True)):
        if not v.ok:
            kept.append(_one_more(r, v, pool, plan, warnings, out))
            continue
        got = r.with_(verified=at_claim.get(k, v))
        if k in at_claim and not at_claim[k].ok:
            got = _confirmed(r, at_claim[k], v, _with_headroom(r, h), pool.traffic, warnings)
        if r.candidate.sized_by_replay:
            warnings.append(f"{r.label}: sized by the replay at {r.replicas} replicas, each "
                            f"replayed at its share plus the {h:.0%} headroom (the analytic "
                            f"screen's {out.screened[r.candidate.index]} missed in simulation)")
        kept.append(_off_floor(got, plan, warnings, out))
    return [r for r in kept if r is not None]


def _with_headroom(r: Recommendation, headroom: float) -> float:
    """The per-replica rate the plan's headroom is meant to absorb: its share x (1 + h)."""
    return r.per_replica_rate_per_s * (1 + headroom)


def replays(verify: VerifyFn, jobs: list[VerifyJob],
             meanwhile: Callable[[], object] | None = None) -> list[Verification]:
    """The jobs replayed on one simulator for all (serial == --jobs N); a verifier with a
    `map` (capplan.plan.verify.ParallelVerifier, `--jobs`) runs them at once, each result its
    own job's (seeded), so the answer is the serial one; `meanwhile()` runs while they do."""
    if not jobs:
        if meanwhile is not None:
            meanwhile()
        return []
    engine = verification_engine(jobs)
    jobs = [replace(j, sim_engine=engine) for j in jobs]
    if meanwhile is not None and hasattr(verify, "map_while"):
        return list(verify.map_while(jobs, meanwhile))
    if meanwhile is not None:
        meanwhile()
    return list(getattr(verify, "map", lambda js: [verify(j) for j in js])(jobs))


def _confirmed(r: Recommendation, at_claim: Verification, at_headroom: Verification,
               rate: float, t: Traffic, warnings: list[str]) -> Recommendation:
    """r, whose replica missed the SLOs in simulation at the capacity the analytic screen
    claims but met them at its share plus the headroom (`rate`, replayed `at_headroom`): the
    replay's rate is the most a replica is known to carry, and the SLO it missed at the claim
    is what binds it (the replay's)."""
    c = replace(r.candidate, max_rate_per_s=rate, binding_constraint=_replay_binding(
        at_claim, t))
    warnings.append(f"{r.label}: the simulator replayed a replica at the "
                    f"{r.candidate.max_rate_per_s:.3g} req/s the analytic screen gives it and "
                    f"it missed ({at_claim.reason}); it meets the SLOs at {rate:.3g} req/s, "
                    "its share plus the headroom, which is the capacity given")
    return r.with_(candidate=c, verified=at_headroom)


def _off_floor(r: Recommendation, plan: PlanFile, warnings: list[str], out: _Misses
               ) -> Recommendation | None:
    """r, or None (appended to `out.floored`, with a warning) when its replicas each carry under
    NEAR_FLOOR_FRAC of their capacity at the rate the replay confirmed and the plan does not
    allow that (the analytic screen's rule, `near_floor`)."""
    if plan.allow_near_floor or not near_floor(r.candidate):
        return r
    warnings.append(f"{r.label} at {r.replicas} replicas left out: at the rate the replay "
                    f"confirms each replica carries under {NEAR_FLOOR_FRAC:.0%} of its "
                    "capacity (near the latency floor; allow_near_floor: true shows it)")
    out.floored.append(r)
    return None


def _one_more(r: Recommendation, miss: Verification, pool: PlanPool, plan: PlanFile,
              warnings: list[str], out: _Misses) -> Recommendation | None:
    """r missed in simulation at its share plus the headroom: the same configuration with one
    replica more, or MORE_REPLICAS times its replicas where that is more (sized by the replay,
    to be replayed next round), or None past SCALE_OUT_MAX times the analytic count or the
    latency floor (`out.floored`)."""
    t, h = pool.traffic, plan.headroom
    out.missed[r.candidate.index] = (r, miss)
    n = max(r.replicas + 1, math.ceil(r.replicas * MORE_REPLICAS))
    most = min(out.screened[r.candidate.index] * SCALE_OUT_MAX, MAX_REPLICAS)
    floor = most if plan.allow_near_floor else floor_replicas(r.candidate, t, h)
    head = (f"{r.label} at {r.replicas} replica(s) met the SLOs analytically but missed them "
            f"in simulation at its share plus the {h:.0%} headroom ({miss.reason})")
    if n > min(most, floor):
        warnings.append(head + "; dropped")
        if floor < n <= most:
            out.floored.append(r)
        return None
    warnings.append(head + f"; replayed with {n}")
    return _replicated(r, n, t, _replay_binding(miss, t), h)


def _replay_refusal(out: _Misses, t: Traffic, headroom: float) -> InfeasibleError:
    """Why no configuration is left after the replays: the miss closest to its SLOs, and the
    fleets the replay would take under the latency floor (`_Misses`)."""
    floor = ""
    if out.floored:
        r0 = out.floored[0]
        c = r0.candidate
        # a plan left out after its replay passed carries the rate that replay confirmed; one
        # left out after a miss (`_one_more`, `_scaled_out`) was confirmed at no rate
        if r0.verified is not None and r0.verified.ok:
            what = (f"whose replica the replay confirms at {c.max_rate_per_s:.3g} req/s, "
                    f"limited by the {c.binding_constraint}")
        else:
            miss = out.missed.get(c.index)
            why = f", {miss[1].reason}" if miss is not None and miss[0] is r0 else ""
            what = (f"which no replay confirmed: it missed the SLOs at "
                    f"{r0.replicas} replica(s), each at "
                    f"{_with_headroom(r0, headroom):.3g} req/s with the headroom{why}")
        floor = (f" (at most {floor_replicas(c, t, headroom)} of {r0.label}, {what}: more "
                 f"would each carry under {NEAR_FLOOR_FRAC:.0%} of the "
                 f"{c.capacity_per_s:.3g} req/s it sustains, near its latency floor; "
                 "allow_near_floor: true in the plan, or recommend --allow-near-floor, "
                 "replays more)")
    if not out.missed:
        return InfeasibleError("no fleet of sensible size meets the SLOs in simulation" + floor
                               + "; loosen the SLOs or lower the rate")
    r, v = min(out.missed.values(), key=lambda m: _overshoot(m[1], t)[0])
    return InfeasibleError(
        "every configuration that met the SLOs analytically missed them in simulation, "
        f"also with up to {SCALE_OUT_MAX}x its replicas{floor}; nearest miss: {r.label} at "
        f"{r.replicas} replica(s) ({v.reason}); loosen the SLOs or lower the rate")


def _scaled_out(missed: list[tuple[Recommendation, Verification]], pool: PlanPool,
                plan: PlanFile, verify: VerifyFn, warnings: list[str], out: _Misses
                ) -> list[Recommendation]:
    """The replay is the truth: each configuration that missed in simulation (at the replica
    count it last missed at), replayed at up to SCALE_OUT_MAX times the analytic count; the
    fewest replicas whose replica meets the SLOs in the replay with the plan's headroom on top
    of its share (bisection: a replica carries less as replicas are added) become its plan.
    Unless the plan allows fleets near the latency floor, no more replicas than keep each over
    NEAR_FLOOR_FRAC of its capacity (`floor_replicas`, the screen's rule); a configuration that
    would need more is appended to `out.floored`."""
    t = pool.traffic

    def replay(r: Recommendation, n: int, binding: str) -> Recommendation | None:
        rec = _replicated(r, n, t, binding, plan.headroom)
        (v,) = replays(verify, [verify_job(rec, pool, plan.verify.requests_per_check,
                                           rec.candidate.max_rate_per_s)])
        return rec.with_(verified=v) if v.ok else None

    found_all = []
    for r, miss in missed:
        binding = _replay_binding(miss, t)
        screened = out.screened.get(r.candidate.index, r.replicas)
        most = min(screened * SCALE_OUT_MAX, MAX_REPLICAS)
        floor = most if plan.allow_near_floor else floor_replicas(r.candidate, t,
                                                                  plan.headroom)
        lo, hi = r.replicas, min(most, floor)  # lo missed
        found = replay(r, hi, binding) if hi > lo else None
        while found is not None and hi - lo > 1:
            mid = (lo + hi) // 2
            if (got := replay(r, mid, binding)) is not None:
                found, hi = got, mid
            else:
                lo = mid
        if found is not None:
            warnings.append(f"{r.label}: sized by the replay at {found.replicas} replicas, "
                            f"each replayed at its share plus the {plan.headroom:.0%} headroom "
                            f"(the analytic screen's {screened} missed in simulation)")
            found_all.append(found)
        elif floor < most:
            warnings.append(f"{r.label} left out: the replay needs more than {floor} replicas, "
                            f"each then under {NEAR_FLOOR_FRAC:.0%} of its capacity (near the "
                            "latency floor; allow_near_floor: true shows that fleet)")
            out.floored.append(r)
    return found_all


def _overshoot(v: Verification, t: Traffic) -> tuple[float, str]:
    """How far a replay was over its SLOs (the largest value / objective of those it reports;
    inf for an overloaded replica) and what that is: an overloaded replica that preempted ran
    out of KV cache (KV capacity, one of the binding constraints the analytic screen names)."""
    ratio, worst, _ = t.slos.worst(v.simulated)
    if "overloaded" in v.reason or worst is None:
        return math.inf, "KV capacity" if v.simulated.get("preemptions") else "capacity"
    return ratio, f"{worst.label} SLO"


def _replay_binding(miss: Verification, t: Traffic) -> str:
    """What the replay found binding at too few replicas: the SLO it missed by most, or KV
    capacity with the preemptions the replay counted ("KV capacity (replay: 647
    preemptions)"; `replay_found` reads both)."""
    what = _overshoot(miss, t)[1]
    if what == "KV capacity":
        n = int(miss.simulated["preemptions"])
        return replay_binding(what, f"{n:,} preemption{'s' if n != 1 else ''}")
    return replay_binding(what)


def _replicated(r: Recommendation, n: int, t: Traffic, binding: str, headroom: float
                ) -> Recommendation:
    """Recommendation r at n replicas, sized by the replay: the most a replica is known to
    carry is its share with the headroom on top (the rate replayed); the analytic prediction
    is at its share."""
    rate = t.rate_per_s / n
    pred = summarize(queue_model(r.candidate, t).at_rate(np.float64(rate)))
    c = replace(r.candidate, replicas=n, max_rate_per_s=rate * (1 + headroom),
                binding_constraint=binding, ttft_p99_s=float(pred["ttft_s"]["p99"]),
                sized_by_replay=True)
    return replace(r, candidate=c, per_replica_rate_per_s=rate, verified=None,
                   predicted=Prediction.of(pred), slo_margins=t.slos.margins(pred))
