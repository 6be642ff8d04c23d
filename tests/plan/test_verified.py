"""The planner's simulator check (capplan/plan/verified.py) with stand-in replays: which rates
a plan's replicas are replayed at, what capacity it then states, the replicas the replay adds
and the latency-floor rule after it.

A stand-in replay passes a replica up to a rate the test sets (`Limit`), so every figure is a
hand calculation on the plan's own numbers: 20 req/s of Llama-3.1-8B, 1024/256 tokens, on one
H100 TP 1 configuration family, 20% headroom.
"""

from __future__ import annotations

import math

import pytest

from capplan.errors import InfeasibleError
from capplan.plan.planner import run_plan
from capplan.plan.result import Verification
from capplan.plan.schema import PlanFile
from capplan.plan.search_bound import NEAR_FLOOR_FRAC
from capplan.plan.verified import VERIFY_MIN_REQUESTS

RATE, HEADROOM = 20.0, 0.2


def _plan(rate: float = RATE, **extra) -> PlanFile:
    return PlanFile.model_validate({
        "model": "llama-3.1-8b", "candidates": {"gpus": ["h100-sxm"], "tp": [1]},
        "workloads": [{"name": "x", "rate_per_s": rate, "input_len": 1024, "output_len": 256,
                       "slo": {"ttft_p99_s": 1.0, "tbt_p99_s": 0.05}}], **extra})


class Limit:
    """A stand-in replay: a replica meets the SLOs up to `limit` req/s (its TTFT p99 is
    limit-proportional above it); every replayed rate is recorded."""

    def __init__(self, limit: float) -> None:
        self.limit, self.rates, self.requests = limit, [], []

    def __call__(self, job) -> Verification:
        rate = sum(ln.rate_per_s for ln in job.lanes) / job.replicas
        self.rates.append(rate)
        self.requests.append(job.requests)
        ok = rate <= self.limit * (1 + 1e-9)
        ttft = 0.5 if ok else rate / self.limit
        return Verification(ok=ok, reason="" if ok else f"p99 TTFT {ttft * 1e3:.1f} ms > "
                            "1000.0 ms", requests=job.requests, rate_per_s=rate,
                            simulated={"ttft_s": {"p99": ttft}, "tbt_s": {"p99": 0.02}})


@pytest.fixture(scope="module")
def screened(catalog):
    """The analytic screen's best (no replay): 1 replica, capacity X > 24 req/s."""
    best = run_plan(catalog, _plan(), None).best
    assert best.replicas == 1 and best.candidate.max_rate_per_s > RATE * (1 + HEADROOM)
    return best


def test_a_replica_is_replayed_at_its_share_plus_the_headroom_then_at_its_capacity(
        catalog, screened):
    # share 20 x 1.2 = 24 req/s first (what the replicas were sized for), then the capacity X
    # the plan states; passing both, X stands and the plan is the screen's
    x = screened.candidate.max_rate_per_s
    replay = Limit(x + 1)
    best = run_plan(catalog, _plan(verify={"top": 1}), replay).best
    assert replay.rates == pytest.approx([24.0, x])
    assert best.replicas == 1 and best.candidate.max_rate_per_s == pytest.approx(x)
    assert best.verified.rate_per_s == pytest.approx(x)
    assert best.candidate.binding_constraint == screened.candidate.binding_constraint


def test_a_replica_missing_at_its_capacity_states_the_rate_the_replay_confirmed(
        catalog, screened):
    # passes at 24 req/s, misses at X: each replica "carries up to" 24 req/s, not X, and the
    # SLO it missed at X binds it, as the replay found
    replay = Limit(24.5)
    res = run_plan(catalog, _plan(verify={"top": 1}), replay)
    best = res.best
    assert best.replicas == 1
    assert best.candidate.max_rate_per_s == pytest.approx(24.0)
    assert best.candidate.binding_constraint == "TTFT SLO (replay)"
    assert not best.candidate.sized_by_replay  # the screen's replicas stand
    assert best.verified.ok and best.verified.rate_per_s == pytest.approx(24.0)
    assert any("it meets the SLOs at 24 req/s" in w for w in res.warnings), res.warnings


def test_a_miss_at_the_headroom_is_replayed_with_more_replicas(catalog, screened):
    # one replica misses at 24 req/s; two replicas each take 20 x 1.2 / 2 = 12 <= 13: the
    # plan is 2 replicas, sized by the replay, each stated to carry 12 req/s
    replay = Limit(13.0)
    res = run_plan(catalog, _plan(verify={"top": 1}), replay)
    best = res.best
    assert replay.rates == pytest.approx([24.0, 12.0])
    assert best.replicas == 2 and best.candidate.sized_by_replay
    assert best.candidate.max_rate_per_s == pytest.approx(12.0)
    assert best.per_replica_rate_per_s == pytest.approx(10.0)
    assert best.candidate.binding_constraint == "TTFT SLO (replay)"
    assert any("replayed with 2" in w for w in res.warnings), res.warnings


