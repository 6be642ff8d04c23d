"""Prefix caching in the compiled fleet loop (capplan/sim/fleet_loop.py): each replica keeps
its own cache (the single engine's structures, one row per replica); exact against the single
engine and against routing first and running each replica on its own."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from capplan.sim import Requests, compiled_available
from capplan.sim.fleet import (
    FleetReplaySpec,
    _group_keys,
    check_windows,
    replay_schedule,
    replica_timeline,
)
from tests.sim.fleet_reference import _subset, route_static

needs_numba = pytest.mark.skipif(not compiled_available(), reason="numba (the fast extra)")
TOL_S = 1e-9


def _shared(n: int, rate: float, groups: int, seed: int = 0, prefix_hi: int = 2000) -> Requests:
    """Requests whose prompts start with one of `groups` system prompts (or none: group -1),
    of a random shared length up to the prompt."""
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1 / rate, n))
    inp = rng.integers(200, 2400, n)
    out = rng.integers(1, 80, n)
    grp = rng.integers(-1, groups, n)
    pre = np.minimum(inp, rng.integers(16, prefix_hi, n))
    return Requests(arr, inp, out, np.zeros(n, np.int64), prefix_group=grp, prefix_tokens=pre)


def _spec(dep, reqs, windows, **kw):  # noqa: ANN001, ANN003, ANN202
    return FleetReplaySpec(requests=reqs, engine_config=dep, windows=windows, **kw)


def _small_pool(dep):  # noqa: ANN001, ANN202
    """The deployment with a 600-block pool (9,600 tokens): caches evict, requests preempt."""
    return replace(dep, memory=replace(dep.memory, num_gpu_blocks=600))


def _replica_run(dep, reqs):  # noqa: ANN001, ANN202
    from capplan.sim.fleet import engine_for

    return engine_for(dep, "compiled").run(reqs)


@needs_numba
@pytest.mark.parametrize("router", ["round-robin", "least-outstanding", "prefix-affinity"])
@pytest.mark.parametrize("small", [False, True])
def test_one_replica_with_prefix_caching_is_the_single_engine(llama_h100, router, small):
    dep = _small_pool(llama_h100) if small else llama_h100
    reqs = _shared(300, 12.0, 3, seed=1)
    single = _replica_run(dep, reqs)
    assert single.prefix_hit_tokens > 0
    res = replay_schedule(_spec(dep, reqs, [(0.0, 5.0, 1), (5.0, 60.0, 1)], router=router))
    rec = res.record
    assert res.completed == len(reqs)
    np.testing.assert_allclose(rec.first_token_at_s, single.first_token_at_s, rtol=0,
                               atol=TOL_S)
    np.testing.assert_allclose(rec.finished_at_s, single.finished_at_s, rtol=0, atol=TOL_S)
    assert rec.prefix_hit_tokens == single.prefix_hit_tokens
    assert res.per_replica[0]["preemptions"] == single.preemptions
    if small:
        assert single.preemptions > 0  # preempted sequences release shared blocks too


@needs_numba
@pytest.mark.parametrize("router", ["round-robin", "prefix-affinity"])
def test_static_routers_with_prefixes_equal_separate_runs(llama_h100, router):
    # Round-robin and prefix affinity read no replica state: the fleet loop (each replica its
    # own cache) equals routing first and running each replica's requests on its own engine.
    dep = _small_pool(llama_h100)
    reqs = _shared(500, 40.0, 4, seed=2)
    windows = [(0.0, 4.0, 2), (4.0, 8.0, 3), (8.0, 40.0, 1)]
    res = replay_schedule(_spec(dep, reqs, windows, router=router, startup_lag_s=1.0))
    _, ready, stop = replica_timeline(check_windows(windows), 1.0)
    rep, disp = route_static(reqs.arrival_at_s, _group_keys(reqs), ready, stop, router)
    first = np.full(len(reqs), np.nan)
    fin = np.full(len(reqs), np.nan)
    for r in range(len(ready)):
        idx = np.flatnonzero(rep == r)
        if not len(idx):
            assert res.per_replica[r]["requests"] == 0
            continue
        rec = _replica_run(dep, _subset(reqs, idx, disp))
        first[idx], fin[idx] = rec.first_token_at_s, rec.finished_at_s
        assert res.per_replica[r]["prefix_hit_tokens"] == rec.prefix_hit_tokens
        assert res.per_replica[r]["preemptions"] == rec.preemptions
    done = np.isfinite(fin)
    assert res.completed == int(done.sum())
    np.testing.assert_allclose(res.record.first_token_at_s, first[done], rtol=0, atol=TOL_S)
    np.testing.assert_allclose(res.record.finished_at_s, fin[done], rtol=0, atol=TOL_S)
    assert sum(p["prefix_hit_tokens"] for p in res.per_replica) > 0


def _hits(dep, reqs, router: str, n_rep: int = 4):  # noqa: ANN001, ANN202
    res = replay_schedule(_spec(dep, reqs, [(0.0, 1e4, n_rep)], router=router))
    assert res.completed == len(reqs) and res.unfinished == 0
    return res.record.prefix_hit_tokens / float(np.sum(reqs.input_tokens))


def _system_prompts(seed: int, rate: float, n: int = 400) -> Requests:
    """Four system prompts of 1,000-1,750 tokens, each request one of them plus 50-400 tokens
    of its own."""
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1 / rate, n))
    grp = rng.integers(0, 4, n)
    pre = 1000 + 250 * grp
    inp = pre + rng.integers(50, 400, n)
    return Requests(arr, inp, rng.integers(20, 200, n), np.zeros(n, np.int64),
                    prefix_group=grp, prefix_tokens=pre)


@needs_numba
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("rate", [0.5, 8.0])
def test_least_outstanding_hit_rate_between_round_robin_and_affinity(llama_h100, seed, rate):
    # Four replicas whose caches keep every prompt (no eviction): a request misses its system
    # prompt only where no earlier request of that prompt ran on its replica, so the misses
    # are the (prompt, replica) pairs a router makes, 4 to 16. Prefix affinity makes the fewest
    # (each prompt on one replica: 4); round-robin, request i on replica i mod 4, soon puts
    # every prompt on every replica (16, the most). Least-outstanding spreads by load, blind to
    # content, so its pairs, and its hit rate, lie between. At 0.5 req/s requests overlap
    # less: it sends most to replica 0 (the lowest index on ties) and fewer pairs than
    # round-robin reach replicas 2-3 (measured: 0.825 / 0.819 against round-robin's 0.818 /
    # 0.816, affinity's 0.844 / 0.841); at 8 req/s it uses every replica for every prompt and
    # equals round-robin's rate.
    # (Requests of one prompt that overlap on a replica before its blocks are computed can
    # each miss: a few blocks either way, inside the margins below.)
    reqs = _system_prompts(seed, rate)
    rr = _hits(llama_h100, reqs, "round-robin")
    lo = _hits(llama_h100, reqs, "least-outstanding")
    pa = _hits(llama_h100, reqs, "prefix-affinity")
    assert rr <= lo <= pa
    assert pa > rr + 0.02  # affinity saves the 12 misses on the other replicas
    if rate < 1:
        assert lo > rr


@needs_numba
@pytest.mark.parametrize("router", ["round-robin", "least-outstanding", "prefix-affinity"])
def test_fleet_loop_compiled_equals_interpreted_with_prefixes(llama_h100, router):
    # The same fleet loop source as plain Python (--sim-engine python: the loop loaded a second
    # time on the scheduler's plain twin): the same routing, hits, preemptions and times to
    # 1e-9 s, with caches that evict and a schedule that adds and drains replicas.
    dep = _small_pool(llama_h100)
    reqs = _shared(150, 30.0, 3, seed=5)
    windows = [(0.0, 1.0, 2), (1.0, 2.0, 3), (2.0, 30.0, 2)]
    a, b = (replay_schedule(_spec(dep, reqs, windows, router=router, startup_lag_s=0.5,
                                  sim_engine=e)) for e in ("compiled", "python"))
    assert a.per_replica == b.per_replica
    assert sum(p["prefix_hit_tokens"] for p in a.per_replica) > 0
    for key in ("first_token_at_s", "finished_at_s", "admitted_at_s"):
        np.testing.assert_allclose(getattr(a.record, key), getattr(b.record, key), rtol=0,
                                   atol=TOL_S, err_msg=key)
    assert a.tbt_s == pytest.approx(b.tbt_s, rel=0, abs=TOL_S)


@needs_numba
def test_kernel_probe_runs_a_cache_hit(llama_h100):
    # check_kernel compares the cached fleet loop with the single engine on kernel_probe's run:
    # it must go through the prefix cache (a hit on a freed block), or a stale cached copy of
    # the caching rules would pass unnoticed.
    from capplan.sim import compiled as C
    from capplan.sim.fleet import engine_for
    from capplan.sim.fleet_loop import kernel_probe

    eng = engine_for(llama_h100, "compiled")
    arr, q, cfg, _, _ = C._inputs_of(eng, _shared(3, 1.0, 1), None, 0.0, None)
    consts, moe = C._model(eng.step_model)
    got, want = kernel_probe(q, cfg, consts, moe)
    assert want[1] == llama_h100.pool.block_size  # the shared block, found cached
    assert got[1] == want[1]
    np.testing.assert_array_equal(got[0], want[0])
