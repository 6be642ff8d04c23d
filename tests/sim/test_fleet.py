"""The fleet replay (capplan.sim.fleet, sim/fleet_loop.py) and the compiled engine's event
skipping: exact against single-replica runs, no request lost on any schedule."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capplan.errors import InputError
from capplan.sim import ContinuousEngine, Requests, compiled_available
from capplan.sim.fleet import (
    FleetReplaySpec,
    check_windows,
    replay_schedule,
    replica_timeline,
)
from tests.sim.conftest import step_by_step
from tests.sim.fleet_reference import route_static

needs_numba = pytest.mark.skipif(not compiled_available(), reason="numba (the fast extra)")
TOL_S = 1e-9


def _reqs(n: int, rate: float, seed: int = 0, out_hi: int = 120, groups: int = 0) -> Requests:
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1 / rate, n))
    inp = rng.integers(16, 600, n)
    out = rng.integers(1, out_hi, n)
    grp = rng.integers(0, groups, n) if groups else None
    return Requests(arr, inp, out, np.zeros(n, np.int64), prefix_group=grp,
                    prefix_tokens=None if grp is None else np.full(n, 8))


def _engine(dep, cls):  # noqa: ANN001, ANN202
    s, pool = dep.settings, dep.pool
    return cls(dep.step, pool.num_blocks, pool.block_size, s.max_num_seqs,
               s.max_num_batched_tokens, s.profile.scheduler)


def _spec(dep, reqs, windows, **kw):  # noqa: ANN001, ANN003, ANN202
    return FleetReplaySpec(requests=reqs, engine_config=dep, windows=windows, **kw)


@needs_numba
def test_event_skipping_matches_step_by_step_at_low_load(llama_h100):
    # Low load: almost every step is a pure decode step inside a skipped stretch (block edges,
    # window-free): per-request times and TBT samples equal the loop's run step by step.
    from capplan.sim.engine import CompiledEngine
    from capplan.sim.metrics import step_summary

    reqs = _reqs(150, 2.0, seed=3)
    a = _engine(llama_h100, CompiledEngine).run(reqs)
    plain = _engine(llama_h100, ContinuousEngine)
    plain.jit = False
    with step_by_step():
        b = plain.run(reqs)
    for key in ("first_token_at_s", "finished_at_s", "admitted_at_s"):
        np.testing.assert_allclose(getattr(a, key), getattr(b, key), rtol=0, atol=TOL_S)
    sa, sb = a.steps, step_summary(b)
    assert sa.num_steps == sb.num_steps > 20 * len(reqs)  # mostly decode steps
    va = np.repeat(sa.tbt_gap_s, sa.tbt_count.astype(int))
    vb = np.repeat(sb.tbt_gap_s, sb.tbt_count.astype(int))
    np.testing.assert_allclose(np.sort(va), np.sort(vb), rtol=0, atol=TOL_S)


@needs_numba
@pytest.mark.parametrize("router", ["round-robin", "least-outstanding", "prefix-affinity"])
def test_one_replica_is_the_single_engine(llama_h100, router):
    from capplan.sim.engine import CompiledEngine

    reqs = _reqs(400, 25.0, seed=1)
    single = _engine(llama_h100, CompiledEngine).run(reqs)
    res = replay_schedule(_spec(llama_h100, reqs, [(0.0, 5.0, 1), (5.0, 60.0, 1)],
                                router=router))
    ttft = np.sort(single.first_token_at_s - single.arrival_at_s)
    assert res.completed == len(reqs) and res.unfinished == 0
    assert res.ttft_s["p99"] == pytest.approx(ttft[int(np.ceil(0.99 * len(ttft))) - 1],
                                              abs=TOL_S)
    want = np.repeat(single.steps.tbt_gap_s, single.steps.tbt_count.astype(int))
    assert res.tbt_s["mean"] == pytest.approx(float(np.mean(want)), rel=1e-12)


@needs_numba
def test_round_robin_schedule_equals_separate_runs(llama_h100):
    # Round-robin reads no replica state: the fleet loop's routing (lag, drain included) equals
    # routing first (route_static, plain Python) and running each replica on its own.
    from capplan.sim.engine import CompiledEngine
    from capplan.sim.fleet import _group_keys
    from tests.sim.fleet_reference import _subset

    reqs = _reqs(600, 30.0, seed=2)
    windows = [(0.0, 6.0, 2), (6.0, 12.0, 4), (12.0, 40.0, 1)]
    res = replay_schedule(_spec(llama_h100, reqs, windows, router="round-robin",
                                startup_lag_s=2.0, slo_ttft_s=0.5))
    _, ready, stop = replica_timeline(check_windows(windows), 2.0)
    rep, disp = route_static(reqs.arrival_at_s, _group_keys(reqs), ready, stop, "round-robin")
    assert [p["requests"] for p in res.per_replica] == np.bincount(rep, minlength=4).tolist()
    first = np.full(len(reqs), np.nan)
    for r in range(len(ready)):
        idx = np.flatnonzero(rep == r)
        rec = _engine(llama_h100, CompiledEngine).run(_subset(reqs, idx, disp))
        first[idx] = rec.first_token_at_s
        # a replica added at 6 s serves from 8 s; the ones dropped at 12 s take nothing after
        assert disp[idx].min() >= ready[r] and disp[idx].max() < stop[r]
    ttft = np.sort(first - reqs.arrival_at_s)
    assert res.ttft_s["p90"] == pytest.approx(ttft[int(np.ceil(0.9 * len(ttft))) - 1],
                                              abs=TOL_S)


@needs_numba
def test_least_outstanding_spreads_long_requests(llama_h100):
    # Every other request is long: round-robin puts all long ones on replica 0; least
    # outstanding sends new requests to the replica holding fewer, so its tail TTFT is lower.
    n = 300
    arr = np.arange(n) * 0.02
    out = np.where(np.arange(n) % 2 == 0, 600, 4)
    reqs = Requests(arr, np.full(n, 256), out, np.zeros(n, np.int64))
    w = [(0.0, 100.0, 2)]
    rr = replay_schedule(_spec(llama_h100, reqs, w, router="round-robin"))
    lo = replay_schedule(_spec(llama_h100, reqs, w, router="least-outstanding"))
    assert [p["requests"] for p in rr.per_replica] == [150, 150]
    assert lo.tbt_s["p99"] < rr.tbt_s["p99"]


@needs_numba
def test_prefix_affinity_keeps_a_group_on_one_replica(llama_h100):
    reqs = _reqs(300, 20.0, seed=4, groups=7)
    res = replay_schedule(_spec(llama_h100, reqs, [(0.0, 100.0, 3)], router="prefix-affinity"))
    assert res.completed == len(reqs)
    # reproduce the routing: first of a group round-robin, later ones where it went
    _, ready, stop = replica_timeline(check_windows([(0.0, 100.0, 3)]), 0.0)
    rep, _ = route_static(reqs.arrival_at_s, reqs.prefix_group, ready, stop, "prefix-affinity")
    for g in range(7):
        assert len(set(rep[reqs.prefix_group == g])) == 1
    assert [p["requests"] for p in res.per_replica] == np.bincount(rep, minlength=3).tolist()


@needs_numba
@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(counts=st.lists(st.integers(0, 3), min_size=1, max_size=5),
       lag=st.sampled_from([0.0, 0.7, 3.0]),
       router=st.sampled_from(["round-robin", "least-outstanding", "prefix-affinity"]),
       seed=st.integers(0, 99))
def test_no_request_is_lost(llama_h100, counts, lag, router, seed):
    # shared prefixes (each replica its own prefix cache) for every router
    reqs = _reqs(120, 40.0, seed=seed, out_hi=40, groups=5)
    if max(counts) == 0:
        counts[0] = 1
    windows = [(i * 0.6, (i + 1) * 0.6, c) for i, c in enumerate(counts)]
    res = replay_schedule(_spec(llama_h100, reqs, windows, router=router, startup_lag_s=lag,
                                slo_ttft_s=0.2))
    assert res.completed + res.unfinished == len(reqs)
    assert sum(w.completed + w.unfinished for w in res.windows) == len(reqs)
    _, ready, stop = replica_timeline(check_windows(windows), lag)
    # unfinished exactly when no replica accepts at or after the arrival (none is dropped)
    a = reqs.arrival_at_s[:, None]
    taken = ((ready < stop) & (stop > np.maximum(a, ready))).any(axis=1)
    assert res.unfinished == int((~taken).sum())
    for w in res.windows:
        if w.completed + w.unfinished:
            assert 0.0 <= w.attainment <= 1.0


def test_schedule_errors(llama_h100):
    reqs = _reqs(10, 5.0)
    for windows in ([], [(0.0, 1.0, 1), (2.0, 3.0, 1)], [(0.0, 1.0, -1)], [(1.0, 1.0, 1)],
                    [(0.0, 1.0, 0)]):
        with pytest.raises(InputError):
            replay_schedule(_spec(llama_h100, reqs, windows))
    with pytest.raises(InputError, match="router"):
        replay_schedule(_spec(llama_h100, reqs, [(0.0, 1.0, 1)], router="random"))
    with pytest.raises(InputError, match="lag"):
        replay_schedule(_spec(llama_h100, reqs, [(0.0, 1.0, 1)], startup_lag_s=-1))


def test_replica_timeline_by_hand():
    w = check_windows([(0, 10, 2), (10, 20, 4), (20, 30, 3), (30, 40, 1), (40, 50, 2)])
    decided, ready, stop = replica_timeline(w, 5.0)
    # replicas 0-1 from 0; 2-3 decided at 10, ready at 15; 3 drains at 20, 2 at 30, 1 at 30;
    # replica 4 decided at 40, ready at 45
    assert decided.tolist() == [0, 0, 10, 10, 40]
    assert ready.tolist() == [0, 0, 15, 15, 45]
    assert stop.tolist() == [np.inf, 30, 30, 20, np.inf]


@needs_numba
def test_least_outstanding_by_hand(llama_h100):
    # r0 (long) at 0 s -> replica 0 (tie: lowest index); r1 (2 tokens) at 1 ms -> replica 1
    # (replica 0 holds one); r2 at 1 s: r1 finished long ago, r0 still decodes (500 tokens at
    # ~7 ms a step) -> replica 1 holds none: it takes r2. Round-robin sends r2 to replica 0.
    reqs = Requests(np.array([0.0, 0.001, 1.0]), np.array([100, 100, 100]),
                    np.array([500, 2, 10]), np.zeros(3, np.int64))
    lo = replay_schedule(_spec(llama_h100, reqs, [(0.0, 10.0, 2)], router="least-outstanding"))
    rr = replay_schedule(_spec(llama_h100, reqs, [(0.0, 10.0, 2)], router="round-robin"))
    assert [p["requests"] for p in lo.per_replica] == [1, 2]
    assert [p["requests"] for p in rr.per_replica] == [2, 1]


def test_a_fleet_cache_older_than_the_scheduler_it_compiled_in_is_dropped(tmp_path):
    # numba checks only fleet_loop.py's own stamp; its cached loop has compiled.py's scheduler
    # compiled in, so an index older than compiled.py (or the step formula) is flushed
    import os
    from types import SimpleNamespace

    from capplan.sim.fleet_loop import drop_stale_cache

    source = tmp_path / "compiled.py"
    source.write_text("x")
    flushed = []

    def cached(name: str, age_s: float):
        index = tmp_path / f"{name}.nbi"
        index.write_text("i")
        t = os.path.getmtime(source) + age_s
        os.utime(index, (t, t))
        cache = SimpleNamespace(_cache_file=SimpleNamespace(_index_path=str(index)),
                                flush=lambda: flushed.append(name))
        return SimpleNamespace(_cache=cache)

    old, new = cached("old", -60.0), cached("new", +60.0)
    never = SimpleNamespace(_cache=SimpleNamespace(
        _cache_file=SimpleNamespace(_index_path=str(tmp_path / "none.nbi")),
        flush=lambda: flushed.append("none")))
    assert drop_stale_cache([old, new, never], [str(source)]) == 1
    assert flushed == ["old"]