def test_the_replay_does_not_size_a_fleet_under_the_latency_floor(catalog):
    # TTFT p99 105 ms sits near this replica's floor: the screen plans 5 replicas, each at ~28%
    # of its capacity C. A stand-in that passes only up to 8% of C needs
    # ceil(24 / (0.08 C)) replicas, each under the 10% the screen leaves out, so the replay
    # stops at floor(24 / (0.1 C)) (within 4x the screen's 5) and says why; allowed, it sizes
    # that fleet.
    plan = _plan(verify={"top": 1}, workloads=[{
        "name": "x", "rate_per_s": RATE, "input_len": 1024, "output_len": 256,
        "slo": {"ttft_p99_s": 0.105}}])
    screen = run_plan(catalog, plan, None).best.candidate
    cap = screen.capacity_per_s
    floor = math.floor(RATE * (1 + HEADROOM) / (NEAR_FLOOR_FRAC * cap))
    need = math.ceil(RATE * (1 + HEADROOM) / (0.08 * cap) - 1e-9)
    assert screen.replicas < floor < need <= 4 * screen.replicas
    replay = Limit(0.08 * cap)
    with pytest.raises(InfeasibleError, match=f"at most {floor} of h100-sxm TP 1 .*near its "
                                              "latency floor"):
        run_plan(catalog, plan, replay)
    assert min(replay.rates) >= RATE * (1 + HEADROOM) / floor * (1 - 1e-9)
    allowed = plan.model_copy(update={"allow_near_floor": True})
    best = run_plan(catalog, allowed, Limit(0.08 * cap)).best
    assert best.replicas == need and best.candidate.sized_by_replay


def test_a_loaded_replica_is_replayed_with_more_requests_than_a_light_one(catalog):
    # the count follows the replay's steps (requests x 256 outputs / running batch) within
    # [2,000, verify.requests]: near capacity ~100 sequences run, so 10,000 (the default
    # cap); at 1.2 req/s ~2 run and 200,000 x 2 / 256 < 2,000, so 2,000 (its replay at its
    # capacity, ~17 req/s, is a loaded one again)
    heavy, light = Limit(1e9), Limit(1e9)
    run_plan(catalog, _plan(verify={"top": 1}), heavy)
    run_plan(catalog, _plan(1.0, verify={"top": 1}), light)
    assert heavy.requests == [10_000, 10_000]
    assert light.rates[0] == pytest.approx(1.2) and light.rates[1] > 10
    assert light.requests == [VERIFY_MIN_REQUESTS, 10_000]


class Thrash(Limit):
    """A stand-in replay whose replica runs out of KV cache above `limit`: overloaded, with
    647 preemptions."""

    def __call__(self, job) -> Verification:
        v = super().__call__(job)
        if v.ok:
            return v
        return Verification(ok=False, reason="overloaded: served 9 of 30 requests/s while "
                            "requests arrived; the queue keeps growing", requests=v.requests,
                            rate_per_s=v.rate_per_s,
                            simulated={**v.simulated, "preemptions": 647})


def test_a_replica_overloaded_by_preemptions_is_bound_by_kv_capacity(catalog, screened):
    # passes at 24 req/s, overloaded at X with 647 preemptions: what binds it is the KV cache
    # (the README's "KV capacity"), as the replay found, not a "capacity" no list names
    best = run_plan(catalog, _plan(verify={"top": 1}), Thrash(24.5)).best
    assert best.candidate.max_rate_per_s == pytest.approx(24.0)
    assert best.candidate.binding_constraint == "KV capacity (replay: 647 preemptions)"


def test_a_runner_up_no_replay_confirmed_is_marked_unverified(catalog):
    # the screen's #2 misses at its share plus the headroom and is resized to 2 replicas; the
    # rounds stop at the confirmed #1, so nothing replays those 2: its capacity (20 / 2 x 1.2
    # = 12 req/s) is unconfirmed and its binding says so instead of "(replay)"
    plan = _plan(verify={"top": 2})
    plan = plan.model_copy(update={"candidates": plan.candidates.model_copy(
        update={"gpus": ["h100-sxm", "h200"]})})
    second = run_plan(catalog, plan.model_copy(update={"verify": _plan().verify}),
                      None).recommendations[1].candidate
    misses = second.pool.num_blocks  # its KV cache: the other GPU's

    class Second(Limit):
        def __call__(self, job) -> Verification:
            v = super().__call__(job)
            if job.num_gpu_blocks != misses:
                return v
            return Verification(ok=False, reason="p99 TTFT 1200.0 ms > 1000.0 ms",
                                requests=v.requests, rate_per_s=v.rate_per_s,
                                simulated={"ttft_s": {"p99": 1.2}, "tbt_s": {"p99": 0.02}})

    res = run_plan(catalog, plan, Second(1e9))
    assert res.best.verified is not None
    (resized,) = [r for r in res.recommendations if r.candidate.sized_by_replay]
    assert resized.replicas == 2 and resized.verified is None
    assert resized.candidate.max_rate_per_s == pytest.approx(12.0)
    assert resized.candidate.binding_constraint == "TTFT SLO (unverified)"
    assert "which no replay confirmed" in resized.why_not_first
    assert "(replay)" not in resized.why_not_first
